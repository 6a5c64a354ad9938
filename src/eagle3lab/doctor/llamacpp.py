# long: one engine's reader, fixes, GGUF checks and probe; they share its flag table and measured facts
"""llama.cpp for the doctor: a `llama-server` line read into the doctor's `Launch`, fixes written back in
llama-server's flags, the draft GGUF checked against the target GGUF (serving.gguf.draft_mismatches, the one home of
those rules), and a running llama-server probed: /props and /slots, greedy /completion probes whose timings count the
accepted draft tokens, /metrics (only with --metrics) for the drafting rounds.

llama-server's parser (common/arg.cpp) takes exact option names (no prefixes, no `--flag=value`), reads underscores
in `--` options as dashes, and keeps the last of a repeated option, except --spec-type, whose comma-separated lists
add up (a list naming `none` adds nothing).

What llama.cpp 11434 starts without a complaint and then serves badly, measured on real servers (the wheel's Q4_1
SmolLM2-135M, the committed draft; the right line, --spec-type draft-eagle3 --spec-draft-n-max 2, gives 1.52 tokens
per target step on four MT-bench prompts):
- --spec-type draft-simple: the EAGLE-3 GGUF runs as a standalone draft model, without the target's hidden states:
  1.04 (2% of the draft tokens accepted).
- no --spec-type: llama.cpp infers a type from the draft GGUF only for MTP, DFlash and DSpark drafts; the EAGLE-3
  draft is loaded and never used (/slots: speculative false).
- a GGUF whose eagle3.target_layers are not the trained layers: converted against a 24-layer config ([2, 12, 21])
  1.17, from a config with top-level eagle_aux_hidden_state_layer_ids [0, 1, 2] 1.02.
- --spec-draft-p-min 0.99 (1 drafting round in 144 tokens: 1.01; 0.95: 6, 1.04; 0.9: 8, 1.07), and
  --spec-draft-n-min above --spec-draft-n-max (every draft dropped).
- --spec-draft-n-max 0: /health answers, the first request aborts the server.
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from eagle3lab.doctor.artifacts import DraftInfo, TargetInfo
from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import Launch, fix_flags
from eagle3lab.doctor.probe import PROBE_PROMPTS, counters_text, judge_accept_length, probes_failed
from eagle3lab.io import InputError
from eagle3lab.serving.client import Completion, ServerClient, ServerError, json_object
from eagle3lab.serving.gguf import (
    DRAFT_ARCH,
    default_target_layers,
    draft_mismatches,
    gguf_facts,
    trained_target_layers,
)
from eagle3lab.serving.llamacpp import SPEC_TYPE, LlamaCpp

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
}
FLAGS = {setting: option for option, setting in reversed(OPTIONS.items())}  # each setting's first spelling
DEFAULTS = {"n_max": 3, "n_min": 0, "p_min": 0.0}  # common_params_speculative
# common_speculative_all_types_str()
SPEC_TYPES = {"none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-cache"}
SPEC_TYPES |= {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"}
REMOVED = {"--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min"}  # llama-server refuses to start
# at or above this p-min (almost) no round drafts (measured: 0.9 -> 1.07 tokens per target step, 0.99 -> 1.01)
P_MIN_STOPS_DRAFTING = 0.9
EXPORT_FIX = (
    "export the draft folder against this target: eagle3lab export DRAFT_FOLDER --target TARGET --out DRAFT.gguf "
    "(llama.cpp's convert_hf_to_gguf.py with --target-model-dir of this target)"
)
ENGINE = LlamaCpp()  # its completion request and its counters


# ---- the launch line ------------------------------------------------------------------------------------------------


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
    argv = launch.argv
    start = entry_index(argv)
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
        if name in REMOVED:
            launch.notes.append(
                f"{name} was removed from llama.cpp: llama-server refuses to start (use {FLAGS['n_max']})"
            )
        setting = OPTIONS.get(name)
        if setting is None:
            i += 1
            continue
        if i + 1 >= len(argv):
            launch.notes.append(f"{name} has no value")
            break
        launch._spans.setdefault(setting, []).append(i)
        if setting == "spec_type":
            types += _spec_types(launch, argv[i + 1])
        else:
            values[setting] = argv[i + 1]
        i += 2
    launch.model_path = values.get("model_path")
    launch.draft_path = values.get("draft_path")
    spec = {key: _number(launch, key, values.get(key), type(default)) for key, default in DEFAULTS.items()}
    types = list(dict.fromkeys(types))
    launch.spec_config = {"types": types, **spec, "metrics": metrics}
    context = _number(launch, "context_length", values.get("context_length"), int)
    launch.context_length = context or None  # 0: the model's own context
    if types:
        launch.algorithm = "EAGLE3" if types == [SPEC_TYPE] else ",".join(types).upper()
        k = spec["n_max"]
        launch.num_steps, launch.topk, launch.num_draft_tokens = k, 1, k + 1
    return launch


def _spec_types(launch: Launch, value: str) -> list[str]:
    """One --spec-type list: llama.cpp refuses unknown names, and a list naming `none` turns nothing on."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SPEC_TYPES]
    if unknown:
        launch.notes.append(f"--spec-type {', '.join(unknown)}: unknown to llama.cpp, which refuses to start")
    return [] if "none" in names else [n for n in names if n in SPEC_TYPES]


def _number(launch: Launch, setting: str, text: str | None, kind: type):
    if text is None:
        return DEFAULTS.get(setting)
    try:
        return kind(text)
    except ValueError:
        launch.notes.append(f"{FLAGS[setting]} {text!r} is not a number: llama-server refuses to start")
        return DEFAULTS.get(setting)


class LlamaCppSyntax:
    """How llama-server spells the Launch fields, and how a fix is written back into its command. Fixes name the
    Launch fields (algorithm EAGLE3, num_steps, context_length) or llama.cpp's own settings (n_min, p_min)."""

    engine = "llamacpp"
    speculation_fix = f"-md DRAFT.gguf --spec-type {SPEC_TYPE}"
    _SETTINGS = {"algorithm": "spec_type", "num_steps": "n_max", "topk": "n_max", "num_draft_tokens": "n_max"}

    def _setting(self, key: str) -> str:
        return self._SETTINGS.get(key, key)

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


# ---- the draft and target GGUFs -------------------------------------------------------------------------------------


def is_gguf(path) -> bool:
    return bool(path) and str(path).endswith(".gguf")


@dataclass
class GGUFPair:
    """The draft and target GGUF files a llama.cpp diagnosis checks (either may be unknown)."""

    draft: str | None
    target: str | None


def gguf_pair(launch: Launch | None, draft, target) -> GGUFPair | None:
    """The GGUFs the inputs name: --draft / --target when they are .gguf files, else a llama-server line's -md / -m;
    None when there is neither a GGUF nor a llama-server line (not a llama.cpp diagnosis)."""
    line = launch if launch is not None and launch.engine == LLAMACPP.engine else None
    pair = GGUFPair(
        str(draft) if is_gguf(draft) else line and line.draft_path,
        str(target) if is_gguf(target) else line and line.model_path,
    )
    return pair if line is not None or pair.draft or pair.target else None


_READ_FIX = {
    "draft": "-md (or --draft): the draft's GGUF (eagle3lab export DRAFT_FOLDER writes one)",
    "target": "-m (or --target): the target's GGUF",
}


@functools.lru_cache(maxsize=8)
def _facts(path: str, mtime_ns: int) -> dict:
    return gguf_facts(path)


def read_facts(path: str) -> dict:
    """gguf_facts, read once per file version: GGUFReader parses the whole vocabulary (seconds per file)."""
    file = Path(path)
    return _facts(str(file.resolve()), file.stat().st_mtime_ns) if file.is_file() else gguf_facts(path)  # names it


def target_info(path: str) -> TargetInfo | None:
    """The target GGUF as the generic checks know a target (layers, width, vocab, trained context); None: unreadable."""
    try:
        facts = read_facts(path)
    except InputError:
        return None
    if not (facts["block_count"] and facts["embedding_length"]):
        return None
    return TargetInfo(
        path, facts["block_count"], facts["embedding_length"], facts["vocab_size"], facts["context_length"]
    )


def _read(path: str, what: str) -> tuple[dict | None, list[Finding]]:
    try:
        return read_facts(path), []
    except InputError as e:
        return None, [Finding("gguf", ERROR, f"the {what} GGUF cannot be read", [str(e)], fix=_READ_FIX[what])]


def _facts_text(facts: dict) -> str:
    if facts["architecture"] == DRAFT_ARCH:
        head = facts["draft_vocab_size"]
        d2t = "d2t" if facts["d2t_max_target_id"] is not None else "no d2t"
        return (
            f"{facts['path']}: eagle3, target_layers {facts['target_layers']}, target_hidden_size "
            f"{facts['target_hidden_size']}, vocab {facts['vocab_size']}, head {head} ({d2t})"
        )
    return (
        f"{facts['path']}: {facts['architecture']}, {facts['block_count']} layers, embedding_length "
        f"{facts['embedding_length']}, vocab {facts['vocab_size']}"
    )


def check_fit(draft: dict, target: dict, folder: DraftInfo | None) -> list[Finding]:
    """The draft GGUF against the target GGUF (draft_mismatches), and against what its folder was trained on."""
    n_layers = target["block_count"]
    trained = trained_target_layers(folder.config, n_layers) if folder is not None and n_layers else None
    ev = [_facts_text(draft), _facts_text(target)]
    if trained is not None:
        ev.append(f"{folder.path / 'config.json'}: trained on the inputs of target layers {trained}")
    where = f"draft {draft['path']}: "  # draft_mismatches names the file first; the evidence names both
    problems = draft_mismatches(draft, target, trained)
    if problems:
        return [Finding("gguf", ERROR, p.removeprefix(where), ev, fix=EXPORT_FIX) for p in problems]
    layers, defaults = draft["target_layers"], default_target_layers(n_layers or 0)
    if trained is None and n_layers and layers != defaults:
        return [
            Finding(
                "gguf",
                WARNING,
                f"eagle3.target_layers {layers} are not the defaults for a {n_layers}-layer target ({defaults})",
                ev
                + [
                    "right only if the draft was trained on them; llama.cpp serves a GGUF naming other layers without "
                    "a complaint (top-level ids [0, 1, 2] for a draft trained on the defaults: 1.02 measured)",
                    "pass --draft FOLDER (the folder it was exported from) to check",
                ],
            )
        ]
    return [Finding("gguf", OK, "the draft GGUF fits the target GGUF", ev)]


def check_spec_type(launch: Launch, draft: dict | None) -> list[Finding]:
    """Only draft-eagle3 hands an EAGLE-3 draft the target's hidden states; llama.cpp takes any other type, or none."""
    if launch.draft_path is None:
        return []
    types = launch.spec_config["types"]
    kind = f"draft {launch.draft_path}: " + (f"general.architecture {draft['architecture']!r}" if draft else "unread")
    ev = [f"{launch.source}: {launch.describe('algorithm')}", kind]
    if types == [SPEC_TYPE]:
        return [Finding("algorithm", OK, f"--spec-type {SPEC_TYPE}: the draft reads the target's hidden states", ev)]
    fix = fix_flags(launch, algorithm="EAGLE3")
    if not types:
        why = [
            "llama.cpp infers a type from the draft GGUF only for MTP, DFlash and DSpark drafts "
            "(common_speculative_types_from_gguf): an EAGLE-3 draft is loaded and never drafts",
            "the server starts and answers at the target's own speed; /slots reports speculative false",
        ]
        return [
            Finding("algorithm", ERROR, "no --spec-type: llama.cpp never runs the EAGLE-3 draft", ev + why, fix=fix)
        ]
    why = [f"only {SPEC_TYPE} hands the draft the target's hidden states (the three captured layers fc reads)"]
    if "draft-simple" in types:
        why.append(
            "draft-simple runs the EAGLE-3 GGUF as a standalone draft model: it starts without a complaint and "
            "every draft token is rejected (1.04 tokens per target step measured)"
        )
    if SPEC_TYPE in types:
        why.append(
            f"{SPEC_TYPE} beside another draft type fails every request (HTTP 500: failed to process speculative "
            "batch, measured with draft-simple)"
        )
    title = f"--spec-type {','.join(types)}: the EAGLE-3 draft is not run as EAGLE-3"
    return [Finding("algorithm", ERROR, title, ev + why, fix=fix)]


def check_draft_length(launch: Launch) -> list[Finding]:
    """--spec-draft-n-max / -n-min / -p-min: llama.cpp takes values under which no round drafts, or it aborts."""
    if not launch.speculative:
        return []
    spec = launch.spec_config
    n_max, n_min, p_min = spec["n_max"], spec["n_min"], spec["p_min"]
    ev = [f"{launch.source}: " + ", ".join(LLAMACPP.describe(launch, key) for key in DEFAULTS)]
    findings = []
    if n_max < 1:
        why = "GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) in llama_context::decode"
        findings.append(
            Finding(
                "spec_params",
                ERROR,
                f"--spec-draft-n-max {n_max}: llama-server starts, then aborts on the first request",
                ev + [f"/health answers; the first completion kills the server ({why})"],
                fix=fix_flags(launch, num_steps=DEFAULTS["n_max"]),
            )
        )
    elif n_min > n_max:
        findings.append(
            Finding(
                "spec_params",
                ERROR,
                f"--spec-draft-n-min {n_min} > --spec-draft-n-max {n_max}: every draft is dropped",
                ev
                + [
                    "llama.cpp drafts up to n-max tokens, then drops a draft shorter than n-min: the draft runs "
                    "every round and nothing is ever verified (0 drafting rounds measured)"
                ],
                fix=fix_flags(launch, n_min=0),
            )
        )
    if p_min >= P_MIN_STOPS_DRAFTING:
        findings.append(
            Finding(
                "spec_params",
                ERROR,
                f"--spec-draft-p-min {p_min:g}: (almost) no round drafts",
                ev
                + [
                    "llama.cpp stops a draft where the draft's top token is below p-min (its probability among the "
                    "top 10); with the committed draft 0.9 drafted in 8 rounds of 144 tokens, 0.95 in 6, 0.99 in 1",
                    "its log's mean len counts drafting rounds only and rises with p-min: judge tokens per target step",
                ],
                fix=fix_flags(launch, p_min=0.0),
            )
        )
    if findings:
        return findings
    return [Finding("spec_params", OK, f"the draft proposes up to {n_max} tokens per round", ev)]


def static_checks(launch: Launch | None, pair: GGUFPair, folder: DraftInfo | None) -> list[Finding]:
    """Every llama.cpp check that needs no server: the GGUF pair, and the line's --spec-* settings."""
    draft = target = None
    findings = []
    if pair.draft:
        draft, more = _read(pair.draft, "draft")
        findings += more
    if pair.target and pair.draft:
        target, more = _read(pair.target, "target")
        findings += more
    if draft is not None and target is not None:
        findings += check_fit(draft, target, folder)
    elif draft is not None and not pair.target:
        findings.append(
            Finding(
                "gguf",
                WARNING,
                "the draft GGUF is not checked against a target",
                [_facts_text(draft)],
                fix="--target TARGET.gguf, or --launch with the llama-server line (-m)",
            )
        )
    if launch is not None and launch.engine == LLAMACPP.engine:
        findings += check_spec_type(launch, draft) + check_draft_length(launch)
    return findings


# ---- a running llama-server -----------------------------------------------------------------------------------------


def server_props(client: ServerClient) -> dict | None:
    """llama-server's /props (its build, model and endpoints); None from a server that is not llama.cpp's."""
    try:
        props = json_object(client.http.get("/props"))
    except (httpx.HTTPError, ServerError):
        return None
    return props if "build_info" in props else None


def _slots_speculative(client: ServerClient) -> bool | None:
    """Whether the first slot speculates (/slots); None when the server was started with --no-slots."""
    try:
        return bool(json_object(client.http.get("/slots")).get("speculative"))
    except (httpx.HTTPError, ServerError):
        return None


def _prompt_ids(client: ServerClient, prompt: str) -> list[int]:
    """The prompt in the server's own chat template and tokenizer (the doctor needs neither)."""
    messages = [{"role": "user", "content": prompt}]
    text = json_object(client.http.post("/apply-template", json={"messages": messages}))["prompt"]
    return json_object(client.http.post("/tokenize", json={"content": text}))["tokens"]


def _send_probes(client: ServerClient, probes: int, probe_tokens: int) -> tuple[list[Completion], list[str]]:
    done, errors = [], []
    for prompt in (PROBE_PROMPTS * probes)[:probes]:
        try:
            done.append(ENGINE.complete(client, _prompt_ids(client, prompt), probe_tokens))
        except (httpx.HTTPError, ServerError) as e:
            errors.append(f"{e.__class__.__name__}: {e}")
    return done, errors


def _speculation_off(ev: list[str], why: str, expect_speculation: bool) -> Finding:
    return Finding(
        "speculation",
        ERROR if expect_speculation else WARNING,
        f"speculation is off on the llama.cpp server: {why}",
        ev
        + [
            "llama-server speculates only with a draft (-md) and a --spec-type that uses it: with -md and no "
            "--spec-type it loads an EAGLE-3 draft and never drafts"
        ],
        fix=LLAMACPP.speculation_fix if expect_speculation else None,
    )


def check_server(client, props, launch, expect_speculation, probes, probe_tokens, low) -> list[Finding]:
    """llama.cpp: speculation on or off from /slots, and the accept length over greedy probes, as tokens per target
    step (rounds where p-min stops the draft count too), from the responses' timings; /metrics adds the rounds."""
    ev = [
        f"GET /props: model {props.get('model_path')}, n_ctx "
        f"{(props.get('default_generation_settings') or {}).get('n_ctx')}, build {props.get('build_info')}"
    ]
    findings = [Finding("server", OK, f"{client.url} is a llama.cpp server (/props)", ev)]
    speculative = _slots_speculative(client)
    if speculative is False:
        return findings + [_speculation_off(ev, "/slots reports speculative false", expect_speculation)]
    metrics = bool(props.get("endpoint_metrics"))
    if not metrics:
        findings.append(
            Finding(
                "metrics",
                WARNING,
                "/metrics is off: the probe needs llama-server started with --metrics for its drafting rounds",
                ["GET /props: endpoint_metrics false; the accepted tokens still come from each response's timings"],
                fix="--metrics",
            )
        )
    if probes == 0:
        return findings
    before = ENGINE.counters(client) if metrics else None
    done, errors = _send_probes(client, probes, probe_tokens)
    if not done:
        return findings + [probes_failed(client, errors)]
    rounds = ENGINE.counters(client) - before if metrics else None
    return findings + [_judge(done, errors, rounds, speculative, launch, expect_speculation, probe_tokens, low)]


def _judge(done, errors, rounds, speculative, launch, expect_speculation, probe_tokens, low) -> Finding:
    timings = [c.meta or {} for c in done]
    tokens = sum(c.completion_tokens or 0 for c in done)
    drafted = sum(t.get("draft_n", 0) for t in timings)
    accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
    ev = [
        f"{len(done)} probe(s) via POST /completion, greedy, max {probe_tokens} new tokens",
        *errors[:2],
        f"{tokens} tokens in {tokens - accepted} target steps: {accepted} of {drafted} draft tokens accepted "
        "(the responses' timings)",
    ]
    if rounds is not None:
        ev.append(f"/metrics over the probes: {counters_text(rounds)}")
    if tokens < 8:
        return Finding(
            "probe", WARNING, "probes produced too few tokens to judge acceptance", ev, fix="a larger --probe-tokens"
        )
    if drafted == 0 and speculative is None:
        return _speculation_off(ev, "no probe drafted a token (and /slots is off)", expect_speculation)
    if drafted == 0:
        ev.append(
            "/slots reports speculative true, yet no round drafted: llama.cpp drops a draft whose top token is below "
            "--spec-draft-p-min, or that is shorter than --spec-draft-n-min"
        )
    ev.append("accept length here: tokens per target step, the rounds that did not draft included")
    return judge_accept_length(tokens / (tokens - accepted), "probe accept length", ev, launch, low)
