"""SpecForge as a peer trainer: its inputs written from one of our runs, its checkpoint exported into our draft
format, and (when `make specforge` has built its environment) its own trainer on a tiny run."""

import json

import pytest
import torch

from eagle3lab.drafters.eagle3.train import Eagle3TrainConfig, train_draft
from eagle3lab.io import InputError
from eagle3lab.models.checkpoint import read_json
from eagle3lab.models.draft import EMBEDDING, load_draft
from eagle3lab.train.features import FeatureCache
from eagle3lab.train.specforge import environment
from eagle3lab.train.specforge.export import STATE_FILE, export_draft, latest_state
from eagle3lab.train.specforge.inputs import (
    DRAFT_CONFIG,
    FEATURES,
    RUN_ID,
    VOCAB_MAPPING,
    our_run,
    prepare_inputs,
    run_config,
)
from test_draft import make_draft
from test_features import save_tiny_target, write_conversations

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """One of our runs on a tiny target: 12 conversations, 1 epoch, TTT 2."""
    root = tmp_path_factory.mktemp("specforge")
    cfg = Eagle3TrainConfig(
        data=str(write_conversations(root / "train.jsonl", 12)),
        output=str(root / "ours"),
        target=str(save_tiny_target(root / "tiny")),
        features_cache=str(root / "features"),
        draft_vocab_size=96,
        ttt_length=2,
        max_len=120,
        batch_tokens=400,
        progress=False,
    )
    train_draft(cfg)
    return {"root": root, "run": root / "ours", "cfg": cfg}


def test_feature_records_are_our_cached_features_in_specforge_layout(ours):
    inputs = ours["root"] / "inputs"
    provenance = prepare_inputs(ours["run"], inputs)
    run = our_run(ours["run"])
    cache = FeatureCache(run["cache"], read_json(run["cache"] / "key.json"))
    index = cache.index(run["records"])
    files = sorted((inputs / FEATURES).glob("*.ckpt"))  # SpecForge's order: sorted names
    assert len(files) == len(index) == provenance["records"] == 12
    for path, (shard, _, start, length) in zip(files, index):
        record, cached = torch.load(path, weights_only=True), cache.load(shard, start, length)
        assert set(record) == {"input_ids", "loss_mask", "aux_hidden_state", "hidden_state"}
        assert torch.equal(record["input_ids"], cached["input_ids"]) and record["input_ids"].dtype == torch.long
        assert torch.equal(record["loss_mask"], cached["loss_mask"].long())
        assert record["aux_hidden_state"].shape == (1, length, 3 * 64) and record["hidden_state"].shape == (
            1,
            length,
            64,
        )
        assert torch.equal(record["aux_hidden_state"][0], cached["aux"].to(torch.bfloat16))
        assert torch.equal(record["hidden_state"][0], cached["final"].to(torch.bfloat16))


def test_specforge_gets_our_vocab_mapping_draft_config_and_settings(ours):
    inputs = ours["root"] / "inputs"
    prepare_inputs(ours["run"], inputs)
    ours_draft = load_draft(ours["run"] / "draft", target=torch.zeros(49152, 64))
    mapping = torch.load(inputs / VOCAB_MAPPING, weights_only=True)
    assert torch.equal(mapping["d2t"], ours_draft.d2t) and torch.equal(mapping["t2d"], ours_draft.t2d)
    assert read_json(inputs / DRAFT_CONFIG) == read_json(ours["run"] / "draft" / "config.json")
    config = run_config(inputs, ours["root"] / "sf", learning_rate=3e-4)
    assert config["training"] == {
        "num_epochs": 1,
        "ttt_length": 2,
        "log_interval": 10,
        "attention_backend": "sdpa",
        "learning_rate": 3e-4,
    }
    assert config["data"]["max_length"] == 120 and config["data"]["hidden_states_path"] == str(inputs / FEATURES)
    assert "learning_rate" not in run_config(inputs, ours["root"] / "sf")["training"]  # SpecForge's own default


def test_an_online_run_or_a_missing_field_is_named(ours, tmp_path):
    result = read_json(ours["run"] / "result.json")
    (tmp_path / "result.json").write_text(json.dumps({**result, "config": {"online": True}}))
    with pytest.raises(InputError, match="online run has no feature cache"):
        our_run(tmp_path)
    (tmp_path / "result.json").write_text(json.dumps({**result, "features_cache": {"train": {}}}))
    with pytest.raises(InputError, match=r"result.json: field 'features_cache.train': missing field 'folder'"):
        our_run(tmp_path)


def _specforge_checkpoint(draft, folder, step):
    """What SpecForge saves: bf16 draft weights without the frozen embedding, under RUN_ID-stepN/."""
    weights = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in draft.state_dict().items()}
    del weights[EMBEDDING]
    path = folder / f"{RUN_ID}-step{step}" / STATE_FILE
    path.parent.mkdir(parents=True)
    torch.save({"draft_state_dict": weights, "global_step": step, "strategy": "eagle3"}, path)
    return path


def test_export_round_trip_gives_a_draft_our_engines_load(tmp_path):
    draft = make_draft()
    _specforge_checkpoint(make_draft(seed=1), tmp_path / "run", 3)
    newest = _specforge_checkpoint(draft, tmp_path / "run", 12)
    assert latest_state(tmp_path / "run") == newest
    embedding = draft.embed_tokens.weight.detach()
    out = export_draft(newest, draft.config.to_sglang(), embedding, tmp_path / "draft")
    loaded = load_draft(out)
    for name, tensor in draft.state_dict().items():
        want = tensor if name in (EMBEDDING, "d2t", "t2d") else tensor.to(torch.bfloat16).float()
        assert torch.equal(loaded.state_dict()[name], want), name


def test_export_names_the_file_and_field_of_a_bad_checkpoint(tmp_path):
    draft = make_draft()
    path = _specforge_checkpoint(draft, tmp_path / "run", 1)
    state = torch.load(path, weights_only=True)
    del state["draft_state_dict"]["fc.weight"]
    torch.save(state, path)
    with pytest.raises(InputError, match=rf"(?s){path}: field 'draft_state_dict' does not fit.*fc.weight"):
        export_draft(path, draft.config.to_sglang(), draft.embed_tokens.weight, tmp_path / "out")
    torch.save({**state, "strategy": "dflash"}, path)
    with pytest.raises(InputError, match="field 'strategy' is 'dflash'"):
        export_draft(path, draft.config.to_sglang(), draft.embed_tokens.weight, tmp_path / "out")
    with pytest.raises(InputError, match="SpecForge saved no checkpoint"):
        latest_state(tmp_path / "elsewhere")


@pytest.mark.slow
@pytest.mark.skipif(
    not (environment.env_dir() / environment.READY).exists(),
    reason=f"SpecForge's environment: {environment.SETUP_HINT}",
)
def test_specforge_trains_on_our_inputs_and_its_draft_loads(ours):
    from eagle3lab.train.specforge.training import train_specforge

    inputs = ours["root"] / "inputs"
    prepare_inputs(ours["run"], inputs)
    result = train_specforge(inputs, ours["root"] / "sf", progress=False)
    assert result["steps"] == 12  # SpecForge's batch size 1: one step a conversation
    assert result["learning_rate"] == 1e-4  # its own default, read from the config it resolved
    draft = load_draft(result["draft"], target=torch.zeros(49152, 64))
    ours_draft = load_draft(ours["run"] / "draft", target=torch.zeros(49152, 64))
    assert torch.equal(draft.d2t, ours_draft.d2t)
    assert not torch.equal(draft.fc.weight, ours_draft.fc.weight)
