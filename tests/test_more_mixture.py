"""`python -m eagle3lab.pipeline.more_mixture`: the prompts that grow stage 01's mixture are new (none of the first
mixture's, whose val split picks every draft), drawn as stage 01 draws, and a machine without them rebuilds them
bitwise, checked against dvc.lock; bad settings and files are errors naming where."""

import json

import pytest
import yaml

from eagle3lab import paths
from eagle3lab.data.survey import prompt_key_of
from eagle3lab.io import InputError, read_jsonl
from eagle3lab.pipeline import mixture_restore, more_mixture
from eagle3lab.pipeline.stages import load_params

PARAMS = paths.ROOT / "params.yaml"


@pytest.fixture
def root(locked_root):
    return locked_root


def keys(path):
    return [prompt_key_of(row["conversations"]) for row in read_jsonl(path)]  # a prompt may hold U+2028


def test_the_grown_prompts_are_rebuilt_bitwise_and_none_is_the_first_mixtures(root):
    folder = more_mixture.restore(root)  # stage 01's mixture first: this root has neither
    locked = mixture_restore.locked_hash(root, more_mixture.STAGE, more_mixture.FOLDER)
    assert mixture_restore.folder_hash(folder) == locked
    new = keys(folder / "train.jsonl")
    first = more_mixture.first_keys(root)
    assert len(new) == len(set(new)) and not set(new) & first
    record = json.loads((paths.ROOT / more_mixture.RECORD).read_text())  # the committed accounting of that draw
    assert record["new_prompts"] == len(new) and record["first_prompts"] == len(first)
    assert record["first_missing_from_grown"] == 0  # the grown draw holds the first one
    assert sum(source["new"] for source in record["sources"].values()) == len(new)


def test_a_total_that_does_not_grow_the_mixture_is_refused_before_any_draw():
    params = load_params(PARAMS)
    first = params["dataset_survey"]["mixture_total"]
    for total in (first, None, "8000"):
        params["answers"]["more"] = {"mixture_total": total}
        with pytest.raises(
            InputError, match=rf"section 'answers.more': field 'mixture_total' must be .* above .*{first}"
        ):
            more_mixture.grown_total(params, PARAMS)


def test_a_first_mixture_record_without_conversations_is_named(root):
    folder = root / mixture_restore.FOLDER
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text(json.dumps({"id": "a", "conversations": []}) + "\n" + json.dumps({"id": "b"}))
    (folder / "val.jsonl").write_text("")
    with pytest.raises(InputError, match=r"mixture/train.jsonl: record 2: field 'conversations'"):
        more_mixture.first_keys(root)
    (folder / "train.jsonl").write_text(json.dumps({"id": "a", "conversations": []}) + "\n")
    (folder / "val.jsonl").unlink()
    with pytest.raises(InputError, match=r"mixture/val.jsonl: no such file"):
        more_mixture.first_keys(root)


def test_a_lock_whose_grown_prompts_differ_is_refused_and_leaves_nothing(root):
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    lock["stages"][more_mixture.STAGE]["outs"][0]["md5"] = "0" * 32 + ".dir"
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))
    with pytest.raises(InputError, match=r"stage 'more_mixture' locked artifacts/more_mixture as 0+\.dir"):
        more_mixture.restore(root)
    assert not (root / more_mixture.FOLDER).exists() and (root / mixture_restore.FOLDER).exists()


def _write(path, record):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_the_results_section_counts_the_new_answers_beside_the_first_ones(tmp_path):
    from eagle3lab.pipeline import report_more_data

    assert "not drawn yet" in report_more_data.section(tmp_path)
    source = {"selected": 9, "quota": 9, "new": 6}
    _write(tmp_path / "more_mixture.json", {"mixture_total": 12, "grown_prompts": 11, "first_prompts": 5,
           "first_missing_from_grown": 0, "new_prompts": 6, "sources": {"s": source}})  # fmt: skip
    ran = {"cpu": "Xeon A", "minutes": {"train": 1.0, "score": 0.5}}
    greedy, sampled = {"dtype": "bfloat16", "temperature": 0.0}, {"dtype": "bfloat16", "temperature": 0.7}
    cell = {"prompts": 4, "skipped": 1, "errors": 0, "tokens_per_s": 9.0, "minutes": 1.0, "ran": ran}
    _write(tmp_path / "answers" / "train-000.json", cell | {"split": "train", "success": 3, "settings": greedy})
    _write(tmp_path / "answers" / "val.json", cell | {"split": "val", "success": 2, "settings": greedy})
    _write(tmp_path / "answers" / "sampled-000.json", cell | {"split": "train", "success": 3, "settings": sampled})
    _write(tmp_path / "answers_more" / "more-000.json", cell | {"split": "train", "success": 4, "settings": greedy})
    text = report_more_data.section(tmp_path)
    assert "1 `more_answers` cells have run: 4 of the 6 new prompts answered, so 7 training conversations" in text
    assert "(the first mixture's train cells: 3)" in text and "No draft on all of it has trained yet" in text
    acceptance = {"pooled": [{"set": "all", "accept_length": 1.5}]}
    training = {"stopped_by": "patience", "steps": 40, "answer_tokens_seen": 300, "tokens": 900}
    grown = {"records": 7, "answer_tokens": 100, "training": training, "acceptance": acceptance, "ran": ran}
    _write(tmp_path / "grown_drafts" / "grown.json", grown | {"overrides": {}})
    _write(tmp_path / "grown_drafts" / "tuned.json", grown | {"overrides": {"init_draft": "drafts/gpu-6960"}})
    text = report_more_data.section(tmp_path)
    assert "| grown | from scratch | 7 | 100 | patience | 40 | 3 | 900 | 1.50 | 1.50 |" in text
    assert "| tuned | fine-tune of gpu-6960 | 7 | 100 | patience | 40 | 3 | 900 | 1.50 | 1.50 |" in text
    # the curve's prediction, and a draft from scratch against the one it trained after (its per-prompt mean)
    intervals = [{"seed": 0, "interval": [1.4, 1.6]}, {"seed": 1, "interval": [1.45, 1.7]}]
    said = {"predicted": 1.52, "chosen": "saturating", "intervals": intervals}
    predicted = {
        "scale": 7,
        "largest_measured": 5,
        "projection": True,
        "bootstrap_seeds": [0, 1],
        "sets": {"all": said},
    }
    _write(tmp_path / "grown_forecast.json", predicted)
    per_prompt = {"pooled": acceptance["pooled"], "per_prompt": [{"accept_length": 1.3}, {"accept_length": 1.55}]}
    _write(tmp_path / "grown_drafts" / "grown.json", grown | {"overrides": {}, "acceptance": per_prompt,
           "predicted_before": predicted})  # fmt: skip
    text = report_more_data.section(tmp_path)
    prediction = "1.520 on all sets at 7 conversations (saturating, fitted on the curve to 5, a projection; bootstrap "
    assert f"(`grown_forecast`): {prediction}seeds [0, 1]: [1.400, 1.600], [1.450, 1.700])." in text
    assert f"`grown` measured 1.425, borderline the interval predicted before it trained: {prediction}" in text
