"""A DFlash draft's configuration: the z-lab `DFlashDraftModel` config.json that vLLM (`qwen3_dflash.py`) and
llama.cpp's converter (`conversion/qwen.py`, class DFlashModel) read, built from a target's config or read back.

The traps are in the fields (docs/dflash.md): `block_size` (llama.cpp's converter reads dflash_config's, else the top
level's, else 16; vLLM reads neither: its block is num_speculative_tokens + 1); `dflash_config.target_layer_ids`
counts the z-lab way (id i is the output of target layer i, HF hidden_states[i + 1]; vLLM and llama.cpp add the 1
themselves); `dflash_config.mask_token_id` must be the token the draft was trained with (llama.cpp silently drafts
nothing when it is missing); and every layer is full, non-causal attention (`is_causal` false)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from eagle3lab.models.checkpoint import DraftFormatError
from eagle3lab.models.draft_config import _rope_from_hf, target_shape

ARCHITECTURE = "DFlashDraftModel"


def drafted_by(draft) -> int:
    """The tokens a whole block of a draft folder drafts (its config.json's block_size - 1): the most a round of it
    can draft, and the k it is served at unless `tune` chose fewer."""
    from eagle3lab.models.checkpoint import read_json

    return DFlashConfig.from_hf(read_json(Path(draft) / "config.json"), f"{draft}/config.json").drafted


def default_target_layers(num_target_layers: int) -> list[int]:
    """The layers an EAGLE-3 draft of this target reads (SGLang's default inputs of layers 2, N/2 and N-3), in DFlash
    ids: so a DFlash draft trains from the same feature cache as the EAGLE-3 drafts. [1, 14, 26] for SmolLM2."""
    return [1, num_target_layers // 2 - 1, num_target_layers - 4]


@dataclass
class DFlashConfig:
    hidden_size: int  # the target's: llama.cpp fuses the target's features to this width
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary: the draft drafts with the target's own head
    num_target_layers: int
    target_layer_ids: list[int]  # z-lab ids: the output of target layer i (HF hidden_states[i + 1])
    mask_token_id: int  # the token filling the block's slots after the anchor, embedded by the target
    block_size: int = 4  # the anchor plus block_size - 1 drafted tokens
    num_hidden_layers: int = 1
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    hidden_act: str = "silu"
    extra: dict = field(default_factory=dict, repr=False, compare=False)  # unrelated keys, written back

    @property
    def drafted(self) -> int:
        """Tokens a block drafts: vLLM's num_speculative_tokens, llama.cpp's --spec-draft-n-max."""
        return self.block_size - 1

    @classmethod
    def from_target(cls, target_config, *, mask_token_id: int, block_size: int = 4, num_hidden_layers: int = 1,
                    target_layer_ids: list[int] | None = None) -> DFlashConfig:  # fmt: skip
        """A draft as wide as the target, with its attention and MLP shapes (the z-lab and SpecForge convention)."""
        layers = target_config.num_hidden_layers
        return cls(
            **target_shape(target_config),
            num_target_layers=layers,
            target_layer_ids=list(target_layer_ids or default_target_layers(layers)),
            mask_token_id=int(mask_token_id),
            block_size=int(block_size),
            num_hidden_layers=int(num_hidden_layers),
        ).checked()

    def checked(self, where: str = "the DFlash config") -> DFlashConfig:
        if self.block_size < 2:
            raise DraftFormatError(f"{where}: block_size {self.block_size}: a block needs the anchor and a draft")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DraftFormatError(f"{where}: mask_token_id {self.mask_token_id} is outside the vocabulary")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers - 1]
        if bad or not self.target_layer_ids:
            # the last layer's output is the final state, which llama.cpp does not capture (an assert at load)
            raise DraftFormatError(
                f"{where}: target_layer_ids {self.target_layer_ids}: expected ids 0..{self.num_target_layers - 2} "
                f"of a {self.num_target_layers}-layer target"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise DraftFormatError(f"{where}: num_attention_heads is not a multiple of num_key_value_heads")
        return self

    def to_hf(self) -> dict:
        out = dict(self.extra)
        out.update(
            {
                "architectures": [ARCHITECTURE],
                "model_type": "qwen3",
                "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "num_hidden_layers": self.num_hidden_layers,
                "num_target_layers": self.num_target_layers,
                "vocab_size": self.vocab_size,
                "block_size": self.block_size,  # both places: the converter reads either
                "dflash_config": {
                    "block_size": self.block_size,
                    "mask_token_id": self.mask_token_id,
                    "target_layer_ids": self.target_layer_ids,
                },
                "layer_types": ["full_attention"] * self.num_hidden_layers,
                "is_causal": False,
                "use_sliding_window": False,
                "sliding_window": None,
                "max_position_embeddings": self.max_position_embeddings,
                "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta,
                "rope_scaling": None,
                "hidden_act": self.hidden_act,
                "attention_bias": False,
                "tie_word_embeddings": False,
            }
        )
        return out

    @classmethod
    def from_hf(cls, cfg: dict, where: str = "config.json") -> DFlashConfig:
        def need(key, holder=cfg, name=None):
            if key not in holder:
                raise DraftFormatError(f"{where}: missing field '{name or key}'")
            return holder[key]

        if ARCHITECTURE not in (cfg.get("architectures") or []):
            raise DraftFormatError(f"{where}: architectures {cfg.get('architectures')}: expected ['{ARCHITECTURE}']")
        dflash = cfg.get("dflash_config") or {}
        block = cfg.get("block_size", dflash.get("block_size"))
        if block is None:
            raise DraftFormatError(
                f"{where}: missing field 'block_size' (llama.cpp then takes 16, vLLM never reads it)"
            )
        if dflash.get("block_size", block) != block:
            raise DraftFormatError(
                f"{where}: block_size {block} at the top level, {dflash['block_size']} in dflash_config "
                "(llama.cpp's converter takes dflash_config's)"
            )
        if cfg.get("is_causal") or dflash.get("causal"):
            raise DraftFormatError(f"{where}: is_causal is true: a DFlash block attends both ways")
        theta, _ = _rope_from_hf(_Attributes(cfg))
        heads = need("num_attention_heads")
        known = {f.name for f in fields(cls)} | {"architectures", "dflash_config", "rope_parameters", "is_causal"}
        return cls(
            hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            vocab_size=need("vocab_size"),
            num_target_layers=need("num_target_layers"),
            target_layer_ids=list(need("target_layer_ids", dflash, "dflash_config.target_layer_ids")),
            mask_token_id=int(need("mask_token_id", dflash, "dflash_config.mask_token_id")),
            block_size=int(block),
            num_hidden_layers=cfg.get("num_hidden_layers", 1),
            max_position_embeddings=cfg.get("max_position_embeddings", 8192),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            hidden_act=cfg.get("hidden_act", "silu"),
            extra={k: v for k, v in cfg.items() if k not in known},
        ).checked(where)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        return d


class _Attributes:
    """A config dict read as attributes (what _rope_from_hf reads)."""

    def __init__(self, cfg: dict):
        self.__dict__.update(cfg)
