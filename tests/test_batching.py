"""The continuous-batching decode engine: greedy output equals HF batch-1 generate while rows leave and join."""

import torch

from eagle3lab.regen.batching import BatchGenerator


def test_batched_decode_matches_batch1_generate(tiny_target):
    """Rows leave at different steps (EOS) and new rows join the running cache; greedy output equals HF batch-1."""
    from eagle3lab.models.target import load_target

    t = load_target(tiny_target)
    prompts = [[1] + list(range(5 + i, 5 + i + 3 + 7 * i)) for i in range(10)]
    refs = [
        t.model.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=2)[
            0, len(p) :
        ].tolist()
        for p in prompts
    ]
    eos = {refs[i][3 + 2 * i] for i in (0, 3, 6)}  # stop tokens that end some rows early
    engine = BatchGenerator(t.model, t.tokenizer, batch_size=4, max_new_tokens=20, refill_fraction=0.01)
    engine.eos = eos
    for i, p in enumerate(prompts):
        engine.submit(i, p)
    got = {}
    engine.run(lambda h, r: got.__setitem__(h, r))
    lengths = set()
    for i, ref in enumerate(refs):
        cut = next((k for k, x in enumerate(ref) if x in eos), None)
        expected = ref if cut is None else ref[:cut]
        assert got[i].text == t.tokenizer.decode(expected, skip_special_tokens=True), i
        assert got[i].finish_reason == ("length" if cut is None else "stop")
        lengths.add(got[i].new_tokens)
    assert len(lengths) >= 3  # rows really finished at different steps


def _engine_outputs(engine_cls, t, prompts, eos, **kw):
    engine = engine_cls(t.model, t.tokenizer, batch_size=4, max_new_tokens=20, **kw)
    engine.eos = eos
    for i, p in enumerate(prompts):
        engine.submit(i, p)
    got = {}
    engine.run(lambda h, r: got.__setitem__(h, r))
    return got


def test_continuous_engine_matches_batching_engine_greedy(tiny_target):
    """transformers' paged continuous batching gives the same greedy answers, finish reasons and token counts as
    BatchGenerator in fp32, with rows stopping at EOS, at max new tokens and at the context bound."""
    from eagle3lab.models.target import load_target
    from eagle3lab.regen.continuous import ContinuousGenerator

    t = load_target(tiny_target, dtype="float32")
    prompts = [[1] + list(range(5 + i, 5 + i + 3 + 7 * i)) for i in range(10)]
    prompts.append([1] + list(range(100, 100 + 305)))  # 306 + 20 > the context of 320: stops at the context bound
    refs = [
        t.model.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=2)[
            0, len(p) :
        ].tolist()
        for p in prompts[:7]
    ]
    eos = {refs[i][3 + 2 * i] for i in (0, 3, 6)}  # stop tokens that end some rows early
    batching = _engine_outputs(BatchGenerator, t, prompts, eos, refill_fraction=0.01)
    continuous = _engine_outputs(ContinuousGenerator, t, prompts, eos)
    assert set(continuous) == set(batching) == set(range(len(prompts)))
    for i in batching:
        assert continuous[i] == batching[i], i
    reasons = {r.finish_reason for r in batching.values()}
    assert reasons == {"stop", "length"}
    assert batching[len(prompts) - 1].new_tokens == 320 - 306
