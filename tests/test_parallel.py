"""Parallel autograde on a real PostgreSQL gradebook, and resuming an interrupted run."""
from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import postgres
from conftest import filled_submission, write_nb
from grading import notebooks as nbs
from grading.autograde import autograde, graded_columns

NB = "01_scaled_dot_product_attention"
FULL = sum(p for s, _, p in graded_columns() if s == NB)
CAUSAL_BUG = '''
def causal_mask(T, device=None):
    return torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)
'''


def _class(folder: Path, n: int) -> dict[str, float]:
    """n students alternating correct / buggy notebook 01; returns the expected totals."""
    expected = {}
    for i in range(n):
        name = f"s{i:02d}"
        buggy = i % 2 == 1
        write_nb(filled_submission(NB, {"causal_mask": CAUSAL_BUG} if buggy else None), folder / name / f"{NB}.ipynb")
        expected[name] = FULL - 1 if buggy else FULL
    return expected


def _totals(out: Path) -> dict[str, float]:
    with open(out / "grades.csv") as f:
        return {r["student"]: float(r[f"{NB}:total"]) for r in csv.DictReader(f) if r["student"] != "(max points)"}


@pytest.mark.skipif(not postgres.available() and not os.environ.get("CI"), reason="no PostgreSQL server binaries")
def test_two_workers_on_postgres(tmp_path):
    expected = _class(tmp_path / "subs", 4)
    with postgres.server() as url:
        results = autograde(tmp_path / "subs", tmp_path / "out", course_dir=tmp_path / "course", db_url=url, workers=2)
        assert {r.student: r.status for r in results} == {s: "graded" for s in expected}
        assert _totals(tmp_path / "out") == expected
        # the gradebook really is the PostgreSQL one
        from nbgrader.api import Gradebook

        with Gradebook(url) as gb:
            assert sorted(s.id for s in gb.students) == sorted(expected)


def test_more_workers_need_a_real_database(tmp_path):
    _class(tmp_path / "subs", 1)
    with pytest.raises(ValueError, match="SQLite"):
        autograde(tmp_path / "subs", tmp_path / "out", course_dir=tmp_path / "course", workers=2)


def test_interrupted_run_resumes_without_regrading(tmp_path):
    expected = _class(tmp_path / "subs", 3)
    course, out = tmp_path / "course", tmp_path / "out"
    cmd = [sys.executable, "-m", "grading", "autograde", str(tmp_path / "subs"), "--out", str(out),
           "--course", str(course)]
    proc = subprocess.Popen(cmd, cwd=nbs.ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    status = course / "status"
    deadline = time.monotonic() + 300
    while not (status.is_dir() and list(status.glob("*.json"))):
        assert time.monotonic() < deadline and proc.poll() is None, "first student never finished"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole run dies: the parent, its worker, the kernels
    proc.wait()
    finished = {p.stem: p.stat().st_mtime_ns for p in status.glob("*.json")}
    assert 1 <= len(finished) < 3, "the interruption came too late to test anything"
    shutil.rmtree(out, ignore_errors=True)

    results = autograde(tmp_path / "subs", out, course_dir=course, resume=True)
    assert {r.student: r.status for r in results} == {s: "graded" for s in expected}
    assert _totals(out) == expected
    for student, mtime in finished.items():  # not graded again
        assert (status / f"{student}.json").stat().st_mtime_ns == mtime
    assert (out / "failures.csv").exists() and (out / "failures.png").exists()
