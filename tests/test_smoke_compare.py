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
    assert code == 1 and 'artifacts/regen/train.jsonl: records (in order of their content): [1].text: "4" != "5"' in out


def test_records_written_in_another_order_are_the_same_records(tmp_path, capsys):
    """Regeneration writes records as its concurrent requests finish; two runs of one commit wrote them in another
    order, and a set's iteration ordered a table's rows differently."""
    code, out = run(tmp_path, capsys, regen=[{"id": "b", "text": "4"}, {"id": "a", "text": "Hello"}])
    assert code == 0, out


def test_a_choice_made_by_measured_speed_is_not_a_difference_but_the_data_beside_it_is(tmp_path, capsys):
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    a, b = fake_root(tmp_path / "a", checkout), fake_root(tmp_path / "b", checkout)
    speed = {"question": "conversations for 1x in local", "figure": 3.1, "accept_length_needed": 3.1}
    for root, best, tau, gain in ((a, "1,3,1,4", 3.08, 0.04), (b, "1,2,2,4", 6.44, 0.04)):
        (root / "metrics" / "benchmark.json").write_text(json.dumps({"best_config": best, "sweep": [{"a": 1}]}))
        findings = [{"question": "gain per doubling", "figure": gain}, speed | {"figure": tau}]
        (root / "metrics" / "scaling.json").write_text(json.dumps({"break_even_tau": tau, "findings": findings}))
    assert smoke_compare.main([str(a), str(b)]) == 0, capsys.readouterr().out
    (b / "metrics" / "scaling.json").write_text(json.dumps({"break_even_tau": 1.0, "findings": [{"figure": 0.05}]}))
    assert smoke_compare.main([str(a), str(b)]) == 1
    assert "metrics/scaling.json: findings" in capsys.readouterr().out


def test_a_file_on_one_side_only_is_a_difference(tmp_path, capsys):
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    a, b = fake_root(tmp_path / "a", checkout), fake_root(tmp_path / "b", checkout)
    (b / "metrics" / "tune.json").write_text("{}")
    assert smoke_compare.main([str(a), str(b)]) == 1
    assert "metrics/tune.json: only in B" in capsys.readouterr().out


def test_the_evaluation_sets_feature_cache_on_one_side_only_is_no_difference_but_its_answers_are(tmp_path, capsys):
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    a, b = fake_root(tmp_path / "a", checkout), fake_root(tmp_path / "b", checkout)
    for root in (a, b):
        (root / "artifacts" / "eval" / "85589342c252cd0c").mkdir(parents=True)
        (root / "artifacts" / "eval" / "85589342c252cd0c" / "turn1.jsonl").write_text('{"id": "a"}\n')
    kept = b / "artifacts" / "eval" / "85589342c252cd0c" / "features" / "9bd8e33f357f3b29"
    kept.mkdir(parents=True)
    (kept / "key.json").write_text('{"layers": [2, 15, 27]}')
    assert smoke_compare.main([str(a), str(b)]) == 0
    (b / "artifacts" / "eval" / "85589342c252cd0c" / "turn1.jsonl").write_text('{"id": "b"}\n')
    assert smoke_compare.main([str(a), str(b)]) == 1
    assert "artifacts/eval/85589342c252cd0c/turn1.jsonl" in capsys.readouterr().out


def test_a_folder_that_is_not_a_smoke_root_is_bad_usage(tmp_path, capsys):
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    a = fake_root(tmp_path / "a", checkout)
    assert smoke_compare.main([str(a), str(checkout)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{checkout} is not a smoke root" in err
    assert smoke_compare.main([str(a), str(tmp_path / "missing")]) == 2


def test_what_each_run_draws_anew_is_not_a_difference(tmp_path, capsys):
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    roots = [fake_root(tmp_path / "a", checkout), fake_root(tmp_path / "b", checkout)]
    for pid, port, root in ((13989, 41465, roots[0]), (23096, 36719, roots[1])):
        progress = {"status": "finished", "pid": pid, "server": f"http://127.0.0.1:{port}", "timeline": [[0.0, pid]]}
        (root / "artifacts" / "regen" / "train.progress.json").write_text(json.dumps(progress))
        (root / "artifacts" / "train.json").write_text(json.dumps({"command": ["llama-server", "--port", str(port)]}))
        (root / "artifacts" / "tokens_per_s.tsv").write_text(f"step\ttokens_per_s\n1\t{pid / 10}\n")
    assert smoke_compare.main([str(r) for r in roots]) == 0, capsys.readouterr().out
    (roots[1] / "artifacts" / "regen" / "train.progress.json").write_text(json.dumps({"status": "running"}))
    assert smoke_compare.main([str(r) for r in roots]) == 1
    assert 'train.progress.json: status: "finished" != "running"' in capsys.readouterr().out
