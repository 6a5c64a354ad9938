"""The EAGLE-3 draft model as SGLang (`LlamaForCausalLMEagle3`) and SpecForge define it, its KV cache, the
training-time-test (TTT) unroll, and save/load in the exact checkpoint format SGLang reads (models.checkpoint)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from eagle3lab.models.checkpoint import DraftFormatError, open_checkpoint, write_checkpoint
from eagle3lab.models.draft_config import DraftConfig, llama_config

# ---- KV cache ------------------------------------------------------------------------------------------------------


class DraftCache:
    """The draft's own KV cache (one layer), with rollback. Storage grows by doubling, so appends are amortised O(1)."""

    def __init__(self):
        self.k: torch.Tensor | None = None  # [B, kv_heads, capacity, head_dim]
        self.v: torch.Tensor | None = None
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add new keys/values; return all cached keys/values (views)."""
        n = k.shape[2]
        need = self.length + n
        if self.k is None or need > self.k.shape[2] or self.k.dtype != k.dtype:
            cap = max(need, 2 * (self.k.shape[2] if self.k is not None else 64))
            new_k = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])
            new_v = v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])
            if self.k is not None and self.length:
                new_k[:, :, : self.length] = self.k[:, :, : self.length]
                new_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = new_k, new_v
        self.k[:, :, self.length : need] = k
        self.v[:, :, self.length : need] = v
        self.length = need
        return self.k[:, :, :need], self.v[:, :, :need]

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a draft cache of length {self.length} to {length}")
        self.length = length

    def select(self, keep: torch.LongTensor) -> None:
        """Keep only these cached positions, in this order (rollback after tree verification)."""
        keep = torch.as_tensor(keep, dtype=torch.long, device=self.k.device if self.k is not None else None)
        if keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= self.length):
            raise IndexError(f"select: positions {keep.tolist()} outside a cache of length {self.length}")
        if self.k is None:
            return
        n = keep.numel()
        self.k[:, :, :n] = self.k[:, :, keep].clone()
        self.v[:, :, :n] = self.v[:, :, keep].clone()
        self.length = n


# ---- modules -------------------------------------------------------------------------------------------------------


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class DraftAttention(nn.Module):
    """Llama attention whose q/k/v read the 2H-wide [embedding, hidden] input; GQA; RoPE."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if self.heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.heads} is not a multiple of num_key_value_heads {self.kv_heads}"
            )
        self.q_proj = nn.Linear(2 * cfg.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def qkv(self, x, cos, sin):
        """q [B, heads, T, D], k and v [B, kv_heads, T, D], RoPE applied to q and k."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def out(self, attn):  # [B, heads, T, D] -> [B, T, H]
        b, _, t, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class DraftDecoderLayer(nn.Module):
    """SGLang's midlayer: attention over cat[input_layernorm(embeds), hidden_norm(hidden)], residual = hidden."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.self_attn = DraftAttention(cfg)
        self.mlp = LlamaMLP(llama_config(cfg))
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    @torch.no_grad()
    def copy_target_layer(self, layer: nn.Module) -> None:
        """Start from a target decoder layer of the same shape: q/k/v's hidden half, o_proj, the MLP and the norms
        (hidden_norm takes the layer's input norm); the embedding half of q/k/v keeps its initialisation."""
        hidden = self.hidden_norm.weight.shape[0]
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(self.self_attn, name).weight[:, hidden:].copy_(getattr(layer.self_attn, name).weight)
        self.self_attn.o_proj.weight.copy_(layer.self_attn.o_proj.weight)
        self.mlp.load_state_dict(layer.mlp.state_dict())
        self.hidden_norm.weight.copy_(layer.input_layernorm.weight)
        self.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)

    def forward(self, embeds, hidden, cos, sin, attend):
        """`attend(q, k, v) -> [B, heads, T, D]` decides which keys each query sees (cache or TTT)."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        q, k, v = self.self_attn.qkv(x, cos, sin)
        h = hidden + self.self_attn.out(attend(q, k, v))
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Draft(nn.Module):
    def __init__(self, config: DraftConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # the target's embedding, frozen
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = DraftDecoderLayer(config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(llama_config(config))  # inv_freq is a non-persistent buffer
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.set_vocab(torch.arange(min(config.draft_vocab_size, config.vocab_size)))

    # -- vocab ---------------------------------------------------------------------------------------------------
    def set_vocab(self, draft_to_target_ids: torch.Tensor) -> None:
        """Install the draft vocabulary: draft id d stands for target id draft_to_target_ids[d]."""
        ids = torch.as_tensor(draft_to_target_ids, dtype=torch.long).cpu()  # checked and indexed on the CPU: any device
        if ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"draft vocab has {ids.numel()} ids, config says {self.config.draft_vocab_size}")
        if ids.unique().numel() != ids.numel() or int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError("draft vocab ids must be distinct target ids")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target id of each draft id, [draft_vocab]."""
        return self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def new_cache(self) -> DraftCache:
        return DraftCache()

    # -- forward -------------------------------------------------------------------------------------------------
    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """SGLang semantics: fc only when the width differs from H (EAGLE mode hands over an H-wide state: no fc)."""
        return self.fc(hidden) if hidden.shape[-1] != self.config.hidden_size else hidden

    def _step(self, input_ids, hidden, position_ids, attend):
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        cos, sin = self.rotary(hidden, position_ids)
        out_hidden = self.midlayer(embeds, hidden, cos, sin, attend)
        return self.lm_head(self.norm(out_hidden)), out_hidden

    def forward(self, input_ids, hidden, position_ids, cache: DraftCache | None = None, attn_mask=None):
        """Draft-vocab logits [B,T,Vd] and the pre-norm output hidden [B,T,H] (the next step's `hidden`).

        Keys/values of the new tokens are appended to `cache`. `attn_mask` [T, cache.length + T] (or [B, T, S]),
        True = may attend; None = causal over cache + new tokens."""
        t = input_ids.shape[1]
        past = cache.length if cache is not None else 0

        def attend(q, k, v):
            if cache is not None:
                k, v = cache.append(k, v)
            if attn_mask is None:
                mask = (
                    torch.arange(past + t, device=q.device)[None, :]
                    <= (past + torch.arange(t, device=q.device))[:, None]
                )
            else:
                mask = attn_mask.to(q.device, torch.bool)
                if mask.shape[-2:] != (t, past + t):
                    raise ValueError(f"attn_mask has shape {tuple(mask.shape)}, expected [..., {t}, {past + t}]")
                if mask.dim() == 3:
                    mask = mask[:, None]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])

        return self._step(input_ids, hidden, position_ids, attend)

    def ttt_forward(self, input_ids, hidden, position_ids, steps: int, first: int = 0) -> list[torch.Tensor]:
        """Training-time test: unroll the draft `steps` times over a whole sequence at once.

        Draft position t pairs token input_ids[t] with hidden[t] (already projected). At step i it reads the token
        i places later (input_ids[t + i], zero past the end: those positions carry no loss) and its own output
        hidden from step i-1, at position position_ids[t] + i, exactly what inference feeds the chain rooted at t.
        Attention at step i: step-0 keys of positions <= t (causal) plus this position's own keys of steps 1..i,
        i.e. what the inference path with a DraftCache sees when it drafts i tokens after position t.
        Returns the draft-vocab logits of each step, [B, T, Vd] each. With `first` > 0 the steps after the first run
        only from position `first` on (their logits are [B, T - first, Vd]): chains rooted in an answer need no more,
        and the first step still runs everywhere, as the keys every later step attends to."""
        b, t = input_ids.shape
        causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
        keys, values, logits = [], [], []
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        scale = 1.0 / math.sqrt(self.config.head_dim)

        def attend(q, k, v):
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
            keys.append(k)
            values.append(v)
            scores = torch.matmul(q, keys[0].transpose(-1, -2)) * scale
            scores = scores.masked_fill(~causal[t - q.shape[-2] :], float("-inf"))  # the query rows' causal block
            # own keys from steps 1..i: one score per position (a diagonal), appended after the causal block
            diag = [(q * kj).sum(-1, keepdim=True) * scale for kj in keys[1:]]
            probs = torch.softmax(torch.cat([scores, *diag], dim=-1).float(), dim=-1).to(q.dtype)
            out = torch.matmul(probs[..., :t], values[0])
            for j, vj in enumerate(values[1:]):
                out = out + probs[..., t + j : t + j + 1] * vj
            return out

        ids, positions = input_ids, position_ids
        for i in range(steps):
            if i:
                ids = F.pad(input_ids[:, i:], (0, i))[:, first:]
                positions = position_ids[:, first:] + i
            step_logits, hidden = self._step(ids, hidden, positions, attend)
            hidden = hidden[:, first:] if i == 0 else hidden
            logits.append(step_logits)
        return logits


# ---- save / load ---------------------------------------------------------------------------------------------------

EMBEDDING = "embed_tokens.weight"


def expected_keys(model: Eagle3Draft) -> set[str]:
    return set(model.state_dict().keys())


def save_draft(
    model: Eagle3Draft,
    folder,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int | None = None,
    with_embedding: bool = True,
) -> Path:
    """Write config.json + safetensors with exactly SGLang's keys. Atomic.

    `dtype` casts the floating tensors (d2t/t2d keep theirs); `max_shard_bytes` shards the weights so no file
    exceeds it; `with_embedding=False` leaves out the frozen target embedding (load_draft restores it from the
    target), which is most of a small draft's bytes."""
    state = {k: v.detach() for k, v in model.state_dict().items() if with_embedding or k != EMBEDDING}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    config = model.config.to_sglang()
    config["torch_dtype"] = str(state["fc.weight"].dtype).removeprefix("torch.")
    return write_checkpoint(folder, config, state, max_shard_bytes=max_shard_bytes)


def _target_embedding(target) -> torch.Tensor:
    model = getattr(target, "model", target)  # a Target, or a HF model
    if isinstance(model, torch.Tensor):
        return model
    return model.get_input_embeddings().weight


def _complete(state: dict, config: DraftConfig, target) -> None:
    """Fill in what a draft may leave out: the embedding (from the target), d2t (identity vocab), t2d (from d2t)."""
    if EMBEDDING not in state and target is not None:
        state[EMBEDDING] = _target_embedding(target).detach().cpu()
    if "d2t" not in state and config.draft_vocab_size == config.vocab_size:
        state["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    if "t2d" not in state and "d2t" in state:
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[state["d2t"].long() + torch.arange(state["d2t"].numel())] = True
        state["t2d"] = t2d


def load_draft(folder, target=None, dtype: torch.dtype | None = None) -> Eagle3Draft:
    """Load a draft in SGLang/SpecForge format (also `layers.0.*` and `model.`-prefixed variants, and shards).

    A missing `embed_tokens.weight` is taken from `target` (a Target, a HF model or the embedding tensor); a missing
    `t2d` is rebuilt from `d2t`. Any other missing or unexpected key raises DraftFormatError listing them all."""
    checkpoint = open_checkpoint(folder)
    config = DraftConfig.from_sglang(checkpoint.config, where=str(checkpoint.folder / "config.json"))
    if any(f.suffix != ".safetensors" for f in checkpoint.files):
        raise DraftFormatError(f"{folder}: no *.safetensors weights (pytorch_model.bin is not supported)")
    state = checkpoint.tensors()
    model = Eagle3Draft(config)
    _complete(state, config, target)
    expected = expected_keys(model)
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        hint = f" ({EMBEDDING} is absent: pass the target to load_draft)" if EMBEDDING in missing else ""
        raise DraftFormatError(f"{folder}: missing keys {missing}, unexpected keys {unexpected}{hint}")
    own = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} != {tuple(own[k].shape)}" for k, v in state.items() if v.shape != own[k].shape]
    if wrong:
        raise DraftFormatError(f"{folder}: shape mismatch: {', '.join(wrong)}")
    state["d2t"] = state["d2t"].long()
    state["t2d"] = state["t2d"].bool()
    model.load_state_dict(state)
    if dtype is not None:
        model.to(dtype)
    return model.eval()
