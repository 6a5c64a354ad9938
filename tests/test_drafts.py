"""The GPU-trained drafts committed under drafts/: their provenance describes exactly the weights beside it, they load,
and params.yaml benchmarks them."""

import json

import pytest
import torch
import yaml

from eagle3lab import paths
from eagle3lab.io import InputError, sha256_file
from eagle3lab.pipeline.gpu_adopt import read_provenance

COMMITTED = {"smollm2-regenerated-1486": ("regenerated", 1486), "smollm2-original-6960": ("original", 6960)}


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_committed_draft_matches_its_provenance_and_loads(name):
    from eagle3lab.models.draft import load_draft

    folder = paths.ROOT / "drafts" / name
    record = read_provenance(folder)  # raises when a weight file's sha256 differs from the recorded one
    assert record["draft"] == name and set(record["sha256"]) == {"model.safetensors"}
    assert (record["data"]["responses"], record["data"]["conversations"]) == COMMITTED[name]
    assert record["metrics"]["held_out_top1_per_ttt_step"] and record["recipe"]["ttt_length"] == 3
    # the embedding is left out (it is the target's): SmolLM2's shape stands in for it
    draft = load_draft(folder, target=torch.zeros(49152, 576))
    assert draft.fc.weight.shape == (576, 3 * 576)


def test_params_benchmark_every_committed_draft():
    drafts = yaml.safe_load(paths.PARAMS.read_text())["benchmark"]["third_party_drafts"]
    assert sorted(drafts) == sorted(f"drafts/{name}" for name in COMMITTED)


@pytest.fixture
def draft_folder(tmp_path):
    """A folder with one small weight file and the 6,960 draft's provenance, re-hashed for it."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    record = json.loads((paths.ROOT / "drafts" / "smollm2-original-6960" / "provenance.json").read_text())
    record["sha256"] = {"model.safetensors": sha256_file(folder / "model.safetensors")}
    return folder, record


def write(folder, record):
    (folder / "provenance.json").write_text(json.dumps(record))


def test_read_provenance_refuses_a_record_that_does_not_describe_its_weights(draft_folder):
    folder, record = draft_folder
    write(folder, record)
    assert read_provenance(folder)["data"]["conversations"] == 6960
    (folder / "model.safetensors").write_bytes(b"other weights")
    recorded = record["sha256"]["model.safetensors"]
    with pytest.raises(InputError, match=rf"provenance.json: field 'sha256' .*model.safetensors: recorded {recorded}"):
        read_provenance(folder)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "model-2.safetensors").write_bytes(b"a shard the record does not list")
    with pytest.raises(InputError, match=r"\(model-2.safetensors: recorded None, found [0-9a-f]{64}\)"):
        read_provenance(folder)


def test_read_provenance_names_a_missing_or_mistyped_field_and_skips_a_draft_without_one(draft_folder):
    folder, record = draft_folder
    assert read_provenance(folder) is None  # a draft from elsewhere: benchmarked, not placed on the curve
    del record["data"]["conversations"]
    write(folder, record)
    with pytest.raises(InputError, match=r"d/provenance.json: data: missing field 'conversations'"):
        read_provenance(folder)
    record["data"]["conversations"] = "6,960"
    write(folder, record)
    with pytest.raises(InputError, match=r"field 'conversations' should be int, got str"):
        read_provenance(folder)
    (folder / "provenance.json").write_text("{")
    with pytest.raises(InputError, match=r"provenance.json: line 1: not valid JSON"):
        read_provenance(folder)
