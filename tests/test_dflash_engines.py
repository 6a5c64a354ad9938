"""A DFlash draft for SmolLM2 served by the two CPU engines, each against its own baseline server on loopback:
vLLM (method dflash, float32) and llama.cpp (the exported GGUF, --spec-type draft-dflash). The draft is untrained
(seeded): what is checked is that each engine loads it as trained, drafts with it, and still answers its own
baseline's greedy tokens; the trained draft's figures are in docs/dflash.md."""

import json
from dataclasses import replace

import pytest
import torch

from conftest import speculative_row
from eagle3lab.drafters.dflash.config import DFlashConfig
from eagle3lab.drafters.dflash.export import export_dflash_gguf, gguf_mismatches
from eagle3lab.drafters.dflash.model import DFlashDraft, save_dflash
from eagle3lab.drafters.dflash.serve import DFlashLlamaCpp
from eagle3lab.engines.llamacpp.gguf import gguf_facts
from eagle3lab.engines.llamacpp.round_split import format_split, split_rounds
from eagle3lab.io import InputError
from eagle3lab.serving.processes import free_port


@pytest.fixture(scope="module")
def dflash_draft(smollm2_dir, tmp_path_factory):
    from transformers import AutoConfig

    torch.manual_seed(0)
    config = DFlashConfig.from_target(AutoConfig.from_pretrained(smollm2_dir), mask_token_id=16, block_size=4)
    return save_dflash(DFlashDraft(config), tmp_path_factory.mktemp("dflash") / "draft")


def test_vllm_serves_the_draft_and_answers_its_own_baseline(vllm, vllm_baseline, dflash_draft, smollm2_dir,
                                                           three_prompts, tmp_path):  # fmt: skip
    engine = replace(vllm, method="dflash")
    command = engine.launch_command(smollm2_dir, port=free_port(), draft=dflash_draft, k=3)
    assert '"method": "dflash"' in command[command.index("--speculative-config") + 1]
    with engine.serve(command, log_path=tmp_path / "dflash.log") as server:
        row, _ = speculative_row(engine, server, vllm_baseline, three_prompts, 32)
    assert row["drafts"] > 0 and len(row["position_acceptance"]) == 3  # it drafted blocks of 3
    assert row["identical_rate"] == 1.0  # float32: greedy output is the baseline's, token for token


def test_llamacpp_serves_the_exported_draft_and_answers_its_own_baseline(
    llamacpp, llamacpp_target, llamacpp_baseline, dflash_draft, three_prompts, tmp_path
):
    gguf = export_dflash_gguf(dflash_draft, "smollm2-135m-instruct", tmp_path / "draft.gguf")
    facts = gguf_facts(gguf)
    assert facts["architecture"] == "dflash" and facts["target_layers"] == [2, 15, 27]  # a layer's input, in GGUF
    engine = DFlashLlamaCpp(threads=1)
    command = engine.launch_command(llamacpp_target, port=free_port(), draft=dflash_draft, k=3)
    assert command[command.index("--spec-type") + 1] == "draft-dflash"
    with engine.serve(command, log_path=tmp_path / "dflash.log") as server:
        row, _ = speculative_row(engine, server, llamacpp_baseline, three_prompts, 32)
    assert row["drafts"] > 0 and row["identical_rate"] == 1.0


def test_an_export_that_does_not_say_what_the_draft_was_trained_as_is_refused(llamacpp, dflash_draft, tmp_path):
    gguf = export_dflash_gguf(dflash_draft, "smollm2-135m-instruct", tmp_path / "draft.gguf")
    config = DFlashConfig.from_hf(json.loads((dflash_draft / "config.json").read_text()))
    target = gguf_facts(llamacpp.model("smollm2-135m-instruct"))
    assert gguf_mismatches(gguf, config, target) == []
    problems = gguf_mismatches(gguf, replace(config, block_size=16, mask_token_id=3), target)
    assert any("block_size" in p for p in problems) and any("mask_token_id" in p for p in problems)
    with pytest.raises(InputError, match="no config.json"):
        export_dflash_gguf(tmp_path, "smollm2-135m-instruct", tmp_path / "x.gguf")


def test_the_round_split_serves_a_dflash_draft_as_dflash(llamacpp, dflash_draft, three_prompts):
    split = split_rounds(str(dflash_draft), "smollm2-135m-instruct", max_steps=2, prompts=three_prompts[:2], tokens=24)
    one, two = split["rows"]
    assert split["spec_type"] == "draft-dflash" and "--spec-type draft-dflash" in two["command"]
    assert "--spec-synth-rates 1,1" in two["command"]
    # synthetic acceptance takes every drafted token of the block too: the round is the block's whole cost
    assert one["perfect_accept_length"] == pytest.approx(2.0, abs=0.1)
    assert two["perfect_accept_length"] == pytest.approx(3.0, abs=0.2)
    assert "draft-dflash" in format_split(split)
    with pytest.raises(InputError, match="at most 3 tokens"):
        split_rounds(str(dflash_draft), "smollm2-135m-instruct", max_steps=4, prompts=three_prompts[:2])
