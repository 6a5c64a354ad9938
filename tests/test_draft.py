"""The EAGLE-3 draft: shapes, SGLang semantics, cache rollback, TTT = inference, and the checkpoint format."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from conftest import TINY_WIDTH
from eagle3lab.models.checkpoint import HEADER_ROOM, open_checkpoint
from eagle3lab.models.draft import DraftCache, DraftConfig, DraftFormatError, Eagle3Draft, load_draft, save_draft

SGLANG_KEYS = {
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    "embed_tokens.weight",
}


def target_config(**kw):
    base = {
        **TINY_WIDTH,
        "intermediate_size": 96,
        "vocab_size": 300,
        "max_position_embeddings": 512,
        "num_hidden_layers": 6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e4},
    }
    return LlamaConfig(**{**base, **kw})


def make_draft(seed=0, draft_vocab=50):
    torch.manual_seed(seed)
    draft = Eagle3Draft(DraftConfig.from_target(target_config(), draft_vocab, aux_layer_ids=[1, 2, 3]))
    with torch.no_grad():  # non-trivial norms and weights so every parameter matters
        for name, p in draft.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.1 if "norm" in name else 0.2)
    draft.set_vocab(torch.randperm(300)[:draft_vocab])
    return draft.eval()


def inputs(draft, b=2, t=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, draft.config.vocab_size, (b, t), generator=g)
    aux = torch.randn(b, t, 3 * draft.config.target_hidden_size, generator=g)
    return ids, aux, torch.arange(t).expand(b, t)


def test_config_from_target_and_sglang_json():
    cfg = DraftConfig.from_target(target_config(), 50, aux_layer_ids=[1, 2, 3])
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.rope_theta, cfg.max_position_embeddings) == (16, 2, 5e4, 512)
    j = cfg.to_sglang()
    assert j["architectures"] == ["LlamaForCausalLMEagle3"]
    assert j["num_hidden_layers"] == 1 and j["draft_vocab_size"] == 50 and j["target_hidden_size"] == 64
    assert j["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True}
    assert j["tie_word_embeddings"] is False  # SGLang would tie lm_head to the embedding otherwise
    assert DraftConfig.from_sglang(json.loads(json.dumps(j))) == cfg
    assert (
        "eagle_aux_hidden_state_layer_ids"
        not in DraftConfig.from_target(target_config(), 50).to_sglang()["eagle_config"]
    )


def test_shapes_vocab_maps_and_project():
    draft = make_draft()
    ids, aux, pos = inputs(draft)
    hidden = draft.project(aux)
    assert hidden.shape == (2, 10, 64)
    assert draft.project(hidden) is hidden  # H-wide input (EAGLE mode): fc skipped, as SGLang does
    logits, out = draft(ids, hidden, pos)
    assert logits.shape == (2, 10, 50) and out.shape == (2, 10, 64)
    d = torch.arange(50)
    target_ids = draft.draft_to_target(d)
    assert torch.equal(target_ids, draft.draft_ids) and draft.t2d[target_ids].all() and int(draft.t2d.sum()) == 50
    assert not draft.embed_tokens.weight.requires_grad


def test_cache_incremental_equals_full_and_rollback():
    draft = make_draft()
    ids, aux, pos = inputs(draft, b=1, t=12)
    hidden = draft.project(aux)
    full, _ = draft(ids, hidden, pos)
    cache = draft.new_cache()
    parts = [draft(ids[:, a:b], hidden[:, a:b], pos[:, a:b], cache)[0] for a, b in ((0, 5), (5, 6), (6, 12))]
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    # crop back and recompute the tail: same logits
    cache.crop(7)
    tail, _ = draft(ids[:, 7:], hidden[:, 7:], pos[:, 7:], cache)
    torch.testing.assert_close(tail, full[:, 7:], atol=1e-5, rtol=1e-5)
    # select: keep positions 0..3 and 5 (a tree branch), then position 5's successor sees exactly those keys
    cache.crop(6)
    cache.select(torch.tensor([0, 1, 2, 3, 5]))
    assert cache.length == 5
    got, _ = draft(ids[:, 6:7], hidden[:, 6:7], pos[:, 6:7], cache)
    mask = torch.tensor([[True, True, True, True, False, True, True]])
    ref_cache = draft.new_cache()
    draft(ids[:, :6], hidden[:, :6], pos[:, :6], ref_cache)
    want, _ = draft(ids[:, 6:7], hidden[:, 6:7], pos[:, 6:7], ref_cache, attn_mask=mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        cache.crop(99)
    with pytest.raises(ValueError, match="attn_mask"):
        draft(ids[:, :2], hidden[:, :2], pos[:, :2], draft.new_cache(), attn_mask=torch.ones(2, 3, dtype=torch.bool))


def test_tree_mask_isolates_branches():
    """Two sibling tokens at the same depth must not see each other (tree attention)."""
    draft = make_draft()
    ids, aux, pos = inputs(draft, b=1, t=6)
    hidden = draft.project(aux)
    cache = draft.new_cache()
    draft(ids[:, :4], hidden[:, :4], pos[:, :4], cache)
    mask = torch.tensor([[True] * 4 + [True, False], [True] * 4 + [False, True]])
    sib_pos = torch.tensor([[4, 4]])
    both, _ = draft(ids[:, 4:6], hidden[:, 4:6], sib_pos, cache, attn_mask=mask)
    for j in range(2):
        c = draft.new_cache()
        draft(ids[:, :4], hidden[:, :4], pos[:, :4], c)
        alone, _ = draft(ids[:, 4 + j : 5 + j], hidden[:, 4 + j : 5 + j], sib_pos[:, :1], c)
        torch.testing.assert_close(both[:, j], alone[:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps", [1, 4])
def test_ttt_unroll_equals_inference_with_cache(steps):
    """Training-time step-i logits at position p == what inference computes when drafting i tokens after p."""
    draft = make_draft()
    ids, aux, pos = inputs(draft, b=2, t=11)
    hidden = draft.project(aux)
    with torch.no_grad():
        ttt = draft.ttt_forward(ids, hidden, pos, steps)
        assert len(ttt) == steps and ttt[0].shape == (2, 11, 50)
        for p in (0, 4, 11 - steps):
            cache = draft.new_cache()
            logits, out = draft(ids[:, : p + 1], hidden[:, : p + 1], pos[:, : p + 1], cache)
            torch.testing.assert_close(logits[:, p], ttt[0][:, p], atol=1e-5, rtol=1e-4)
            h = out[:, p : p + 1]
            for i in range(1, steps):
                logits, h = draft(ids[:, p + i : p + i + 1], h, pos[:, p : p + 1] + i, cache)
                torch.testing.assert_close(logits[:, 0], ttt[i][:, p], atol=1e-5, rtol=1e-4)
                assert cache.length == p + 1 + i


def test_ttt_step_attention_is_not_plain_causal():
    """A model whose step-i attention were plain causal over its own outputs would differ: the test above bites."""
    draft = make_draft()
    ids, aux, pos = inputs(draft, b=1, t=8)
    hidden = draft.project(aux)
    with torch.no_grad():
        ttt = draft.ttt_forward(ids, hidden, pos, 2)
        _, out0 = draft(ids, hidden, pos)
        naive, _ = draft(torch.nn.functional.pad(ids[:, 1:], (0, 1)), out0, pos + 1)
    assert not torch.allclose(naive[:, 3], ttt[1][:, 3], atol=1e-3)


def test_save_load_round_trip_identical_logits(tmp_path):
    draft = make_draft()
    save_draft(draft, tmp_path / "d")
    keys = set(load_file(str(tmp_path / "d" / "model.safetensors")))
    assert keys == SGLANG_KEYS
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    back = load_draft(tmp_path / "d")
    ids, aux, pos = inputs(draft)
    with torch.no_grad():
        a = draft(ids, draft.project(aux), pos)[0]
        b = back(ids, back.project(aux), pos)[0]
    assert torch.equal(a, b)
    assert torch.equal(back.d2t, draft.d2t) and torch.equal(back.t2d, draft.t2d)


def _rewrite(folder, fn):
    path = folder / "model.safetensors"
    state = fn(load_file(str(path)))
    save_file(state, str(path))


def test_load_variants_layers0_no_embed_no_t2d(tmp_path):
    draft = make_draft()
    save_draft(draft, tmp_path / "d")
    emb = draft.embed_tokens.weight.detach().clone()

    def variant(state):
        out = {
            k.replace("midlayer.", "layers.0."): v for k, v in state.items() if k not in ("embed_tokens.weight", "t2d")
        }
        return out

    _rewrite(tmp_path / "d", variant)
    with pytest.raises(DraftFormatError, match="embed_tokens.weight"):
        load_draft(tmp_path / "d")
    back = load_draft(tmp_path / "d", target=emb)
    ids, aux, pos = inputs(draft)
    with torch.no_grad():
        assert torch.equal(draft(ids, draft.project(aux), pos)[0], back(ids, back.project(aux), pos)[0])
    assert torch.equal(back.t2d, draft.t2d)


def test_load_reports_missing_and_unexpected_keys(tmp_path):
    draft = make_draft()
    save_draft(draft, tmp_path / "d")

    def broken(state):
        state.pop("fc.weight")
        state.pop("midlayer.hidden_norm.weight")
        state["midlayer.extra.weight"] = torch.zeros(2)
        return state

    _rewrite(tmp_path / "d", broken)
    with pytest.raises(DraftFormatError) as e:
        load_draft(tmp_path / "d")
    msg = str(e.value)
    assert "fc.weight" in msg and "midlayer.hidden_norm.weight" in msg and "midlayer.extra.weight" in msg


def test_load_rejects_wrong_shape_and_missing_config(tmp_path):
    draft = make_draft()
    save_draft(draft, tmp_path / "d")
    _rewrite(tmp_path / "d", lambda s: {**s, "lm_head.weight": torch.zeros(7, 64)})
    with pytest.raises(DraftFormatError, match="lm_head.weight"):
        load_draft(tmp_path / "d")
    (tmp_path / "e").mkdir()
    with pytest.raises(DraftFormatError, match="config.json"):
        load_draft(tmp_path / "e")


def test_sharded_bf16_draft_without_embedding_round_trips(tmp_path):
    """Issue 11's committed-draft form: bf16, no frozen embedding, every file under a cap; load_draft restores it."""
    draft = make_draft()
    cap = 40_000 + HEADER_ROOM  # forces several shards for this tiny draft
    save_draft(draft, tmp_path / "d", dtype=torch.bfloat16, max_shard_bytes=cap, with_embedding=False)
    shards = sorted((tmp_path / "d").glob("*.safetensors"))
    assert len(shards) > 1 and all(f.stat().st_size <= cap for f in shards)
    index = json.loads((tmp_path / "d" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == SGLANG_KEYS - {"embed_tokens.weight"}
    checkpoint = open_checkpoint(tmp_path / "d")
    shapes = checkpoint.shapes()
    assert shapes["fc.weight"] == ([64, 192], "bfloat16") and shapes["d2t"][1] == "int64"
    assert "embed_tokens.weight" not in shapes and checkpoint.tensor("absent") is None
    assert torch.equal(checkpoint.tensor("d2t"), draft.d2t)
    with pytest.raises(DraftFormatError, match="embed_tokens.weight"):
        load_draft(tmp_path / "d")
    back = load_draft(tmp_path / "d", target=draft.embed_tokens.weight)
    ref = Eagle3Draft(draft.config)  # what bf16 storage keeps of each weight; the embedding comes from the target
    ref.load_state_dict(
        {
            k: v.bfloat16().float() if v.is_floating_point() and "embed" not in k else v
            for k, v in draft.state_dict().items()
        }
    )
    ids, aux, pos = inputs(draft)
    with torch.no_grad():
        assert torch.equal(ref(ids, ref.project(aux), pos)[0], back(ids, back.project(aux), pos)[0])
    with pytest.raises(ValueError, match="over the shard cap"):
        save_draft(draft, tmp_path / "e", max_shard_bytes=70 * 1024)


def test_checkpoint_errors_name_the_file_and_field(tmp_path):
    draft = make_draft()
    save_draft(draft, tmp_path / "d", max_shard_bytes=100_000)
    index = tmp_path / "d" / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"fc.weight": "model-00009-of-00009.safetensors"}}))
    with pytest.raises(DraftFormatError, match="index.json.*model-00009"):
        open_checkpoint(tmp_path / "d")
    index.write_text("{}")
    with pytest.raises(DraftFormatError, match="index.json: field 'weight_map'"):
        open_checkpoint(tmp_path / "d")
    index.write_text("not json")
    with pytest.raises(DraftFormatError, match="index.json: unreadable"):
        open_checkpoint(tmp_path / "d")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.json").write_text("[1]")
    with pytest.raises(DraftFormatError, match="config.json: expected a JSON object"):
        open_checkpoint(tmp_path / "e")
    (tmp_path / "e" / "config.json").write_text(json.dumps(draft.config.to_sglang()))
    (tmp_path / "e" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(DraftFormatError, match="model.safetensors: cannot read"):
        open_checkpoint(tmp_path / "e").shapes()


def test_cache_select_on_batch_and_dtype():
    cache = DraftCache()
    k = torch.arange(6.0).view(1, 1, 6, 1)
    cache.append(k, k)
    cache.select(torch.tensor([4, 0]))
    assert cache.length == 2 and cache.k[0, 0, :2, 0].tolist() == [4.0, 0.0]
    with pytest.raises(IndexError):
        cache.select(torch.tensor([2]))


def test_smollm2_draft_config_and_forward():
    """Integration: the draft shaped from the real SmolLM2 target config serialises as SGLang expects and runs."""
    from eagle3lab.models.target import load_target

    target = load_target()
    cfg = DraftConfig.from_target(target.model.config, 1024)
    j = cfg.to_sglang()
    assert (j["hidden_size"], j["target_hidden_size"], j["num_key_value_heads"], j["head_dim"]) == (576, 576, 3, 64)
    assert j["max_position_embeddings"] == 8192 and j["rope_theta"] == 100000.0 and j["vocab_size"] == 49152
    draft = Eagle3Draft(cfg)
    draft.embed_tokens.weight.data.copy_(target.model.get_input_embeddings().weight)
    assert draft.fc.in_features == 3 * 576
    logits, out = draft(torch.tensor([[1, 2, 3]]), draft.project(torch.randn(1, 3, 1728)), torch.arange(3)[None])
    assert logits.shape == (1, 3, 1024) and torch.isfinite(logits).all()
