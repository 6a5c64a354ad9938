"""vLLM for the doctor: its launch line read into the doctor's `Launch`, fixes written back as a corrected
`--speculative-config '{...}'` (what vLLM does with the draft's config
is `fields`, its own findings `rules`).

vLLM's CLI (FlexibleArgumentParser) turns underscores in option names into dashes, takes `--flag=value` and `--flag
value`, `-sc` / `-tp` short forms, unique prefixes of `--` options and dotted dict options
(`--speculative-config.method eagle3`); `vllm serve` takes the model positionally or as `--model`. Any other option,
a --speculative-config key SpeculativeConfig does not have (it forbids extra fields) or a method it does not know is an
error.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from eagle3lab.doctor.launch import KnownFlags, Launch, LaunchSyntax, check_flags, check_value, is_option
from eagle3lab.engines.vllm import rules
from eagle3lab.engines.vllm.fields import (
    ALGORITHM_METHODS,
    METHOD_ALGORITHMS,
    METHODS,
    SPEC_KEYS,
    aux_capture,
    inferred_method,
    missing_model,
)

ENTRY_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main")
DEFAULT_K = 3  # what a fix proposes when the line gives no num_speculative_tokens
# option (dashes) -> Launch field; "spec" is --speculative-config
OPTIONS = {
    "--model": "model_path",
    "--max-model-len": "context_length",
    "--tensor-parallel-size": "tp_size",
    "-tp": "tp_size",
    "--speculative-config": "spec",
    "-sc": "spec",
}
# Every option vLLM 0.32's server takes (`vllm serve` and the api_server share make_arg_parser; read from its parser)
_ALL_OPTIONS = """
    --additional-config --aggregate-engine-logging --all2all-backend --allow-credentials
    --allow-deprecated-quantization --allowed-headers --allowed-local-media-path --allowed-media-domains
    --allowed-methods --allowed-origins --anthropic-disabled-thinking-effort --api-key --api-server-count
    --async-scheduling --attention-backend --attention-config --aux-output-config --block-size --chat-template
    --chat-template-content-format --code-revision --cohere-format --cohere-is-reasoning-model
    --collect-detailed-traces --compilation-config --config --config-format --convert --cp-kv-cache-interleave-size
    --cpu-distributed-timeout-seconds --cpu-offload-gb --cpu-offload-params --cudagraph-capture-sizes
    --cudagraph-metrics --custom-histogram-buckets --data-parallel-address --data-parallel-backend
    --data-parallel-external-lb --data-parallel-hybrid-lb --data-parallel-multi-port-external-lb --data-parallel-rank
    --data-parallel-rpc-port --data-parallel-size --data-parallel-size-local --data-parallel-start-rank
    --data-parallel-supervisor-port --dbo-decode-token-threshold --dbo-prefill-token-threshold --dcp-comm-backend
    --dcp-kv-cache-interleave-size --dcp-q-replicate --decode-context-parallel-size --default-chat-template-kwargs
    --default-mm-loras --device-ids --device-memory-utilization --diffusion-config --disable-access-log-for-endpoints
    --disable-cascade-attn --disable-chunked-mm-input --disable-custom-all-reduce --disable-fastapi-docs
    --disable-hybrid-kv-cache-manager --disable-log-stats --disable-nccl-for-dp-synchronization
    --disable-sliding-window --disable-uvicorn-access-log --distributed-executor-backend --distributed-timeout-seconds
    --download-dir --dp-supervisor-probe-failure-threshold --dp-supervisor-probe-interval-s
    --dp-supervisor-probe-timeout-s --dp-sync-interval --dtype --ec-manager-config --ec-transfer-config
    --elastic-ep-max-dp-size --enable-auto-tool-choice --enable-batch-sharded-sampling --enable-chunked-prefill
    --enable-cumem-allocator --enable-dbo --enable-elastic-ep --enable-ep-weight-filter --enable-eplb
    --enable-expert-parallel --enable-fault-tolerance --enable-flash-late-interaction --enable-flashinfer-autotune
    --enable-force-include-usage --enable-hc-sp --enable-layerwise-nvtx-tracing --enable-log-deltas
    --enable-log-outputs --enable-log-requests --enable-logging-iteration-details --enable-lora
    --enable-mamba-cache-stochastic-rounding --enable-mamba-shared-prefix-checkpoint --enable-mfu-metrics
    --enable-mixed-moe-lora-format --enable-mm-embeds --enable-moe-shared-loras --enable-nccl-comm-suspend
    --enable-offline-docs --enable-per-request-metrics --enable-prefix-caching --enable-prompt-embeds
    --enable-prompt-tokens-details --enable-request-id-headers --enable-return-routed-experts --enable-scale-out
    --enable-server-load-tracking --enable-shm-tensor-arena --enable-sleep-mode --enable-ssl-refresh
    --enable-tokenizer-info-endpoint --enable-tower-connector-lora --enable-trace-replay --enforce-eager
    --engram-config --eplb-config --exclude-tools-when-tool-choice-none --expert-placement-strategy
    --fail-on-environ-validation --fault-tolerance-config --fingerprint-mode --fingerprint-value --fully-sharded-loras
    --gdn-prefill-backend --generation-config --gpu-memory-utilization --grpc --grpc-port --h11-max-header-count
    --h11-max-incomplete-event-size --headless --help --hf-config-path --hf-overrides --hf-token --host
    --ignore-patterns --interleave-mm-strings --io-processor-plugin --ir-op-priority --jit-monitor-mode
    --jit-monitor-verbose --kda-decode-backend --kda-prefill-backend --kernel-config --kv-cache-dtype
    --kv-cache-dtype-skip-layers --kv-cache-memory-bytes --kv-cache-metrics --kv-cache-metrics-sample
    --kv-events-config --kv-offloading-backend --kv-offloading-size --kv-sharing-fast-prefill --kv-transfer-config
    --language-model-only --limit-mm-per-prompt --linear-backend --load-format --log-config-file --log-error-stack
    --log-level --logging-config --logits-processors --logprobs-mode --long-prefill-token-threshold
    --long-prefill-token-threshold-adaptive --lora-dtype --lora-modules --lora-target-modules --mamba-backend
    --mamba-block-size --mamba-cache-dtype --mamba-cache-mode --mamba-cache-philox-rounds --mamba-ssm-cache-dtype
    --mamba-ssu-algorithm --master-addr --master-port --max-cpu-loras --max-cudagraph-capture-size --max-log-len
    --max-logprobs --max-lora-cls-labels --max-lora-rank --max-loras --max-model-len --max-num-active-seqs
    --max-num-batched-tokens --max-num-queued-reqs --max-num-queued-tokens --max-num-scheduled-tokens --max-num-seqs
    --max-parallel-loading-workers --media-io-kwargs --middleware --mm-device-do-normalize --mm-encoder-attn-backend
    --mm-encoder-attn-dtype --mm-encoder-fp8-scale-path --mm-encoder-fp8-scale-save-margin
    --mm-encoder-fp8-scale-save-path --mm-encoder-only --mm-encoder-tp-mode --mm-hasher-algorithm
    --mm-ipc-gpu-memory-gb --mm-processor-cache-gb --mm-processor-cache-type --mm-processor-device
    --mm-processor-kwargs --mm-shm-cache-max-object-size-mb --mm-tensor-ipc --model --model-class-overrides
    --model-impl --model-loader-extra-config --moe-backend --nnodes --no-allow-credentials
    --no-allow-deprecated-quantization --no-async-scheduling --no-cohere-is-reasoning-model --no-cudagraph-metrics
    --no-data-parallel-external-lb --no-data-parallel-hybrid-lb --no-dcp-q-replicate --no-disable-cascade-attn
    --no-disable-chunked-mm-input --no-disable-custom-all-reduce --no-disable-fastapi-docs
    --no-disable-hybrid-kv-cache-manager --no-disable-nccl-for-dp-synchronization --no-disable-sliding-window
    --no-disable-uvicorn-access-log --no-enable-auto-tool-choice --no-enable-batch-sharded-sampling
    --no-enable-chunked-prefill --no-enable-cumem-allocator --no-enable-dbo --no-enable-elastic-ep
    --no-enable-ep-weight-filter --no-enable-eplb --no-enable-expert-parallel --no-enable-fault-tolerance
    --no-enable-flash-late-interaction --no-enable-flashinfer-autotune --no-enable-force-include-usage
    --no-enable-hc-sp --no-enable-layerwise-nvtx-tracing --no-enable-log-deltas --no-enable-log-outputs
    --no-enable-log-requests --no-enable-logging-iteration-details --no-enable-lora
    --no-enable-mamba-cache-stochastic-rounding --no-enable-mamba-shared-prefix-checkpoint --no-enable-mfu-metrics
    --no-enable-mixed-moe-lora-format --no-enable-mm-embeds --no-enable-moe-shared-loras --no-enable-nccl-comm-suspend
    --no-enable-offline-docs --no-enable-per-request-metrics --no-enable-prefix-caching --no-enable-prompt-embeds
    --no-enable-prompt-tokens-details --no-enable-request-id-headers --no-enable-return-routed-experts
    --no-enable-scale-out --no-enable-server-load-tracking --no-enable-shm-tensor-arena --no-enable-sleep-mode
    --no-enable-ssl-refresh --no-enable-tokenizer-info-endpoint --no-enable-tower-connector-lora
    --no-enable-trace-replay --no-enforce-eager --no-exclude-tools-when-tool-choice-none
    --no-fail-on-environ-validation --no-fully-sharded-loras --no-interleave-mm-strings --no-jit-monitor-verbose
    --no-kv-cache-metrics --no-kv-sharing-fast-prefill --no-language-model-only --no-log-error-stack
    --no-long-prefill-token-threshold-adaptive --no-mm-device-do-normalize --no-mm-encoder-only --no-numa-bind
    --no-ray-workers-use-nsight --no-return-sampling-mask --no-return-tokens-as-token-ids
    --no-scheduler-reserve-full-isl --no-skip-mm-profiling --no-skip-tokenizer-init --no-sleep-mode-offload-cudagraph
    --no-specialize-active-lora --no-swa-bounded-replay --no-tokens-only --no-trust-remote-code
    --no-trust-request-chat-template --no-trust-request-mm-kwargs --no-use-fp64-gumbel --no-use-replayssm
    --no-use-tqdm-on-load --node-rank --num-gpu-blocks-override --numa-bind --numa-bind-cpus --numa-bind-nodes
    --offload-backend --offload-group-size --offload-num-in-group --offload-params --offload-prefetch-step
    --optimization-level --otlp-traces-endpoint --override-generation-config --per-request-spec-decode-metrics
    --performance-mode --pipeline-parallel-size --pooler-config --port --prefill-context-parallel-size
    --prefill-schedule-interval --prefix-cache-retention-interval --prefix-caching-hash-algo --prefix-match-unit
    --profiler-config --pt-load-map-location --quantization --quantization-config --ray-workers-use-nsight
    --reasoning-config --reasoning-parser --reasoning-parser-plugin --renderer-num-workers --replayssm-buffer-len
    --response-role --return-sampling-mask --return-tokens-as-token-ids --revision --root-path --runner
    --safetensors-load-strategy --safetensors-prefetch-block-size --safetensors-prefetch-num-threads --scheduler-cls
    --scheduler-reserve-full-isl --scheduling-policy --seed --served-model-name --show-hidden-metrics-for-version
    --shutdown-timeout --skip-mm-profiling --skip-tokenizer-init --sleep-mode-offload-cudagraph
    --sleep-preserve-parameter-names --sparse-indexer-topk-backend --spec-method --spec-model --spec-tokens
    --specialize-active-lora --speculative-config --sse-keep-alive-interval --ssl-ca-certs --ssl-cert-reqs
    --ssl-certfile --ssl-ciphers --ssl-keyfile --stream-interval --structured-outputs-config --swa-bounded-replay
    --tensor-parallel-size --tokenizer --tokenizer-mode --tokenizer-revision --tokens-only --tool-call-parser
    --tool-parser-plugin --tool-server --tool-strict-level --trust-remote-code --trust-request-chat-template
    --trust-request-mm-kwargs --ubatch-size --uds --use-fp64-gumbel --use-replayssm --use-tqdm-on-load
    --uvicorn-log-level --video-pruning-method --video-pruning-rate --watermark --watermark-config
    --weight-transfer-config --worker-cls --worker-extension-cls -ac -asc -cc -dc -dcp -dp -dpa -dpb -dpe -dph -dpl
    -dpm -dpn -dpp -dpr -ep -h -n -pcp -pp -q -r -sc -tp
"""
KNOWN = KnownFlags("vLLM 0.32", frozenset(_ALL_OPTIONS.split()), prefixes=True)


def reads(argv: list[str]) -> bool:
    return entry_index(argv) is not None


def entry_index(argv: list[str]) -> int | None:
    """Index of the first server argument of a vLLM command, None when the line does not start vLLM."""
    for i, tok in enumerate(argv):
        if tok in ENTRY_MODULES and i > 0 and argv[i - 1] == "-m":
            return i + 1
        if Path(tok).name == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return i + 1
    return None


def _option(tok: str) -> tuple[str, str | None]:
    """`--max_model_len=4096` -> ("--max-model-len", "4096"): dashes for underscores up to a dotted key's first `.`."""
    name, eq, value = tok.partition("=")
    if name.startswith("--"):
        head, dot, rest = name[2:].partition(".")
        name = "--" + head.replace("_", "-") + dot + rest
    return name, value if eq else None


def _base(tok: str) -> str:
    """The option a token names, as vLLM matches it: `--speculative_config.method` -> `--speculative-config`."""
    return _option(tok)[0].partition(".")[0]


def _int(text: str) -> int:
    """vLLM's human-readable integers: 4096, 32k (x1000), 32K (x1024)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", text.strip())
    if not match:
        raise ValueError(text)
    scale = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20}[match.group(2)]
    return int(float(match.group(1)) * scale)


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def read_launch(launch: Launch) -> Launch:
    """Fill `launch` (argv set, a vLLM line) as vLLM's argparse would: the last of a repeated option wins, and dotted
    `--speculative-config.KEY` values replace a JSON `--speculative-config` altogether (vLLM re-appends them last)."""
    launch.syntax = VLLM
    i = entry_index(launch.argv)
    check_flags(launch, i, KNOWN, _base)
    argv = launch.argv
    if argv[i : i + 1] == ["serve"]:
        i += 1
        if i < len(argv) and not argv[i].startswith("-"):
            launch.model_path = argv[i]
    whole, dotted, spans = None, {}, []
    while i < len(argv):
        name, inline = _option(argv[i])
        base, _, key = name.partition(".")
        field = OPTIONS.get(KNOWN.resolve(base)[0]) if is_option(argv[i]) else None
        if field is None:
            i += 1
            continue
        if inline is None and (i + 1 >= len(argv) or is_option(argv[i + 1])):
            launch.errors.append(f"{name} has no value")
            i += 1
            continue
        value, end = (inline, i + 1) if inline is not None else (argv[i + 1], i + 2)
        if field == "spec":
            spans.append((i, end))
            text = value
            if key:
                key, parsed = _spec_item(launch, key, _json_value(value))
                dotted[key] = parsed
                text = parsed if isinstance(parsed, str) else value
            else:
                whole = _read_spec_json(launch, name, value)
                checked = whole and dict(_spec_item(launch, k, v) for k, v in whole.items())
                if checked != whole:
                    whole, text = checked, json.dumps(checked)
            option = argv[i][: len(base)] + (f".{key}" if key else "")  # the user's spelling, the key as meant
            argv[i:end] = [f"{option}={text}"] if inline is not None else [option, text]
        else:
            _set_field(launch, field, name, value, (i, end, inline is not None))
        i = end
    launch._spans["spec"] = spans  # every spelling of it, valid or not: a fix replaces them all
    spec = dotted or whole
    if spec is not None:
        launch.spec_config = spec
        _read_spec(launch, spec)
    return launch


def _read_spec_json(launch: Launch, name: str, value: str) -> dict | None:
    try:
        spec = json.loads(value)
    except ValueError as e:
        launch.errors.append(f"{name} is not JSON ({e}): {value[:80]!r}; write it as {VLLM.speculation_fix}")
        return None
    if not isinstance(spec, dict):
        launch.errors.append(f"{name} must be a JSON object, got {value[:80]!r}")
        return None
    return spec


def _spec_item(launch: Launch, key: str, value: Any) -> tuple[str, Any]:
    """One --speculative-config key (dotted for nested ones) and its value, an unknown key or method replaced by the
    one meant (SpeculativeConfig forbids extra fields and takes only its methods)."""
    top, dot, rest = key.partition(".")
    top = check_value(launch, "--speculative-config", top, SPEC_KEYS, "key") or top
    if top == "method" and not rest and isinstance(value, str):
        value = check_value(launch, '--speculative-config "method"', value, METHODS, "method") or value
    return top + dot + rest, value


def _set_field(launch: Launch, field: str, name: str, value: str, span: tuple[int, int, bool]) -> None:
    if field == "model_path":
        launch.model_path = value
        return
    try:
        number = _int(value)
    except ValueError:
        if not (field == "context_length" and value in ("-1", "auto")):  # the target's own max positions
            launch.errors.append(f"{name} {value!r} is not an integer")
        return
    setattr(launch, field, number)
    launch._spans[field] = span


def _read_spec(launch: Launch, spec: dict) -> None:
    """--speculative-config onto the Launch: method -> algorithm, model -> draft, k -> steps k / topk 1 / k+1."""
    launch.draft_path = spec.get("model") if isinstance(spec.get("model"), str) else None
    method = spec.get("method")
    if method is None:
        method = inferred_method(launch.draft_path)
        launch.notes.append(
            f'--speculative-config has no "method": vLLM infers {method!r} from the draft path '
            f"{launch.draft_path!r} (only names containing 'eagle-', 'eagle3' or 'dflash' name a method)"
        )
    launch.algorithm = METHOD_ALGORITHMS.get(str(method), str(method).upper())
    k = spec.get("num_speculative_tokens")
    if isinstance(k, int) and not isinstance(k, bool):
        launch.num_steps, launch.topk, launch.num_draft_tokens = k, 1, k + 1
    elif k is not None:
        launch.errors.append(f'--speculative-config "num_speculative_tokens" {k!r} is not an integer')


class VLLMSyntax(LaunchSyntax):
    """How vLLM spells the Launch fields, and how a fix is written back into a vLLM command."""

    engine = "vllm"
    known = KNOWN
    missing_spec_params = (
        "without it vLLM takes n_predict from the draft config, which EAGLE-3 drafts do not carry, and refuses to start"
    )
    speculation_fix = "--speculative-config " + shlex.quote(
        json.dumps({"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": DEFAULT_K})
    )
    _SPEC_KEYS = {"algorithm": "method", "draft_path": "model", "num_steps": "num_speculative_tokens"}
    _FLAGS = {"model_path": "--model", "context_length": "--max-model-len", "tp_size": "--tensor-parallel-size"}

    def flag(self, key: str) -> str:
        if key in self._SPEC_KEYS:
            return f'--speculative-config "{self._SPEC_KEYS[key]}"'
        if key in ("topk", "num_draft_tokens"):
            return '--speculative-config "num_speculative_tokens" (a chain: topk 1, k + 1 tokens verified)'
        return self._FLAGS[key]

    def describe(self, launch: Launch, key: str) -> str:
        spec = launch.spec_config
        if key in self._SPEC_KEYS and spec is None:
            return "no --speculative-config"
        if key == "algorithm" and "method" not in spec:
            return f'--speculative-config without "method" (vLLM infers {inferred_method(launch.draft_path)!r})'
        if key in self._SPEC_KEYS:
            return f'--speculative-config "{self._SPEC_KEYS[key]}": {json.dumps(spec.get(self._SPEC_KEYS[key]))}'
        value = getattr(launch, key)
        return f"{self.flag(key)} {value}" if value is not None else f"no {self.flag(key)}"

    def missing_draft(self, launch: Launch) -> list[str] | None:
        return missing_model(launch.spec_config, launch.draft_path)

    def aux_capture(self, config: dict, num_layers: int) -> tuple[list[int], str]:
        return aux_capture(config, num_layers)

    def describe_spec(self, launch: Launch) -> str:
        """One number, k: the draft proposes a chain of k tokens and k + 1 are verified per round."""
        return f"{self.describe(launch, 'num_steps')} (steps k, topk 1, num-draft-tokens k + 1)"

    def eagle3_under_eagle(self, launch: Launch, draft, ev: list[str]):
        return rules.eagle3_under_eagle(launch, draft, ev)

    def draft_checks(self, launch: Launch, draft, target) -> list:
        return rules.check_architecture(launch, draft)

    def consequences(self, algorithm: str) -> list[str]:
        if algorithm != "DRAFT_MODEL":
            return []
        return [
            "vLLM runs the checkpoint as a standalone draft model: it starts and answers /health, then the first "
            "request kills the engine (Eagle3LlamaForCausalLM.forward() needs the target's hidden states)"
        ]

    def spec_with(self, launch: Launch, changes: dict[str, Any]) -> dict:
        """The --speculative-config with the changes; a fix for a line without one names a DRAFT placeholder."""
        spec = dict(launch.spec_config or {})
        for key, value in changes.items():
            if key == "algorithm":
                spec["method"] = ALGORITHM_METHODS.get(value, str(value).lower())
            elif key in self._SPEC_KEYS:
                spec[self._SPEC_KEYS[key]] = value
        spec.setdefault("model", launch.draft_path or "DRAFT")
        spec.setdefault("num_speculative_tokens", DEFAULT_K)
        return spec

    def _changed(self, launch: Launch, changes: dict[str, Any]) -> list[str]:
        tokens = []
        if set(changes) & set(self._SPEC_KEYS):
            tokens += ["--speculative-config", json.dumps(self.spec_with(launch, changes))]
        if "context_length" in changes:
            tokens += ["--max-model-len", str(changes["context_length"])]
        return tokens

    def flags(self, launch: Launch, changes: dict[str, Any]) -> str:
        return shlex.join(self._changed(launch, changes))

    def corrected(self, launch: Launch, changes: dict[str, Any]) -> str:
        """The command with --max-model-len set in place and one --speculative-config where the first one was (every
        other spelling of it dropped); what the line lacks is appended."""
        argv = list(launch.argv)
        appended = []
        if "context_length" in changes:
            value = str(changes["context_length"])
            if "context_length" in launch._spans:
                start, _, inline = launch._spans["context_length"]
                if inline:
                    argv[start] = f"{argv[start].split('=', 1)[0]}={value}"
                else:
                    argv[start + 1] = value
            else:
                appended += ["--max-model-len", value]
        spans = launch._spans.get("spec") or []
        new = self._changed(launch, {k: v for k, v in changes.items() if k in self._SPEC_KEYS})
        if new and not spans:
            appended = new + appended
        if not new:
            spans = []
        dropped = {j for start, end in spans for j in range(start, end)}
        out = []
        for j, tok in enumerate(argv):
            if spans and j == spans[0][0]:
                out += new
            if j not in dropped:
                out.append(tok)
        return shlex.join(out + appended)


VLLM = VLLMSyntax()
