"""What vLLM 0.32 reads from an EAGLE-3 draft's config.json (read from its source): which model class it builds
from the architecture name, which target layers it captures, and the other fields that change what it serves; and the
--speculative-config keys and methods it takes."""

from __future__ import annotations

from eagle3lab.engines.base import DraftField
from eagle3lab.models.target import TargetError

METHOD_ALGORITHMS = {"eagle3": "EAGLE3", "eagle": "EAGLE"}  # vLLM's method -> the algorithm the checks know
ALGORITHM_METHODS = {"EAGLE3": "eagle3", "EAGLE": "eagle", "NEXTN": "eagle"}
# SpeculativeConfig's fields and methods in vLLM 0.32 (config/speculative.py): --speculative-config with any other
# key or method refuses to start (extra fields are forbidden)
_SPEC_KEYS_TEXT = """
    attention_backend code_revision disable_eagle_block_drop disable_padded_drafter_batch draft_load_config
    draft_model_config draft_parallel_config draft_sample_method draft_tensor_parallel_size dspark_draft_topk
    enable_adaptive_verification enforce_eager index_share_for_mtp_iteration kv_cache_dtype max_model_len method model
    moe_backend num_speculative_tokens num_speculative_tokens_per_batch_size parallel_drafting prompt_lookup_max
    prompt_lookup_min quantization rejection_sample_method revision suffix_decoding_max_cached_requests
    suffix_decoding_max_spec_factor suffix_decoding_max_tree_depth suffix_decoding_min_token_prob
    synthetic_acceptance_length synthetic_acceptance_rates target_model_config target_parallel_config
    tensor_parallel_size use_heterogeneous_vocab use_local_argmax_reduction
"""
SPEC_KEYS = tuple(_SPEC_KEYS_TEXT.split())
_METHODS_TEXT = """
    ngram medusa mlp_speculator draft_model suffix custom_class eagle eagle3 extract_hidden_states deepseek_mtp
    dots3_note_mtp mimo_mtp mimo_v2_mtp glm4_moe_mtp glm4_moe_lite_mtp glm_ocr_mtp ernie_mtp nemotron_h_mtp
    exaone_moe_mtp exaone4_5_mtp qwen3_next_mtp qwen4_exp_mtp qwen3_5_mtp longcat_flash_mtp bailing_hybrid_v3_mtp
    minimax_m3_mtp bailing_hybrid_mtp mtp kimi_k3_mtp pangu_ultra_moe_mtp step3p5_mtp hy_v3_mtp hy_v4_mtp gemma4_mtp
    inkling_mtp glm5_next_mtp dflash ngram_gpu dspark
"""
METHODS = tuple(_METHODS_TEXT.split())
# SpeculativeConfig.__post_init__ (vLLM 0.32): the methods that run without a "model" (the target's own MTP or DSpark
# layers, prompt lookup, suffix trees, hidden-state extraction)
METHODS_WITHOUT_MODEL = {"mtp", "dspark", "ngram", "[ngram]", "ngram_gpu", "suffix", "extract_hidden_states"}


def inferred_method(draft_path: str | None) -> str:
    """vLLM's guess when --speculative-config has no "method" (SpeculativeConfig.__post_init__): by the draft's name."""
    name = (draft_path or "").lower()
    guess = "eagle" if "eagle-" in name else "eagle3" if "eagle3" in name else "dflash" if "dflash" in name else None
    return guess or "draft_model"


def missing_model(spec: dict | None, draft_path: str | None) -> list[str] | None:
    """Why a --speculative-config without "model" runs no draft: vLLM 0.32 takes the target itself as the draft for
    mtp and dspark and needs no model for n-gram, suffix and hidden-state extraction; every other method refuses to
    start. None: no --speculative-config, a model named, or a method that needs none."""
    if spec is None or draft_path:
        return None
    method = str(spec.get("method") or inferred_method(draft_path))
    if method in METHODS_WITHOUT_MODEL:
        return None
    return [
        f'--speculative-config: method {method!r} and no "model": vLLM 0.32 refuses to start '
        "('num_speculative_tokens was provided but without speculative model.', config/speculative.py)"
    ]


# vLLM 0.32's model registry: the class that runs each EAGLE draft architecture it knows
_REGISTRY = {
    "EagleLlamaForCausalLM": ["EagleLlamaForCausalLM"],
    "Eagle3LlamaForCausalLM": [
        "Eagle3LlamaForCausalLM",
        "LlamaForCausalLMEagle3",
        "Eagle3MiniMaxM2ForCausalLM",
        "Eagle3Qwen2_5vlForCausalLM",
        "Eagle3Qwen3vlForCausalLM",
        "PEagleDraftModel",
        "PeagleLlamaForCausalLM",
    ],
    "Eagle3Qwen3ForCausalLM": ["Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM"],
    "Eagle3DeepseekV2ForCausalLM": ["Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"],
    "EagleDeepseekV3ForCausalLM": ["EagleDeepSeekMTPModel"],
    **{name: [name] for name in ("EagleLlama4ForCausalLM", "EagleMiniCPMForCausalLM", "EagleCohereForCausalLM")},
    **{name: [name] for name in ("EagleMistralForCausalLM", "EagleMistralLarge3ForCausalLM")},
}
DRAFT_CLASSES = {name: cls for cls, names in _REGISTRY.items() for name in names}
# the class a checkpoint in the doctor's (SGLang) format needs: one Llama decoder layer; a Qwen3 one adds q_norm
LLAMA_CLASSES = {"eagle3": "Eagle3LlamaForCausalLM", "eagle": "EagleLlamaForCausalLM"}
LLAMA_NAMES = {"eagle3": "LlamaForCausalLMEagle3", "eagle": "LlamaForCausalLM"}  # config names that resolve to them
QWEN3_MARK = "midlayer.self_attn.q_norm.weight"


def draft_architecture(method: str, architecture: str) -> str:
    """The architecture vLLM resolves for a draft (EAGLEConfig: eagle prefixes Eagle, eagle3 prefixes Eagle3 unless
    the name already starts with Eagle3 or ends with Eagle3)."""
    if method == "eagle":
        return architecture if architecture.startswith("Eagle") else f"Eagle{architecture}"
    if architecture.startswith("Eagle3") or architecture.endswith("Eagle3"):
        return architecture
    return f"Eagle3{architecture}"


def aux_capture(config: dict, num_layers: int) -> tuple[list[int], str]:
    """The hidden_states indices vLLM's target captures for an EAGLE-3 draft: the top-level
    eagle_aux_hidden_state_layer_ids first, else eagle_config's, each id i read as hidden_states[i] (vLLM captures
    the embedding output at 0 and each layer's output after it), sorted, duplicates dropped; else (2, N//2, N-3)."""
    top = config.get("eagle_aux_hidden_state_layer_ids")
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top:
        source = f"vLLM reads the top-level eagle_aux_hidden_state_layer_ids {top} first (id i = hidden_states[i])"
        ids = top
    elif nested:
        source = (
            f"vLLM reads eagle_config.eagle_aux_hidden_state_layer_ids {nested} as hidden_states[i] "
            f"(SGLang and the trainers read id i as hidden_states[i + 1])"
        )
        ids = nested
    else:
        return [2, num_layers // 2, num_layers - 3], "vLLM defaults: hidden_states[2], [N//2], [N-3]"
    beyond = [i for i in ids if not 0 <= i <= num_layers]
    if beyond:
        raise TargetError(
            f"vLLM never captures ids {beyond} of a {num_layers}-layer target (it captures "
            f"hidden_states[0..{num_layers}]): fewer states than fc expects reach the draft"
        )
    return sorted(set(ids)), source


# Every draft config.json field vLLM 0.32 reads (llama_eagle3.py, config/speculative.py, gpu_model_runner.py,
# transformers_utils/configs/eagle.py), and what it does with a bad or missing value.
FIELDS = (
    DraftField(
        "eagle_aux_hidden_state_layer_ids",
        "capture",
        "read first: the target captures hidden_states[i] for each id",
        "ids other than the trained states: wrong layers, served silently ([0, 1, 2]: 1.02 vs 1.44)",
        True,
    ),
    DraftField(
        "eagle_config.eagle_aux_hidden_state_layer_ids",
        "capture",
        "read when there is no top-level list, each id i as hidden_states[i] (the trainers mean hidden_states[i + 1])",
        "read one layer early against the trainers' convention: served silently",
        True,
    ),
    DraftField(
        "eagle_config.use_aux_hidden_state",
        "capture",
        "false: the target captures nothing and fc is never built (its weights dropped)",
        "false: the draft reads the target's final state, served silently (1.02 vs 1.44)",
        True,
    ),
    DraftField(
        "num_aux_hidden_states",
        "fc",
        "overrides the number of captured states, the width of fc",
        "a count other than fc's: fc.weight fails to load",
        False,
    ),
    DraftField(
        "target_hidden_size",
        "fc",
        "fc input = target_hidden_size x captured states (default hidden_size)",
        "wrong: fc.weight fails to load",
        False,
    ),
    DraftField(
        "norm_before_fc",
        "fc",
        "true: an RMSNorm before fc",
        "true without its weights: the norm keeps its initial values, served silently (1.06 vs 1.44)",
        True,
    ),
    DraftField(
        "fc_norm",
        "fc",
        "true: an RMSNorm per captured state before fc",
        "true without its weights: initial values, served silently (1.04 vs 1.44)",
        True,
    ),
    DraftField(
        "draft_vocab_size",
        "vocab",
        "sizes lm_head and the draft-to-target map",
        "missing or not lm_head's rows: an AssertionError at load",
        False,
    ),
    DraftField(
        "d2t",
        "vocab",
        "the tensor mapping draft ids to target ids",
        "missing: a zero map, so draft id i is target id i (the first draft_vocab_size ids), served silently "
        "(1.00 vs 1.44)",
        True,
    ),
    DraftField(
        "vocab_size",
        "vocab",
        "sizes the draft embedding and the target-width logits",
        "not the target's: a shape error or an index error",
        False,
    ),
    DraftField(
        "max_position_embeddings",
        "positions",
        "raised to the served max_model_len when smaller (an INFO log line)",
        "harmless: vLLM overrides it",
        False,
    ),
    DraftField(
        "rope_theta",
        "positions",
        "the draft attention's RoPE base (missing: 10000)",
        "measured: 10000 instead of the target's 100000 left acceptance unchanged (1.44 both), the draft's attention "
        "does not rotate by it",
        False,
    ),
    DraftField(
        "rope_scaling",
        "positions",
        "the draft attention's RoPE scaling",
        "measured: linear x4 left acceptance as it was (1.46 vs 1.44)",
        False,
    ),
    DraftField("hidden_size", "shape", "every width of the draft layer", "wrong: weights fail to load", False),
    DraftField("intermediate_size", "shape", "the MLP width", "wrong: weights fail to load", False),
    DraftField(
        "num_attention_heads",
        "shape",
        "the attention heads (with head_dim: q_proj's rows)",
        "a split other than training's with the same products: served silently (18 of 32 for 9 of 64: 1.34 vs 1.44)",
        True,
    ),
    DraftField(
        "num_key_value_heads",
        "shape",
        "the KV heads",
        "a split other than training's with the same products: served silently",
        True,
    ),
    DraftField(
        "head_dim",
        "shape",
        "the head width (default hidden_size / heads)",
        "a split other than training's with the same products: served silently",
        True,
    ),
    DraftField(
        "num_hidden_layers",
        "shape",
        "the draft layers built",
        "measured: 2 for a one-layer checkpoint left acceptance as it was (1.44 both)",
        False,
    ),
    DraftField(
        "rms_norm_eps",
        "shape",
        "every RMSNorm's epsilon",
        "not the trained one: served silently (1.0: 1.08 vs 1.44)",
        True,
    ),
    DraftField("hidden_act", "shape", "the MLP activation", "not silu: ValueError, vLLM refuses", False),
    DraftField(
        "attention_bias",
        "shape",
        "true: q/k/v projections with biases",
        "true without bias weights: uninitialised biases, served silently (1.00 vs 1.44)",
        True,
    ),
    DraftField(
        "norm_before_residual",
        "class",
        "true: the residual is the normed hidden state",
        "true for a draft trained without it (SGLang's network): served silently (1.04 vs 1.44)",
        True,
    ),
    DraftField(
        "norm_output",
        "class",
        "true: the next draft step reads the post-norm state",
        "true for a draft trained on the pre-norm state: served silently (1.34 vs 1.44) from step 2",
        True,
    ),
    DraftField(
        "architectures",
        "class",
        "picks the draft's model class (prefixed Eagle3 under eagle3)",
        "a name of another family: that class, missing layers at init, served silently",
        True,
    ),
    DraftField("model_type", "class", "picks the config class", "missing: the config fails to load", False),
)
