"""`python -m eagle3lab.pipeline.mixture_restore`: stage 01's mixture rebuilt from the data and params alone is the
one dvc.lock records, byte for byte; a draw that differs is refused and leaves nothing behind."""

import pytest

from eagle3lab.io import InputError
from eagle3lab.pipeline import mixture_restore


@pytest.fixture
def root(locked_root):
    return locked_root


def test_the_rebuilt_mixture_is_the_one_dvc_lock_records(root):
    folder = mixture_restore.restore(root)
    assert sorted(p.name for p in folder.iterdir()) == ["train.jsonl", "val.jsonl"]
    assert mixture_restore.folder_hash(folder) == mixture_restore.locked_hash(root)
    assert not (root / f"{mixture_restore.FOLDER}.restoring").exists()


def test_a_draw_that_differs_from_the_lock_is_refused_and_leaves_nothing(root, monkeypatch):
    def other_draw(params, folder, root):
        folder.mkdir(parents=True)
        (folder / "train.jsonl").write_text("{}\n")

    monkeypatch.setattr(mixture_restore, "rebuild", other_draw)
    with pytest.raises(InputError, match=r"dvc.lock: stage 'dataset_survey' locked artifacts/mixture as \w+\.dir"):
        mixture_restore.restore(root)
    assert not (root / "artifacts" / "mixture").exists() and not list((root / "artifacts").iterdir())


def test_a_machine_that_has_the_mixture_keeps_it_untouched(root, monkeypatch):
    (root / mixture_restore.FOLDER).mkdir(parents=True)
    (root / mixture_restore.FOLDER / "train.jsonl").write_text("mine\n")
    monkeypatch.setattr(mixture_restore, "rebuild", lambda params, folder, root: pytest.fail("rebuilt what was there"))
    assert (mixture_restore.restore(root) / "train.jsonl").read_text() == "mine\n"


def test_a_lock_without_the_stage_is_named(root):
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    with pytest.raises(InputError, match="no stage 'dataset_survey': its output was never locked"):
        mixture_restore.restore(root)
