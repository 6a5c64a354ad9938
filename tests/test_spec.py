"""The speculative decoding engine: losslessness (adaptive drafting included), tree masks, cache rollback,
rejection sampling, EAGLE mode, the shared ndraft rule, and the same on CUDA when there is one."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from eagle3lab.decoding.config import SpecConfig, max_draft_tokens
from eagle3lab.decoding.engine import Generation, SpecEngine, generate
from eagle3lab.decoding.tree import DraftTree, keep_cache_positions
from eagle3lab.models.draft import DraftConfig, Eagle3Draft

CHAIN_AND_TREE = ["1,1,1,2", "1,3,1,4", "1,1,3,3", "1,3,2,5", "1,3,2,8", "1,4,4,12"]


def tiny_target(seed=0, init=0.2, vocab=256, layers=4, hidden=64):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=init,
    )
    return LlamaForCausalLM(cfg).eval()


def random_draft(target, draft_vocab, seed=1):
    torch.manual_seed(seed)
    draft = Eagle3Draft(DraftConfig.from_target(target.config, draft_vocab_size=draft_vocab)).eval()
    draft.set_vocab(torch.randperm(target.config.vocab_size)[:draft_vocab])
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    return draft


def copying_draft(target, draft_vocab=192, seed=1):
    """A draft that predicts 'the token repeats': fc passes the first aux layer (about the token's embedding),
    the layer adds nothing, and the head is the target's tied embedding. Tiny random targets repeat tokens in runs,
    so this draft is accepted often but not always."""
    draft = random_draft(target, draft_vocab, seed)
    h = target.config.hidden_size
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, :h] = torch.eye(h)
        draft.midlayer.self_attn.o_proj.weight.zero_()
        draft.midlayer.mlp.down_proj.weight.zero_()
        draft.norm.weight.copy_(target.model.norm.weight)
        draft.lm_head.weight.copy_(target.lm_head.weight[draft.draft_ids])
    return draft


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def chaotic():
    """A random target whose greedy output changes token almost every step, and a random draft."""
    target = tiny_target(init=0.2)
    return target, random_draft(target, 128)


@pytest.fixture(scope="module")
def repetitive():
    target = tiny_target(init=0.05)
    return target, copying_draft(target)


def prompts(n, vocab=256, length=20, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]


# ---- config ------------------------------------------------------------------------------------------------------


def test_config_parse_and_validation():
    assert SpecConfig.parse("1,0,0,0").is_baseline
    c = SpecConfig.parse("1,5,1,6")
    assert (c.steps, c.topk, c.num_draft_tokens, c.label) == (5, 1, 6, "1,5,1,6")
    assert SpecConfig.parse("1,3,4,16").max_draft_tokens == 1 + 4 + 2 * 16
    with pytest.raises(ValueError, match="batch size 4"):
        SpecConfig.parse("4,5,1,6")
    with pytest.raises(ValueError, match="steps \\+ 1"):
        SpecConfig.parse("1,5,1,4")
    with pytest.raises(ValueError, match="between 2 and"):
        SpecConfig.parse("1,2,2,8")
    with pytest.raises(ValueError, match="four integers"):
        SpecConfig.parse("1,5,1")
    with pytest.raises(ValueError, match="needs a draft"):
        SpecEngine(tiny_target(layers=2), None, "1,3,1,4")


# ---- losslessness --------------------------------------------------------------------------------------------------


def test_baseline_equals_hf_generate(chaotic):
    target, _ = chaotic
    for prompt in prompts(2):
        ours = generate(target, prompt, 30)
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False, min_new_tokens=30)
        assert ours.tokens == ref[0, len(prompt) :].tolist()
        assert ours.verify_count == 29 and ours.accept_length == 1.0


@pytest.mark.parametrize("config", CHAIN_AND_TREE)
def test_lossless_random_draft(chaotic, config):
    target, draft = chaotic
    assert len(set(generate(target, prompts(1)[0], 30).tokens)) > 10  # the output really varies
    for prompt in prompts(2):
        base = generate(target, prompt, 30)
        for mode in ("eagle3", "eagle"):
            spec = generate(target, prompt, 30, draft=draft, config=config, mode=mode)
            assert spec.tokens == base.tokens, (config, mode)


@pytest.mark.parametrize("config", CHAIN_AND_TREE)
def test_lossless_accepting_draft(repetitive, config):
    target, draft = repetitive
    lengths = []
    for prompt in prompts(3, seed=11):
        base = generate(target, prompt, 48)
        spec = generate(target, prompt, 48, draft=draft, config=config)
        assert spec.tokens == base.tokens
        lengths.append(spec.accept_length)
    steps = SpecConfig.parse(config).steps
    assert max(lengths) > 1.2, lengths  # the draft is really accepted ...
    assert min(lengths) < steps + 1  # ... and really rejected sometimes


def test_eos_stops_generation(chaotic):
    target, draft = chaotic
    prompt = prompts(1)[0]
    full = generate(target, prompt, 30).tokens
    eos = full[7]
    for config in ("1,0,0,0", "1,3,1,4", "1,3,2,5"):
        g = generate(target, prompt, 30, draft=draft, config=config, eos_token_ids=[eos])
        assert g.tokens == full[: full.index(eos) + 1] and g.finished_by == "eos"


# ---- adaptive drafting ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", ["1,4,1,5", "1,3,2,8", "1,4,4,12"])
def test_adaptive_drafting_is_lossless_and_drafts_less(repetitive, config):
    """fp32, chain and tree: with a confidence threshold the output is still plain greedy's, and the draft proposes
    fewer tokens (the threshold really cuts)."""
    target, draft = repetitive
    for prompt in prompts(3, seed=11):
        base = generate(target, prompt, 40)
        full = generate(target, prompt, 40, draft=draft, config=config, trace=True)
        cut = generate(target, prompt, 40, draft=draft, config=config, trace=True, threshold=0.6)
        assert full.tokens == base.tokens and cut.tokens == base.tokens
        proposed = [len(r.tokens) for r in cut.rounds]
        assert min(proposed) < max(len(r.tokens) for r in full.rounds)
        assert all(c >= 0.6 for r in cut.rounds for c in r.confidence)
        assert all(0 <= rank < SpecConfig.parse(config).topk for r in cut.rounds for rank in r.ranks)


def test_adaptive_drafting_rejects_a_bad_threshold(repetitive):
    target, draft = repetitive
    with pytest.raises(ValueError, match="threshold 1.5"):
        SpecEngine(target, draft, "1,3,1,4", threshold=1.5)


@pytest.mark.parametrize("steps,topk", [(1, 1), (4, 1), (1, 3), (2, 2), (3, 2), (3, 4)])
def test_max_draft_tokens_is_the_engines_full_tree(chaotic, monkeypatch, steps, topk):
    """decoding.config's bound is what the engine can offer: every candidate it creates (root included) when
    nothing is pruned, before the best num_draft_tokens - 1 are kept."""
    from eagle3lab.decoding import engine as module

    target, draft = chaotic
    bound = max_draft_tokens(steps, topk)
    engine = SpecEngine(target, draft, SpecConfig(1, steps, topk, bound))
    created = []
    real_prune = module.prune
    monkeypatch.setattr(module, "prune", lambda tree, *a: created.append(len(tree.tokens)) or real_prune(tree, *a))
    g = engine.generate(prompts(1)[0], 6, trace=True)
    assert all(len(r.tokens) + 1 == bound for r in g.rounds)
    assert created == ([] if topk == 1 else [bound] * len(g.rounds))


# ---- tree mask and cache rollback --------------------------------------------------------------------------------


def _example_tree(vocab):
    """root -> a, b; a -> c, d; c -> e (depths 1, 1, 2, 2, 3)."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, vocab, (6,), generator=g).tolist()
    parents = [-1, 0, 0, 1, 1, 3]
    depths = [0, 1, 1, 2, 2, 3]
    children = [[1, 2], [3, 4], [], [5], [], []]
    return DraftTree(tokens=tokens, parents=parents, depths=depths, children=children, proposal=[None] * 6)


def _branch(tree, node):
    path = []
    while node != -1:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]


@torch.inference_mode()
def test_tree_verify_logits_equal_sequential_branches(chaotic):
    target, draft = chaotic
    engine = SpecEngine(target, draft, "1,3,2,6")
    context = prompts(1)[0]
    tree = _example_tree(target.config.vocab_size)
    cache = DynamicCache(config=target.config)
    engine._target(context, 0, cache, None)
    n = len(context)
    logits, _ = engine._target(tree.tokens, n, cache, None, mask=engine._tree_mask(tree, n), depths=tree.depths)
    for leaf in (2, 4, 5):
        branch = _branch(tree, leaf)
        full = target(torch.tensor([context + [tree.tokens[i] for i in branch]])).logits[0, n:]
        torch.testing.assert_close(logits[branch], full.float(), atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_cache_rollback_keeps_exactly_the_accepted_positions(chaotic):
    target, draft = chaotic
    engine = SpecEngine(target, draft, "1,3,2,6")
    context = prompts(1)[0]
    n = len(context)
    tree = _example_tree(target.config.vocab_size)
    chain = DraftTree(
        tokens=tree.tokens[:4],
        parents=[-1, 0, 1, 2],
        depths=[0, 1, 2, 3],
        children=[[1], [2], [3], []],
        proposal=[None] * 4,
    )
    # a deep tree path and a side branch (gathered), a chain prefix (cropped), nothing accepted
    for t, rows in ((tree, [0, 1, 3, 5]), (tree, [0, 2]), (chain, [0, 1, 2]), (tree, [0])):
        cache = DynamicCache(config=target.config)
        engine._target(context, 0, cache, None)
        engine._target(t.tokens, n, cache, None, mask=engine._tree_mask(t, n), depths=t.depths)
        keep_cache_positions(cache, n, rows)
        ref = DynamicCache(config=target.config)
        target.model(input_ids=torch.tensor([context + [t.tokens[r] for r in rows]]), cache=ref, use_cache=True)
        assert cache.get_seq_length() == n + len(rows)
        for mine, theirs in zip(cache.layers, ref.layers):
            torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=1e-5)


# ---- rejection sampling preserves the target distribution --------------------------------------------------------


def test_verify_step_distribution_matches_target(chaotic):
    """The acceptance rule alone, many samples: the first emitted token is distributed as the target's p at the
    root, both for a sampled chain proposal (Leviathan) and for deterministic top-k children (point masses)."""
    target, draft = chaotic
    engine = SpecEngine(target, draft, "1,1,1,2")
    vocab = target.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, vocab, generator=gen) * 2
    p = torch.softmax(logits[0], -1)
    draft_logits = torch.randn(draft.config.draft_vocab_size, generator=gen) * 2
    q = torch.softmax(draft_logits, -1)
    # make proposals likely tokens so acceptance and rejection both happen often
    top = p.topk(3).indices.tolist()
    n = 20000
    for kind in ("sampled", "topk"):
        counts = torch.zeros(vocab)
        for _ in range(n):
            if kind == "sampled":
                d = int(torch.multinomial(q, 1, generator=gen))
                tree = DraftTree(
                    tokens=[0, engine.draft_vocab_to_target[d]],
                    parents=[-1, 0],
                    depths=[0, 1],
                    children=[[1], []],
                    proposal=[None, q],
                )
            else:
                tree = DraftTree(
                    tokens=[0] + top,
                    parents=[-1, 0, 0, 0],
                    depths=[0, 1, 1, 1],
                    children=[[1, 2, 3], [], [], []],
                    proposal=[None] * 4,
                )
            path, bonus = engine._verify(tree, logits, 1.0, gen)
            counts[tree.tokens[path[0]] if path else bonus] += 1
        tv = 0.5 * (counts / n - p).abs().sum()
        assert tv < 0.04, (kind, float(tv))
        likely = p > 5 / n
        expected = p[likely] * n
        observed = counts[likely]
        stat = chisquare(observed, expected * observed.sum() / expected.sum())
        assert stat.pvalue > 1e-4, (kind, stat)


@torch.inference_mode()
def _exact_marginals(target, prompt, temperature):
    """P(token 1), P(token 2), P(token 3) of the target's own sampling, computed exhaustively."""
    vocab = target.config.vocab_size
    p1 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1] / temperature, -1)
    seqs = torch.tensor([prompt + [a] for a in range(vocab)])
    p2_given = torch.softmax(target(seqs).logits[:, -1] / temperature, -1)  # [a, b]
    joint12 = p1[:, None] * p2_given
    seqs = torch.tensor([prompt + [a, b] for a in range(vocab) for b in range(vocab)])
    p3_given = torch.softmax(target(seqs).logits[:, -1] / temperature, -1).view(vocab, vocab, vocab)
    p3 = (joint12[:, :, None] * p3_given).sum((0, 1))
    return p1, joint12.sum(0), p3


@pytest.mark.parametrize("config,threshold", [("1,2,1,3", 0.0), ("1,2,2,4", 0.0), ("1,2,1,3", 0.1), ("1,2,2,4", 0.1)])
def test_sampling_end_to_end_matches_target_marginals(config, threshold):
    """Whole generations on a tiny model (vocab 24, draft vocab 12): the empirical marginals of tokens 2 and 3,
    which pass through draft proposals, acceptance and residual sampling, match the target's exact marginals, with
    and without adaptive drafting."""
    target = tiny_target(init=0.15, vocab=24, layers=4, hidden=32)
    draft = copying_draft(target, draft_vocab=12)
    prompt = prompts(1, vocab=24, length=6)[0]
    temperature = 1.5
    exact = _exact_marginals(target, prompt, temperature)
    engine = SpecEngine(target, draft, config, threshold=threshold)
    n = 700
    counts = torch.zeros(3, 24)
    accepted = 0
    for i in range(n):
        g = engine.generate(prompt, 3, temperature=temperature, seed=i)
        accepted += sum(g.accepted)
        for j, t in enumerate(g.tokens):
            counts[j, t] += 1
    assert accepted > 50  # proposals are accepted often enough to matter
    for j in range(3):
        tv = 0.5 * (counts[j] / n - exact[j]).abs().sum()
        assert tv < 0.12, (j, float(tv))
        likely = exact[j] > 5 / n
        stat = chisquare(counts[j][likely], exact[j][likely] * counts[j][likely].sum() / exact[j][likely].sum())
        assert stat.pvalue > 1e-4, (j, stat)


# ---- EAGLE (wrong flag) mode -------------------------------------------------------------------------------------


@torch.inference_mode()
def test_eagle_mode_skips_fc_and_uses_the_target_head(repetitive):
    target, _ = repetitive
    draft = copying_draft(target, draft_vocab=256)  # every token draftable; d2t a permutation, as trained vocabs are
    fc_calls = []
    handle = draft.fc.register_forward_hook(lambda *a: fc_calls.append(1))
    try:
        prompt = prompts(1, seed=11)[0]
        wrong = generate(target, prompt, 24, draft=draft, config="1,3,1,4", mode="eagle", trace=True)
        assert not fc_calls
        right = generate(target, prompt, 24, draft=draft, config="1,3,1,4", mode="eagle3")
        assert fc_calls
    finally:
        handle.remove()
    # the first proposal, recomputed by hand the way SGLang's EAGLE path does it
    final = target.model(input_ids=torch.tensor([prompt])).last_hidden_state
    first = wrong.tokens[0]
    _, out = draft(torch.tensor([prompt[1:] + [first]]), final, torch.arange(len(prompt))[None])
    head = target.lm_head.weight[: draft.config.draft_vocab_size]
    expected = int(draft.draft_to_target(torch.nn.functional.linear(draft.norm(out[0, -1]), head).argmax()))
    assert wrong.rounds[0].tokens[0] == expected
    # the same trained draft: accepted under EAGLE3, useless under EAGLE, and both lossless
    assert wrong.tokens == right.tokens
    assert right.accept_length > 1.5 and wrong.accept_length < 1.2


# ---- accounting --------------------------------------------------------------------------------------------------


def test_accept_length_accounting(repetitive):
    target, draft = repetitive
    prompt = prompts(1, seed=11)[0]
    g = generate(target, prompt, 200, draft=draft, config="1,4,1,5")
    assert g.finished_by == "length" and g.completion_tokens == 200
    assert g.verify_count == len(g.accepted)
    # every verify emits its accepted drafts plus one bonus token; only the last may be cut at the length limit
    assert sum(a + 1 for a in g.accepted[:-1]) < 199 <= sum(a + 1 for a in g.accepted)
    assert g.accept_length == pytest.approx(199 / g.verify_count)
    assert g.sglang_accept_length == pytest.approx(200 / g.verify_count)
    acc = g.position_acceptance
    assert len(acc) == 4 and all(a >= b for a, b in zip(acc, acc[1:]))
    assert acc[0] == pytest.approx(sum(a >= 1 for a in g.accepted) / g.verify_count)
    assert g.time_total >= g.time_prefill + g.time_draft + g.time_verify
    base = generate(target, prompt, 50)
    assert (base.verify_count, base.accept_length, base.position_acceptance) == (49, 1.0, [])
    summary = Generation(config="1,0,0,0", mode="baseline", prompt_tokens=3, tokens=[1], finished_by="eos").summary()
    assert summary["accept_length"] == 1.0 and summary["verify_count"] == 0


# ---- SmolLM2 -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_lossless_smollm2_random_draft():
    from eagle3lab.benchmark.prompts import encode_chat
    from eagle3lab.models.target import load_target

    target = load_target()
    torch.manual_seed(0)
    draft = Eagle3Draft(DraftConfig.from_target(target.model.config, draft_vocab_size=2048)).eval()
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.model.model.embed_tokens.weight)
    messages = [{"role": "user", "content": "Name three prime numbers and explain why they are prime."}]
    prompt = encode_chat(target.tokenizer, messages)
    base = generate(target.model, prompt, 24)
    ref = target.model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24)
    assert base.tokens == ref[0, len(prompt) :].tolist()
    for config in ("1,3,1,4", "1,3,2,6"):
        spec = generate(target.model, prompt, 24, draft=draft, config=config)
        assert spec.tokens == base.tokens, config


# ---- CUDA --------------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("config", ["1,3,1,4", "1,3,2,8"])
def test_cuda_engine_equals_plain_greedy_fp32(config):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    target = tiny_target(init=0.05)
    draft = copying_draft(target)
    target, draft = target.cuda(), draft.cuda()
    draft.set_vocab(draft.draft_ids)  # the same vocabulary again, from CUDA ids into a CUDA draft
    for prompt in prompts(2, seed=11):
        ref = target.generate(
            torch.tensor([prompt], device="cuda"), max_new_tokens=32, do_sample=False, min_new_tokens=32
        )
        for threshold in (0.0, 0.5):
            spec = generate(target, prompt, 32, draft=draft, config=config, threshold=threshold)
            assert spec.tokens == ref[0, len(prompt) :].tolist(), (config, threshold)
        sampled = generate(target, prompt, 8, draft=draft, config=config, temperature=1.0, seed=0)
        assert len(sampled.tokens) == 8
