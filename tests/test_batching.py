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
