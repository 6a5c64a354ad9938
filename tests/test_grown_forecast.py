"""Issue 66's prediction of the grown draft (the `grown_forecast` stage): the curve's chosen form read at the grown
scale with its intervals, a labelled projection; no prediction where no form can be chosen; the grown scale counted
from the committed answers; and a draft from scratch that trains only on a prediction of its own scale, kept in its
record as it stood before it trained."""

import json
from pathlib import Path

import pytest
import yaml

from eagle3lab import paths
from eagle3lab.io import InputError
from eagle3lab.pipeline import grown_drafts, grown_forecast
from test_forecast import SCALES, saturating, write_drafts


def _root(tmp_path: Path, monkeypatch, train_lines=(3, 2), more_lines=(4,)) -> Path:
    """A root with smoke params (train-000/001, more-000) and committed answers files of these many lines."""
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    params = yaml.safe_load(Path("params/smoke.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for folder, names, counts in (("answers", ("train-000", "train-001"), train_lines), ("answers_more", ("more-000",),
                                  more_lines)):  # fmt: skip
        (tmp_path / folder).mkdir(exist_ok=True)
        for name, count in zip(names, counts, strict=True):
            (tmp_path / folder / f"{name}.jsonl").write_text("".join(f'{{"id": "{name}-{i}"}}\n' for i in range(count)))
    return tmp_path / "params.yaml"


def test_the_grown_scale_is_predicted_off_the_chosen_form_as_a_labelled_projection(tmp_path, monkeypatch):
    params = _root(tmp_path, monkeypatch, train_lines=(3000, 2000), more_lines=(2500,))
    write_drafts(tmp_path / "metrics" / "drafts", saturating)
    record = grown_forecast.run(params, tmp_path)
    assert json.loads((tmp_path / grown_forecast.RECORD).read_text()) == record
    assert (record["scale"], record["largest_measured"], record["projection"]) == (7500, max(SCALES), True)
    every = record["sets"]["all"]
    assert every["fitted_on"] == SCALES and every["seeds"] == [3] * len(SCALES) and every["chosen"]
    assert "least mean absolute error" in every["why"]
    # the curve rises yet: the prediction sits above the largest scale's level, near the truth, inside its intervals
    assert saturating(max(SCALES)) < every["predicted"] and abs(every["predicted"] - saturating(7500)) < 0.05
    for interval in every["intervals"]:
        assert interval["interval"][0] <= every["predicted"] <= interval["interval"][1]
    assert [i["seed"] for i in every["intervals"]] == yaml.safe_load(params.read_text())["drafts"]["forecast"][
        "bootstrap_seeds"
    ]


def test_below_four_scales_it_predicts_nothing_and_says_why(tmp_path, monkeypatch):
    params = _root(tmp_path, monkeypatch)
    write_drafts(tmp_path / "metrics" / "drafts", saturating)
    for path in (tmp_path / "metrics" / "drafts").glob("*.json"):
        if json.loads(path.read_text())["records"] > 55:
            path.unlink()
    every = grown_forecast.run(params, tmp_path)["sets"]["all"]
    assert (every["predicted"], every["intervals"], every["fitted_on"]) == (None, [], [22, 55])
    assert "no fitting scale" in every["why"]


def test_a_missing_answers_file_is_named(tmp_path, monkeypatch):
    params = _root(tmp_path, monkeypatch)
    (tmp_path / "answers_more" / "more-000.jsonl").unlink()
    with pytest.raises(InputError, match=r"answers_more/more-000.jsonl: no such file: the grown scale counts"):
        grown_forecast.run(params, tmp_path)


def test_a_draft_from_scratch_trains_only_on_a_prediction_of_its_own_scale(tmp_path, monkeypatch):
    params = _root(tmp_path, monkeypatch)
    cells = {"grown": {}, "finetuned": {"start": "drafts/gpu"}}
    raw = yaml.safe_load(params.read_text())
    raw["drafts"]["grown"]["cells"] = cells
    params.write_text(yaml.safe_dump(raw))
    (tmp_path / "drafts" / "gpu").mkdir(parents=True)
    (tmp_path / "drafts" / "gpu" / "config.json").write_text("{}")
    scratch, tuned = (grown_drafts.cell_of(name, params) for name in cells)
    run = type("Run", (), {"records": 9})()
    for reading in (lambda: scratch.read_prediction(run), lambda: scratch.train(run, {})):  # training reads it first
        with pytest.raises(InputError, match=r"grown_forecast.json: no such file: `grown_forecast` predicts"):
            reading()
    assert tuned.read_prediction(run) is None  # a fine-tuned draft is no draft of the curve
    (tmp_path / "metrics").mkdir()
    (tmp_path / grown_forecast.RECORD).write_text(json.dumps({"scale": 8, "sets": {}}))
    with pytest.raises(InputError, match=r"field 'scale' is 8, but this draft trains on 9 conversations"):
        scratch.read_prediction(run)
    (tmp_path / grown_forecast.RECORD).write_text(json.dumps({"scale": 9, "sets": {"all": {"predicted": 1.5}}}))
    before = scratch.read_prediction(run)
    (tmp_path / grown_forecast.RECORD).write_text(json.dumps({"scale": 9, "sets": {"all": {"predicted": 9.9}}}))
    assert scratch.predicted == before and before["sets"]["all"]["predicted"] == 1.5  # as it stood before training
