"""One run per course folder, and grades that fail loudly when the course changes under a run.

A second `autograde` (or `report`) on a course folder that a run holds stops at once, names that run and
changes nothing, and the first run's grades are right; a lock left by a killed run blocks nobody; a
notebook whose hidden cases did not run while its public ones did, or a student graded after the course
folder changed mid-run, is flagged in `review` rather than given a silent 0. Notebook 01 only, one
student per run.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import cloudpickle
import pytest
from conftest import filled_submission, write_nb
from support import holdback

from grading import course
from grading import notebooks as nbs
from grading.autograde import autograde, graded_columns
from grading.judge import NOT_RUN, CaseResult, CellResult, NotebookRecord
from grading.outcome import StudentOutcome, read_outcome
from grading.worker import PREPARATION_CHANGED, review_flags

NB = "01_scaled_dot_product_attention"
FULL = sum(p for s, _, p in graded_columns() if s == NB)
HIDDEN_NOT_RUN = "no hidden case ran"  # the start of the review flag of worker.hidden_cases_not_run


def _rows(out: Path) -> dict[str, dict]:
    with open(out / "grades.csv", newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f) if r["student"] != "(max points)"}


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder`: (size, modification time), to show that nothing changed."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _wait_for(path: Path, proc: subprocess.Popen | None = None, thread: threading.Thread | None = None,
              timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc is None or proc.poll() is None, f"the run ended (exit code {proc.returncode}) before {path}"
        assert thread is None or thread.is_alive(), f"the run ended before {path}"
        assert time.monotonic() < deadline, f"{path} not there after {timeout} s"
        time.sleep(0.2)


def test_a_second_run_on_the_course_folder_is_refused_and_the_first_grades_right(tmp_path):
    """Run A holds its only student back until the test lets it go; meanwhile `autograde` of class B and
    `report` on the same --course stop at once with one line naming A, and change nothing."""
    course_dir, out_a, out_b = tmp_path / "course", tmp_path / "out_a", tmp_path / "out_b"
    write_nb(filled_submission(NB), tmp_path / "class_a" / "alice" / f"{NB}.ipynb")
    write_nb(filled_submission(NB), tmp_path / "class_b" / "bob" / f"{NB}.ipynb")
    go = tmp_path / "go"
    with open(tmp_path / "run_a.log", "w") as log:
        first = subprocess.Popen([sys.executable, holdback.__file__, str(tmp_path / "class_a"), str(out_a),
                                  str(course_dir), "alice", str(go)], cwd=nbs.ROOT, stdout=log, stderr=log)
    try:
        _wait_for(course_dir / "held.json", first)  # A has prepared the course and is grading
        before = _tree(course_dir)

        started = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "grading", "autograde", str(tmp_path / "class_b"),
                                 "--out", str(out_b), "--course", str(course_dir)],
                                cwd=nbs.ROOT, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, (second.returncode, second.stdout[-2000:], second.stderr[-2000:])
        assert time.monotonic() - started < 60, "the second run did not stop at once"
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, second.stderr
        for names_the_first in (f"pid {first.pid} ", f"on {socket.gethostname()}", f"--out {out_a}", "started 20"):
            assert names_the_first in errors[0], errors[0]
        assert "graded" not in second.stdout, second.stdout
        assert not out_b.exists(), "the refused run made its --out folder"

        # `report` writes the grades from the course's gradebook: refused too, its folder untouched
        out_r = tmp_path / "out_r"
        out_r.mkdir()
        (out_r / "outcomes").mkdir()
        (out_r / "grades.csv").write_text("student,status,review,notes\n")
        report_before = _tree(out_r)
        report = subprocess.run([sys.executable, "-m", "grading", "report", str(out_r), "--course", str(course_dir)],
                                cwd=nbs.ROOT, capture_output=True, text=True, timeout=300)
        assert report.returncode == 2 and f"pid {first.pid} " in report.stderr, (report.returncode, report.stderr)
        assert _tree(out_r) == report_before

        assert _tree(course_dir) == before, "a refused run changed the course folder"
        go.touch()
        assert first.wait(timeout=600) == 0, (tmp_path / "run_a.log").read_text()[-3000:]
    finally:
        first.kill()
        first.wait()
    assert not json.loads((course_dir / "held.json").read_text())["gave_up"]
    row = _rows(out_a)["alice"]
    assert (row["status"], float(row[f"{NB}:total"]), row["review"]) == ("graded", FULL, "")
    with course.hold(course_dir, "after run A"):  # A let go of it when it ended
        pass


HOLDER = """
import sys, time
from pathlib import Path
from grading import course
with course.hold(Path(sys.argv[1]), "a run about to be killed"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_hold_is_passed_on_not_taken_twice(tmp_path):
    """What the holder calls gets its hold by argument; a second hold of the folder, even from the holder's own
    thread, is refused like another run's; a hold of another folder is not taken for this one. Nothing is
    prepared in any of these (the course folder stays as it was)."""
    root, other = tmp_path / "course", tmp_path / "other"
    with course.hold(root, "first run") as held:
        assert held.root == root.resolve() and held.run == "first run"
        before = _tree(root)
        with pytest.raises(course.CourseLockError, match="in use by another grading run.*first run"):
            with course.hold(root, "second run"):
                pass
        with course.hold(other, "a run on another folder") as elsewhere:
            with pytest.raises(ValueError, match="the hold given is of .*other, not of the course folder"):
                course.prepare_grading_course(root, held=elsewhere)
        assert _tree(root) == before
    with course.hold(root, "after the first"):  # released: the next run takes it
        pass


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(tmp_path):
    course_dir = tmp_path / "course"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(course_dir)], cwd=nbs.ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(course.CourseLockError, match=f"pid {holder.pid} .*a run about to be killed"):
            with course.hold(course_dir, "the next run"):
                pass
    finally:
        holder.kill()
        holder.wait()
    lock = course_dir / course.LOCK_FILE
    assert f'"pid": {holder.pid}' in lock.read_text(), "the killed run's details should still be in the file"
    course.prepare_grading_course(course_dir)  # takes the lock: the dead run's file does not stop it
    with course.hold(course_dir, "the next run"):
        info = json.loads(lock.read_text())
        assert (info["pid"], info["run"]) == (os.getpid(), "the next run")


def _record(sandbox: str, public_ran: bool, hidden_ran: list[bool]) -> NotebookRecord:
    """A judge's record of notebook 01 with one test cell: its public case, and hidden cases that ran or not."""
    def case(name: str, public: bool, ran: bool) -> CaseResult:
        return CaseResult(name, name if public else f"hidden case {name}", public, ran, "" if ran else NOT_RUN,
                          "" if ran else NOT_RUN)

    cases = [case("causal/5", True, public_ran)] + [case(f"causal/{i}", False, r) for i, r in enumerate(hidden_ran)]
    cell = CellResult("test_causal_mask", 0.0, 1.0, cases)
    return NotebookRecord("s", NB, sandbox, "", True, 1.0, [], [cell])


@pytest.mark.parametrize(("sandbox", "public_ran", "hidden_ran", "flagged"), [
    ("finished", True, [False, False], True),   # the symptom: the hidden inputs were not there
    ("finished", True, [True, False], False),   # one hidden case ran: the inputs were there
    ("finished", False, [False, False], False),  # nothing ran: flagged as such (the test below)
    ("time limit", True, [False, False], False),  # flagged as a time limit instead
])
def test_hidden_cases_that_did_not_run_where_public_ones_did_are_flagged(tmp_path, sandbox, public_ran,
                                                                         hidden_ran, flagged):
    flags = review_flags(tmp_path, "s", [_record(sandbox, public_ran, hidden_ran)])
    assert any(f.startswith(f"{NB}: {HIDDEN_NOT_RUN}") and "test_causal_mask" in f for f in flags) == flagged, flags


@pytest.mark.parametrize(("sandbox", "public_ran", "hidden_ran", "flagged"), [
    ("finished", False, [False, False], True),   # nothing ran: the kit not importable there, or the checks stopped
    ("finished", True, [False, False], False),   # the public case ran (the other flag says the rest)
    ("finished", False, [True, False], False),   # a hidden case ran
    ("time limit", False, [False, False], False),  # flagged as a time limit instead
])
def test_a_finished_notebook_in_which_no_case_ran_is_flagged_not_a_silent_zero(tmp_path, sandbox, public_ran,
                                                                              hidden_ran, flagged):
    """A sandbox that cannot import the kit's checks (an editable install of another checkout, say) leaves every
    test cell with no case run: its 0 is flagged for a person, as is a notebook whose code stopped the checks."""
    flags = review_flags(tmp_path, "s", [_record(sandbox, public_ran, hidden_ran)])
    assert any(f.startswith(f"{NB}: no case ran in any of its 1 test cells") for f in flags) == flagged, flags


def test_case_inputs_removed_mid_run_flag_the_student_instead_of_a_silent_zero(tmp_path):
    """The course folder changes under a run (here the hidden cases' inputs are deleted, as a second run that
    prepares the folder again does for a moment) while its student waits: the student's row says so."""
    course_dir, out = tmp_path / "course", tmp_path / "out"
    write_nb(filled_submission(NB), tmp_path / "subs" / "alice" / f"{NB}.ipynb")
    go, done = tmp_path / "go", {}
    run = threading.Thread(target=lambda: done.update(results=autograde(
        tmp_path / "subs", out, course_dir=course_dir, task=holdback.HoldBack("alice", file=str(go)))))
    run.start()
    try:
        _wait_for(course_dir / "held.json", thread=run)
        inputs = sorted((course_dir / "case_inputs").glob("*.h5"))
        assert inputs, "the course has no hidden-case inputs to remove"
        for path in inputs:
            path.unlink()
    finally:
        go.touch()
        run.join(timeout=600)
    assert not run.is_alive()
    row = _rows(out)["alice"]
    assert row["status"] == "graded" and float(row[f"{NB}:total"]) == 0.0, row  # no hidden case could run
    assert f"{NB}: {HIDDEN_NOT_RUN}" in row["review"] and PREPARATION_CHANGED in row["review"], row["review"]
    # the worker saw it, in the record it wrote when the student was done (the run adds it to every row too)
    assert PREPARATION_CHANGED in read_outcome(course_dir / "outcomes" / "alice.json").flags


@dataclass(frozen=True)
class ChangesTheCourseWhenDone:
    """A task that grades nothing: its student is done at once, and then the course folder changes (as when
    another run prepares it again between a run's last student and its report)."""

    def __call__(self, run, student: str) -> StudentOutcome:
        (run.root / "case_inputs.json").write_text("{}")
        return StudentOutcome(student, status="graded")


def test_a_course_changed_after_the_last_student_flags_every_row(tmp_path, caplog):
    write_nb(filled_submission(NB), tmp_path / "subs" / "alice" / f"{NB}.ipynb")
    with caplog.at_level(logging.ERROR, logger="grading"):
        autograde(tmp_path / "subs", tmp_path / "out", course_dir=tmp_path / "course", task=ChangesTheCourseWhenDone())
    assert PREPARATION_CHANGED in _rows(tmp_path / "out")["alice"]["review"]
    assert any("changed during this run" in r.getMessage() for r in caplog.records), caplog.records


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the tasks above go to the workers by value
