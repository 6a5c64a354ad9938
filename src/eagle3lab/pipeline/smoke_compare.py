"""`python -m eagle3lab.pipeline.smoke_compare A B`: whether two smoke roots (eagle3lab.pipeline.smoke) hold the same
pipeline outputs, timings and what measured speed decides excluded: a code change that alters none may be recorded in
dvc.lock without a rerun (`python -m eagle3lab.pipeline.relock`)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import struct
import sys
from pathlib import Path

import numpy as np

from eagle3lab.io import InputError, command
from eagle3lab.regen.files import LOCK_SUFFIX, PROGRESS_SUFFIX, STALE_SUFFIX
from eagle3lab.regen.run import SERVER_LOG_SUFFIX

# Only these folders: figures/ (PNG bytes are not reproducible) and reports/ (executed notebooks: timings, paths) are
# views of what these hold. answers/ and answers_more/ (the grid's committed regeneration) are compared where a root has
# them: a smoke root made before the grid (or before issue 66's more_answers) has none.
COMPARED = ("artifacts", "metrics", "answers", "answers_more")
REQUIRED = ("artifacts", "metrics")
# an answers cell's own run files beside its output, which git and DVC leave out too (.gitignore, .dvcignore)
ANSWERS_RUN_FILES = (PROGRESS_SUFFIX, SERVER_LOG_SUFFIX, LOCK_SUFFIX, STALE_SUFFIX)

# The words that mark a JSON key as a timing or a fact about the moment, process or machine of a run: the key is split
# at "_", "-" and spaces, and its whole value is left out when any word is one of these (costs_ms, tokens_per_s,
# time_split, server_pid). Each family differs between two runs of the same code on the same machine (two smoke runs
# of one commit showed each of these differ), or says nothing about the code:
TIMING_WORDS = frozenset(
    {
        # durations, in the units the metrics use: seconds, step_s, round_ms, minutes, hours (regeneration estimates);
        # timeline: regeneration's progress, [seconds, tokens, records]; other: the per-round overhead in seconds
        # (tune's profile.other, measured even where a costs file gives the rest)
        *("seconds", "s", "ms", "minutes", "hours", "elapsed", "time", "wall", "eta", "duration", "timeline", "other"),
        # rates and their ratios: tokens_per_s, tok_s, throughput, speedup_vs_baseline all divide by a duration
        *("speedup", "throughput"),
        # when a run happened: created, started_at, updated_at (regeneration's progress files)
        *("created", "started", "updated", "finished", "date"),
        # the process and machine it ran on: process ids (pid, server_pid), the CPU (scaling's hardware), and a grid
        # cell's record of where, when and at which commit it ran (`ran`)
        *("pid", "hardware", "host", "cpu", "ran"),
    }
)


# What is decided by measured speed under names that do not say so (two smoke runs of one commit on one machine
# differed in each): the shape that ran fastest and everything chosen from it, the cost model's break-even and
# calibration, tune's whole profile and decision. Listed by file and top-level key; every other key is compared.
DECIDED_BY_TIMINGS = {
    "metrics/benchmark.json": {"best_config", "lossless", "tuned", "llamacpp", "llamacpp_split"},
    # each fit's records_for_break_even and records_for_2x: the fit read at the timed costs' break-even (stage 05)
    "metrics/scaling.json": {"break_even_tau", "tau_for_2x", "local_calibration", "tuned", "engines", "records_needed"}
    | {"records_for_break_even", "records_for_2x"},
    "metrics/tune.json": {"profile", "costs", "predictions", "benchmark", "ranked", "winner", "decision", "launch"},
}
# A finding read off the cost model (data needed for a speedup) carries the accept length that speedup needs.
SPEED_FINDING = "accept_length_needed"
# Content-keyed caches: a folder named by a hash of its input file's bytes. Regeneration writes records as requests
# finish (several at once), so the same records come in another order and the key differs; the drafts trained from
# the cache are compared bitwise, the records themselves as a set.
CACHES = ("artifacts/features/", "artifacts/grid/features/")
CACHE_PATH = re.compile(r"<root>/artifacts/(?:grid/)?features/[0-9a-f]+")
# The evaluation set's teacher-forced features (benchmark.eval_set.features_folder): a cache of the target forward the
# scored drafts share, kept beside the set's answers (which are compared) by a run of the code that keeps them.
EVAL_FEATURES = re.compile(r"artifacts/eval/[0-9a-f]+/features/")


def is_timing(name: str) -> bool:
    return any(word in TIMING_WORDS for word in re.split(r"[_\s.-]+", name.lower()))


def is_result(path: Path) -> bool:
    """Whether a file is compared. Left out: logs (servers' output: times, process ids), files named for a timing
    (dvclive's tokens_per_s.tsv), and training's resume checkpoints (checkpoint.pt: the seconds trained, train_time,
    and the process's unseeded Python RNG state; the weights they resume are compared as draft/model.safetensors)."""
    return path.suffix not in (".log", ".pt") and not is_timing(path.stem)


def without_timings(value, decided: set[str] = frozenset()):
    """A JSON value with its timing keys, the keys in `decided` (at any depth: a file's names for what its timings
    decide) and findings read off the cost model left out: what must be equal between two runs of the same code."""
    if isinstance(value, dict):
        return {
            k: without_timings(v, decided)
            for k, v in value.items()
            if not is_timing(k) and k not in decided and not (isinstance(v, dict) and SPEED_FINDING in v)
        }
    if isinstance(value, list):
        kept = [without_timings(v, decided) for v in value if not (isinstance(v, dict) and SPEED_FINDING in v)]
        # rows of a table: their order is how the run met them (a set's iteration, requests as they finished)
        if kept and all(isinstance(v, dict) for v in kept):
            kept.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return kept
    return value


# Ports the OS hands out at random to each server a run starts: in commands (--port 41465) and addresses
# (http://127.0.0.1:48431).
PORT = re.compile(r"(--port\W+|(?:127\.0\.0\.1|localhost):)\d+")


def check_root(root: Path) -> None:
    if not root.is_dir():
        raise InputError(f"{root} is not a folder")
    # eagle3lab.pipeline.smoke.prepare_root links notebooks/ into every scratch root: it tells one from a checkout.
    if not (root / "notebooks").is_symlink():
        raise InputError(f"{root} is not a smoke root: no notebooks/ link (a checkout, or not a smoke folder?)")
    for folder in REQUIRED:
        if not (root / folder).is_dir():
            raise InputError(f"{root} is not a finished smoke root: no {folder}/ folder")


def normaliser(root: Path):
    """Text read from a root, with what differs between two roots and means the same made equal: the root's own path
    (as given and resolved) becomes <root>, a server's port <port>."""
    prefixes = sorted({str(root.absolute()), str(root.resolve())}, key=len, reverse=True)
    # a prefix must end where a path part ends: /tmp/smoke is not a prefix of /tmp/smoke2
    own = re.compile("|".join(re.escape(p) + r"(?![\w.-])" for p in prefixes))
    return lambda text: CACHE_PATH.sub("<cache>", PORT.sub(r"\1<port>", own.sub("<root>", text)))


def outputs(root: Path) -> set[str]:
    found = {str(p.relative_to(root)) for folder in COMPARED for p in (root / folder).rglob("*") if p.is_file()}
    found = {
        rel for rel in found if not (rel.startswith(("answers/", "answers_more/")) and rel.endswith(ANSWERS_RUN_FILES))
    }
    return {
        rel for rel in found if is_result(Path(rel)) and not rel.startswith(CACHES) and not EVAL_FEATURES.match(rel)
    }


def short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def json_difference(a, b, where: str = "") -> str | None:
    """The first field where two JSON values differ, timing keys left out; None when equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [k for k in a if k in b] + sorted(a.keys() ^ b.keys()):
            if is_timing(key):
                continue
            field = f"{where}.{key}" if where else key
            if key not in b or key not in a:
                return f"{field} only in {'A' if key in a else 'B'}"
            if found := json_difference(a[key], b[key], field):
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where or '(top)'}: {len(a)} items != {len(b)}"
        return next((f for i, (x, y) in enumerate(zip(a, b)) if (f := json_difference(x, y, f"{where}[{i}]"))), None)
    same_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    if type(a) is not type(b) or (a != b and not same_nan):  # exact: 1 and 1.0, or True and 1, differ too
        return f"{where or '(top)'}: {short(a)} != {short(b)}"
    return None


def safetensors_header(data: bytes) -> tuple[dict, int]:
    """A safetensors file: 8-byte little-endian header length, a JSON header, then the tensors' raw bytes."""
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), 8 + length


# safetensors dtype -> numpy, to show a differing element's value (BF16: the upper half of a float32)
NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1"}
NUMPY_DTYPES |= {"U8": "u1", "BOOL": "?", "BF16": "<u2"}


def element(raw: bytes, dtype: str):
    value = np.frombuffer(raw, NUMPY_DTYPES[dtype])[0]
    if dtype == "BF16":
        value = np.array([int(value) << 16], "<u4").view("<f4")[0]
    return value.item()


def tensor_difference(a: bytes, b: bytes) -> str | None:
    """The first tensor (by name) whose dtype, shape or bytes differ; the metadata too."""
    (head_a, start_a), (head_b, start_b) = safetensors_header(a), safetensors_header(b)
    if found := json_difference(head_a.pop("__metadata__", None), head_b.pop("__metadata__", None), "__metadata__"):
        return found
    if head_a.keys() != head_b.keys():
        return f"tensors only in A: {sorted(head_a.keys() - head_b)}, only in B: {sorted(head_b.keys() - head_a)}"
    for name in sorted(head_a):
        ta, tb = head_a[name], head_b[name]
        if (ta["dtype"], ta["shape"]) != (tb["dtype"], tb["shape"]):
            return f"tensor {name}: {ta['dtype']}{ta['shape']} != {tb['dtype']}{tb['shape']}"
        raw_a = memoryview(a)[start_a + ta["data_offsets"][0] : start_a + ta["data_offsets"][1]]
        raw_b = memoryview(b)[start_b + tb["data_offsets"][0] : start_b + tb["data_offsets"][1]]
        if raw_a != raw_b:
            size = len(raw_a) // max(math.prod(ta["shape"]), 1)
            byte = int(np.argmax(np.frombuffer(raw_a, np.uint8) != np.frombuffer(raw_b, np.uint8)))
            i = byte - byte % size
            pair = (bytes(raw_a[i : i + size]), bytes(raw_b[i : i + size]))
            shown = [element(r, ta["dtype"]) if ta["dtype"] in NUMPY_DTYPES else r.hex() for r in pair]
            return f"tensor {name}: element {i // size} {shown[0]} != {shown[1]}"
    return None


def lines_difference(a: list[str], b: list[str], what: str) -> str | None:
    for i, (x, y) in enumerate(zip(a, b), 1):
        if x != y:
            return f"{what} {i}: {short(x)} != {short(y)}"
    return f"{len(a)} {what}s != {len(b)}" if len(a) != len(b) else None


def difference(rel: str, a: Path, b: Path, norm_a, norm_b) -> str | None:
    """How one output differs between the roots (the first difference only), or None."""
    raw_a, raw_b = (a / rel).read_bytes(), (b / rel).read_bytes()
    suffix = Path(rel).suffix
    if suffix == ".safetensors":
        return tensor_difference(raw_a, raw_b)
    try:
        text_a, text_b = norm_a(raw_a.decode()), norm_b(raw_b.decode())
    except UnicodeDecodeError:  # any other binary: bitwise
        digests = [hashlib.sha256(raw).hexdigest()[:12] for raw in (raw_a, raw_b)]
        return None if raw_a == raw_b else f"sha256 {digests[0]} != {digests[1]}"
    try:
        if suffix == ".json":
            decided = DECIDED_BY_TIMINGS.get(rel, set())
            return json_difference(*(without_timings(json.loads(t), decided) for t in (text_a, text_b)))
        if suffix == ".jsonl":  # the records as a set: written as they finished (see CACHES)
            records_a, records_b = ([json.loads(line) for line in t.splitlines()] for t in (text_a, text_b))
            if found := json_difference(without_timings(records_a), without_timings(records_b)):
                return f"records (in order of their content): {found}"
            return None
    except json.JSONDecodeError:  # a truncated or hand-edited file: still an output, compared as text
        pass
    return lines_difference(text_a.splitlines(), text_b.splitlines(), "line")


def compare(a: Path, b: Path, within: set[str] | None = None) -> tuple[list[str], int]:
    """One line per output that differs, and how many outputs were compared: all of them, or only those that are or
    lie under one of the paths `within` (the outputs of the stages a relock would keep)."""
    norm_a, norm_b = normaliser(a), normaliser(b)
    in_a, in_b = outputs(a), outputs(b)
    if within is not None:
        inside = tuple(f"{path.rstrip('/')}/" for path in within)
        in_a, in_b = ({rel for rel in found if rel in within or rel.startswith(inside)} for found in (in_a, in_b))
    lines = []
    for rel in sorted(in_a | in_b):
        if rel not in in_b or rel not in in_a:
            lines.append(f"{rel}: only in {'A' if rel in in_a else 'B'}")
        elif found := difference(rel, a, b, norm_a, norm_b):
            lines.append(f"{rel}: {found}")
    return lines, len(in_a | in_b)


@command("smoke compare")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3lab.pipeline.smoke_compare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("a", type=Path, help="a smoke root (python -m eagle3lab.pipeline.smoke --root A)")
    parser.add_argument("b", type=Path, help="another smoke root")
    args = parser.parse_args(argv)
    check_root(args.a)
    check_root(args.b)
    lines, compared = compare(args.a, args.b)
    for line in lines:
        print(line)
    print(f"smoke compare: {compared} outputs compared, {len(lines)} differ")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
