"""What vLLM 0.32 reads from an EAGLE-3 draft's config.json (read from its source): which model class it builds
from the architecture name, which target layers it captures, and the other fields that change what it serves."""

from __future__ import annotations

from eagle3lab.models.target import TargetError

METHOD_ALGORITHMS = {"eagle3": "EAGLE3", "eagle": "EAGLE"}  # vLLM's method -> the algorithm the checks know
ALGORITHM_METHODS = {"EAGLE3": "eagle3", "EAGLE": "eagle", "NEXTN": "eagle"}
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


FIELDS: tuple = ()
