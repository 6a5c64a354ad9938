"""`eagle3lab doctor`: catch a silently bypassed EAGLE-3 draft before launch (launch line, draft, target) and after
(a running SGLang server's accept length).

SGLang serves an EAGLE-3 draft under `--speculative-algorithm EAGLE` without any error: the target hands over its
final hidden state (width H) instead of three concatenated aux states (3H), the draft skips `fc` because the width
already equals its own, and every draft token is rejected (accept length 1.0). Each check below turns one such silent
mismatch into a finding with evidence and a concrete corrected flag.

Library use (a notebook):
    report = diagnose(launch="python -m sglang.launch_server ...", draft="artifacts/draft", target="smollm2-135m-instruct")
    report.exit_code, report.findings, report.render(), report.to_json()
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ERROR, WARNING, OK = "error", "warning", "ok"
_RANK = {ERROR: 0, WARNING: 1, OK: 2}

# Algorithms whose target captures the three aux hidden states (SpeculativeAlgorithm.is_eagle3()).
EAGLE3_ALGORITHMS = {"EAGLE3"}
# Algorithms that hand the draft only the target's final hidden state (NEXTN is rewritten to EAGLE by SGLang).
EAGLE_ALGORITHMS = {"EAGLE", "NEXTN"}

# Accept length (tokens per verify step, bonus token included): at or below NOTHING the draft contributes nothing.
ACCEPT_NOTHING = 1.05
ACCEPT_LOW = 2.0
HF_LLAMA_DEFAULT_MAX_POSITIONS = 2048  # what a Llama config without max_position_embeddings falls back to


# ---- findings and the report ---------------------------------------------------------------------------------------


@dataclass
class Finding:
    check: str  # stable id: launch, algorithm, aux_layers, draft_vocab, context_length, spec_params, draft, target, server...
    severity: str  # error | warning | ok
    title: str
    evidence: list[str] = field(default_factory=list)
    fix: str | None = None  # a concrete corrected flag or command


@dataclass
class Report:
    findings: list[Finding]
    inputs: dict[str, Any]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def by_check(self, check: str) -> list[Finding]:
        return [f for f in self.findings if f.check == check]

    def summary(self) -> dict[str, int]:
        return {s: sum(f.severity == s for f in self.findings) for s in (ERROR, WARNING, OK)}

    def to_dict(self) -> dict:
        return {
            "exit_code": self.exit_code,
            "summary": self.summary(),
            "inputs": self.inputs,
            "findings": [asdict(f) for f in self.findings],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render(self) -> str:
        s = self.summary()
        lines = [f"eagle3lab doctor: {s[ERROR]} error(s), {s[WARNING]} warning(s), {s[OK]} ok"]
        for key, value in self.inputs.items():
            if value is not None:
                lines.append(f"  {key}: {value}")
        for f in sorted(self.findings, key=lambda f: _RANK[f.severity]):
            lines.append("")
            lines.append(f"{f.severity.upper():<8}[{f.check}] {f.title}")
            for e in f.evidence:
                lines.append(f"          {e}")
            if f.fix:
                first, *rest = f.fix.splitlines()
                lines.append(f"  fix:    {first}")
                lines.extend(f"          {r}" for r in rest)
        verdict = "errors found: the draft is not (fully) used as launched" if self.errors else "no errors"
        lines += ["", f"exit {self.exit_code}: {verdict}"]
        return "\n".join(lines)


# ---- the launch line ----------------------------------------------------------------------------------------------

# field -> SGLang option strings (server_args.py: primary name first, then aliases)
LAUNCH_FLAGS = {
    "model_path": ["--model-path", "--model"],
    "draft_path": ["--speculative-draft-model-path", "--speculative-draft-model"],
    "algorithm": ["--speculative-algorithm"],
    "num_steps": ["--speculative-num-steps"],
    "topk": ["--speculative-eagle-topk"],
    "num_draft_tokens": ["--speculative-num-draft-tokens"],
    "context_length": ["--context-length"],
    "tp_size": ["--tp-size", "--tensor-parallel-size"],
}
# Other SGLang options sharing prefixes with ours: argparse resolves an abbreviation only when it is unique.
_SIBLING_FLAGS = [
    "--model-impl",
    "--model-loader-extra-config",
    "--model-checksum",
    "--speculative-draft-model-revision",
    "--speculative-draft-load-format",
    "--speculative-draft-attention-backend",
    "--speculative-draft-window-size",
    "--speculative-draft-model-quantization",
    "--speculative-draft-placement",
    "--speculative-draft-gpu",
    "--speculative-accept-threshold-single",
    "--speculative-accept-threshold-acc",
    "--speculative-attention-mode",
    "--speculative-token-map",
    "--speculative-use-rejection-sampling",
    "--speculative-adaptive",
    "--speculative-adaptive-config",
    "--speculative-moe-runner-backend",
    "--speculative-moe-a2a-backend",
    "--speculative-ngram-min-bfs-breadth",
    "--speculative-ngram-max-bfs-breadth",
    "--speculative-dflash-block-size",
    "--context-parallel-size",
]
# SGLang ServerArgs field names as /server_info reports them
SERVER_INFO_FIELDS = {
    "model_path": "model_path",
    "draft_path": "speculative_draft_model_path",
    "algorithm": "speculative_algorithm",
    "num_steps": "speculative_num_steps",
    "topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
    "context_length": "context_length",
    "tp_size": "tp_size",
}
_INT_FIELDS = {"num_steps", "topk", "num_draft_tokens", "context_length", "tp_size"}


@dataclass
class Launch:
    """The speculative part of an SGLang launch, from a command line or from a server's /server_info."""

    source: str
    argv: list[str] | None = None
    model_path: str | None = None
    draft_path: str | None = None
    algorithm: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    context_length: int | None = None
    tp_size: int | None = None
    notes: list[str] = field(default_factory=list)  # parse problems, as evidence lines
    _spans: dict[str, tuple[int, bool]] = field(default_factory=dict, repr=False)  # field -> (token index, '=' form)

    @property
    def speculative(self) -> bool:
        return self.algorithm is not None

    def corrected(self, **changes: Any) -> str:
        """The command with the given fields set (flag replaced in place, or appended); argv-less sources give flags."""
        if self.argv is None:
            return " ".join(f"{LAUNCH_FLAGS[k][0]} {v}" for k, v in changes.items())
        argv = list(self.argv)
        appended = []
        for key, value in changes.items():
            flag = LAUNCH_FLAGS[key][0]
            if key in self._spans:
                i, eq = self._spans[key]
                if eq:
                    argv[i] = f"{argv[i].split('=', 1)[0]}={value}"
                else:
                    argv[i + 1] = str(value)
            else:
                appended += [flag, str(value)]
        return shlex.join(argv + appended)


def _fix(launch: Launch, **changes: Any) -> str:
    """A fix as the changed flags, then (for a command line) the whole corrected command."""
    flags = " ".join(f"{LAUNCH_FLAGS[k][0]} {v}" for k, v in changes.items())
    return flags if launch.argv is None else f"{flags}\n{launch.corrected(**changes)}"


def _resolve_flag(opt: str) -> tuple[str | None, str | None]:
    """Map an option string to a Launch field like argparse does (exact, alias, or unique prefix).

    Returns (field, note); field None when the option is not one of ours."""
    for key, names in LAUNCH_FLAGS.items():
        if opt in names:
            return key, None
    ours = [(key, name) for key, names in LAUNCH_FLAGS.items() for name in names if name.startswith(opt)]
    if not ours or len(opt) < 4:
        return None, None
    keys = {key for key, _ in ours}
    if len(keys) > 1:
        return None, f"`{opt}` is ambiguous ({', '.join(n for _, n in ours)}); SGLang rejects it"
    key = keys.pop()
    others = [name for name in _SIBLING_FLAGS if name.startswith(opt)]
    if others:
        return key, (
            f"`{opt}` read as {LAUNCH_FLAGS[key][0]}, but newer SGLang rejects it as ambiguous "
            f"(also matches {', '.join(others[:3])}); write {LAUNCH_FLAGS[key][0]}"
        )
    return key, None


def parse_launch(command: str | list[str]) -> Launch:
    """Parse `python -m sglang.launch_server ...` or `sglang serve ...` (shell quoting, `--flag=value`, aliases)."""
    launch = Launch(source="launch line")
    if isinstance(command, str):
        try:
            argv = shlex.split(command.replace("\\\r\n", " ").replace("\\\n", " "))
        except ValueError as e:
            launch.notes.append(f"the launch line is not valid shell syntax ({e})")
            return launch
    else:
        argv = [str(a) for a in command]
    argv = [a for a in argv if a.strip()]
    launch.argv = argv

    start = None
    for i, tok in enumerate(argv):
        if tok == "sglang.launch_server" and i > 0 and argv[i - 1] == "-m":
            start = i + 1
        elif Path(tok).name == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve":
            start = i + 2
            # `sglang serve MODEL` also takes the model positionally
            if start < len(argv) and not argv[start].startswith("-"):
                launch.model_path = argv[start]
        if start is not None:
            break
    if start is None:
        launch.notes.append(
            "not an SGLang launch (expected `python -m sglang.launch_server` or `sglang serve`); flags read anyway"
        )
        start = 0

    i = start
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            i += 1
            continue
        opt, eq, inline = tok.partition("=")
        key, note = _resolve_flag(opt)
        if note:
            launch.notes.append(note)
        if key is None:
            i += 1
            continue
        if eq:
            value, span = inline, (i, True)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, span = argv[i + 1], (i, False)
            i += 2
        else:
            launch.notes.append(f"{opt} has no value")
            i += 1
            continue
        if key in _INT_FIELDS:
            try:
                value = int(value)
            except ValueError:
                launch.notes.append(f"{opt} {value!r} is not an integer")
                continue
        elif key == "algorithm":
            value = value.upper()
        setattr(launch, key, value)
        launch._spans[key] = span
    return launch


def launch_from_server_info(info: dict) -> Launch:
    launch = Launch(source="server /server_info")
    for key, name in SERVER_INFO_FIELDS.items():
        value = info.get(name)
        if value is not None:
            setattr(launch, key, value.upper() if key == "algorithm" and isinstance(value, str) else value)
    return launch


# ---- the draft checkpoint -----------------------------------------------------------------------------------------


@dataclass
class DraftInfo:
    path: Path
    config: dict
    shapes: dict[str, tuple[list[int], str]]  # normalised key -> (shape, dtype)
    files: list[Path]

    def get(self, name: str, default=None):
        return self.config.get(name, default)

    @property
    def hidden_size(self) -> int | None:
        return self.config.get("hidden_size")

    @property
    def target_hidden_size(self) -> int | None:
        # SGLang: hidden_size_in = config.target_hidden_size if present else config.hidden_size
        return self.config.get("target_hidden_size") or self.hidden_size

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    @property
    def fc_in(self) -> int | None:
        shape = self.shapes.get("fc.weight")
        return shape[0][1] if shape and len(shape[0]) == 2 else None

    @property
    def aux_layer_ids(self) -> list[int] | None:
        eagle = self.config.get("eagle_config") or {}
        return eagle.get("eagle_aux_hidden_state_layer_ids")

    @property
    def kind(self) -> str:
        """eagle3 (three aux states into fc), eagle (EAGLE-1/2: final state), or unknown."""
        arch = " ".join(self.architectures).lower()
        if "eagle3" in arch:
            return "eagle3"
        if self.fc_in and self.target_hidden_size and self.fc_in == 3 * self.target_hidden_size:
            return "eagle3"
        if "eagle" in arch or (self.fc_in and self.hidden_size and self.fc_in == 2 * self.hidden_size):
            return "eagle"
        return "unknown"


class DoctorInputError(Exception):
    """An input could not be read; becomes a finding, never a traceback."""


def _tensor_shapes(files: list[Path]) -> dict[str, tuple[list[int], str]]:
    shapes = {}
    for f in files:
        try:
            if f.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(str(f), framework="pt") as st:
                    for name in st.keys():
                        sl = st.get_slice(name)
                        shapes[name] = (list(sl.get_shape()), str(sl.get_dtype()))
            else:  # pytorch_model.bin (many published EAGLE-3 drafts); mmap keeps it lazy
                import torch

                state = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
                for name, t in state.items():
                    shapes[name] = (list(t.shape), str(t.dtype).replace("torch.", ""))
        except Exception as e:  # a corrupt or foreign file: report which one and why
            raise DoctorInputError(f"{f}: cannot read tensor headers ({e.__class__.__name__}: {e})") from None
    # SGLang loads `name` or `model.name`: normalise to the bare name
    return {(k[6:] if k.startswith("model.") else k): v for k, v in shapes.items()}


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise DoctorInputError(f"{index}: not a valid safetensors index ({e})") from None
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise DoctorInputError(f"{folder}: no weights (*.safetensors or pytorch_model.bin)")
    return files


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DoctorInputError(f"{path} is missing") from None
    except (OSError, ValueError) as e:
        raise DoctorInputError(f"{path}: unreadable ({e})") from None


def read_draft(path: str | Path) -> DraftInfo:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise DoctorInputError(f"draft folder {folder} does not exist")
    cfg_path = folder / "config.json"
    config = _read_json(cfg_path)
    if not isinstance(config, dict):
        raise DoctorInputError(f"{cfg_path}: expected a JSON object")
    files = _weight_files(folder)
    return DraftInfo(path=folder, config=config, shapes=_tensor_shapes(files), files=files)


def load_tensor(draft: DraftInfo, name: str):
    """Load one (small) tensor fully, e.g. d2t / t2d, from whichever file holds it."""
    for f in draft.files:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as st:
                for key in (name, f"model.{name}"):
                    if key in st.keys():
                        return st.get_tensor(key)
        else:
            import torch

            state = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
            for key in (name, f"model.{name}"):
                if key in state:
                    return state[key]
    return None


# ---- the target config ---------------------------------------------------------------------------------------------


@dataclass
class TargetInfo:
    source: str
    num_layers: int
    hidden_size: int
    vocab_size: int | None
    max_position_embeddings: int | None


def read_target_config(spec: str) -> TargetInfo:
    """Target facts from a local folder's config.json, the embedded target, or a hub id already in the local cache."""
    from eagle3lab.models.target import EMBEDDED, TargetError, resolve

    path = Path(spec).expanduser()
    if path.is_file() and path.name.endswith(".json"):
        cfg_path = path
    elif path.is_dir():
        cfg_path = path / "config.json"
    elif spec in EMBEDDED:
        try:
            cfg_path = Path(resolve(spec)) / "config.json"
        except TargetError as e:
            raise DoctorInputError(str(e)) from None
    else:
        cfg_path = None
        if spec.count("/") == 1 and not spec.startswith((".", "/")):
            try:
                from huggingface_hub import try_to_load_from_cache

                cached = try_to_load_from_cache(spec, "config.json")
                cfg_path = Path(cached) if isinstance(cached, str) else None
            except (ImportError, ValueError, OSError):  # no hub client, or an id the hub would refuse
                cfg_path = None
        if cfg_path is None:
            raise DoctorInputError(
                f"target '{spec}' is not a local folder and its config.json is not in the local Hugging Face cache; "
                f"pass --target with a folder holding its config.json"
            )
    config = _read_json(cfg_path)
    # Multimodal targets (e.g. Kimi-K2.5) keep the language model's fields under text_config.
    if isinstance(config, dict) and "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    missing = [k for k in ("num_hidden_layers", "hidden_size") if not isinstance(config.get(k), int)]
    if missing:
        raise DoctorInputError(
            f"{cfg_path}: missing field(s) {', '.join(missing)} (needed for the layer and width checks)"
        )
    return TargetInfo(
        source=str(cfg_path),
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        vocab_size=config.get("vocab_size"),
        max_position_embeddings=config.get("max_position_embeddings"),
    )


# ---- static checks ------------------------------------------------------------------------------------------------


def _fmt_indices(indices: list[int]) -> str:
    return ", ".join(f"hidden_states[{i}]" for i in indices)


def check_algorithm(launch: Launch, draft: DraftInfo | None, target: TargetInfo | None) -> list[Finding]:
    algo = launch.algorithm
    where = (
        f"{launch.source}: --speculative-algorithm {algo}" if algo else f"{launch.source}: no --speculative-algorithm"
    )
    if draft is None:
        if algo in EAGLE_ALGORITHMS and launch.draft_path and "eagle3" in launch.draft_path.lower().replace("-", ""):
            return [
                Finding(
                    "algorithm",
                    WARNING,
                    f"the draft path names an EAGLE-3 draft but the algorithm is {algo}",
                    [
                        where,
                        f"draft path {launch.draft_path}",
                        "if it is an EAGLE-3 checkpoint its fc is bypassed (accept length 1.0); pass --draft to check",
                    ],
                    fix=_fix(launch, algorithm="EAGLE3"),
                )
            ]
        return [
            Finding(
                "algorithm",
                WARNING,
                "algorithm vs draft not checked: the draft checkpoint is not at hand",
                [where, f"draft path {launch.draft_path or '(none)'}; pass --draft FOLDER"],
            )
        ]

    ht = target.hidden_size if target else draft.target_hidden_size
    hd = draft.hidden_size
    fc = draft.fc_in
    kind = draft.kind
    arch = draft.architectures or ["(no architectures)"]
    ev = [
        where,
        f"draft {draft.path}: architectures {arch}, fc.weight "
        + (f"{list(draft.shapes['fc.weight'][0])}" if "fc.weight" in draft.shapes else "absent"),
    ]

    if not launch.speculative:
        return [
            Finding(
                "algorithm",
                ERROR,
                "no speculative algorithm: the draft is never loaded",
                ev + ["without --speculative-algorithm SGLang serves the target alone (or refuses the draft path)"],
                fix=_fix(launch, algorithm="EAGLE3" if kind == "eagle3" else "EAGLE"),
            )
        ]
    if kind == "eagle3" and algo in EAGLE_ALGORITHMS:
        n_layers = fc // ht if fc and ht and fc % ht == 0 else 3
        return [
            Finding(
                "algorithm",
                ERROR,
                f"EAGLE-3 draft served with {algo}: fc is bypassed, every draft token is rejected",
                ev
                + [
                    f"the draft's fc expects {n_layers} x {ht} = {fc or n_layers * ht} features "
                    f"(the target's aux hidden states, concatenated)",
                    f"under {algo} the target captures no aux states and sends its final hidden state: {ht} features",
                    f"SGLang applies fc only when the width differs from the draft's hidden size ({hd}); "
                    + (
                        "it does not, so fc is skipped silently"
                        if ht == hd
                        else "here it differs, so fc receives the wrong tensor and the launch fails or produces garbage"
                    ),
                    "the draft then predicts from features it was never trained on: accept length 1.0, no error, no warning",
                ],
                fix=_fix(launch, algorithm="EAGLE3"),
            )
        ]
    if kind == "eagle" and algo in EAGLE3_ALGORITHMS:
        return [
            Finding(
                "algorithm",
                ERROR,
                "a non-EAGLE-3 (EAGLE-1/2) draft served with EAGLE3",
                ev
                + [
                    f"under EAGLE3 the target sends 3 x {ht} = {3 * ht} aux features",
                    f"this draft takes the final hidden state ({ht} features) and has no 3 x {ht} fc",
                ],
                fix=_fix(launch, algorithm="EAGLE"),
            )
        ]
    if kind == "eagle3" and algo in EAGLE3_ALGORITHMS:
        return [
            Finding(
                "algorithm",
                OK,
                "EAGLE-3 draft served with EAGLE3: the target sends the aux states fc expects",
                ev + [f"fc input {fc}, target sends {fc // ht if fc and ht else 3} x {ht}"],
            )
        ]
    if kind == "eagle" and algo in EAGLE_ALGORITHMS:
        return [Finding("algorithm", OK, f"EAGLE draft served with {algo}", ev)]
    if algo not in EAGLE_ALGORITHMS | EAGLE3_ALGORITHMS:
        sev = ERROR if kind in ("eagle3", "eagle") else WARNING
        return [
            Finding(
                "algorithm",
                sev,
                f"{algo} does not run an EAGLE draft",
                ev + [f"the draft is an {kind.upper()} checkpoint; {algo} uses a different drafting scheme"],
                fix=_fix(launch, algorithm="EAGLE3" if kind == "eagle3" else "EAGLE"),
            )
        ]
    return [
        Finding(
            "algorithm",
            WARNING,
            "could not tell whether the draft is EAGLE-3",
            ev + ["neither the architecture name nor the fc width identifies it"],
        )
    ]


def check_aux_layers(draft: DraftInfo | None, target: TargetInfo | None, launch: Launch | None) -> list[Finding]:
    if draft is None or draft.kind != "eagle3":
        return []
    if launch is not None and launch.algorithm not in EAGLE3_ALGORITHMS and launch.speculative:
        return []  # no aux states are captured at all; check_algorithm already says so
    ids = draft.aux_layer_ids
    fc = draft.fc_in
    if fc is None:
        return [
            Finding(
                "aux_layers",
                ERROR,
                "the draft has no fc.weight [hidden, 3 x target hidden]",
                [f"tensors: {', '.join(sorted(draft.shapes)[:12])}"],
                fix="export the draft with its fc.weight (eagle3lab.models.draft.save_draft)",
            )
        ]
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, int) for i in ids)):
        return [
            Finding(
                "aux_layers",
                ERROR,
                "eagle_config.eagle_aux_hidden_state_layer_ids is not a list of integers",
                [f"{draft.path / 'config.json'}: {ids!r}"],
                fix='"eagle_aux_hidden_state_layer_ids": [1, 14, 26]',
            )
        ]
    source = (
        f"explicit eagle_aux_hidden_state_layer_ids {ids} (id i = output of layer i = hidden_states[i+1])"
        if ids is not None
        else "SGLang defaults: the inputs of layers [2, N//2, N-3]"
    )
    if target is None:
        ht = draft.target_hidden_size
        n = len(ids) if ids is not None else 3
        sev = OK if fc == n * ht else ERROR
        return [
            Finding(
                "aux_layers",
                WARNING,
                "capture layers not checked against the target (no target config)",
                [source, "pass --target PATH|ID to check that the layers exist"],
            ),
            Finding(
                "aux_layers",
                sev,
                f"fc input width {fc} {'=' if sev == OK else '!='} {n} x {ht} (draft's target_hidden_size)",
                [f"fc.weight {draft.shapes['fc.weight'][0]}"],
            ),
        ]

    from eagle3lab.models.target import TargetError, aux_hidden_indices

    n_layers = target.num_layers
    try:
        indices = aux_hidden_indices(n_layers, ids)
    except TargetError as e:
        default_ids = [i - 1 for i in aux_hidden_indices(n_layers)]
        return [
            Finding(
                "aux_layers",
                ERROR,
                "the draft asks for aux layers the target does not have",
                [source, f"target {target.source}: {n_layers} decoder layers", str(e)],
                fix=f'"eagle_aux_hidden_state_layer_ids": {default_ids} in {draft.path / "config.json"} '
                f"(SGLang's defaults for a {n_layers}-layer target), or retrain the draft on existing layers",
            )
        ]
    findings = []
    expected = len(indices) * target.hidden_size
    ev = [
        source,
        f"target {target.source}: {n_layers} layers, hidden {target.hidden_size}",
        f"captured: {_fmt_indices(indices)} -> {len(indices)} x {target.hidden_size} = {expected} features",
        f"draft fc.weight {draft.shapes['fc.weight'][0]}: takes {fc}",
    ]
    if len(indices) != 3:
        findings.append(
            Finding(
                "aux_layers",
                ERROR,
                f"{len(indices)} aux layers, but SGLang's EAGLE-3 fc takes exactly 3",
                ev,
                fix="list exactly three layer ids in eagle_aux_hidden_state_layer_ids",
            )
        )
    elif fc != expected:
        dth = draft.config.get("target_hidden_size")
        why = f"the draft was built for a target of hidden {fc // 3}" if fc % 3 == 0 else "fc width is not 3 x anything"
        if dth and dth != target.hidden_size:
            why += f" (config target_hidden_size {dth}); this target has hidden {target.hidden_size}"
        findings.append(
            Finding(
                "aux_layers",
                ERROR,
                f"fc input width {fc} != {len(indices)} x {target.hidden_size} = {expected}",
                ev + [why],
                fix="serve the draft with the target it was trained on, or retrain it for this target",
            )
        )
    else:
        findings.append(
            Finding(
                "aux_layers",
                OK,
                f"aux layers exist and fc width matches: {len(indices)} x {target.hidden_size} = {fc}",
                ev,
            )
        )
    if draft.config.get("target_hidden_size") is None and draft.hidden_size != target.hidden_size:
        findings.append(
            Finding(
                "aux_layers",
                ERROR,
                "config.json lacks target_hidden_size while the draft hidden differs from the target's",
                [
                    f"draft hidden {draft.hidden_size}, target hidden {target.hidden_size}: SGLang builds fc as 3 x {draft.hidden_size}"
                ],
                fix=f'"target_hidden_size": {target.hidden_size} in {draft.path / "config.json"}',
            )
        )
    return findings


def check_draft_vocab(draft: DraftInfo | None, target: TargetInfo | None) -> list[Finding]:
    if draft is None:
        return []
    cfg = draft.path / "config.json"
    findings = []
    vocab = draft.get("vocab_size")
    dvocab = draft.get("draft_vocab_size") or vocab
    tvocab = target.vocab_size if target and target.vocab_size else vocab
    if draft.get("tie_word_embeddings"):
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                "tie_word_embeddings is true: SGLang replaces the draft's lm_head with embed_tokens",
                [
                    f"{cfg}: tie_word_embeddings true",
                    f"embed_tokens has {vocab} rows (target vocab) while the trained lm_head "
                    f"has {draft.shapes.get('lm_head.weight', ([None],))[0][0]} rows over the draft vocab; d2t then maps the wrong ids",
                ],
                fix=f'"tie_word_embeddings": false in {cfg}',
            )
        )
    if not isinstance(vocab, int) or not isinstance(dvocab, int):
        return findings + [
            Finding(
                "draft_vocab",
                ERROR,
                "config.json lacks vocab_size / draft_vocab_size",
                [f"{cfg}: vocab_size {vocab!r}, draft_vocab_size {draft.get('draft_vocab_size')!r}"],
                fix=f'set "vocab_size": <target vocab> and "draft_vocab_size": <rows of lm_head.weight> in {cfg}',
            )
        ]
    if target and target.vocab_size and vocab != target.vocab_size:
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                f"draft vocab_size {vocab} != target vocab {target.vocab_size}",
                [f"{cfg}", f"target {target.source}"],
                fix="use the draft trained for this target",
            )
        )
    lm = draft.shapes.get("lm_head.weight")
    if lm is None:
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                "the draft has no lm_head.weight",
                ["SGLang would fall back to the target's head only when draft_vocab_size is unset"],
                fix="export the draft with lm_head.weight [draft_vocab_size, hidden]",
            )
        )
    elif lm[0][0] != dvocab or (draft.hidden_size and lm[0][1] != draft.hidden_size):
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                f"lm_head.weight {lm[0]} does not match draft_vocab_size x hidden = [{dvocab}, {draft.hidden_size}]",
                [f"{cfg}: draft_vocab_size {dvocab}, hidden_size {draft.hidden_size}"],
                fix=f'"draft_vocab_size": {lm[0][0]} in {cfg} if lm_head is right, else re-export the draft',
            )
        )
    if dvocab == tvocab and "d2t" not in draft.shapes:
        findings.append(Finding("draft_vocab", OK, f"draft vocab = target vocab ({tvocab}): no d2t mapping needed", []))
        return findings
    d2t_shape = draft.shapes.get("d2t")
    if d2t_shape is None:
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                f"no d2t tensor: draft ids 0..{dvocab - 1} would be read as target ids",
                [
                    f"draft_vocab_size {dvocab} < target vocab {tvocab}; SGLang maps draft -> target ids only through d2t"
                ],
                fix="export d2t (int64 [draft_vocab_size], target id = draft id + d2t[draft id]) with the weights",
            )
        )
        return findings
    if d2t_shape[0] != [dvocab]:
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                f"d2t shape {d2t_shape[0]} != [draft_vocab_size {dvocab}]",
                [],
                fix="re-export d2t from the draft vocab used in training",
            )
        )
        return findings
    d2t = load_tensor(draft, "d2t").long()
    import torch

    ids = d2t + torch.arange(dvocab)
    ev = [f"d2t {d2t_shape[0]} {d2t_shape[1]}: target ids {int(ids.min())}..{int(ids.max())}"]
    bad = []
    if int(ids.min()) < 0 or int(ids.max()) >= tvocab:
        bad.append(f"d2t maps draft ids outside the target vocab [0, {tvocab})")
    if len(torch.unique(ids)) != dvocab:
        bad.append(f"d2t maps {dvocab - len(torch.unique(ids))} draft ids onto target ids already taken")
    t2d_shape = draft.shapes.get("t2d")
    if t2d_shape is None:
        findings.append(
            Finding(
                "draft_vocab",
                WARNING,
                "no t2d tensor (SGLang ignores it; SpecForge-style tools expect it)",
                [],
                fix="export t2d (bool [target vocab], True for target ids in the draft vocab)",
            )
        )
    elif t2d_shape[0] != [tvocab]:
        bad.append(f"t2d shape {t2d_shape[0]} != [target vocab {tvocab}]")
    else:
        t2d = load_tensor(draft, "t2d").bool()
        ev.append(f"t2d {t2d_shape[0]}: {int(t2d.sum())} target ids marked")
        if int(t2d.sum()) != dvocab:
            bad.append(f"t2d marks {int(t2d.sum())} target ids, draft_vocab_size is {dvocab}")
        elif not bool(t2d[ids.clamp(0, tvocab - 1)].all()):
            bad.append("t2d and d2t disagree: some mapped target ids are not marked in t2d")
    if bad:
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                "d2t / t2d are inconsistent with the vocab sizes",
                ev + bad,
                fix="re-export d2t and t2d from the same draft vocab (eagle3lab.models.draft.save_draft)",
            )
        )
    else:
        findings.append(
            Finding(
                "draft_vocab",
                OK,
                f"draft vocab {dvocab} -> target vocab {tvocab}: d2t/t2d consistent, lm_head rows match",
                ev,
            )
        )
    return findings


def check_context_length(draft: DraftInfo | None, target: TargetInfo | None, launch: Launch | None) -> list[Finding]:
    if draft is None:
        return []
    cfg = draft.path / "config.json"
    draft_max = draft.get("max_position_embeddings")
    ev = []
    if draft_max is None:
        draft_max = HF_LLAMA_DEFAULT_MAX_POSITIONS
        ev.append(f"{cfg} has no max_position_embeddings: Llama configs default to {draft_max}")
    if launch is not None and launch.context_length:
        served, why = launch.context_length, f"--context-length {launch.context_length} ({launch.source})"
    elif target is not None and target.max_position_embeddings:
        served, why = (
            target.max_position_embeddings,
            f"target max_position_embeddings {target.max_position_embeddings} (no --context-length)",
        )
    else:
        return [
            Finding(
                "context_length",
                WARNING,
                "served context length unknown: draft positions not checked",
                ev + [f"draft max_position_embeddings {draft_max}; pass --launch with --context-length or --target"],
            )
        ]
    ev += [f"draft max_position_embeddings {draft_max}", f"served context: {why}"]
    if draft_max < served:
        return [
            Finding(
                "context_length",
                ERROR,
                f"the draft's positions stop at {draft_max} but the server accepts {served} tokens",
                ev + ["beyond the draft's rotary range acceptance collapses on long inputs, silently"],
                fix=f'"max_position_embeddings": {served} in {cfg}'
                + (f"\nor serve with {launch.corrected(context_length=draft_max)}" if launch and launch.argv else ""),
            )
        ]
    return [Finding("context_length", OK, f"draft positions {draft_max} cover the served context {served}", ev)]


def check_spec_params(launch: Launch | None) -> list[Finding]:
    if launch is None or not launch.speculative:
        return []
    values = {
        "--speculative-num-steps": launch.num_steps,
        "--speculative-eagle-topk": launch.topk,
        "--speculative-num-draft-tokens": launch.num_draft_tokens,
    }
    given = {k: v for k, v in values.items() if v is not None}
    ev = [f"{launch.source}: " + ", ".join(f"{k} {v}" for k, v in values.items())]
    if not given:
        return [Finding("spec_params", OK, "steps/topk/num-draft-tokens left to SGLang's per-model defaults", ev)]
    if len(given) < 3:
        steps = launch.num_steps or 3
        return [
            Finding(
                "spec_params",
                ERROR,
                "set all three of steps / topk / num-draft-tokens, or none",
                ev + ["SGLang auto-chooses them only when none is given; a partial set fails or mixes with defaults"],
                fix=_fix(launch, num_steps=steps, topk=1, num_draft_tokens=steps + 1),
            )
        ]
    bad = [f"{k} {v} must be >= 1" for k, v in values.items() if v < 1]
    if bad:
        return [
            Finding(
                "spec_params",
                ERROR,
                "non-positive speculative parameters",
                ev + bad,
                fix=_fix(launch, num_steps=3, topk=1, num_draft_tokens=4),
            )
        ]
    steps, topk, ndraft = launch.num_steps, launch.topk, launch.num_draft_tokens
    if topk == 1 and ndraft != steps + 1:
        return [
            Finding(
                "spec_params",
                WARNING,
                f"topk 1 needs num-draft-tokens = steps + 1 = {steps + 1}, got {ndraft}",
                ev + [f"SGLang silently overrides it to {steps + 1}: what you benchmark is not what you set"],
                fix=_fix(launch, num_draft_tokens=steps + 1),
            )
        ]
    if topk > 1 and ndraft > 1 + steps * topk:
        return [
            Finding(
                "spec_params",
                WARNING,
                f"num-draft-tokens {ndraft} exceeds the draft tree (1 + steps x topk = {1 + steps * topk})",
                ev,
                fix=_fix(launch, num_draft_tokens=1 + steps * topk),
            )
        ]
    return [Finding("spec_params", OK, f"steps {steps}, topk {topk}, num-draft-tokens {ndraft} are consistent", ev)]


def check_launch_vs_draft_path(launch: Launch, draft_arg: str | None) -> list[Finding]:
    if not draft_arg or not launch.draft_path:
        return []
    a, b = Path(draft_arg).expanduser(), Path(launch.draft_path).expanduser()
    same = a.exists() and b.exists() and a.resolve() == b.resolve()
    if same or str(a) == str(b):
        return []
    return [
        Finding(
            "draft",
            WARNING,
            "--draft is not the draft the launch line serves",
            [
                f"--draft {draft_arg}",
                f"{launch.source}: --speculative-draft-model-path {launch.draft_path}",
                "the checks use --draft; make sure it is the same checkpoint",
            ],
        )
    ]


# ---- the running server -------------------------------------------------------------------------------------------

PROBE_PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three tips for writing clear technical documentation.",
]


def _accept_lengths_from_info(info: dict) -> list[float]:
    """avg_spec_accept_length: top level (older SGLang), per DP rank in internal_states, or per decode server (PD)."""
    found = []
    if isinstance(info.get("avg_spec_accept_length"), (int, float)):
        found.append(float(info["avg_spec_accept_length"]))
    for group in ("internal_states", "decode"):
        for state in info.get(group) or []:
            if isinstance(state, dict):
                value = state.get("avg_spec_accept_length")
                if isinstance(value, (int, float)):
                    found.append(float(value))
                for inner in state.get("internal_states") or []:
                    if isinstance(inner, dict) and isinstance(inner.get("avg_spec_accept_length"), (int, float)):
                        found.append(float(inner["avg_spec_accept_length"]))
    return found


def judge_accept_length(
    value: float, what: str, evidence: list[str], launch: Launch | None, low: float = ACCEPT_LOW
) -> Finding:
    if value <= ACCEPT_NOTHING:
        fix = None
        if launch is not None and launch.algorithm in EAGLE_ALGORITHMS:
            fix = (
                _fix(launch, algorithm="EAGLE3") + "\n(if the draft is EAGLE-3; run the doctor with --draft to confirm)"
            )
        return Finding(
            "accept_length",
            ERROR,
            f"{what} {value:.2f}: the draft contributes nothing",
            evidence
            + [
                "every verify step keeps only the target's own token: no draft token is ever accepted",
                "usual cause: an EAGLE-3 draft served with EAGLE/NEXTN (fc bypassed), or a draft for another target",
            ],
            fix=fix or "run `eagle3lab doctor --launch '<the server command>' --draft DRAFT --target TARGET`",
        )
    if value < low:
        return Finding(
            "accept_length",
            WARNING,
            f"{what} {value:.2f}: the draft works but is weak",
            evidence
            + [
                f"below {low}: speculation likely costs more than it saves; a data/quality issue, not a flag bug",
                "more on-policy training data (target-regenerated responses) raises it",
            ],
        )
    return Finding("accept_length", OK, f"{what} {value:.2f}: the draft is used", evidence)


class _Http:
    def __init__(self, base: str, timeout: float, transport=None):
        import httpx

        self.base = base.rstrip("/")
        self.client = httpx.Client(base_url=self.base, timeout=timeout, transport=transport)
        self.httpx = httpx

    def get(self, path):
        return self.client.get(path)

    def post(self, path, payload):
        return self.client.post(path, json=payload)

    def close(self):
        self.client.close()


def _json_or_none(resp) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _meta_info(body: Any) -> dict | None:
    """SGLang's per-request meta_info (POST /generate; a batch answers with a list)."""
    if isinstance(body, list) and body:
        body = body[0]
    meta = body.get("meta_info") if isinstance(body, dict) else None
    return meta if isinstance(meta, dict) else None


def check_server(
    url: str,
    launch: Launch | None,
    *,
    expect_speculation: bool,
    probes: int = 3,
    probe_tokens: int = 64,
    timeout: float = 30.0,
    low: float = ACCEPT_LOW,
    transport=None,
) -> tuple[list[Finding], Launch | None]:
    """Runtime checks. Returns the findings and the launch as the server reports it (None when it does not)."""
    findings: list[Finding] = []
    http = _Http(url, timeout, transport)
    try:
        info, info_path = None, None
        for path in ("/server_info", "/get_server_info"):
            try:
                resp = http.get(path)
            except http.httpx.HTTPError as e:
                return [
                    Finding(
                        "server",
                        ERROR,
                        f"server {url} is unreachable",
                        [f"GET {path}: {e.__class__.__name__}: {e}"],
                        fix="check the URL and that the server is up (GET /health)",
                    )
                ], None
            if resp.status_code == 200 and isinstance(_json_or_none(resp), dict):
                info, info_path = resp.json(), path
                break
        server_launch = None
        if info is None:
            findings.append(
                Finding(
                    "server",
                    WARNING,
                    f"{url} has no /server_info: not an SGLang server (or an old one)",
                    ["server args and avg_spec_accept_length unavailable; relying on probe requests"],
                )
            )
        else:
            server_launch = launch_from_server_info(info)
            accepts = _accept_lengths_from_info(info)
            ev = [
                f"GET {info_path}: speculative_algorithm {info.get('speculative_algorithm')!r}, "
                f"draft {info.get('speculative_draft_model_path')!r}, version {info.get('version', '?')}"
            ]
            findings.append(Finding("server", OK, f"{url} answers /server_info", ev))
            if launch is not None and launch.algorithm != server_launch.algorithm:
                findings.append(
                    Finding(
                        "server",
                        WARNING,
                        "the running server does not match the launch line",
                        [
                            f"launch line: {launch.algorithm}; server: {server_launch.algorithm}",
                            "it was started with another command: restart it with the checked one",
                        ],
                    )
                )
            if not server_launch.speculative and not accepts:
                sev = ERROR if expect_speculation else WARNING
                findings.append(
                    Finding(
                        "speculation",
                        sev,
                        "speculation is off on the server",
                        ev + ["no speculative_algorithm and no avg_spec_accept_length: no draft is loaded"],
                        fix="--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT"
                        if expect_speculation
                        else None,
                    )
                )
            elif accepts:
                mean = sum(accepts) / len(accepts)
                findings.append(
                    judge_accept_length(
                        mean,
                        "server avg_spec_accept_length",
                        ev + [f"avg_spec_accept_length per rank: {', '.join(f'{a:.2f}' for a in accepts)}"],
                        launch or server_launch,
                        low,
                    )
                )
        if probes > 0:
            findings += _probe(
                http,
                url,
                info,
                launch or server_launch,
                expect_speculation or bool(server_launch and server_launch.speculative),
                probes,
                probe_tokens,
                low,
            )
        return findings, server_launch
    finally:
        http.close()


def _probe(http: _Http, url, info, launch, expect_speculation, probes, probe_tokens, low) -> list[Finding]:
    results, endpoint, errors = [], None, []
    for prompt in (PROBE_PROMPTS * probes)[:probes]:
        body = None
        try:
            if endpoint in (None, "/generate"):
                resp = http.post(
                    "/generate", {"text": prompt, "sampling_params": {"max_new_tokens": probe_tokens, "temperature": 0}}
                )
                if resp.status_code == 200:
                    endpoint, body = "/generate", _json_or_none(resp)
                elif endpoint is None and resp.status_code in (404, 405):
                    endpoint = "/v1/chat/completions"
                else:
                    errors.append(f"POST /generate: HTTP {resp.status_code} {resp.text[:200]}")
            if endpoint == "/v1/chat/completions":
                model = (info or {}).get("served_model_name") or (info or {}).get("model_path") or _first_model(http)
                resp = http.post(
                    endpoint,
                    {
                        "model": model,
                        "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": probe_tokens,
                        "temperature": 0,
                        "stream": False,
                    },
                )
                if resp.status_code == 200:
                    body = _json_or_none(resp)
                else:
                    errors.append(f"POST {endpoint}: HTTP {resp.status_code} {resp.text[:200]}")
        except http.httpx.HTTPError as e:
            errors.append(f"POST {endpoint or '/generate'}: {e.__class__.__name__}: {e}")
        if body is not None:
            results.append(body)
    if not results:
        return [
            Finding(
                "probe",
                ERROR,
                f"probe requests to {url} failed",
                errors[:3],
                fix="check the server log; retry with --probes 0 to skip probing",
            )
        ]
    metas = [_meta_info(b) for b in results]
    with_ct = [m for m in metas if m and m.get("spec_verify_ct") is not None]
    ev = [f"{len(results)} probe(s) via POST {endpoint}, temperature 0, max {probe_tokens} new tokens"] + errors[:2]
    if not with_ct:
        sev = ERROR if expect_speculation else WARNING
        if endpoint != "/generate":
            ev.append(
                "the server has no SGLang /generate; OpenAI-style responses carry no meta_info, "
                "so speculation is off or at least unreported"
            )
        return [
            Finding(
                "speculation",
                sev,
                "no spec_verify_ct in any response: speculation is off",
                ev
                + [
                    "a server that speculates reports meta_info.spec_verify_ct on every request; "
                    "this is not the same as accept length 1.0 (draft loaded but useless)"
                ],
                fix="--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT"
                if expect_speculation
                else None,
            )
        ]
    tokens = sum(int(m.get("completion_tokens") or 0) for m in with_ct)
    verify = sum(int(m["spec_verify_ct"]) for m in with_ct)
    per = [m.get("spec_accept_length") for m in with_ct]
    ev.append(
        f"completion_tokens {tokens}, spec_verify_ct {verify}; per-request spec_accept_length "
        + ", ".join(f"{p:.2f}" if isinstance(p, (int, float)) else "-" for p in per)
    )
    if verify == 0 or tokens < 8:
        return [
            Finding(
                "probe",
                WARNING,
                "probes produced too few tokens to judge acceptance",
                ev,
                fix="rerun with a larger --probe-tokens",
            )
        ]
    return [judge_accept_length(tokens / verify, "probe accept length", ev, launch, low)]


def _first_model(http: _Http) -> str:
    try:
        data = _json_or_none(http.get("/v1/models")) or {}
        return data.get("data", [{}])[0].get("id") or "default"
    except (http.httpx.HTTPError, AttributeError, IndexError, TypeError):
        return "default"


# ---- orchestration ------------------------------------------------------------------------------------------------


def _local_dir(path: str | None) -> bool:
    return bool(path) and Path(path).expanduser().is_dir()


def _read_target_finding(spec: str) -> tuple[TargetInfo | None, list[Finding]]:
    try:
        info = read_target_config(spec)
    except DoctorInputError as e:
        return None, [
            Finding(
                "target",
                WARNING,
                "target config not at hand: layer and vocab checks use the draft's own config",
                [str(e)],
                fix="--target PATH (a folder with the target's config.json) or the embedded target id",
            )
        ]
    return info, [
        Finding(
            "target",
            OK,
            f"target config: {info.num_layers} layers, hidden {info.hidden_size}, "
            f"vocab {info.vocab_size}, max positions {info.max_position_embeddings}",
            [info.source],
        )
    ]


def _read_draft_finding(spec: str | Path) -> tuple[DraftInfo | None, list[Finding]]:
    try:
        info = read_draft(spec)
    except DoctorInputError as e:
        return None, [
            Finding(
                "draft",
                ERROR,
                "the draft checkpoint cannot be read",
                [str(e)],
                fix="point --draft at the exported folder (config.json + model.safetensors)",
            )
        ]
    return info, [
        Finding(
            "draft",
            OK,
            f"draft checkpoint read: {info.kind.upper()} ({', '.join(info.architectures) or 'no architectures'})",
            [f"{info.path}: {len(info.shapes)} tensors in {', '.join(f.name for f in info.files)}"],
        )
    ]


def diagnose(
    launch: str | list[str] | None = None,
    draft: str | Path | None = None,
    target: str | None = None,
    server: str | None = None,
    *,
    probes: int = 3,
    probe_tokens: int = 64,
    timeout: float = 30.0,
    low_accept: float = ACCEPT_LOW,
    transport=None,
) -> Report:
    """Run every check the inputs allow. Any combination of inputs; unreadable ones become findings."""
    if not any((launch, draft, target, server)):
        raise ValueError("diagnose needs at least one of launch, draft, target, server")
    findings: list[Finding] = []
    parsed = parse_launch(launch) if launch else None
    if parsed is not None:
        sev = WARNING if parsed.notes else OK
        findings.append(
            Finding(
                "launch",
                sev,
                "launch line parsed" + (" with problems" if parsed.notes else ""),
                parsed.notes
                + [
                    f"algorithm {parsed.algorithm}, model {parsed.model_path}, draft {parsed.draft_path}, "
                    f"steps/topk/ndraft {parsed.num_steps}/{parsed.topk}/{parsed.num_draft_tokens}, "
                    f"context {parsed.context_length}, tp {parsed.tp_size}"
                ],
            )
        )
        findings += check_launch_vs_draft_path(parsed, str(draft) if draft else None)

    # target: --target, else the launch line's model when it is a local folder
    target_info = None
    target_spec = target or (parsed.model_path if parsed and _local_dir(parsed.model_path) else None)
    if target_spec:
        target_info, more = _read_target_finding(target_spec)
        findings += more
    elif parsed is not None or draft is not None:
        findings.append(
            Finding(
                "target",
                WARNING,
                "no target config: layer existence and target vocab not checked",
                [f"model path {parsed.model_path if parsed else None!r} is not a local folder"],
                fix="--target PATH|ID",
            )
        )

    # draft: --draft, else the launch line's draft when it is a local folder
    draft_info = None
    draft_spec = draft or (parsed.draft_path if parsed and _local_dir(parsed.draft_path) else None)
    if draft_spec:
        draft_info, more = _read_draft_finding(draft_spec)
        findings += more

    server_launch = None
    if server:
        expect = bool(draft_info) or bool(parsed and parsed.speculative)
        server_findings, server_launch = check_server(
            server,
            parsed,
            expect_speculation=expect,
            probes=probes,
            probe_tokens=probe_tokens,
            timeout=timeout,
            low=low_accept,
            transport=transport,
        )
        findings += server_findings
        # without a launch line, the server's own args name the draft and target; use them when they are local
        if parsed is None and server_launch is not None:
            if draft_info is None and not draft_spec and _local_dir(server_launch.draft_path):
                draft_spec = server_launch.draft_path
                draft_info, more = _read_draft_finding(draft_spec)
                findings += more
            if target_info is None and not target_spec and _local_dir(server_launch.model_path):
                target_spec = server_launch.model_path
                target_info, more = _read_target_finding(target_spec)
                findings += more

    # static checks run on the launch line, or on what the server reports it was launched with
    effective = parsed or server_launch
    if effective is not None and (effective.speculative or draft_info is not None):
        findings += check_algorithm(effective, draft_info, target_info)
    findings += check_aux_layers(draft_info, target_info, effective)
    findings += check_draft_vocab(draft_info, target_info)
    findings += check_context_length(draft_info, target_info, effective)
    findings += check_spec_params(effective)

    inputs = {
        "launch": " ".join(parsed.argv) if parsed and parsed.argv else launch,
        "draft": str(draft_spec) if draft_spec else None,
        "target": target_spec,
        "server": server,
    }
    return Report(findings=findings, inputs=inputs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eagle3lab doctor",
        description="Check an SGLang launch line, an EAGLE-3 draft, its target and a running server for a silently "
        "unused draft. Exit 0: no errors; 1: errors; 2: bad usage.",
    )
    parser.add_argument(
        "--launch", help='the server command, quoted: "python -m sglang.launch_server --model-path ..."'
    )
    parser.add_argument("--draft", help="draft checkpoint folder (config.json + weights)")
    parser.add_argument("--target", help="target: a folder with config.json, the embedded id, or a cached hub id")
    parser.add_argument("--server", help="URL of a running server, e.g. http://127.0.0.1:30000")
    parser.add_argument("--probes", type=int, default=3, help="probe requests sent to --server (0: none; default 3)")
    parser.add_argument("--probe-tokens", type=int, default=64, help="max new tokens per probe (default 64)")
    parser.add_argument("--timeout", type=float, default=30.0, help="HTTP timeout in seconds (default 30)")
    parser.add_argument(
        "--low-accept",
        type=float,
        default=ACCEPT_LOW,
        help=f"accept length below this is a weak-draft warning (default {ACCEPT_LOW})",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage, 0 on --help
        return int(e.code or 0)
    if not any((args.launch, args.draft, args.target, args.server)):
        parser.print_usage(sys.stderr)
        print("eagle3lab doctor: give at least one of --launch, --draft, --target, --server", file=sys.stderr)
        return 2
    if args.probes < 0 or args.probe_tokens < 1 or args.timeout <= 0:
        print("eagle3lab doctor: --probes >= 0, --probe-tokens >= 1 and --timeout > 0 are required", file=sys.stderr)
        return 2
    report = diagnose(
        launch=args.launch,
        draft=args.draft,
        target=args.target,
        server=args.server,
        probes=args.probes,
        probe_tokens=args.probe_tokens,
        timeout=args.timeout,
        low_accept=args.low_accept,
    )
    print(report.to_json() if args.json else report.render())
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
