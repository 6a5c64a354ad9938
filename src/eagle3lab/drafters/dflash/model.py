"""The DFlash block drafter as vLLM (`qwen3_dflash.py`) and llama.cpp (`src/models/dflash.cpp`) run it, and its
checkpoint in the z-lab layout both read (config.json + model.safetensors, no embedding, no head).

One forward drafts a whole block. The target's features from K layers are fused once (`hidden_norm(fc(concat))`)
into the context; every draft layer projects that context to keys and values (its own k_proj, k_norm and RoPE, no
input norm). The block is the anchor (the last token the target emitted) followed by mask tokens, embedded by the
target; its queries see the context strictly before the anchor and the whole block both ways. Slot k's output, through
the final norm and the target's own head, drafts the token k places after the anchor."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from eagle3lab.drafters.dflash.config import DFlashConfig
from eagle3lab.models.checkpoint import DraftFormatError, _read_file, open_checkpoint, write_checkpoint
from eagle3lab.models.draft_config import llama_config


def _rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = LlamaRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)

    def keys_values(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values [B, kv_heads, T, D] of a stream: the fused context or the block."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return _rotate(k, cos[:, None], sin[:, None]), v

    def forward(self, x, context_kv, cos, sin, mask):
        """`x` [B, Q, H]: the normed block stream; `context_kv`: the context's keys and values; `mask` [B, Q, S + Q]
        (True = may attend)."""
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.heads, self.head_dim)).transpose(1, 2)
        q = _rotate(q, cos[:, None], sin[:, None])
        k, v = self.keys_values(x, cos, sin)
        k, v = torch.cat([context_kv[0], k], dim=2), torch.cat([context_kv[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.heads * self.head_dim))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = LlamaMLP(llama_config(cfg))
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, h, context_kv, cos, sin, mask):
        h = h + self.self_attn(self.input_layernorm(h), context_kv, cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    """The trained part of a DFlash draft. The target's embedding and head are passed in, never owned: frozen,
    shared, and left out of the checkpoint, as the engines expect."""

    def __init__(self, config: DFlashConfig):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        super().__init__()
        self.config = config
        k = len(config.target_layer_ids)
        self.fc = nn.Linear(k * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(llama_config(config))  # inv_freq: a non-persistent buffer
        self.apply(self._init)

    @staticmethod
    def _init(module):
        if isinstance(module, nn.Linear):  # Qwen3's initializer_range, as the reference drafts start
            nn.init.normal_(module.weight, std=0.02)

    def context(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values of the context: the target's features [B, S, K*H] (their layers' concat) at
        `positions` [B, S]. Appending a later context's to an earlier one's equals computing them together."""
        fused = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        cos, sin = self.rotary(fused, positions)
        return [layer.self_attn.keys_values(fused, cos, sin) for layer in self.layers]

    def forward(self, block_embeds, positions, context_kv, mask) -> torch.Tensor:
        """The block's output states [B, Q, H] (after the final norm): `block_embeds` [B, Q, H] the target's
        embedding of each block's anchor and mask tokens, at `positions` [B, Q]; `mask` [B, Q, S + Q]."""
        h = block_embeds.to(self.fc.weight.dtype)
        cos, sin = self.rotary(h, positions)
        for layer, kv in zip(self.layers, context_kv, strict=True):
            h = layer(h, kv, cos, sin, mask)
        return self.norm(h)


def block_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """[N * block_size, context_len + N * block_size] for N blocks anchored at `anchors` [N]: a block's queries see
    the context strictly before their anchor (its own features do not exist yet when it is drafted) and their whole
    block, both ways; nothing of any other block."""
    n = anchors.numel()
    slot_block = torch.arange(n, device=anchors.device).repeat_interleave(block_size)
    sees_context = torch.arange(context_len, device=anchors.device)[None] < anchors[slot_block][:, None]
    sees_block = slot_block[:, None] == slot_block[None]
    return torch.cat([sees_context, sees_block], dim=1)


def draft_blocks(
    draft: DFlashDraft, embed: torch.Tensor, head: torch.Tensor, features, ids, anchors, drafted: int | None = None
) -> torch.Tensor:
    """The target-vocabulary logits [N, drafted, V] of the blocks anchored at `anchors` [N] along one text:
    `features` [T, K*H] the target's, `ids` [T] its tokens; slot k of a block anchored at a drafts token a + k.
    `drafted` (default block_size - 1): the mask tokens after the anchor. Fewer is the block the engines run at
    k < block_size - 1: truncated, and the slots, which see each other, see fewer masks than in training."""
    size, t = 1 + (draft.config.drafted if drafted is None else drafted), ids.numel()
    device = next(draft.parameters()).device
    positions = torch.arange(t, device=device)
    context_kv = draft.context(features[None].to(device), positions[None])
    block_ids = torch.full((anchors.numel(), size), draft.config.mask_token_id, dtype=torch.long, device=device)
    block_ids[:, 0] = ids.to(device)[anchors]
    block_positions = (anchors.to(device)[:, None] + torch.arange(size, device=device)).reshape(1, -1)
    mask = block_mask(anchors.to(device), t, size)[None]
    out = draft(F.embedding(block_ids.reshape(1, -1), embed), block_positions, context_kv, mask)
    return F.linear(out.view(anchors.numel(), size, -1)[:, 1:], head.to(out.dtype)).float()


# ---- save / load -------------------------------------------------------------------------------------------------


def save_dflash(draft: DFlashDraft, folder, dtype: torch.dtype | None = None) -> Path:
    """config.json + model.safetensors in the z-lab layout (no embedding, no head). Atomic."""
    state = {k: v.detach() for k, v in draft.state_dict().items()}
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    config = draft.config.to_hf()
    config["torch_dtype"] = str(state["fc.weight"].dtype).removeprefix("torch.")
    return write_checkpoint(folder, config, state)


def load_dflash(folder, dtype: torch.dtype | None = None) -> DFlashDraft:
    """A DFlash draft in the z-lab layout (also `model.`-prefixed keys); any missing or unexpected key, or a shape
    off the config, raises DraftFormatError naming them."""
    checkpoint = open_checkpoint(folder)
    config = DFlashConfig.from_hf(checkpoint.config, where=str(checkpoint.folder / "config.json"))
    # raw names: the EAGLE-3 reading (checkpoint.tensors) maps layers.0 to its own midlayer
    state = {k.removeprefix("model."): v for f in checkpoint.files for k, v in _read_file(f, None).items()}
    draft = DFlashDraft(config)
    own = draft.state_dict()
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    if missing or unexpected:
        raise DraftFormatError(f"{folder}: missing keys {missing}, unexpected keys {unexpected}")
    wrong = [f"{k} {tuple(v.shape)} != {tuple(own[k].shape)}" for k, v in state.items() if v.shape != own[k].shape]
    if wrong:
        raise DraftFormatError(f"{folder}: shape mismatch: {', '.join(wrong)}")
    draft.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
    if dtype is not None:
        draft.to(dtype)
    return draft.eval()
