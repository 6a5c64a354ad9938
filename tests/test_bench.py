"""`eagle3lab bench` end to end on a tiny random target (SmolLM2's tokenizer) with a random draft."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from conftest import TINY_WIDTH
from eagle3lab.benchmark.commands import bench as main
from eagle3lab.benchmark.commands import bench_parser
from eagle3lab.benchmark.costs import measure_forward_costs
from eagle3lab.benchmark.prompts import load_prompts
from eagle3lab.benchmark.run import run_benchmark, to_dataframe
from eagle3lab.models.draft import DraftConfig, Eagle3Draft, save_draft
from eagle3lab.models.target import converted_dir, resolve
from eagle3lab.pipeline.report_tables import ROW_KEYS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama folder with SmolLM2's tokenizer and chat template, a random draft, a prompt file."""
    root = tmp_path_factory.mktemp("bench")
    tokenizer = AutoTokenizer.from_pretrained(resolve("smollm2-135m-instruct"))
    torch.manual_seed(0)
    cfg = LlamaConfig(
        **TINY_WIDTH,
        num_hidden_layers=4,
        vocab_size=len(tokenizer),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        initializer_range=0.2,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    draft = Eagle3Draft(DraftConfig.from_target(cfg, draft_vocab_size=512))
    draft.set_vocab(torch.randperm(cfg.vocab_size)[:512])
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(model.model.embed_tokens.weight)
    save_draft(draft, root / "draft")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "a", "set": "chat", "prompt": "Write a haiku about caches."})
        + "\n"
        + json.dumps(
            {
                "id": 2,
                "set": "chat",
                "conversations": [
                    {"from": "human", "value": "Hi"},
                    {"from": "gpt", "value": "Hello!"},
                    {"from": "human", "value": "Count to five."},
                    {"from": "gpt", "value": "1 2 3 4 5"},
                ],
            }
        )
        + "\n"
        + json.dumps({"id": "c", "set": "code", "prompt": "def add(a, b):"})
        + "\n"
    )
    assert converted_dir("smollm2-135m-instruct").exists()
    return root


def test_cli_end_to_end(tiny, capsys):
    out = tiny / "result.json"
    rc = main(
        [
            "--target",
            str(tiny / "target"),
            "--prompts",
            str(tiny / "prompts.jsonl"),
            "--max-new-tokens",
            "12",
            "--configs",
            "1,0,0,0",
            "1,2,1,3",
            "1,2,2,4",
            "--draft",
            str(tiny / "draft"),
            "--modes",
            "eagle3,eagle",
            "--repeats",
            "2",
            "--output",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "hf-prompt-lookup" in printed and "draft [EAGLE]" in printed
    result = json.loads(out.read_text())
    assert result["meta"]["sets"] == ["chat", "code"] and result["meta"]["repeats"] == 2
    rows = result["rows"]
    # per set: baseline, 2 peers, 2 modes x 2 speculative configs
    assert len(rows) == 2 * (1 + 2 + 4)
    for row in rows:
        for key in (
            *ROW_KEYS,
            "speedup_vs_hf_generate",
            "identical_rate",
            "divergences",
            "position_acceptance",
        ):
            assert key in row, key
        assert row["tokens_per_s"] > 0
    chat = [r for r in rows if r["set"] == "chat"]
    assert chat[0]["system"] == "baseline" and chat[0]["speedup_vs_baseline"] == 1.0
    assert [r["prompts"] for r in chat] == [2] * len(chat)
    for row in chat:
        # float32: every system reproduces the baseline's greedy output token for token
        assert row["identical_rate"] == 1.0 and row["divergences"] == [], row["system"]
        if row["draft"]:
            assert len(row["position_acceptance"]) == 2 and row["accept_length"] >= 1.0
            assert row["verify_count"] > 0 and abs(sum(row["time_split"].values()) - 1) < 1e-6
    per_prompt = result["per_prompt"]
    assert len(per_prompt) == 3 * 7 and all(len(p["times"]) == 2 for p in per_prompt)


def test_cli_errors(tiny, capsys):
    base = ["--target", str(tiny / "target"), "--prompts", str(tiny / "prompts.jsonl"), "--quiet"]
    assert main(base + ["--configs", "2,3,1,4", "--draft", str(tiny / "draft")]) == 2
    assert "batch size 2" in capsys.readouterr().err
    assert main(base + ["--configs", "1,3,1,4", "--draft", str(tiny / "missing")]) == 2
    assert f"eagle3lab bench: --draft {tiny / 'missing'}: nothing there" in capsys.readouterr().err
    bad = tiny / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "prompt": "ok"}) + "\n" + json.dumps({"id": "y", "text": "?"}) + "\n")
    assert main(["--target", str(tiny / "target"), "--prompts", str(bad), "--configs", "1,0,0,0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl: record 2" in err and "'prompt'" in err
    assert main(base + ["--configs", "1,3,1,4@1.5", "--draft", str(tiny / "draft")]) == 2
    assert "config '1,3,1,4@1.5': the threshold" in capsys.readouterr().err
    assert main(base + ["--configs", "1,0,0,0", "--device", "tpu"]) == 2
    assert "device 'tpu'" in capsys.readouterr().err


def test_prompts_and_python_api(tiny):
    from eagle3lab.models.target import load_target

    target = load_target(str(tiny / "target"))
    prompts = load_prompts(target.tokenizer, prompts_file=tiny / "prompts.jsonl", limit=1)
    assert [(p.id, p.set) for p in prompts] == [("a", "chat"), ("c", "code")]
    convo = load_prompts(target.tokenizer, prompts_file=tiny / "prompts.jsonl")[1]
    assert [m["role"] for m in convo.messages] == ["user", "assistant", "user"]  # trailing answer dropped
    text = target.tokenizer.decode(convo.ids)
    assert "Count to five." in text and "1 2 3 4 5" not in text and text.rstrip().endswith("assistant")
    result = run_benchmark(
        target,
        prompts_file=tiny / "prompts.jsonl",
        limit=1,
        max_new_tokens=6,
        configs=["1,3,1,4"],
        drafts=[tiny / "draft"],
        peers=[],
        progress=False,
    )
    df = to_dataframe(result)
    assert list(df["config"]) == ["1,0,0,0", "1,3,1,4"] * 2 and set(df["set"]) == {"chat", "code"}
    # an adaptive config is its own system, still lossless
    adaptive = run_benchmark(
        target,
        prompts_file=tiny / "prompts.jsonl",
        limit=1,
        max_new_tokens=6,
        configs=["1,3,1,4", "1,3,1,4@0.2"],
        drafts=[tiny / "draft"],
        peers=[],
        progress=False,
    )
    rows = [r for r in adaptive["rows"] if r["set"] == "chat"]
    assert [(r["config"], r["threshold"]) for r in rows] == [("1,0,0,0", 0.0), ("1,3,1,4", 0.0), ("1,3,1,4@0.2", 0.2)]
    assert all(r["identical_rate"] == 1.0 for r in rows)


def test_forward_costs(tiny):
    from eagle3lab.models.draft import load_draft
    from eagle3lab.models.target import load_target

    target = load_target(str(tiny / "target"))
    draft = load_draft(tiny / "draft", target=target.model)
    costs = measure_forward_costs(target.model, draft, context=40, ks=(1, 4), repeats=2, topk=2)
    assert costs["context"] == 40 and set(costs["verify"]) == {1, 4} and "prefill" not in costs
    assert all(v > 0 for v in (costs["target_step"], costs["draft_step"], *costs["verify"].values()))
    # prefill as the engine runs it: the target's, and the draft's over the captured aux hidden states
    costs = measure_forward_costs(target.model, draft, context=40, ks=(1,), repeats=2, prefill_lengths=(24, 8, 8))
    prefill = costs["prefill"]
    assert set(prefill) == {"target", "draft"} and all(set(t) == {8, 24} for t in prefill.values())
    assert all(v > 0 for t in prefill.values() for v in t.values())
    assert prefill["target"][8] <= prefill["target"][24]  # made non-decreasing, like verify


@pytest.mark.cuda
def test_cuda_benchmark_row(tiny):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = run_benchmark(
        str(tiny / "target"),
        prompts_file=tiny / "prompts.jsonl",
        limit=1,
        max_new_tokens=8,
        configs=["1,2,1,3", "1,2,2,4"],
        drafts=[tiny / "draft"],
        peers=["hf-generate"],
        device="cuda",
        progress=False,
    )
    assert result["meta"]["device"].startswith("cuda")
    for row in result["rows"]:
        assert row["tokens_per_s"] > 0 and row["identical_rate"] == 1.0, row


def test_one_renderer_for_engine_and_server_rows():
    from eagle3lab.benchmark.table import render_rows
    from eagle3lab.engines.sglang.cli import format_rows

    row = {"set": "mtbench", "system": "sglang-eagle3", "config": "1,3,1,4", "accept_length": None}
    row |= {"tokens_per_s": 101.25, "throughput_tok_s": 99.5, "speedup_vs_baseline": 1.5}
    server = format_rows([row])
    assert server.splitlines()[0].split() == ["set", "system", "config", "accept", "tok/s", "thru", "x", "base"]
    assert server.splitlines()[2].split() == ["mtbench", "sglang-eagle3", "1,3,1,4", "-", "101.2", "99.5", "1.50"]
    engine = render_rows([row | {"position_acceptance": [0.5, 0.25], "draft": "d", "time_split": {"draft": 0.25}}])
    assert "per-position acceptance 0.50 0.25" in engine and "time: draft 25%" in engine


def test_cli_defaults_come_from_the_settings_dataclass():
    import inspect

    from eagle3lab.benchmark.run import DEFAULT_CONFIGS, BenchSettings
    from eagle3lab.options import from_options

    parser = bench_parser()
    assert from_options(parser.parse_args([]), BenchSettings) == BenchSettings()
    assert BenchSettings().configs == DEFAULT_CONFIGS and BenchSettings().sets == ("mtbench",)
    # run_benchmark has no defaults of its own: it takes the dataclass's, any field overridable by keyword
    assert [p.name for p in inspect.signature(run_benchmark).parameters.values() if p.default is not p.empty] == [
        "target",
        "settings",
        "progress",
    ]
    # the flags and their forms are the hand-written parser's: comma-separated sets, modes and peers, several
    # --configs and --draft, --prompts instead of --sets (not both)
    args = parser.parse_args(["--sets", "mtbench, gsm8k", "--peers", "none", "--modes", "eagle3,eagle"])
    args = from_options(args, BenchSettings)
    assert (args.sets, args.peers, args.modes) == (["mtbench", "gsm8k"], [], ["eagle3", "eagle"])
    args = from_options(parser.parse_args(["--configs", "1,3,1,4", "1,5,1,6@0.3", "--draft", "a", "b"]), BenchSettings)
    assert args.configs == ["1,3,1,4", "1,5,1,6@0.3"] and args.drafts == ["a", "b"]
    assert from_options(parser.parse_args(["--prompts", "p.jsonl"]), BenchSettings).prompts_file == "p.jsonl"
    with pytest.raises(SystemExit):
        parser.parse_args(["--sets", "mtbench", "--prompts", "p.jsonl"])


def test_lossless_rows_pair_each_float32_prompt_with_the_timed_runs_check_and_near_tie():
    from eagle3lab.benchmark.run import lossless_rows

    def prompt(pid, identical, divergence=None, system="draft"):
        return {"set": "mtbench", "id": pid, "config": "1,3,1,4", "system": system, "identical": identical,
                "divergence": divergence}  # fmt: skip

    timed = {
        "meta": {"dtype": "bfloat16"},
        "per_prompt": [
            prompt("a", True),
            prompt("b", False, {"index": 17, "logit_gap": 0.06}),
            prompt("b", True, None, "x"),
        ],
    }
    float32 = {
        "meta": {"dtype": "float32"},
        "per_prompt": [prompt("a", True), prompt("b", True), prompt("a", 1, None, "x")],
    }
    rows = lossless_rows(timed, float32, "draft")
    assert [(r["id"], r["identical_float32"], r["identical_bfloat16"]) for r in rows] == [
        ("a", True, True),
        ("b", True, False),
    ]
    assert (rows[1]["departs_at"], rows[1]["logit_gap"]) == (17, 0.06) and rows[0]["departs_at"] is None
