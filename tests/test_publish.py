"""The student copy holds what students need and nothing private."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from grading import notebooks as nbs
from grading.publish import LeakError, check_no_leak, publish


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    return publish(tmp_path_factory.mktemp("student") / "kit")


def test_student_copy_has_the_release_and_starter(copy):
    assert {p.name for p in (copy / "notebooks").glob("*.ipynb")} == {p.name for p in nbs.RELEASE.glob("*.ipynb")}
    assert {p.name for p in (copy / "starter" / "references").glob("*.h5")} == \
        {p.name for p in nbs.PUBLIC_REFERENCES.glob("*.h5")}
    assert not (copy / "solutions").exists() and not (copy / "grading").exists() and not (copy / "tests").exists()
    # the starter package works from the copy alone (no import of the private grading package)
    code = "import starter.checks, starter.data, starter.plotting, starter.notebook_loader; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True,
                         env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})
    assert out.stdout.strip() == "ok", out.stderr[-500:]


def test_leaks_are_caught(copy, tmp_path):
    planted = tmp_path / "planted"
    shutil.copytree(copy, planted)
    shutil.copy(nbs.solution_notebooks()[0], planted / "notebooks" / "extra.ipynb")
    with pytest.raises(LeakError, match="BEGIN SOLUTION"):
        check_no_leak(planted)
    (planted / "notebooks" / "extra.ipynb").unlink()
    shutil.copy(next(nbs.HIDDEN_REFERENCES.glob("*.h5")), planted / "starter" / "references" / "more.h5")
    with pytest.raises(LeakError, match="hidden reference cases"):
        check_no_leak(planted)


def test_repo_address_reaches_the_first_cell_and_the_badges(tmp_path):
    dest = publish(tmp_path / "kit", repo="my-uni/attention-2027")
    for nb in (dest / "notebooks").glob("*.ipynb"):
        text = nb.read_text()
        assert "https://github.com/my-uni/attention-2027.git" in text, f"{nb.name}: first cell still clones the default"
        assert f"colab.research.google.com/github/my-uni/attention-2027/blob/main/notebooks/{nb.name}" in text
        assert "attention-course-kit/attention-transformers" not in text
    assert "github/my-uni/attention-2027/blob/main/notebooks/01_" in (dest / "README.md").read_text()
