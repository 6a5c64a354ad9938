"""llama-server's launch line for the doctor: read into the doctor's `Launch`, fixes written back in llama-server's
flags. llama-server's parser (common/arg.cpp) takes exact option names (no prefixes, no `--flag=value`), reads
underscores in `--` options as dashes, and keeps the last of a repeated option, except --spec-type, whose
comma-separated lists add up (a list naming `none` adds nothing). Any other option, or a --spec-type it does not know,
is an error."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from eagle3lab.doctor.launch import KnownFlags, Launch, LaunchSyntax, check_flags, check_value
from eagle3lab.engines.llamacpp.gguf import SPEC_TYPE

BINARY = "llama-server"
# llama-server option -> the setting it carries (common/arg.cpp)
OPTIONS = {
    "-m": "model_path",
    "--model": "model_path",
    "-md": "draft_path",
    "--model-draft": "draft_path",
    "--spec-draft-model": "draft_path",
    "--spec-type": "spec_type",
    "--spec-draft-n-max": "n_max",
    "--spec-draft-n-min": "n_min",
    "--spec-draft-p-min": "p_min",
    "--draft-p-min": "p_min",
    "-c": "context_length",
    "--ctx-size": "context_length",
    # a draft from a Hugging Face repo: downloaded into the setting -md sets
    "--spec-draft-hf": "draft_repo",
    "-hfd": "draft_repo",
    "-hfrd": "draft_repo",
    "--hf-repo-draft": "draft_repo",
}
FLAGS = {setting: option for option, setting in reversed(OPTIONS.items())}  # each setting's first spelling
DEFAULTS = {"n_max": 3, "n_min": 0, "p_min": 0.0}  # common_params_speculative
# common_speculative_all_types_str()
SPEC_TYPES = {"none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-cache"}
SPEC_TYPES |= {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"}
# The types that run a draft model: common_speculative_init enables draft-eagle3, -dflash and -dspark only with a draft
# context, which only -md or --spec-draft-hf creates (draft-mtp builds its context on the target's own MTP layers).
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")
# Every option llama-server 11434 takes (common/arg.cpp: the common and server options, as its --help lists them),
# less the removed ones it refuses (arg_removed); those with one replacement name it.
_ALL_OPTIONS = """
    --adaptive-decay --adaptive-target --agent --alias --api-key --api-key-file --api-prefix --backend-sampling
    --batch-size --cache-idle-slots --cache-list --cache-prompt --cache-ram --cache-reuse --cache-type-k
    --cache-type-k-draft --cache-type-v --cache-type-v-draft --chat-template --chat-template-file
    --chat-template-kwargs --check-tensors --checkpoint-min-step --completion-bash --cont-batching --context-shift
    --control-vector --control-vector-layer-range --control-vector-scaled --cors-credentials --cors-headers
    --cors-methods --cors-origins --cpu-mask --cpu-mask-batch --cpu-mask-batch-draft --cpu-mask-draft --cpu-moe
    --cpu-moe-draft --cpu-range --cpu-range-batch --cpu-range-draft --cpu-strict --cpu-strict-batch
    --cpu-strict-batch-draft --cpu-strict-draft --ctx-checkpoints --ctx-size --defrag-thold --device --device-draft
    --docker-repo --draft-p-min --draft-p-split --dry-allowed-length --dry-base --dry-multiplier --dry-penalty-last-n
    --dry-sequence-breaker --dynatemp-exp --dynatemp-range --embd-gemma-default --embd-normalize --embedding
    --embeddings --escape --fim-qwen-1.5b-default --fim-qwen-14b-spec --fim-qwen-30b-default --fim-qwen-3b-default
    --fim-qwen-7b-default --fim-qwen-7b-spec --fit --fit-ctx --fit-target --flash-attn --frequency-penalty
    --gpt-oss-120b-default --gpt-oss-20b-default --gpu-layers --gpu-layers-draft --grammar --grammar-file --help
    --hf-file --hf-repo --hf-repo-draft --hf-token --host --ignore-eos --image-max-tokens --image-min-tokens --jinja
    --json-schema --json-schema-file --keep --kv-offload --kv-unified --kv-unified-per-slot --lazy-mode --list-devices
    --load-mode --log-colors --log-disable --log-file --log-jsonl --log-prefix --log-prompts-dir --log-timestamps
    --log-verbose --log-verbosity --logit-bias --lookup-cache-dynamic --lookup-cache-static --lora
    --lora-init-without-apply --lora-scaled --main-gpu --mcp-servers-config --mcp-servers-json --media-path --metrics
    --min-p --mirostat --mirostat-ent --mirostat-lr --mmproj --mmproj-auto --mmproj-device --mmproj-offload
    --mmproj-url --model --model-draft --model-url --models-autoload --models-dir --models-max --models-preset
    --mtmd-batch-max-tokens --n-cpu-ffn --n-cpu-moe --n-cpu-moe-draft --n-gpu-layers --n-gpu-layers-draft --n-predict
    --no-agent --no-cache-idle-slots --no-cache-prompt --no-cont-batching --no-context-shift --no-cors-credentials
    --no-escape --no-host --no-jinja --no-kv-offload --no-kv-unified --no-log-jsonl --no-log-prefix
    --no-log-timestamps --no-mmproj --no-mmproj-auto --no-mmproj-offload --no-models-autoload --no-op-offload
    --no-perf --no-prefill-assistant --no-reasoning-preserve --no-repack --no-skip-chat-parsing --no-slots
    --no-spec-draft-backend-sampling --no-ui --no-ui-mcp-proxy --no-warmup --no-webui --no-webui-mcp-proxy --numa
    --offline --op-offload --override-kv --override-tensor --override-tensor-draft --parallel --path --perf --poll
    --poll-batch --poll-batch-draft --poll-draft --pooling --port --predict --prefill-assistant --presence-penalty
    --prio --prio-batch --prio-batch-draft --prio-draft --props --reasoning --reasoning-budget
    --reasoning-budget-message --reasoning-effort --reasoning-format --reasoning-preserve --repack --repeat-last-n
    --repeat-penalty --rerank --reranking --reuse-port --reverse-prompt --rope-freq-base --rope-freq-scale
    --rope-scale --rope-scaling --rpc --sampler-seq --samplers --sampling-seq --seed --skip-chat-parsing
    --sleep-idle-seconds --slot-prompt-similarity --slot-save-path --slots --spec-default
    --spec-draft-backend-sampling --spec-draft-cpu-mask --spec-draft-cpu-mask-batch --spec-draft-cpu-moe
    --spec-draft-cpu-range --spec-draft-cpu-strict --spec-draft-cpu-strict-batch --spec-draft-device --spec-draft-hf
    --spec-draft-model --spec-draft-n-cpu-moe --spec-draft-n-max --spec-draft-n-min --spec-draft-ncmoe
    --spec-draft-ngl --spec-draft-override-tensor --spec-draft-p-min --spec-draft-p-split --spec-draft-poll
    --spec-draft-poll-batch --spec-draft-prio --spec-draft-prio-batch --spec-draft-sampling --spec-draft-threads
    --spec-draft-threads-batch --spec-draft-type-k --spec-draft-type-v --spec-ngram-map-k-min-hits
    --spec-ngram-map-k-size-m --spec-ngram-map-k-size-n --spec-ngram-map-k4v-min-hits --spec-ngram-map-k4v-size-m
    --spec-ngram-map-k4v-size-n --spec-ngram-mod-n-match --spec-ngram-mod-n-max --spec-ngram-mod-n-min
    --spec-ngram-simple-min-hits --spec-ngram-simple-size-m --spec-ngram-simple-size-n --spec-synth-len
    --spec-synth-rates --spec-type --special --split-mode --spm-infill --sse-ping-interval --ssl-cert-file
    --ssl-key-file --swa-checkpoints --swa-full --tags --temp --temperature --tensor-split --threads --threads-batch
    --threads-batch-draft --threads-draft --threads-http --timeout --tools --tools-runtime --top-k --top-n-sigma
    --top-nsigma --top-p --typical --typical-p --ubatch-size --ui --ui-config --ui-config-file --ui-mcp-proxy --usage
    --verbose --verbosity --version --video-ffmpeg-dir --video-fps --video-timestamp-interval
    --vision-gemma-12b-default --vision-gemma-4b-default --warmup --webui --webui-config --webui-config-file
    --webui-mcp-proxy --xtc-probability --xtc-threshold --yarn-attn-factor --yarn-beta-fast --yarn-beta-slow
    --yarn-ext-factor --yarn-orig-ctx -C -Cb -Cbd -Cd -Cr -Crb -Crd -a -ag -b -bs -c -cb -cl -cmoe -cmoed -cms -cram
    -ctk -ctkd -ctv -ctvd -ctxcp -dev -devd -dr -dt -e -fa -fit -fitc -fitt -h -hf -hfd -hff -hfr -hfrd -hft -j -jf
    -kvo -kvu -l -lcd -lcs -lm -lv -lzm -m -md -mg -mm -mmdev -mmu -mu -n -ncffn -ncmoe -ncmoed -ngl -ngld -nkvo
    -no-ag -no-kvu -nocb -np -nr -ot -otd -r -rea -s -sm -sp -sps -t -tb -tbd -td -to -ts -ub -v
"""
KNOWN = KnownFlags(
    "llama.cpp 11434",
    frozenset(_ALL_OPTIONS.split()),
    renamed={
        "--draft": "--spec-draft-n-max",
        "--draft-n": "--spec-draft-n-max",
        "--draft-max": "--spec-draft-n-max",
        "--draft-min": "--spec-draft-n-min",
        "--draft-n-min": "--spec-draft-n-min",
    },
)


def reads(argv: list[str]) -> bool:
    return entry_index(argv) is not None


def entry_index(argv: list[str]) -> int | None:
    """Index of the first server argument of a llama-server command, None when the line does not start one."""
    for i, tok in enumerate(argv):
        if Path(tok).name == BINARY:
            return i + 1
    return None


def _option(tok: str) -> str:
    return "--" + tok[2:].replace("_", "-") if tok.startswith("--") else tok


def read_launch(launch: Launch) -> Launch:
    """Fill `launch` (argv set, a llama-server line) as llama-server's parser would."""
    launch.syntax = LLAMACPP
    start = entry_index(launch.argv)
    check_flags(launch, start, KNOWN, _option)
    argv = launch.argv
    env = [tok.split("=", 1)[0] for tok in argv[: start - 1] if tok.startswith("LLAMA_ARG_") and "=" in tok]
    if env:
        launch.notes.append(f"{', '.join(env)}: llama-server reads these from the environment; the doctor reads flags")
    values: dict[str, str] = {}
    types: list[str] = []
    metrics = False
    i = start
    while i < len(argv):
        name = _option(argv[i])
        metrics = metrics or name == "--metrics"
        setting = OPTIONS.get(name)
        if setting is None:
            i += 1
            continue
        if i + 1 >= len(argv):
            launch.errors.append(f"{name} has no value")
            break
        launch._spans.setdefault(setting, []).append(i)
        if setting == "spec_type":
            argv[i + 1] = _spec_types(launch, argv[i + 1])
            types += _turned_on(argv[i + 1])
        else:
            values[setting] = argv[i + 1]
        i += 2
    launch.model_path = values.get("model_path")
    launch.draft_path = values.get("draft_path")
    spec = {key: _number(launch, key, values.get(key), type(default)) for key, default in DEFAULTS.items()}
    types = list(dict.fromkeys(types))
    launch.spec_config = {
        "types": types,
        **spec,
        "metrics": metrics,
        "draft_repo": values.get("draft_repo"),
    }
    context = _number(launch, "context_length", values.get("context_length"), int)
    launch.context_length = context or None  # 0: the model's own context
    if types:
        launch.algorithm = "EAGLE3" if types == [SPEC_TYPE] else ",".join(types).upper()
        k = spec["n_max"]
        launch.num_steps, launch.topk, launch.num_draft_tokens = k, 1, k + 1
    return launch


def _spec_types(launch: Launch, value: str) -> str:
    """One --spec-type list with each name llama.cpp does not know (it refuses to start) replaced by the one meant."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    return ",".join(check_value(launch, "--spec-type", n, sorted(SPEC_TYPES), "type") or n for n in names)


def _turned_on(value: str) -> list[str]:
    """The types one --spec-type list turns on: none when it names `none`."""
    names = value.split(",")
    return [] if "none" in names else [n for n in names if n in SPEC_TYPES]


def _number(launch: Launch, setting: str, text: str | None, kind: type):
    if text is None:
        return DEFAULTS.get(setting)
    try:
        return kind(text)
    except ValueError:
        launch.errors.append(f"{FLAGS[setting]} {text!r} is not a number")
        return DEFAULTS.get(setting)


class LlamaCppSyntax(LaunchSyntax):
    """How llama-server spells the Launch fields, and how a fix is written back into its command. Fixes name the
    Launch fields (algorithm EAGLE3, num_steps, context_length) or llama.cpp's own settings (n_min, p_min)."""

    engine = "llamacpp"
    known = KNOWN
    speculation_fix = f"-md DRAFT.gguf --spec-type {SPEC_TYPE}"
    draft_placeholder = "DRAFT.gguf"
    _SETTINGS = {"algorithm": "spec_type", "num_steps": "n_max", "topk": "n_max", "num_draft_tokens": "n_max"}

    def _setting(self, key: str) -> str:
        return self._SETTINGS.get(key, key)

    def missing_draft(self, launch: Launch) -> list[str] | None:
        spec = launch.spec_config or {}
        if launch.draft_path or spec.get("draft_repo"):
            return None
        needs = [t for t in spec.get("types", []) if t in DRAFT_MODEL_TYPES]
        drafting = [FLAGS[key] for key in DEFAULTS if key in launch._spans]
        if not spec.get("types") and drafting:  # draft settings alone: no type, no draft, nothing drafts
            return [
                f"{', '.join(drafting)} set, but no --spec-type and no -md: llama.cpp 11434 serves the target alone "
                "and says nothing; /slots reports speculative false"
            ]
        if not needs:
            return None
        return [
            f"--spec-type {','.join(needs)} runs a draft model and the line names none (-md DRAFT.gguf or "
            "--spec-draft-hf REPO)",
            "llama.cpp 11434 enables a draft type only with a draft context (common_speculative_init) and says "
            "nothing when it has none: the server starts, serves the target alone, and /slots reports speculative "
            "false",
        ]

    def flag(self, key: str) -> str:
        return FLAGS[self._setting(key)]

    def describe(self, launch: Launch, key: str) -> str:
        """Every occurrence as written, else what llama.cpp uses without it."""
        setting = self._setting(key)
        spans = launch._spans.get(setting)
        if spans:
            return " ".join(f"{launch.argv[i]} {launch.argv[i + 1]}" for i in spans)
        default = DEFAULTS.get(setting)
        return f"no {FLAGS[setting]}" + (f" (llama.cpp's default: {default})" if default is not None else "")

    def _changed(self, changes: dict[str, Any]) -> list[tuple[str, str]]:
        """(setting, value as llama-server takes it) for each change; topk and num-draft-tokens follow n-max."""
        return [(self._setting(k), _text(k, v)) for k, v in changes.items() if k not in ("topk", "num_draft_tokens")]

    def flags(self, launch: Launch, changes: dict[str, Any]) -> str:
        return shlex.join([tok for setting, value in self._changed(changes) for tok in (FLAGS[setting], value)])

    def corrected(self, launch: Launch, changes: dict[str, Any]) -> str:
        """The command with each changed setting's last occurrence set (the one llama.cpp reads; earlier ones dropped,
        since --spec-type lists add up) or the flag appended."""
        argv = list(launch.argv)
        dropped: set[int] = set()
        appended: list[str] = []
        for setting, value in self._changed(changes):
            spans = launch._spans.get(setting)
            if not spans:
                appended += [FLAGS[setting], value]
                continue
            argv[spans[-1] + 1] = value
            dropped |= {j for i in spans[:-1] for j in (i, i + 1)}
        return shlex.join([tok for j, tok in enumerate(argv) if j not in dropped] + appended)


def _text(key: str, value: Any) -> str:
    if key == "algorithm":
        return SPEC_TYPE if value == "EAGLE3" else str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


LLAMACPP = LlamaCppSyntax()
