"""The draft config.json fields SGLang reads, and what it does with each (read from its source)."""

from eagle3lab.engines.base import DraftField

# Every draft config.json field SGLang reads (models/llama_eagle3.py, model_runner.py, eagle_worker.py; read at
# newer commits than 0.5.x, where the loader is the same for these fields).
FIELDS = (
    DraftField(
        "eagle_config.eagle_aux_hidden_state_layer_ids",
        "capture",
        "the target captures the output of layer i (hidden_states[i + 1]) for each id",
        "ids other than the trained layers: served silently",
        True,
    ),
    DraftField(
        "eagle_aux_hidden_state_layer_ids",
        "capture",
        "not read (only eagle_config's)",
        "a draft trained on a top-level list only: the defaults are served silently",
        True,
    ),
    DraftField(
        "eagle_config.use_aux_hidden_state",
        "capture",
        "false: no capture; fc is skipped because the width equals hidden_size",
        "false: served silently (accept length about 1.0)",
        True,
    ),
    DraftField(
        "target_hidden_size",
        "fc",
        "fc input = 3 x target_hidden_size (default hidden_size)",
        "wrong: fc.weight fails to load",
        False,
    ),
    DraftField(
        "bias",
        "fc",
        "true: fc with a bias",
        "true without fc.bias: the bias keeps its initial values, served silently",
        True,
    ),
    DraftField(
        "norm_before_residual",
        "class",
        "not read: the residual is always the raw state",
        "a draft trained with it: served without it, silently",
        True,
    ),
    DraftField("norm_before_fc", "fc", "not read", "a draft trained with it: served without the norm, silently", True),
    DraftField(
        "draft_vocab_size",
        "vocab",
        "sizes lm_head; unset: the target's head is loaded instead",
        "not lm_head's rows: fails to load",
        False,
    ),
    DraftField(
        "d2t",
        "vocab",
        "hot_token_id = arange + d2t maps each drafted id",
        "missing: draft ids used as target ids, served silently",
        True,
    ),
    DraftField(
        "tie_word_embeddings",
        "vocab",
        "true: lm_head is the embedding (all target ids)",
        "true: the trained draft-vocab head is dropped, served silently",
        True,
    ),
    DraftField(
        "max_position_embeddings",
        "positions",
        "checked against the target's context",
        "smaller: ValueError unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
        False,
    ),
    DraftField("rope_theta", "positions", "the draft attention's RoPE base", "not the target's: served silently", True),
    DraftField(
        "rope_scaling", "positions", "the draft attention's RoPE scaling", "not the target's: served silently", True
    ),
    DraftField(
        "num_attention_heads",
        "shape",
        "the attention heads",
        "a split other than training's with the same products: served silently",
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
        "the head width",
        "a split other than training's with the same products: served silently",
        True,
    ),
    DraftField(
        "num_hidden_layers",
        "shape",
        "the draft layers built (and its KV pool)",
        "above 1: layers without weights, served silently",
        True,
    ),
    DraftField("rms_norm_eps", "shape", "every RMSNorm's epsilon", "not the trained one: served silently", True),
    DraftField(
        "architectures", "class", "picks the model class (LlamaForCausalLMEagle3)", "an unknown name: refuses", False
    ),
)
