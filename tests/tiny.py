"""A tiny random Llama saved as a model folder with SmolLM2's real tokenizer and ChatML template: real text for
load_target, subprocesses and `transformers serve`, at a tiny compute cost."""

import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle3lab.models.target import resolve

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def save_tiny_chat_model(folder: Path, **llama_config) -> Path:
    """Save LlamaForCausalLM(LlamaConfig(**llama_config)) (seed 0) and SmolLM2's tokenizer files into folder."""
    folder = Path(folder)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**llama_config)).save_pretrained(folder)
    source = Path(resolve("smollm2-135m-instruct"))
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder
