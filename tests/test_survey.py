import random

import pytest
import torch

from eagle3lab.data import survey
from eagle3lab.data.sources import Record


def _rec(i, turns, source="hand", reference=None):
    return Record(
        id=f"{source}/{i}",
        source=source,
        category="chat",
        conversations=[{"role": r, "content": c} for r, c in turns],
        reference=reference,
    )


HAND = [
    _rec(0, [("user", "Hello there"), ("assistant", "Hi! How can I help?")]),
    _rec(1, [("user", "hello   THERE"), ("assistant", "Hi! How can I help?")]),  # duplicate after normalization
    _rec(
        2,
        [
            ("assistant", "Welcome back."),
            ("user", "Tell me a joke"),
            ("assistant", "Why did the chicken cross?"),
            ("user", "Another"),
            ("assistant", ""),
        ],
    ),  # starts with the assistant, one empty answer
    _rec(3, [("user", "Hello there"), ("assistant", "Go away")]),  # same prompt, different answer
]


def test_inventory_exact_counts(smollm2):
    tok = smollm2.tokenizer
    inv = survey.inventory(HAND, tok)
    assert (inv.records, inv.turns, inv.user_turns, inv.assistant_turns) == (4, 11, 5, 6)
    assert (inv.starts_with_assistant, inv.empty_turns, inv.length_sample) == (1, 1, 4)
    assert inv.duplicate_rate == 0.25  # record 1 repeats record 0
    assert inv.prompt_duplicate_rate == 0.5  # records 1 and 3 repeat record 0's prompt

    def n(text):
        return len(tok(text, add_special_tokens=False)["input_ids"])

    # lengths after cleaning: record 2 loses its leading and its empty assistant turn
    assert inv.prompt_lengths == [n("Hello there"), n("hello   THERE"), n("Tell me a joke\nAnother"), n("Hello there")]
    assert inv.per_record_responses[2] == [n("Why did the chicken cross?")]
    assert inv.response_tokens["n"] == 4
    row = inv.row()
    assert row["records"] == 4 and "prompt_lengths" not in row and "response_tokens_p50" in row
    assert survey.inventory(HAND, tok, length_samples=2, seed=1).length_sample == 2


def test_reference_answers_count_as_responses(smollm2):
    recs = [_rec(0, [("user", "2+2?")], reference="4"), _rec(1, [("user", "3+3?")])]
    inv = survey.inventory(recs, smollm2.tokenizer)
    assert inv.assistant_turns == 1 and inv.per_record_responses == [[1], []]


def test_tokens_per_prompt_brackets(smollm2):
    inv = survey.inventory(HAND, smollm2.tokenizer)
    low, high = survey.tokens_per_prompt(inv, max_new_tokens=4, max_turns=2)
    # high: every answer to the first 2 user turns runs to the cap; low: source lengths capped at 4
    assert high == pytest.approx((4 + 4 + 8 + 4) / 4)
    lows = [
        min(inv.per_record_responses[0][0], 4),
        min(inv.per_record_responses[1][0], 4),
        min(inv.per_record_responses[2][0], 4) + 4,
        min(inv.per_record_responses[3][0], 4),
    ]
    assert low == pytest.approx(sum(lows) / 4)


def test_projection_reproduces_the_seeds_figure():
    p = survey.project_regeneration(83288, (861, 1973), 830)
    assert p["hours"] == [pytest.approx(24.0, abs=0.05), pytest.approx(55.0, abs=0.05)]
    assert p["tokens"][0] == 83288 * 861
    assert survey.project_regeneration(100, 360, (100, 400))["hours"] == [0.03, 0.1]
    with pytest.raises(ValueError, match="throughput"):
        survey.project_regeneration(1, 1, 0)


def test_regeneration_projections_cover_whole_source_caps_and_mixture_share(smollm2):
    inv = survey.inventory(HAND, smollm2.tokenizer)
    rows = survey.regeneration_projections(
        {"hand": inv, "other": inv},
        {"hand": 75, "other": 25},
        50.0,
        max_new_tokens=4,
        max_turns=2,
        available={"hand": 40},
    )
    assert [(r["source"], r["scope"], r["prompts"]) for r in rows] == [
        ("hand", "whole source", 40),
        ("hand", "after set caps", 4),
        ("hand", "mixture share", 75),
        ("other", "whole source", 4),
        ("other", "mixture share", 25),
    ]
    tpp = survey.tokens_per_prompt(inv, 4, 2)
    assert rows[2]["tokens"] == [round(75 * tpp[0]), round(75 * tpp[1])]
    assert rows[2]["hours"] == survey.project_regeneration(75, tpp, 50.0)["hours"]


def test_encode_for_scoring_masks_only_the_answers(smollm2):
    tok = smollm2.tokenizer
    turns = [
        {"role": "assistant", "content": "orphan"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello friend"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye"},
    ]
    ids, mask = survey.encode_for_scoring(tok, turns, max_tokens=512)
    masked = tok.decode([t for t, m in zip(ids, mask) if m])
    assert masked == "Hello friend<|im_end|>\nGoodbye<|im_end|>\n"
    assert "orphan" not in tok.decode(ids)
    short, smask = survey.encode_for_scoring(tok, turns, max_tokens=len(ids) - 3)
    assert len(short) == len(ids) - 3 and sum(smask) == sum(mask) - 3
    assert survey.encode_for_scoring(tok, [{"role": "user", "content": "no answer"}], 512) is None
    # an answer starting with spaces (HumanEval's solutions) would merge with the template's newline in one BPE pass
    code = [{"role": "user", "content": "def f(x):"}, {"role": "assistant", "content": "    return x"}]
    ids, mask = survey.encode_for_scoring(tok, code, max_tokens=512)
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == "    return x<|im_end|>\n"


def test_token_nll_matches_full_logits(tiny_llama):
    torch.manual_seed(0)
    seqs = [(torch.randint(0, 320, (n,)).tolist(), [j >= n // 2 for j in range(n)]) for n in (7, 12, 4)]
    got = survey.token_nll(tiny_llama, seqs, pad_id=0, chunk=5)
    for (ids, mask), (total, count) in zip(seqs, got):
        x = torch.tensor([ids])
        logp = torch.log_softmax(tiny_llama(x).logits[0].float(), -1)
        want = -sum(logp[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t])
        assert count == sum(mask[1:])
        assert total == pytest.approx(want, rel=1e-4)


def test_onpolicy_target_samples_beat_shuffled_text(smollm2):
    """Text the target sampled itself must score a lower NLL than the same tokens shuffled."""
    tok, model = smollm2.tokenizer, smollm2.model
    prompts = [
        "Give me three tips for staying healthy.",
        "What is the capital of Japan?",
        "Explain what a CPU does in two sentences.",
    ]
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    tok.padding_side = "left"
    try:
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tok.padding_side = "right"
    torch.manual_seed(0)
    out = model.generate(
        **enc,
        max_new_tokens=24,
        min_new_tokens=24,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=tok.pad_token_id,
    )
    own, shuffled = [], []
    for i, p in enumerate(prompts):
        answer = tok.decode(out[i, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        words = answer.split()
        random.Random(i).shuffle(words)
        own.append(_rec(i, [("user", p), ("assistant", answer)], source="own"))
        shuffled.append(_rec(i, [("user", p), ("assistant", " ".join(words))], source="shuffled"))
    s_own = survey.onpolicy_score(model, tok, own, samples=3, batch_size=2, progress=False, bootstrap=200)
    s_shuf = survey.onpolicy_score(model, tok, shuffled, samples=3, batch_size=2, progress=False, bootstrap=200)
    assert s_own.n_records == 3 and s_own.ci_low <= s_own.nll <= s_own.ci_high
    assert s_own.nll + 1.0 < s_shuf.nll
    assert s_own.row()["perplexity"] == pytest.approx(2.718281828**s_own.nll, rel=1e-2)


def test_onpolicy_skips_unscorable_records_and_errors_when_none(tiny_llama, smollm2):
    tok = smollm2.tokenizer
    prompt_only = [_rec(0, [("user", "just a question")])]
    with pytest.raises(ValueError, match="no record has an answer"):
        survey.onpolicy_score(smollm2.model, tok, prompt_only, samples=2, progress=False)
    mixed = prompt_only + [_rec(1, [("user", "q"), ("assistant", "an answer")])]
    s = survey.onpolicy_score(smollm2.model, tok, mixed, samples=2, progress=False, bootstrap=50)
    assert s.n_records == 1 and s.n_tokens == len(tok("an answer<|im_end|>\n", add_special_tokens=False)["input_ids"])
