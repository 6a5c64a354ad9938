"""eagle3lab doctor on a DFlash draft (no server): the right vLLM and llama.cpp lines pass, and each of the format's
silent traps (docs/dflash.md) is one ERROR with its fix, on a draft folder (vLLM) and on its GGUF (llama.cpp), never
an EAGLE-3 finding. The drafts are tiny (hidden 64) for a 6-layer target; the GGUFs carry the header only."""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import replace
from pathlib import Path

import gguf
import pytest
import torch

from eagle3lab.doctor.cli import main
from eagle3lab.doctor.diagnosis import diagnose
from eagle3lab.doctor.findings import ERROR, OK
from eagle3lab.drafters.dflash.config import DFlashConfig
from eagle3lab.drafters.dflash.export import gguf_mismatches
from eagle3lab.drafters.dflash.model import DFlashDraft, save_dflash
from test_doctor import checks, write_draft, write_target

LAYERS, HIDDEN, VOCAB, MASK = 6, 64, 256, 5
CONFIG = DFlashConfig(
    hidden_size=HIDDEN,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=VOCAB,
    num_target_layers=LAYERS,
    target_layer_ids=[1, 2, 4],
    mask_token_id=MASK,
    block_size=4,
)
EAGLE3_CHECKS = ("aux_layers", "draft_vocab", "draft_fields", "architecture")


def the_error(report, check: str):
    """The report's one error, which must be `check`'s."""
    assert [f.check for f in report.errors] == [check], report.render()
    return report.errors[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    # no "dflash" in the path: vLLM would infer the method from it
    return save_dflash(DFlashDraft(CONFIG), tmp_path_factory.mktemp("saved") / "draft")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_target(tmp_path_factory.mktemp("target"))


def tiny_target(folder: Path, hidden: int = HIDDEN) -> Path:
    shape = {"num_hidden_layers": LAYERS, "vocab_size": VOCAB, "max_position_embeddings": 8192}
    return write_target(folder, nested=False, hidden_size=hidden, **shape)


def draft_copy(saved: Path, folder: Path, edit=None) -> Path:
    """The saved draft with its config.json edited in place by edit(dict)."""
    shutil.copytree(saved, folder)
    cfg = json.loads((folder / "config.json").read_text())
    if edit is not None:
        edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def vllm_line(target: Path, draft: Path, **spec) -> str:
    spec = {"method": "dflash", "model": str(draft), "num_speculative_tokens": 3} | spec
    return f"vllm serve {target} --speculative-config {shlex.quote(json.dumps({k: v for k, v in spec.items() if v}))}"


def write_gguf(path: Path, arch: str, fields: dict) -> Path:
    """A GGUF of metadata only, with a VOCAB-token vocabulary."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in fields.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_array(key, value)
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def draft_gguf(path: Path, drop: tuple[str, ...] = (), **over) -> Path:
    """CONFIG as llama.cpp's converter writes it (keys as in a real export), `over` keys set, `drop` keys left out."""
    fields = {
        "dflash.block_count": 1,
        "dflash.context_length": 8192,
        "dflash.embedding_length": HIDDEN,
        "dflash.feed_forward_length": 128,
        "dflash.attention.head_count": 4,
        "dflash.attention.head_count_kv": 2,
        "dflash.attention.key_length": 16,
        "dflash.attention.causal": False,
        "dflash.block_size": 4,
        "dflash.target_layers": [2, 3, 5],  # the ids + 1
        "tokenizer.ggml.mask_token_id": MASK,
    }
    fields |= {k.replace("__", "."): v for k, v in over.items()}
    return write_gguf(path, "dflash", {k: v for k, v in fields.items() if k not in drop})


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    fields = {"llama.block_count": LAYERS, "llama.embedding_length": HIDDEN, "llama.context_length": 8192}
    return {"target": write_gguf(folder / "target.gguf", "llama", fields), "draft": draft_gguf(folder / "draft.gguf")}


def llama_line(target: Path, draft: Path, *, spec_type: str | None = "draft-dflash", n_max: int | None = 3) -> str:
    line = f"llama-server -m {target} -md {draft}"
    line += f" --spec-type {spec_type}" if spec_type else ""
    return line + (f" --spec-draft-n-max {n_max}" if n_max is not None else "")


# ---- vLLM: the draft folder ----------------------------------------------------------------------------------------


def test_the_right_vllm_line_passes_and_gets_no_eagle3_check(saved, target, capsys):
    report = diagnose(launch=vllm_line(target, saved))
    assert report.exit_code == 0 and not report.warnings, report.render()
    assert {f.check for f in report.findings} >= {"dflash_config", "dflash_target", "algorithm", "spec_params"}
    assert not {f.check for f in report.findings} & set(EAGLE3_CHECKS)
    assert checks(report, "draft", OK)[0].title == "draft checkpoint read: DFLASH (DFlashDraftModel)"
    assert main(["--launch", vllm_line(target, saved)]) == 0
    assert "DFlash draft served with DFLASH" in capsys.readouterr().out


def test_eagle3_method_is_an_error_fixed_to_dflash(saved, target):
    report = diagnose(launch=vllm_line(target, saved, method="eagle3"))
    error = the_error(report, "algorithm")
    assert error.title == '--speculative-config "method": "eagle3": the DFlash draft is not run as DFlash'
    flags, command = error.fix.splitlines()
    assert json.loads(shlex.split(flags)[1]) == {"method": "dflash", "model": str(saved), "num_speculative_tokens": 3}
    assert diagnose(launch=command).exit_code == 0


def test_no_method_is_what_vllm_guesses_from_the_draft_name(saved, target, tmp_path):
    named = draft_copy(saved, tmp_path / "my-dflash-draft")
    assert checks(diagnose(launch=vllm_line(target, named, method=None)), "algorithm", OK)
    error = the_error(diagnose(launch=vllm_line(target, saved, method=None)), "algorithm")
    assert "vLLM infers 'draft_model'" in error.title and '"method": "dflash"' in error.fix


@pytest.mark.parametrize("k", [4, None])
def test_vllm_draft_length_must_be_block_size_minus_one(saved, target, k):
    error = the_error(diagnose(launch=vllm_line(target, saved, num_speculative_tokens=k)), "spec_params")
    assert ("no draft length" if k is None else f"draft length {k} != block_size - 1 = 3") in error.title
    assert json.loads(shlex.split(error.fix.splitlines()[0])[1])["num_speculative_tokens"] == 3


def test_a_shorter_block_on_the_line_is_a_truncated_block_tune_may_choose(saved, target):
    report = diagnose(launch=vllm_line(target, saved, num_speculative_tokens=2))
    assert report.exit_code == 0 and report.warnings[0].title == "draft length 2 < block_size - 1 = 3"
    assert "truncated block, the anchor and 2 masks" in report.warnings[0].evidence[-1]


def _pop(*path):
    def edit(cfg):
        holder = cfg
        for key in path[:-1]:
            holder = holder[key]
        holder.pop(path[-1])

    return edit


def _no_block_size(cfg):
    cfg.pop("block_size")
    cfg["dflash_config"].pop("block_size")


TRAPS = {
    "no block_size": (_no_block_size, "missing field 'block_size' (llama.cpp then takes 16", '"block_size": BLOCK'),
    # the package reads the top-level one, llama.cpp's converter dflash_config's
    "block sizes differ": (
        lambda c: c.update(block_size=8),
        "block_size 8 at the top level, 4 in dflash_config",
        "top level and in dflash_config",
    ),
    "causal": (lambda c: c.update(is_causal=True), "is_causal is true", '"is_causal": false'),
    "no mask token": (_pop("dflash_config", "mask_token_id"), "dflash_config.mask_token_id", '"mask_token_id": ID'),
}


@pytest.mark.parametrize("trap", TRAPS)
def test_each_config_trap_is_an_error_quoting_the_refusal(saved, target, tmp_path, trap):
    edit, message, fix = TRAPS[trap]
    draft = draft_copy(saved, tmp_path / "draft", edit)
    error = the_error(diagnose(launch=vllm_line(target, draft)), "dflash_config")
    assert message in error.title and str(draft / "config.json") in error.evidence[0]
    assert fix in error.fix and str(draft / "config.json") in error.fix


def test_block_size_in_either_place_is_enough(saved, target, tmp_path):
    """llama.cpp's converter reads dflash_config's block_size before the top-level one (measured: a GGUF with block 4
    from either), vLLM neither: one place is enough."""
    for where in ("top", "nested"):
        edit = _pop("dflash_config", "block_size") if where == "top" else _pop("block_size")
        report = diagnose(launch=vllm_line(target, draft_copy(saved, tmp_path / where, edit)))
        assert report.exit_code == 0 and not report.warnings, report.render()


def test_values_that_serve_but_are_probably_not_trained_are_warnings(saved, tmp_path):
    """The config is the only record of training: layer ids one off the defaults ([2, 15, 27] for a 30-layer
    target's [1, 14, 26]), a mask token the target's text uses (its bos, eos, pad or unk)."""
    deep = write_target(tmp_path / "t30", nested=False, hidden_size=HIDDEN, num_hidden_layers=30, vocab_size=VOCAB,
                        max_position_embeddings=8192, eos_token_id=2, unk_token_id=0)  # fmt: skip

    def shifted(cfg):
        cfg["num_target_layers"] = 30
        cfg["dflash_config"].update(target_layer_ids=[2, 15, 27], mask_token_id=0)

    report = diagnose(launch=vllm_line(deep, draft_copy(saved, tmp_path / "draft", shifted)))
    assert report.exit_code == 0, report.render()
    ids, mask = report.warnings
    assert ids.title == "target_layer_ids [2, 15, 27] are the default layers [1, 14, 26] shifted by one"
    assert mask.title == "mask_token_id 0 is the target's unk_token_id" and "1.01 measured" in mask.evidence[1]


VLLM_KEYS = {
    "use_aux_hidden_state": (
        lambda c: c["dflash_config"].update(use_aux_hidden_state=False),
        "use_aux_hidden_state false: vLLM skips fc, and the first request kills the engine",
    ),
    "top-level aux ids": (
        lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 1, 2]),
        "vLLM captures hidden_states [0, 1, 2], not the trained [2, 3, 5]",
    ),
    "eagle_config": (
        lambda c: c.update(eagle_config={"use_aux_hidden_state": True}),  # vLLM ignores an empty one
        "vLLM captures hidden_states of its EAGLE-3 defaults, not the trained [2, 3, 5]",
    ),
}


@pytest.mark.parametrize("key", VLLM_KEYS)
def test_eagle3_keys_vllm_reads_from_a_dflash_config_are_errors(saved, target, ggufs, tmp_path, key):
    """vLLM reads these before (or beside) the DFlash fields; the trainers never write them and from_hf ignores them."""
    edit, title = VLLM_KEYS[key]
    draft = draft_copy(saved, tmp_path / "draft", edit)
    error = the_error(diagnose(launch=vllm_line(target, draft)), "dflash_config")
    assert error.title == title and error.fix.startswith("remove ")
    served = diagnose(launch=llama_line(ggufs["target"], ggufs["draft"]), draft=draft)
    assert not served.errors, served.render()  # llama.cpp's converter reads none of them


def test_a_draft_for_another_width_or_depth_is_an_error(saved, target, tmp_path):
    error = the_error(diagnose(launch=vllm_line(tiny_target(tmp_path / "wider", 96), saved)), "dflash_target")
    assert error.title == "the draft is 64 wide, the target 96" and "train" in error.fix

    def built_deeper(cfg):  # for an 8-layer target, reading layer 5's output: the last of this 6-layer one
        cfg["num_target_layers"] = 8
        cfg["dflash_config"]["target_layer_ids"] = [1, 2, 5]

    deep = draft_copy(saved, tmp_path / "deep", built_deeper)
    error = the_error(diagnose(launch=vllm_line(target, deep)), "dflash_target")
    assert "expected ids 0..4 of a 6-layer target" in error.title and "last layer" in error.title


def test_an_eagle3_draft_under_dflash_is_still_an_error(target, tmp_path):
    eagle3 = write_draft(tmp_path / "eagle3", hidden=HIDDEN, target_hidden=HIDDEN, vocab=VOCAB, draft_vocab=VOCAB)
    error = checks(diagnose(launch=vllm_line(target, eagle3)), "algorithm", ERROR)[0]
    assert error.title == "DFLASH does not run an EAGLE draft" and '"method": "eagle3"' in error.fix


# ---- llama.cpp: the GGUFs ------------------------------------------------------------------------------------------


def test_the_right_llamacpp_line_passes_with_and_without_the_folder(ggufs, saved):
    line = llama_line(ggufs["target"], ggufs["draft"])
    report = diagnose(launch=line)
    assert report.exit_code == 0 and not report.warnings, report.render()
    assert checks(report, "dflash_target", OK) and checks(report, "spec_params", OK)
    assert not checks(report, "gguf")  # none of the EAGLE-3 GGUF rules
    report = diagnose(launch=line, draft=saved)
    assert not report.errors and [f.check for f in report.warnings] == ["draft"]  # --draft is a folder: it says so
    assert checks(report, "gguf", OK)[0].title == f"the GGUF serves what {saved} was trained as"
    # without --spec-type llama.cpp infers draft-dflash from the GGUF and drafts its default n-max, 3
    report = diagnose(launch=llama_line(ggufs["target"], ggufs["draft"], spec_type=None, n_max=None))
    assert report.exit_code == 0 and "infers draft-dflash" in checks(report, "algorithm", OK)[0].evidence[-1]


def test_draft_eagle3_is_fixed_to_draft_dflash(ggufs):
    error = the_error(
        diagnose(launch=llama_line(ggufs["target"], ggufs["draft"], spec_type="draft-eagle3")), "algorithm"
    )
    assert error.title.startswith("--spec-type draft-eagle3:") and "first request aborts" in error.evidence[-1]
    assert error.fix.splitlines()[0] == "--spec-type draft-dflash"
    assert diagnose(launch=error.fix.splitlines()[1]).exit_code == 0


def test_llamacpp_draft_length(ggufs, tmp_path):
    shorter = diagnose(launch=llama_line(ggufs["target"], ggufs["draft"], n_max=2))
    assert shorter.exit_code == 0 and shorter.warnings[0].title == "draft length 2 < block_size - 1 = 3"
    assert shorter.warnings[0].fix.splitlines()[0] == "--spec-draft-n-max 3"
    clamped = diagnose(launch=llama_line(ggufs["target"], ggufs["draft"], n_max=5))
    assert clamped.exit_code == 0 and "clamps it to 3" in clamped.warnings[0].evidence[-1]
    # a block of 8 under llama.cpp's default n-max 3: a shorter block, no warning from llama.cpp
    block8 = draft_gguf(tmp_path / "block8.gguf", dflash__block_size=8)
    error = the_error(diagnose(launch=llama_line(ggufs["target"], block8, n_max=None)), "spec_params")
    assert "no --spec-draft-n-max (llama.cpp's default: 3)" in error.evidence[0]
    assert error.fix.splitlines()[0] == "--spec-draft-n-max 7"


GGUF_TRAPS = {
    "no block_size": ({"drop": ("dflash.block_size",)}, "dflash_config", "missing field 'block_size'"),
    "causal": ({"dflash__attention__causal": True}, "dflash_config", "is_causal is true"),
    "no mask token": ({"drop": ("tokenizer.ggml.mask_token_id",)}, "dflash_config", "mask_token_id"),
    "last layer": ({"dflash__target_layers": [2, 3, 6]}, "dflash_target", "expected ids 0..4 of a 6-layer target"),
    "wider": ({"dflash__embedding_length": 96}, "dflash_target", "the draft is 96 wide, the target 64"),
}


@pytest.mark.parametrize("trap", GGUF_TRAPS)
def test_each_gguf_trap_is_an_error(ggufs, tmp_path, trap):
    over, check, title = GGUF_TRAPS[trap]
    broken = draft_gguf(tmp_path / "draft.gguf", **over)
    error = the_error(diagnose(launch=llama_line(ggufs["target"], broken)), check)
    assert title in error.title and error.fix


def test_a_gguf_that_does_not_serve_what_its_folder_was_trained_as(ggufs, saved, tmp_path):
    other = draft_gguf(tmp_path / "draft.gguf", tokenizer__ggml__mask_token_id=7)
    error = the_error(diagnose(launch=llama_line(ggufs["target"], other), draft=saved), "gguf")
    assert error.title == "tokenizer.ggml.mask_token_id serves mask_token_id 7, the draft was trained with 5"
    assert error.fix.startswith("export the folder again")
    # the export's own check reads the GGUF the same way
    assert gguf_mismatches(ggufs["draft"], CONFIG, {"embedding_length": HIDDEN}) == []
    problems = gguf_mismatches(ggufs["draft"], replace(CONFIG, block_size=16), {"embedding_length": 96})
    assert len(problems) == 2 and "dflash.block_size" in problems[0] and "96" in problems[1]
