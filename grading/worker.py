"""Grade one student: nbgrader's autograde and feedback, driven through its Python API.

`grade_student(root, student)` is the task the engine (grading/engine.py) runs on a Dask worker: nbgrader's
autograde of the student, the feedback pages, the review flags, the student's outcome (grading/outcome.py)
written to `outcomes/<student>.json` as soon as the student is done (what `--resume` reads). The course's
configuration puts `GradeNotebook` in the place of nbgrader's Execute step: a thin adapter around
`grade_notebook`, which runs one notebook in the sandbox (grading/sandbox.py) and has the judge
(grading/judge.py) score it, before nbgrader's SaveAutoGrades writes the scores to the gradebook. This
process never runs student code itself. The API (importing nbgrader costs seconds) is made once per worker
process (`course.api`).

A run passes each task the digest of the course preparation it started with (`graded_under`); grading
compares the course folder's with it before and after the student, so a course prepared again or changed
under the run (another run on the folder, a hand edit) is flagged in `review`, never a silent 0.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Dict, List, Unicode

from starter.notebook_loader import python_source, read_cells

from . import course, judge, notebooks, sandbox
from .judge import NOT_RUN, NotebookRecord
from .notebooks import ASSIGNMENT
from .outcome import FOLDER, StudentOutcome, write_outcome
from .scan import suspicious
from .settings import Limits, Settings, setting_help


def student_code(path: Path) -> str:
    """The student's own code in a submitted (rebuilt) notebook: answer cells and extra cells."""
    parts = []
    for cell in read_cells(path):
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if cell.get("cell_type") == "code" and (meta.get("solution") or not meta):
            parts.append(python_source(cell))
    return "\n\n".join(parts)


PREPARATION_CHANGED = ("the course folder was prepared again or changed during this run (another run on it?): "
                       "its hidden-case inputs, configuration or references differ from those the run started "
                       "with; grade again before trusting this row")

_run_preparation: contextvars.ContextVar[str | None] = contextvars.ContextVar("run_preparation", default=None)


def graded_under(preparation: str, task: Callable[[str, str], Any], root: str, student: str) -> Any:
    """`task(root, student)` (`grade_student`, or a test's task that calls it) for a run whose course was
    prepared with digest `preparation` (`course.preparation_digest`), which `grade_student` checks."""
    token = _run_preparation.set(preparation)
    try:
        return task(root, student)
    finally:
        _run_preparation.reset(token)


def hidden_cases_not_run(rec: NotebookRecord) -> str | None:
    """Why a notebook's score is not to be trusted when, in a sandbox run that finished, test cells ran their
    public cases but none of their hidden ones: the hidden cases' inputs were missing in the sandbox (the
    course folder changed under the run), or code stopped the checks; a student's own error is recorded by
    the check, so it leaves no case unrun. None when that is not so."""
    if rec.sandbox != "finished":  # a time-out or a dead kernel is flagged as such
        return None
    cells = [c.grade_id for c in rec.cells
             if any(not k.public for k in c.cases)
             and any(k.public and k.diagnosis != NOT_RUN for k in c.cases)
             and all(k.diagnosis == NOT_RUN for k in c.cases if not k.public)]
    if not cells:
        return None
    return (f"{rec.notebook}: no hidden case ran in {len(cells)} test cell(s) whose public case did "
            f"({', '.join(cells[:3])}{', ...' if len(cells) > 3 else ''}): the hidden-case inputs were missing in "
            "the sandbox (the course folder changed during the run?) or code stopped the checks; "
            "grade again before trusting this score")


def review_flags(root: Path, student: str, judged: list[NotebookRecord]) -> list[str]:
    """What an instructor should look at: sandbox runs that did not finish, unreadable results,
    hidden cases that did not run where public ones did, grading without the sandbox, and code that
    reaches for the checks (grading.scan)."""
    flags = []
    for rec in judged:
        if not rec.isolated:
            flags.append(f"{rec.notebook}: graded without the sandbox (--no-sandbox)")
        if rec.sandbox != "finished":
            flags.append(f"{rec.notebook}: {rec.sandbox}: {rec.sandbox_message}"[:300])
        not_run = hidden_cases_not_run(rec)
        if not_run:
            flags.append(not_run)
        flags += [f"{rec.notebook}: {p}" for p in rec.problems[:3]]
    for nb in sorted((root / "submitted" / student / ASSIGNMENT).glob("*.ipynb")):
        reasons = suspicious(student_code(nb))
        if reasons:
            flags.append(f"{nb.stem}: code that reaches for the checks ({'; '.join(reasons[:3])}); "
                         "no effect on the score (the judge decides), worth a look")
    return flags


@dataclass(frozen=True)
class CourseFiles:
    """What grading reads of the prepared course: the hidden cases' inputs under opaque ids (the sandbox's), the
    datasets folder (read-only in the sandbox) and the reference files the judge compares with."""

    case_inputs: Path | None
    data_dir: Path | None
    reference_dirs: tuple[Path, ...]


def grade_notebook(nb, student: str, notebook: str, folder: Path | None, settings: Settings,
                   files: CourseFiles) -> NotebookRecord:
    """One notebook of a student, as nbgrader restored it (`nb`, changed in place): run in the sandbox with the
    files handed in beside it in `folder`, then scored by the judge from what the checks observed there; the
    test cells' outputs become the judge's lines and score. Returns the judge's record of the notebook."""
    ran = sandbox.run_in_sandbox(nb, notebook, folder, settings.limits, settings.isolate, files.case_inputs,
                                 files.data_dir, settings.reuse_sandbox)
    return judge.judge_into(nb, ran, list(files.reference_dirs), student, notebook)


_graded = threading.local()  # .records: where GradeNotebook puts its records for grade_student (None: nowhere)


class GradeNotebook(NbGraderPreprocessor):
    """nbgrader's Execute step done by `grade_notebook`; each notebook's record goes to the `grade_student` that
    runs nbgrader's autograde in this thread."""

    isolate = Bool(Settings.isolate, help=setting_help("isolate")).tag(config=True)
    limits = Dict(help="grading.settings.Limits as a dict (missing fields: their defaults)").tag(config=True)
    reuse_sandbox = Bool(Settings.reuse_sandbox, help=setting_help("reuse_sandbox")).tag(config=True)
    case_inputs = Unicode("", help="folder of the hidden cases without expected outputs").tag(config=True)
    data_dir = Unicode("", help="the datasets folder, read-only inside").tag(config=True)
    reference_dirs = List(Unicode(), help="folders of reference files with expected outputs").tag(config=True)

    def settings(self) -> Settings:
        return Settings(Limits(**self.limits), isolate=self.isolate, reuse_sandbox=self.reuse_sandbox)

    def preprocess(self, nb, resources):
        info, folder = resources.get("nbgrader") or {}, (resources.get("metadata") or {}).get("path") or ""
        files = CourseFiles(Path(self.case_inputs) if self.case_inputs else None,
                            Path(self.data_dir) if self.data_dir else None,
                            tuple(Path(d) for d in self.reference_dirs)
                            or (notebooks.PUBLIC_REFERENCES, notebooks.HIDDEN_REFERENCES))
        record = grade_notebook(nb, info.get("student", "?"), info.get("notebook", ""), Path(folder) if folder else None,
                                self.settings(), files)
        records = getattr(_graded, "records", None)
        if records is not None:
            records.append(record)
        return nb, resources


@contextlib.contextmanager
def _collecting() -> Iterator[list[NotebookRecord]]:
    """The records of the notebooks GradeNotebook grades in this thread within the block, in order."""
    found: list[NotebookRecord] = []
    _graded.records = found
    try:
        yield found
    finally:
        _graded.records = None


def grade_student(root: str | Path, student: str) -> StudentOutcome:
    """Grade `student`, staged by intake in the course folder `root`: nbgrader's autograde (the sandbox runs the
    notebooks, the judge scores them, SaveAutoGrades writes the scores to the gradebook), the feedback pages,
    the review flags; returns the student's outcome and writes it (`outcomes/<student>.json`)."""
    root = Path(root)
    api = course.api(root)
    start = time.perf_counter()
    outcome = StudentOutcome(student, status="failed")
    prepared = _run_preparation.get()  # None: called outside a run (nothing to compare with)
    changed = prepared is not None and course.preparation_digest(root) != prepared
    try:
        # nbgrader's autograde runs GradeNotebook on each notebook in this thread: one sandbox for all of this
        # student's notebooks, and the judge's record of each collected here
        with sandbox.student_session() as scope, _collecting() as judged:
            result = api.autograde(ASSIGNMENT, student, force=True, create=True)
        outcome.sandboxes_started = scope.sandboxes_started  # 0: the worker's warm one, reset after the last student
        outcome.judged = judged
        if result.get("success"):
            outcome.status = "graded"
            feedback = api.generate_feedback(ASSIGNMENT, student, force=True)
            if not feedback.get("success"):
                outcome.notes.append(f"no feedback page: {course.last_error(feedback)}")
        else:
            outcome.error = course.last_error(result)
        outcome.flags = review_flags(root, student, judged)
    except Exception as exc:
        outcome.status, outcome.error = "failed", f"{type(exc).__name__}: {exc}"
        outcome.traceback = traceback.format_exc()[-4000:]
    if prepared is not None and (changed or course.preparation_digest(root) != prepared):
        outcome.flags.append(PREPARATION_CHANGED)
    outcome.seconds = round(time.perf_counter() - start, 2)
    write_outcome(root / FOLDER, outcome)
    return outcome
