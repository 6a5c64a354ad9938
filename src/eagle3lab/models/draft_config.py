"""The draft's configuration: SGLang's `LlamaForCausalLMEagle3` config.json, built from a target's config or read
back from a file (any unrelated keys are kept and written back)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from eagle3lab.models.checkpoint import DraftFormatError

ARCHITECTURE = "LlamaForCausalLMEagle3"


def _rope_from_hf(cfg) -> tuple[float, dict | None]:
    """(rope_theta, legacy rope_scaling) from a HF config of either transformers 4 (rope_theta/rope_scaling) or 5
    (rope_parameters)."""
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return float(params["rope_theta"]), (scaling if scaling.get("rope_type", "default") != "default" else None)
    return float(getattr(cfg, "rope_theta", 10000.0)), getattr(cfg, "rope_scaling", None)


def target_shape(target_config) -> dict:
    """A draft layer shaped like one of the target's (SGLang's, SpecForge's and z-lab's convention): the fields
    EAGLE-3's and DFlash's configs share, rope_theta included."""
    heads = target_config.num_attention_heads
    return dict(
        hidden_size=target_config.hidden_size,
        intermediate_size=target_config.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
        vocab_size=target_config.vocab_size,
        # A short context window silently ruins acceptance on long prompts: never below the target's.
        max_position_embeddings=target_config.max_position_embeddings,
        rms_norm_eps=float(target_config.rms_norm_eps),
        rope_theta=_rope_from_hf(target_config)[0],
        hidden_act=getattr(target_config, "hidden_act", "silu"),
    )


def llama_config(cfg):
    """The transformers LlamaConfig of a draft config (EAGLE-3's or DFlash's) for the Llama modules it reuses."""
    from transformers import LlamaConfig

    rope = {"rope_type": "default", **(getattr(cfg, "rope_scaling", None) or {}), "rope_theta": cfg.rope_theta}
    if "type" in rope and rope["rope_type"] == "default":
        rope["rope_type"] = rope.pop("type")
    return LlamaConfig(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        hidden_act=cfg.hidden_act,
        rope_parameters=rope,
        vocab_size=cfg.vocab_size,
    )


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int] | None = None  # eagle_aux_hidden_state_layer_ids; None = SGLang's defaults
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    hidden_act: str = "silu"
    extra: dict = field(
        default_factory=dict, repr=False, compare=False
    )  # unrelated keys of a loaded config.json, written back

    @classmethod
    def from_target(cls, target_config, draft_vocab_size: int, aux_layer_ids: list[int] | None = None) -> DraftConfig:
        """A draft shaped like one layer of the target (SGLang's and SpecForge's convention)."""
        return cls(
            **target_shape(target_config),
            draft_vocab_size=int(draft_vocab_size),
            target_hidden_size=target_config.hidden_size,
            aux_layer_ids=list(aux_layer_ids) if aux_layer_ids is not None else None,
            rope_scaling=_rope_from_hf(target_config)[1],
        )

    def to_sglang(self) -> dict:
        out = dict(self.extra)
        out.update(
            {
                "architectures": [ARCHITECTURE],
                "model_type": "llama",
                "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "num_hidden_layers": 1,
                "vocab_size": self.vocab_size,
                "draft_vocab_size": self.draft_vocab_size,
                "target_hidden_size": self.target_hidden_size,
                "max_position_embeddings": self.max_position_embeddings,
                "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta,
                "rope_scaling": self.rope_scaling,
                "hidden_act": self.hidden_act,
                # SGLang ties lm_head to the embedding when this is true, dropping the draft-vocab head.
                "tie_word_embeddings": False,
                "attention_bias": False,
                "mlp_bias": False,
                "eagle_config": {
                    "eagle_aux_hidden_state_layer_ids": self.aux_layer_ids,
                    "use_aux_hidden_state": True,
                },
            }
        )
        if self.aux_layer_ids is None:
            out["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")
        return out

    @classmethod
    def from_sglang(cls, cfg: dict, where: str = "config.json") -> DraftConfig:
        def need(key):
            if key not in cfg:
                raise DraftFormatError(f"{where}: missing field '{key}'")
            return cfg[key]

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        if cfg.get("num_hidden_layers", 1) != 1:
            raise DraftFormatError(
                f"{where}: num_hidden_layers={cfg['num_hidden_layers']}; only 1-layer drafts are supported"
            )
        theta = cfg.get("rope_theta")
        scaling = cfg.get("rope_scaling")
        if theta is None and isinstance(cfg.get("rope_parameters"), dict):
            rp = dict(cfg["rope_parameters"])
            theta = rp.pop("rope_theta", 10000.0)
            scaling = rp if rp.get("rope_type", "default") != "default" else None
        eagle = cfg.get("eagle_config") or {}
        known = {f.name for f in fields(cls)} | {
            "rope_parameters",
            "eagle_config",
            "architectures",
            "num_hidden_layers",
        }
        return cls(
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            vocab_size=need("vocab_size"),
            draft_vocab_size=cfg.get("draft_vocab_size") or cfg["vocab_size"],
            target_hidden_size=cfg.get("target_hidden_size") or hidden,
            aux_layer_ids=eagle.get("eagle_aux_hidden_state_layer_ids"),
            max_position_embeddings=cfg.get("max_position_embeddings", 8192),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta if theta is not None else 10000.0),
            rope_scaling=scaling,
            hidden_act=cfg.get("hidden_act", "silu"),
            extra={k: v for k, v in cfg.items() if k not in known},
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        return d
