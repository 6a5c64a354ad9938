"""Exact offline acceptance: the walk's rules on hand-made hits, and offline = online on the real SmolLM2 in float32
with the committed GPU-trained draft, prompt by prompt."""

import pytest
import torch

from eagle3lab.benchmark.acceptance import PromptAcceptance, pooled, table
from eagle3lab.benchmark.eval_set import EvalRecord, build_eval_set, load_eval_set, parse_sets, teacher_forced
from eagle3lab.decoding.offline import draft_hits, last_answer, walk
from eagle3lab.io import InputError

TRAINED_DRAFT = "drafts/smollm2-original-6960"


def hits_from(rows: list[str]) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in rows])


def test_walk_counts_each_rounds_run_to_its_first_miss_and_skips_the_bonus_token():
    # prompt of 2 tokens (anchor 1), answer of 8: the prefill emits answer token 0
    hits = hits_from(["0110110000", "0110010000", "0000000000"])
    # anchor 1: hit at depth 0 and 1, miss at 2 -> 2 accepted, +bonus: anchor 4; anchor 4: 1 accepted -> anchor 6;
    # anchor 6: miss -> anchor 7 ... until 8 tokens are out
    assert walk(hits, 2, 8, 3) == [2, 1, 0, 0]
    assert walk(hits, 2, 8, 1) == [1, 0, 1, 0, 0]  # depth 1 reads only the first row
    assert walk(hits, 2, 1, 3) == []  # the prefill's token alone: no round


def test_the_last_answer_is_the_last_run_of_the_loss_mask():
    assert last_answer(torch.tensor([0, 0, 1, 1, 0, 0, 1, 1, 1, 0])) == (6, 3)  # a second turn's answer
    assert last_answer(torch.tensor([0, 1, 1])) == (1, 2)
    assert last_answer(torch.tensor([0, 0])) == (2, 0)


def test_pooled_accept_length_is_emitted_tokens_over_rounds_and_positions_are_shares_of_rounds():
    rows = [
        PromptAcceptance("d", "s", "a", 2, tokens=5, accepted=[2, 0, 0]),
        PromptAcceptance("d", "s", "b", 2, tokens=3, accepted=[1, 0]),
    ]
    result = pooled(rows)
    assert result["accept_length"] == pytest.approx(8 / 5)
    assert result["position_acceptance"] == [pytest.approx(2 / 5), pytest.approx(1 / 5)]
    sets = {(row["set"], row["prompts"]) for row in table(rows)}
    assert sets == {("s", 2), ("all", 2)}


def test_hits_count_a_token_outside_the_draft_vocabulary_as_a_miss(project_draft):
    from eagle3lab.models.draft import load_draft

    _, folder = project_draft
    draft = load_draft(folder).float()
    ids = torch.arange(1, 41) * 3 % 300  # every token a multiple of 3: inside the draft vocab (ids 0, 3, ..., 297)
    aux = torch.randn(40, draft.fc.in_features)
    predicted = draft_hits(draft, aux, ids, 2)
    odd = ids + 1  # no multiple of 3: nothing the draft can propose
    assert not draft_hits(draft, aux, odd, 2).any()
    assert predicted.shape == (2, 40) and not predicted[:, -2:].any()  # past the text: misses


def test_chains_rooted_in_the_answer_are_drafted_the_same_without_the_prompts_later_steps(project_draft):
    from eagle3lab.models.draft import load_draft

    _, folder = project_draft
    draft = load_draft(folder).float()
    ids, aux, first = torch.arange(1, 41) * 3 % 300, torch.randn(40, draft.fc.in_features), 17
    with torch.inference_mode():
        hidden, inputs, positions = draft.project(aux)[None], ids[None], torch.arange(40)[None]
        whole = draft.ttt_forward(inputs, hidden, positions, 3)
        answer = draft.ttt_forward(inputs, hidden, positions, 3, first)
    assert [a.shape[1] for a in answer] == [40, 23, 23]
    for w, a in zip(whole, answer):
        torch.testing.assert_close(a[:, -23:], w[:, first:], rtol=1e-5, atol=1e-5)
    hits = draft_hits(draft, aux, ids, 3, first)
    assert torch.equal(hits[:, first:], draft_hits(draft, aux, ids, 3)[:, first:]) and not hits[:, :first].any()


def test_eval_sets_are_checked_by_name_and_size():
    assert parse_sets(["mtbench"]) == {"mtbench": None}
    with pytest.raises(InputError, match="unknown"):
        parse_sets({"mtbnech": 3})
    with pytest.raises(InputError, match="positive integer"):
        parse_sets({"gsm8k": 0})


def test_a_missing_eval_set_names_its_file(tmp_path):
    with pytest.raises(InputError, match="turn1.jsonl: missing"):
        load_eval_set(tmp_path)


def test_offline_accept_length_equals_the_engines_online_one_on_smollm2_in_float32(smollm2, tmp_path):
    """8 prompts (MT-bench both turns, HumanEval, GSM8K), chains of 3 and 5: the teacher-forced walk gives the local
    engine's accept length exactly, and the cached answer is the engine's own greedy text."""
    from eagle3lab.benchmark.systems import load_bench_draft
    from eagle3lab.decoding.engine import SpecEngine
    from eagle3lab.drafters.eagle3.acceptance import evaluate
    from eagle3lab.regen.batching import eos_ids

    draft = load_bench_draft(TRAINED_DRAFT, smollm2, torch.float32)
    records = build_eval_set(smollm2, tmp_path, {"mtbench": 2, "humaneval": 2, "gsm8k": 2}, 24, batch_size=8)
    assert [r.turn for r in records].count(2) == 2 and len(records) == 8
    assert build_eval_set(smollm2, tmp_path, {"mtbench": 2, "humaneval": 2, "gsm8k": 2}, 24) == records  # cached
    offline = {(r.prompt, r.depth): r for r in evaluate({"d": draft}, smollm2, records, [3, 5], progress=False)}
    forced = {tf.record.id: tf for tf in teacher_forced(smollm2, records, draft.config.aux_layer_ids)}
    eos = eos_ids(smollm2.model, smollm2.tokenizer)
    some_accepted = False
    for (prompt, depth), row in offline.items():
        tf = forced[prompt]
        assert tf.answer_tokens > 1
        engine = SpecEngine(smollm2.model, draft, f"1,{depth},1,{depth + 1}", eos_token_ids=eos)
        online = engine.generate(tf.record.prompt_ids, tf.answer_tokens)
        assert online.tokens == tf.ids[len(tf.record.prompt_ids) :].tolist(), prompt
        assert row.rounds == online.verify_count, (prompt, depth)
        assert row.accept_length == pytest.approx(online.accept_length, abs=1e-12), (prompt, depth)
        some_accepted |= any(row.accepted)
    assert some_accepted  # a trained draft: the equality is not 1.0 == 1.0


def test_an_answer_is_cut_where_the_targets_own_argmax_disagrees(smollm2):
    prompt = smollm2.tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
    greedy = []
    with torch.inference_mode():
        for _ in range(3):
            greedy.append(int(smollm2.model(torch.tensor([prompt + greedy])).logits[0, -1].argmax()))
    wrong = (greedy[2] + 1) % smollm2.vocab_size
    records = [
        EvalRecord("a#1", "mtbench", 1, prompt, greedy, "length"),
        EvalRecord("b#1", "mtbench", 1, prompt, greedy[:2] + [wrong], "length"),
    ]
    kept, cut = teacher_forced(smollm2, records, None)
    assert (kept.answer_tokens, kept.cut) == (3, False)
    assert (cut.answer_tokens, cut.cut) == (2, True)
    assert cut.ids.tolist() == prompt + greedy[:2] and cut.aux.shape[0] == len(prompt) + 2


def test_a_built_sets_features_are_kept_and_read_back_bitwise_without_the_target(smollm2, tmp_path, monkeypatch):
    from eagle3lab.benchmark import eval_set
    from eagle3lab.models.target import aux_hidden_indices

    prompt = smollm2.tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
    records = [EvalRecord(f"mt/{i}#1", "mtbench", 1, prompt, [1, 2, 3][:i], "length", tmp_path) for i in (2, 3)]
    first = list(teacher_forced(smollm2, records, None))
    folder = eval_set.features_folder(smollm2, records, aux_hidden_indices(smollm2.num_layers, None))
    assert sorted(p.name for p in folder.iterdir()) == ["key.json", "mt%2F2%231.pt", "mt%2F3%231.pt"]

    def no_target(*args, **kwargs):
        raise AssertionError("the target ran although its features were kept")

    monkeypatch.setattr(eval_set, "forward_with_aux", no_target)
    again = list(teacher_forced(smollm2, records, None))
    for a, b in zip(first, again):
        assert (
            torch.equal(a.ids, b.ids)
            and torch.equal(a.aux, b.aux)
            and (a.answer_tokens, a.cut) == (b.answer_tokens, b.cut)
        )
    with pytest.raises(AssertionError, match="the target ran"):  # other layers are other features: the target runs
        list(teacher_forced(smollm2, records, [3, 5, 7]))


def test_the_acceptance_commands_read_sets_and_named_drafts_one_way():
    from eagle3lab.benchmark.acceptance import named, sets_option

    assert sets_option("mtbench:all, gsm8k:120,humaneval") == {"mtbench": None, "gsm8k": 120, "humaneval": None}
    assert named("seed1=runs/d/draft") == ("seed1", "runs/d/draft") and named("runs/d/draft/") == (
        "draft",
        "runs/d/draft/",
    )


def test_the_acceptance_subset_keeps_the_first_records_of_the_named_sets():
    from types import SimpleNamespace

    from eagle3lab.benchmark.acceptance import subset

    records = [SimpleNamespace(set=s, id=f"{s}{i}") for i in range(3) for s in ("mtbench", "gsm8k")]
    assert [r.id for r in subset(records, {"mtbench": 2})] == ["mtbench0", "mtbench1"]
    assert [r.id for r in subset(records, {"gsm8k": None, "mtbench": 1})] == ["mtbench0", "gsm8k0", "gsm8k1", "gsm8k2"]
    with pytest.raises(InputError, match="no records of \\['humaneval'\\]"):
        subset(records, {"humaneval": 1})


def test_one_recipes_seeds_are_compared_with_anothers_prompt_by_prompt_at_each_depth():
    """Rows at two depths: each depth is paired on its own (paired_difference pairs by set and id)."""
    from eagle3lab.benchmark.scoring import versus

    rows = [
        {
            "system": system,
            "set": ("mtbench", "gsm8k")[i % 2],
            "id": str(i),
            "depth": depth,
            "accept_length": 1.2 + 0.01 * i + gain + 0.1 * depth,
        }
        for depth in (3, 5)
        for system, gain in (("dflash", 0.0), ("dflash-seed1", 0.02), ("eagle", 0.25), ("eagle-seed1", 0.27))
        for i in range(30)
    ]
    compared = versus(rows, ["dflash", "dflash-seed1"], ["eagle", "eagle-seed1"], [3], boot=200)
    overall, *per_set = compared
    assert [r["depth"] for r in compared] == [3, 3, 3]
    assert overall["set"] == "all sets" and overall["difference"] == pytest.approx(-0.25)
    assert overall["draft_accept"] == pytest.approx(1.2 + 0.01 * 14.5 + 0.01 + 0.3)  # depth 3's rows alone
    assert overall["high"] < 0 and overall["verdict"] == "shown" and overall["seeds"] == [2, 2]
    assert sorted(r["set"] for r in per_set) == ["gsm8k", "mtbench"] and all(r["prompts"] == 15 for r in per_set)
    both = versus(rows, ["dflash"], ["eagle"], [3, 5], boot=200)
    assert [(r["depth"], r["set"]) for r in both][::3] == [(3, "all sets"), (5, "all sets")]
    assert all(r["prompts"] == 30 for r in both[::3])
