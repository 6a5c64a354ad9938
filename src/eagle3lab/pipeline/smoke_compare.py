"""`python -m eagle3lab.pipeline.smoke_compare A B`: whether two smoke roots (eagle3lab.pipeline.smoke) hold the same
pipeline outputs, timings excluded: a code change that alters none may be recorded in dvc.lock with `dvc commit`."""

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

# Only these folders: figures/ (PNG bytes are not reproducible) and reports/ (executed notebooks: timings, paths) are
# views of what these hold.
COMPARED = ("artifacts", "metrics")

# The words that mark a JSON key as a timing or a fact about the moment or machine of a run: the key is split at "_",
# "-" and spaces, and its whole value is left out when any word is one of these (costs_ms, tokens_per_s, time_split).
# Each family differs between two runs of the same code on the same machine, or says nothing about the code:
TIMING_WORDS = frozenset(
    {
        # durations, in the units the metrics use: seconds, step_s, round_ms, minutes, hours (regeneration estimates)
        *("seconds", "s", "ms", "minutes", "hours", "elapsed", "time", "wall", "eta", "duration"),
        # rates and their ratios: tokens_per_s, tok_s, throughput, speedup_vs_baseline all divide by a duration
        *("speedup", "throughput"),
        # when a run happened
        *("created", "started", "finished", "date"),
        # the machine it ran on: same machine for both roots, but not the code's doing
        *("hardware", "host", "cpu"),
    }
)

# Files that only log a run (servers' and trainers' output, with times and process ids), never read as results.
LOG_SUFFIXES = (".log",)


def is_timing(key: str) -> bool:
    return any(word in TIMING_WORDS for word in re.split(r"[_\s-]+", key.lower()))


class NotASmokeRoot(Exception):
    pass


def check_root(root: Path) -> None:
    if not root.is_dir():
        raise NotASmokeRoot(f"{root} is not a folder")
    # eagle3lab.pipeline.smoke.prepare_root links notebooks/ into every scratch root: it tells one from a checkout.
    if not (root / "notebooks").is_symlink():
        raise NotASmokeRoot(f"{root} is not a smoke root: no notebooks/ link (a checkout, or not a smoke folder?)")
    for folder in COMPARED:
        if not (root / folder).is_dir():
            raise NotASmokeRoot(f"{root} is not a finished smoke root: no {folder}/ folder")


def normaliser(root: Path):
    """Paths that name the root itself, or the checkout its links point at, differ between two roots and mean the
    same: each becomes a placeholder, in any text read from the root."""
    prefixes = {str(root.absolute()): "<root>", str(root.resolve()): "<root>"}
    prefixes[str((root / "notebooks").resolve().parent)] = "<checkout>"
    # longest first, and a prefix must end where a path part ends: /tmp/smoke is not a prefix of /tmp/smoke2
    pattern = re.compile("|".join(re.escape(p) + r"(?![\w.-])" for p in sorted(prefixes, key=len, reverse=True)))
    return lambda text: pattern.sub(lambda m: prefixes[m.group(0)], text)


def outputs(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for folder in COMPARED
        for p in (root / folder).rglob("*")
        if p.is_file() and not p.name.endswith(LOG_SUFFIXES)
    }


def short(value) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else value.hex()
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
    except UnicodeDecodeError:  # any other binary (torch .pt, GGUF): bitwise
        digests = [hashlib.sha256(raw).hexdigest()[:12] for raw in (raw_a, raw_b)]
        return None if raw_a == raw_b else f"sha256 {digests[0]} != {digests[1]}"
    try:
        if suffix == ".json":
            return json_difference(json.loads(text_a), json.loads(text_b))
        if suffix == ".jsonl":
            records_a, records_b = text_a.splitlines(), text_b.splitlines()
            for i, (x, y) in enumerate(zip(records_a, records_b), 1):
                if found := json_difference(json.loads(x), json.loads(y)):
                    return f"record {i}: {found}"
            return f"{len(records_a)} records != {len(records_b)}" if len(records_a) != len(records_b) else None
    except json.JSONDecodeError:  # a truncated or hand-edited file: still an output, compared as text
        pass
    return lines_difference(text_a.splitlines(), text_b.splitlines(), "line")


def compare(a: Path, b: Path) -> tuple[list[str], int]:
    """One line per output that differs, and how many outputs were compared."""
    norm_a, norm_b = normaliser(a), normaliser(b)
    in_a, in_b = outputs(a), outputs(b)
    lines = []
    for rel in sorted(in_a | in_b):
        if rel not in in_b or rel not in in_a:
            lines.append(f"{rel}: only in {'A' if rel in in_a else 'B'}")
        elif found := difference(rel, a, b, norm_a, norm_b):
            lines.append(f"{rel}: {found}")
    return lines, len(in_a | in_b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3lab.pipeline.smoke_compare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("a", type=Path, help="a smoke root (python -m eagle3lab.pipeline.smoke --root A)")
    parser.add_argument("b", type=Path, help="another smoke root")
    args = parser.parse_args(argv)
    try:
        check_root(args.a)
        check_root(args.b)
    except NotASmokeRoot as e:
        print(f"smoke compare: {e}", file=sys.stderr)
        return 2
    lines, compared = compare(args.a, args.b)
    for line in lines:
        print(line)
    print(f"smoke compare: {compared} outputs compared, {len(lines)} differ")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
