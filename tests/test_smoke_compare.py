"""smoke_compare on two small fake smoke roots: what counts as a difference, and what does not."""

import json

import numpy as np
from safetensors.numpy import save_file

from eagle3lab.pipeline import smoke_compare


def fake_root(path, checkout, *, weight=None, draft=None, regen=None):
    """A smoke root as eagle3lab.pipeline.smoke leaves it: links into a checkout, artifacts/ and metrics/."""
    (path / "artifacts" / "drafts" / "final").mkdir(parents=True)
    (path / "artifacts" / "regen").mkdir()
    (path / "metrics").mkdir()
    (path / "notebooks").symlink_to(checkout / "notebooks")
    (path / "params.yaml").write_text("common: {seed: 0}\n")
    tensors = {"fc.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "d2t": np.arange(4, dtype=np.int64)}
    if weight is not None:
        tensors["fc.weight"] = weight
    save_file(tensors, str(path / "artifacts" / "drafts" / "final" / "model.safetensors"))
    # the root's own path inside a value, as the stages write it
    scale = {"name": "scale-00004", "accept_length": 1.25, "tokens_per_s": 2230.3, "seconds": 4.5, "costs_ms": {"a": 4}}
    train = {"final": f"{path}/artifacts/drafts/final", "drafts": [scale | (draft or {})]}
    (path / "metrics" / "train.json").write_text(json.dumps(train))
    records = regen or [{"id": "a", "text": "Hello"}, {"id": "b", "text": "4"}]
    (path / "artifacts" / "regen" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "artifacts" / "regen" / "train.jsonl.server.log").write_text(f"started at {path}\n")
    return path


def run(tmp_path, capsys, **b_changes):
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True, exist_ok=True)
    a = fake_root(tmp_path / "smoke-a", checkout)
    b = fake_root(tmp_path / "smoke-a2", checkout, **b_changes)  # A's name a prefix of B's: still B's own root
    code = smoke_compare.main([str(a), str(b)])
    return code, capsys.readouterr().out


def test_identical_roots_compare_equal_even_with_their_own_paths_inside(tmp_path, capsys):
    code, out = run(tmp_path, capsys)
    assert code == 0, out
    assert out.strip() == "smoke compare: 3 outputs compared, 0 differ"  # the .log left out


def test_a_timing_that_differs_is_not_a_difference(tmp_path, capsys):
    code, out = run(tmp_path, capsys, draft={"tokens_per_s": 999.0, "seconds": 1.0, "costs_ms": {"a": 1}})
    assert code == 0, out


def test_one_tensor_byte_that_differs_names_the_tensor(tmp_path, capsys):
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    weight[1, 2] = np.nextafter(weight[1, 2], np.float32(100))  # one bit
    code, out = run(tmp_path, capsys, weight=weight)
    assert code == 1
    assert "artifacts/drafts/final/model.safetensors: tensor fc.weight: element 6 6.0 != 6.000000476837158" in out
    assert "1 differ" in out


def test_a_metric_that_differs_names_its_key_path(tmp_path, capsys):
    code, out = run(tmp_path, capsys, draft={"accept_length": 1.5})
    assert code == 1 and "metrics/train.json: drafts[0].accept_length: 1.25 != 1.5" in out


def test_a_regenerated_record_that_differs_is_named(tmp_path, capsys):
    code, out = run(tmp_path, capsys, regen=[{"id": "a", "text": "Hello"}, {"id": "b", "text": "5"}])
    assert code == 1 and 'artifacts/regen/train.jsonl: record 2: text: "4" != "5"' in out


def test_a_file_on_one_side_only_is_a_difference(tmp_path, capsys):
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    a, b = fake_root(tmp_path / "a", checkout), fake_root(tmp_path / "b", checkout)
    (b / "metrics" / "tune.json").write_text("{}")
    assert smoke_compare.main([str(a), str(b)]) == 1
    assert "metrics/tune.json: only in B" in capsys.readouterr().out


def test_a_folder_that_is_not_a_smoke_root_is_bad_usage(tmp_path, capsys):
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    a = fake_root(tmp_path / "a", checkout)
    assert smoke_compare.main([str(a), str(checkout)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{checkout} is not a smoke root" in err
    assert smoke_compare.main([str(a), str(tmp_path / "missing")]) == 2
