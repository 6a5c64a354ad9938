"""vLLM for the doctor: its launch line read into the doctor's `Launch`, fixes written back as a corrected
`--speculative-config '{...}'` (what vLLM does with the draft's config
is `fields`, its own findings `rules`).

vLLM's CLI (FlexibleArgumentParser) turns underscores in option names into dashes, takes `--flag=value` and `--flag
value`, `-sc` / `-tp` short forms and dotted dict options (`--speculative-config.method eagle3`); `vllm serve` takes
the model positionally or as `--model`.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from eagle3lab.doctor.launch import Launch, LaunchSyntax
from eagle3lab.engines.vllm import rules
from eagle3lab.engines.vllm.fields import ALGORITHM_METHODS, METHOD_ALGORITHMS, aux_capture

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
    argv = launch.argv
    i = entry_index(argv)
    if argv[i : i + 1] == ["serve"]:
        i += 1
        if i < len(argv) and not argv[i].startswith("-"):
            launch.model_path = argv[i]
    whole, dotted, spans = None, {}, []
    while i < len(argv):
        name, inline = _option(argv[i])
        base, _, key = name.partition(".")
        field = OPTIONS.get(base) if argv[i].startswith("-") else None
        if field is None:
            i += 1
            continue
        if inline is None and i + 1 >= len(argv):
            launch.notes.append(f"{name} has no value")
            break
        value, end = (inline, i + 1) if inline is not None else (argv[i + 1], i + 2)
        if field == "spec":
            spans.append((i, end))
            if key:
                dotted[key] = _json_value(value)
            else:
                whole = _read_spec_json(launch, name, value)
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
        launch.notes.append(f"{name} is not JSON ({e}): {value[:80]!r}")
        return None
    if not isinstance(spec, dict):
        launch.notes.append(f"{name} must be a JSON object, got {value[:80]!r}")
        return None
    return spec


def _set_field(launch: Launch, field: str, name: str, value: str, span: tuple[int, int, bool]) -> None:
    if field == "model_path":
        launch.model_path = value
        return
    try:
        number = _int(value)
    except ValueError:
        if not (field == "context_length" and value in ("-1", "auto")):  # the target's own max positions
            launch.notes.append(f"{name} {value!r} is not an integer")
        return
    setattr(launch, field, number)
    launch._spans[field] = span


def inferred_method(draft_path: str | None) -> str:
    """vLLM's guess when --speculative-config has no "method" (SpeculativeConfig.__post_init__): by the draft's name."""
    name = (draft_path or "").lower()
    return "eagle" if "eagle-" in name else "eagle3" if "eagle3" in name else "draft_model"


def _read_spec(launch: Launch, spec: dict) -> None:
    """--speculative-config onto the Launch: method -> algorithm, model -> draft, k -> steps k / topk 1 / k+1."""
    launch.draft_path = spec.get("model") if isinstance(spec.get("model"), str) else None
    method = spec.get("method")
    if method is None:
        method = inferred_method(launch.draft_path)
        launch.notes.append(
            f'--speculative-config has no "method": vLLM infers {method!r} from the draft path '
            f"{launch.draft_path!r} (only names containing 'eagle-' or 'eagle3' are read as EAGLE)"
        )
    launch.algorithm = METHOD_ALGORITHMS.get(str(method), str(method).upper())
    k = spec.get("num_speculative_tokens")
    if isinstance(k, int) and not isinstance(k, bool):
        launch.num_steps, launch.topk, launch.num_draft_tokens = k, 1, k + 1
    elif k is not None:
        launch.notes.append(f'--speculative-config "num_speculative_tokens" {k!r} is not an integer')


class VLLMSyntax(LaunchSyntax):
    """How vLLM spells the Launch fields, and how a fix is written back into a vLLM command."""

    engine = "vllm"
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
