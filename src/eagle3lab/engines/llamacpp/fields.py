"""The draft config.json fields llama.cpp reads, and what it does with each (read from its source)."""

from eagle3lab.engines.base import DraftField

# Every draft config.json field llama.cpp 11434 reads: its converter (conversion/llama.py, the Eagle3 class) writes
# them into the draft GGUF, and src/models/eagle3.cpp and common/speculative.cpp run them.
FIELDS = (
    DraftField(
        "eagle_aux_hidden_state_layer_ids",
        "capture",
        "top level only: eagle3.target_layers, id i = hidden_states[i]",
        "in range but not the trained states: served silently ([0, 1, 2]: 1.02 vs 1.47); not 3 ids: refuses",
        True,
    ),
    DraftField(
        "eagle_config.eagle_aux_hidden_state_layer_ids",
        "capture",
        "not read: the converter writes the defaults [2, N//2, N-3]",
        "a draft trained on other layers: the defaults are served silently",
        True,
    ),
    DraftField(
        "eagle_config.use_aux_hidden_state", "capture", "not read: fc always runs", "false has no effect", False
    ),
    DraftField(
        "target_hidden_size",
        "fc",
        "eagle3.target_hidden_size, fc's input width / 3 (default: the target's hidden_size)",
        "wrong: fc.weight has the wrong shape, refuses",
        False,
    ),
    DraftField(
        "norm_before_fc",
        "fc",
        "true: eagle3.norm_before_fc, a norm before fc",
        "true without its weight: a missing tensor, refuses",
        False,
    ),
    DraftField(
        "draft_vocab_size",
        "vocab",
        "its presence marks an EAGLE-3 draft; the head's size comes from d2t",
        "missing: converted as a plain Llama, fails",
        False,
    ),
    DraftField(
        "d2t", "vocab", "converted to absolute target ids", "missing: the head has the wrong shape, refuses", False
    ),
    DraftField(
        "max_position_embeddings",
        "positions",
        "eagle3.context_length; the draft gets the target's context",
        "smaller: a warning only",
        False,
    ),
    DraftField(
        "rope_theta",
        "positions",
        "eagle3.rope.freq_base (missing: 10000)",
        "measured: 10000 instead of the target's 100000 left acceptance unchanged (1.48 both)",
        False,
    ),
    DraftField(
        "rope_scaling",
        "positions",
        "the draft's RoPE scaling type and factor",
        "measured: linear x4 left acceptance as it was (1.52 vs 1.48)",
        False,
    ),
    DraftField(
        "hidden_size",
        "shape",
        "embedding_length, every tensor shape",
        "wrong: a tensor has the wrong shape, refuses",
        False,
    ),
    DraftField("intermediate_size", "shape", "feed_forward_length", "wrong: refuses", False),
    DraftField(
        "num_attention_heads",
        "shape",
        "head_count (and the q/k permutation)",
        "a split other than training's with the same products: served silently (18 heads of 32 for 9 of 64: 1.37 "
        "vs 1.48)",
        True,
    ),
    DraftField(
        "num_key_value_heads",
        "shape",
        "head_count_kv",
        "a split other than training's with the same products: served silently",
        True,
    ),
    DraftField(
        "head_dim", "shape", "key_length", "a split other than training's with the same products: served silently", True
    ),
    DraftField("num_hidden_layers", "shape", "must be 1 (the EAGLE-3 marker and GGML_ASSERT)", "not 1: refuses", False),
    DraftField(
        "rms_norm_eps",
        "shape",
        "eagle3.attention.layer_norm_rms_epsilon",
        "not the trained one: served silently (1.0: 1.11 vs 1.48)",
        True,
    ),
    DraftField("hidden_act", "shape", "not read: the MLP is always SiLU", "not silu: served as SiLU silently", True),
    DraftField(
        "norm_before_residual",
        "class",
        "true: eagle3.norm_before_residual, the residual is the normed state",
        "true for a draft trained without it: served silently (1.06 vs 1.48)",
        True,
    ),
)
