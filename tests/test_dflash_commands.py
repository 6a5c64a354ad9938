"""A DFlash draft through the one CLI, beside an EAGLE-3 one: `acceptance` scores both kinds in one run and compares
them prompt by prompt, `bench` times a DFlash draft and refuses drafts of two kinds together, `generate` decodes with
either kind and checks the output against plain greedy decoding. Tiny random drafts of a tiny random target."""

import json

import pytest
import torch
from transformers import AutoConfig

from eagle3lab.benchmark import acceptance, eval_set, generate, scoring
from eagle3lab.benchmark.commands import bench
from eagle3lab.benchmark.eval_set import EvalRecord
from eagle3lab.benchmark.prompts import encode_chat
from eagle3lab.decoding.engine import generate as greedy
from eagle3lab.drafters.dflash.config import DFlashConfig
from eagle3lab.drafters.dflash.model import DFlashDraft, save_dflash
from eagle3lab.models.draft import DraftConfig, Eagle3Draft, save_draft
from eagle3lab.models.target import load_target
from test_features import save_tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")
QUESTIONS = {"mtbench": ["Name a colour.", "Count to three."], "gsm8k": ["What is two plus two?", "Halve ten."]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny target, a random EAGLE-3 draft and two random DFlash drafts of it (blocks of 4 and 3), a prompt file
    and four evaluation records: the target's own greedy answers to two questions of two sets."""
    root = tmp_path_factory.mktemp("kinds")
    target_folder = save_tiny_target(root / "target")
    config = AutoConfig.from_pretrained(target_folder)
    torch.manual_seed(0)
    eagle = Eagle3Draft(DraftConfig.from_target(config, draft_vocab_size=512))
    eagle.set_vocab(torch.randperm(config.vocab_size)[:512])
    save_draft(eagle, root / "eagle")
    for name, block_size in (("block", 4), ("short-block", 3)):
        dflash = DFlashConfig.from_target(config, mask_token_id=16, block_size=block_size)
        save_dflash(DFlashDraft(dflash), root / name)
    (root / "prompts.jsonl").write_text(json.dumps({"id": "a", "set": "chat", "prompt": "Write a haiku."}) + "\n")
    target = load_target(str(target_folder))
    records = []
    for set_name, questions in QUESTIONS.items():
        for i, question in enumerate(questions):
            prompt = encode_chat(target.tokenizer, [{"role": "user", "content": question}])
            answer = greedy(target.model, prompt, 16).tokens
            records.append(EvalRecord(f"{set_name}{i}#1", set_name, 1, prompt, answer, "length"))
    return {"root": root, "target": str(target_folder), "records": records}


@pytest.fixture
def eval_records(tiny, monkeypatch):
    """The evaluation set `acceptance` builds: the tiny target's four records."""
    monkeypatch.setattr(eval_set, "build_eval_set", lambda *args, **kwargs: tiny["records"])


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the bad input was refused")


def _acceptance(tiny, tmp_path, *argv) -> tuple[int, dict]:
    out = tmp_path / "acceptance.json"
    drafts = [f"{name}={tiny['root'] / name}" for name in ("eagle", "block")]
    code = scoring.main([*drafts, "--target", tiny["target"], "--output", str(out), *argv])
    return code, json.loads(out.read_text()) if out.exists() else {}


def test_acceptance_scores_both_kinds_at_their_own_depths_and_compares_them_where_both_drafted(
    tiny, eval_records, tmp_path
):
    code, result = _acceptance(tiny, tmp_path, "--compare", "block:eagle")
    assert code == 0
    scored = {(r["system"], r["depth"]) for r in result["table"] if r["set"] == "all"}
    assert scored == {("eagle", 3), ("eagle", 5), ("block", 3)}  # chains at 3 and 5, the block of 4 at its 3
    assert len(result["per_prompt"]) == 3 * len(tiny["records"])
    # the EAGLE-3 draft's rows are the chain scorer's own, as before the kinds shared the command
    target = load_target(tiny["target"])
    chain = scoring.load_drafts({"eagle": tiny["root"] / "eagle"}, target, torch.float32)
    alone = acceptance.per_prompt(scoring.score(chain, target, tiny["records"], None, progress=False))
    assert [r for r in result["per_prompt"] if r["system"] == "eagle"] == alone
    comparison = result["comparison"]
    assert comparison["drafts"] == ["block"] and comparison["partners"] == ["eagle"]
    assert [(r["depth"], r["set"]) for r in comparison["rows"]] == [(3, "all sets"), (3, "gsm8k"), (3, "mtbench")]
    assert comparison["rows"][0]["prompts"] == 4 and comparison["rows"][1]["prompts"] == 2


def test_explicit_depths_score_every_draft_there_and_a_block_refuses_one_past_its_end(
    tiny, eval_records, tmp_path, capsys
):
    code, result = _acceptance(tiny, tmp_path, "--depths", "2", "--subset", "mtbench:1")
    assert code == 0
    assert {(r["system"], r["depth"], r["set"]) for r in result["table"]} == {
        (name, 2, s) for name in ("eagle", "block") for s in ("mtbench", "all")
    }
    assert _acceptance(tiny, tmp_path / "deeper", "--depths", "3,5")[0] == 2
    assert "DFlash draft block: a block of 4 drafts 1 to 3 tokens a round, not 5" in capsys.readouterr().err


def test_a_comparison_of_unknown_drafts_or_of_no_common_depth_is_refused_before_scoring(
    tiny, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(eval_set, "build_eval_set", _no_model)
    root = tiny["root"]
    assert _acceptance(tiny, tmp_path, "--compare", "block:nobody")[0] == 2
    assert "--compare 'block:nobody': nobody not among the drafts (eagle, block)" in capsys.readouterr().err
    argv = [f"eagle={root / 'eagle'}", f"short={root / 'short-block'}", "--target", tiny["target"]]
    assert scoring.main([*argv, "--compare", "short:eagle"]) == 2  # chains at 3 and 5, the block at 2
    assert "scored at no common depth: give --depths" in capsys.readouterr().err


def test_bench_refuses_drafts_of_two_kinds_and_a_dflash_bench_of_two_drafts(tiny, capsys, monkeypatch):
    import eagle3lab.models.target

    monkeypatch.setattr(eagle3lab.models.target, "load_target", _no_model)
    eagle, block, short = (str(tiny["root"] / name) for name in ("eagle", "block", "short-block"))
    assert bench(["--draft", eagle, block, "--target", tiny["target"], "--quiet"]) == 2
    assert f"drafts of different kinds (eagle3: {eagle}; dflash: {block})" in capsys.readouterr().err
    assert bench(["--draft", block, short, "--target", tiny["target"], "--quiet"]) == 2
    assert "a DFlash bench times one draft against its engine's baseline" in capsys.readouterr().err


def test_bench_times_a_dflash_draft_at_its_whole_block_beside_the_baseline(tiny, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--draft", str(tiny["root"] / "block"), "--target", tiny["target"], "--prompts"]
    argv += [str(tiny["root"] / "prompts.jsonl"), "--max-new-tokens", "8", "--output", str(out), "--quiet"]
    assert bench(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["system"], r["config"]) for r in rows] == [("baseline", "1,0,0,0"), ("block", "1,3,1,4")]
    assert all(r["identical_rate"] == 1.0 for r in rows)
    assert "block" in capsys.readouterr().out


@pytest.mark.parametrize("draft, shape", [("eagle", "1,3,1,4"), ("block", "dflash block 4, k 3")])
def test_generate_decodes_with_either_kind_and_checks_it_against_greedy(tiny, draft, shape, capsys):
    argv = [str(tiny["root"] / draft), "Name a colour.", "--target", tiny["target"], "--max-new-tokens", "12"]
    assert generate.main(argv) == 0
    summary = json.loads(capsys.readouterr().out.split("\n}\n")[0] + "}")
    assert summary["config"] == shape and summary["identical_to_greedy"] is True
    assert summary["verify_count"] > 0


def test_generate_exits_1_when_the_output_differs_from_greedy(tiny, capsys, monkeypatch):
    import eagle3lab.decoding.engine

    def other(*args, **kwargs):
        out = greedy(*args, **kwargs)
        out.tokens[-1] += 1
        return out

    monkeypatch.setattr(eagle3lab.decoding.engine, "generate", other)
    argv = [str(tiny["root"] / "block"), "Name a colour.", "--target", tiny["target"], "--max-new-tokens", "6"]
    assert generate.main(argv) == 1
    assert '"identical_to_greedy": false' in capsys.readouterr().out
