"""TrainConfig: the one home of every training default. The `eagle3lab train` CLI (train.cli) is generated from its
fields by eagle3lab.options, help text in each field's metadata, so the two cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3lab.devices import DEVICE_HELP, resolve_device, resolve_dtype
from eagle3lab.io import InputError
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import option

DTYPES = ("bf16", "fp32", "auto")


def int_list(text: str) -> list[int]:
    """`1,14,26` -> [1, 14, 26]."""
    return [int(x) for x in text.split(",")]


@dataclass
class TrainConfig:
    data: str = option(help="training conversations, ShareGPT-style JSONL")
    output: str = option(help="run folder: checkpoint, metrics.jsonl, result.json, draft/")
    val: str | None = option(None, "held-out conversations (same format) for per-step evaluation")
    target: str = option(DEFAULT_TARGET, "target model: embedded name, local folder or Hugging Face id")
    device: str = option("auto", f"where the target and the draft run: {DEVICE_HELP}")
    features_cache: str | None = option(None, "root folder of the offline feature cache (default artifacts/features)")
    online: bool = option(False, "run the target inside each step instead of caching")
    max_records: int | None = option(None, "use the first N records of --data (a data scale)")
    val_max_records: int | None = option(200, "use the first N records of --val")
    draft_vocab_size: int = option(8192, "draft vocabulary: the most frequent assistant tokens of the training data")
    ttt_length: int = option(3, "training-time-test unroll length (draft steps trained per position)")
    epochs: int = option(1, "most passes over the training data (max_answer_tokens may stop sooner)")
    min_answer_tokens: int | None = option(
        None,
        "train on at least this many answer tokens: more passes than --epochs over data that holds fewer, so a "
        "small data scale reaches its plateau (the patience rule then stops it); default: --epochs passes",
    )
    max_steps: int | None = option(None, "stop after this many optimizer steps")
    max_answer_tokens: int | None = option(
        None,
        "stop before the step that would train past this many answer tokens (the ones the loss scores; all passes, "
        "all ranks; default: no cap)",
    )
    lr: float = option(1e-3, "peak learning rate (AdamW, cosine decay)")
    warmup_ratio: float = option(0.03, "share of the steps spent warming up the learning rate")
    min_lr_ratio: float = option(0.1, "final learning rate as a share of the peak")
    weight_decay: float = option(0.0, "AdamW weight decay")
    grad_clip: float = option(0.5, "gradient norm clip")
    batch_tokens: int = option(2048, "token budget of a batch per rank (rows x longest row)")
    max_len: int = option(1024, "truncate conversations to this many tokens")
    aux_layer_ids: list[int] | None = option(
        None, "target layers the draft reads, e.g. 1,14,26 (SGLang ids)", type=int_list
    )
    dtype: str = option(
        "bf16", "autocast dtype of the draft's matmuls (auto: bf16 where bf16 arithmetic is native)", choices=DTYPES
    )
    seed: int = option(0, "seed of the draft's initialisation and of the data order")
    eval_every: int = option(100, "held-out evaluation every N steps (and at each epoch's end and the last step)")
    patience: int | None = option(
        None,
        "stop once this many held-out evaluations in a row have not beaten the best (the plateau); the step budget "
        "is then a ceiling. None: train the whole budget",
    )
    checkpoint_every: int = option(50, "checkpoint every N steps (and at the end)")
    resume: bool = option(False, "continue the checkpoint in --output")
    # lm_head = the target's head rows over the draft vocab, norm = the target's final norm. Off by default: the
    # untrained midlayer's output is not in the target's hidden space, so the copied head starts at twice the uniform
    # loss (17-19 nats vs ln 4096 = 8.3) and spends the first steps unlearning it. Measured on the reference data
    # (5 epochs, vocab 4096): held-out top-1 accuracy 0.115 vs 0.088 at 22 conversations, 0.162 vs 0.137 at 45.
    init_head_from_target: bool = option(
        False, "start lm_head and the final norm from the target's (default: fresh, near-uniform logits)"
    )
    # Copies target decoder layer N (negative: from the end) into the draft's layer: the attention's hidden half of
    # q/k/v, o_proj, the MLP and the norms; the embedding half keeps its fresh initialisation.
    init_layer_from_target: int | None = option(
        None, "start the draft's decoder layer from this target layer (e.g. -1: the last; default: fresh)"
    )
    # Greedy verification accepts a drafted token when it is the target's argmax; 1 - sum(min(p, q)) (the total
    # variation between the target's and the draft's distributions) is one minus the acceptance rate of speculative
    # sampling, a smooth stand-in that forward KL alone does not optimise (REFERENCE.md: +3-8% elsewhere).
    acceptance_loss_weight: float = option(
        0.0, "weight of the acceptance loss, 1 - sum(min(p_target, p_draft)), added to each TTT step's forward KL"
    )
    shard_records: int = option(64, "records per feature-cache shard")
    threads: int | None = option(None, "torch CPU threads (default: torch's choice; under DDP, cores / local ranks)")
    progress: bool = option(True, "show progress bars")
    live_dir: str | None = option(
        None, "dvclive folder of per-step curves shared by runs, each under its output's name (not in git without DVC)"
    )

    @property
    def bf16(self) -> bool:
        """Whether the draft's matmuls autocast to bf16 (auto: where bf16 is native, devices.resolve_dtype)."""
        return self.dtype == "bf16" or (self.dtype == "auto" and resolve_dtype("auto", self.device) == "bfloat16")

    def check(self) -> None:
        if self.dtype not in DTYPES:
            raise InputError(f"dtype '{self.dtype}': expected bf16, fp32 or auto")
        for name in ("ttt_length", "epochs", "batch_tokens", "max_len", "draft_vocab_size"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.acceptance_loss_weight < 0:
            raise InputError(f"acceptance_loss_weight must be >= 0, got {self.acceptance_loss_weight}")
        for name in (
            "checkpoint_every",
            "eval_every",
            "max_steps",
            "min_answer_tokens",
            "max_answer_tokens",
            "patience",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_answer_tokens and self.max_answer_tokens and self.min_answer_tokens > self.max_answer_tokens:
            raise InputError(
                f"min_answer_tokens {self.min_answer_tokens} exceeds max_answer_tokens {self.max_answer_tokens}"
            )
        try:
            resolve_device(self.device)
        except ValueError as e:
            raise InputError(str(e)) from None
        if not Path(self.data).exists():
            raise InputError(f"training data {self.data} does not exist")
        if self.val and not Path(self.val).exists():
            raise InputError(f"held-out data {self.val} does not exist")
