"""Colab's two save locations: the course folder in Drive that the first cell sets up, and
`MyDrive/Colab Notebooks`, where "Save a copy in Drive" puts a notebook opened from its Colab badge.
Notebooks 04-05 find the student's work in either; the first cell says when work is kept in the second.
Colab is stood in for by a fake `google.colab` module and a Drive folder under tmp_path."""
from __future__ import annotations

import os
import shutil
import sys
import types
from pathlib import Path

import nbformat
import pytest
from conftest import filled_submission, write_nb

from grading import notebooks as nbs
from starter import runtime
from starter.layers import get_layers
from starter.notebook_loader import NotebookLoadError, find_notebook, is_untouched_release, load_definitions

NB02, NB03 = "02_positional_encoding.ipynb", "03_multi_head_attention.ipynb"


@pytest.fixture
def drive(tmp_path, monkeypatch):
    """A mounted fake Drive on a fake Colab: (course folder, MyDrive/Colab Notebooks)."""
    my_drive = tmp_path / "drive" / "MyDrive"
    course, saves = my_drive / "attention-course", my_drive / "Colab Notebooks"
    course.mkdir(parents=True)
    saves.mkdir()
    colab = types.ModuleType("google.colab")
    colab.drive = types.SimpleNamespace(mount=lambda *a, **k: pytest.fail("Drive was mounted already"))
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab.drive", colab.drive)
    monkeypatch.setattr(runtime, "DRIVE_MOUNT", str(tmp_path / "drive"))
    monkeypatch.setenv(runtime.NOTEBOOKS_ENV, str(course))  # start_notebook sets these: restored after the test
    monkeypatch.setenv("COURSE_DATA_DIR", str(course / "data"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    return course.resolve(), saves.resolve()


def _dated(path: Path, mtime: float) -> Path:
    os.utime(path, (mtime, mtime))
    return path


def blank(path: Path, release: str = NB03, mtime: float = 2e9) -> Path:
    """The release notebook, untouched, as Colab or the first cell saves it."""
    return _dated(Path(shutil.copyfile(nbs.RELEASE / release, path)), mtime)


def finished(path: Path, release: str = NB03, mtime: float = 2e9) -> Path:
    """The release notebook with every answer filled in, as a student who finished it has it."""
    return _dated(write_nb(filled_submission(Path(release).stem), path), mtime)


def test_the_finished_copy_in_colab_notebooks_is_used_not_the_blank_in_the_course_folder(drive, capsys):
    course, saves = drive
    blank(course / NB03, mtime=2e9)  # newer, but blank: 01's first cell copied it there
    copy = finished(saves / f"Copy of {NB03}", mtime=1e9)
    finished(course / NB02, NB02)
    assert is_untouched_release(course / NB03, NB03), "the release notebook was not seen as a blank"
    assert not is_untouched_release(copy, NB03), "a finished notebook was taken for a blank"
    assert find_notebook(NB03) == copy, "the student's finished copy in Colab Notebooks was not found"
    assert load_definitions(NB03, ["MultiHeadAttention"]).path == copy
    get_layers("mine", verbose=True)  # notebook 04's cell: prints the file each layer came from
    out = capsys.readouterr().out
    assert f"from {copy}\n" in out and f"from {course / NB02}\n" in out, f"04 did not print the paths it used: {out}"
    # off Colab, MyDrive/Colab Notebooks is nobody's course folder: not looked at
    del sys.modules["google.colab"]
    assert find_notebook(NB03) == course / NB03, "off Colab a folder other than the course folder was searched"


def test_the_course_folder_still_works_and_the_newest_finished_copy_wins(drive):
    course, saves = drive
    mine = finished(course / NB03, mtime=1e9)
    blank(saves / f"Copy of {NB03}", mtime=2e9)  # saved from the badge, never worked on
    blank(saves / f"{Path(NB03).stem} (1).ipynb", mtime=2e9)
    assert find_notebook(NB03) == mine, "a newer blank copy in Colab Notebooks won over the student's work"
    later = finished(saves / f"Copy of {NB03}", mtime=3e9)
    assert find_notebook(NB03) == later, "the newest finished copy was not the one used"
    _dated(mine, 4e9)
    assert find_notebook(NB03) == mine, "the newest finished copy was not the one used"


def test_only_blank_releases_keep_the_one_folder_behaviour(drive):
    course, saves = drive
    with pytest.raises(NotebookLoadError, match=f"can't find your {NB03} in {course} nor in {saves}"):
        find_notebook(NB03)
    saved_blank = blank(saves / f"Copy of {NB03}", mtime=3e9)
    assert find_notebook(NB03) == saved_blank, "a blank copy in Colab Notebooks was not found when it was the only one"
    in_course = blank(course / NB03, mtime=1e9)
    assert find_notebook(NB03) == in_course, "with blanks only, the course folder's notebook must be used, as before"


def test_an_answer_cell_worked_on_is_not_a_blank(drive, monkeypatch):
    course, _ = drive
    nb = nbformat.read(nbs.RELEASE / NB03, as_version=4)
    answer = next(c for c in nb.cells if (c.metadata.get("nbgrader") or {}).get("solution"))
    answer.source = answer.source.replace("raise NotImplementedError()", "return x  # my attempt")
    path = write_nb(nb, course / NB03)
    assert not is_untouched_release(path, NB03), "a notebook with one answer written was taken for a blank"
    monkeypatch.setattr(runtime, "KIT_ROOT", course.parent)  # no release to compare with: the markers decide
    monkeypatch.setattr("starter.notebook_loader.KIT_ROOT", course.parent)
    assert not is_untouched_release(path, NB03), "without the release, a worked-on notebook was taken for a blank"
    assert is_untouched_release(blank(course / "blank.ipynb"), NB03), "without the release, a blank was not seen"


def test_the_first_cell_says_every_time_that_work_is_saved_outside_the_course_folder(drive, capsys):
    _, saves = drive
    runtime.start_notebook()
    assert "Colab Notebooks" not in capsys.readouterr().out, "the warning came with nothing in Colab Notebooks"
    (saves / "unrelated.ipynb").write_text("{}")
    blank(saves / "Copy of 01_scaled_dot_product_attention.ipynb", "01_scaled_dot_product_attention.ipynb")
    for _ in range(2):
        out = runtime.start_notebook()
        lines = [ln for ln in capsys.readouterr().out.splitlines() if "Colab Notebooks" in ln]
        assert out == drive[0]
        assert len(lines) == 1, f"expected one line about My Drive/Colab Notebooks, got {lines}"
        assert "(Copy of 01_scaled_dot_product_attention.ipynb)" in lines[0] and "attention-course" in lines[0] \
            and "keep your copies in one of the two" in lines[0], lines[0]
