"""Autograde a folder or zip of student submissions: the whole flow, read top to bottom in `autograde`.

1. intake (`intake.py`): unpack and stage each student's notebooks, rebuilt on the release; each student's
   outcome (`outcome.StudentOutcome`) starts there;
2. grade one student (`worker.grade_student`, one Dask task per student, `engine.run`): nbgrader's
   autograde with the sandbox (`sandbox.py`) as its Execute step and the judge (`judge.py`) scoring
   the test cells, SaveJudgedScores writing the judge's points to the gradebook, then the feedback pages;
   the worker writes the student's outcome, with the judge's record of each notebook;
3. report (`report.py`): each student's outcome in `outcomes/` and the feedback pages; the class's results
   (`results.ClassResults`: the outcomes and the gradebook's points, a person's included), and every view of
   them: `report.json`, `grades.csv`, `failures.csv`/`.png` and `class_report.html` (`class_report.py`), what
   the class got wrong.

Layout of SUBMISSIONS (a folder, or a zip of one): one folder per student, holding that student's
notebooks (any depth; names such as `01_scaled_dot_product_attention (1).ipynb` are recognised by
their number), as an LMS exports it: any folder name (Moodle's `First Last_<id>_assignsubmission_file_`
gives the name and the participant id), or Canvas's flat `lastfirst_<id>_<submission>_<file>` files.
Each student is graded under a safe id (`intake.student_id`); the reports show the name as given.
Original files are only read, never moved or changed.
"""
from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import course, engine, worker
from .intake import intake
from .notebooks import graded_columns
from .outcome import FOLDER, StudentOutcome
from .report import report
from .settings import Settings

log = logging.getLogger(__name__)

__all__ = ["autograde", "graded_columns", "StudentOutcome"]


def autograde(submissions: Path, out: Path, course_dir: Path | None = None, db_url: str | None = None,
              students: list[str] | None = None, resume: bool = False, settings: Settings = Settings(),
              progress: bool = False, task: Callable[..., Any] | None = None) -> list[StudentOutcome]:
    """Grade every student in `submissions` (folder or zip). Returns one outcome per student folder.

    resume=True keeps the results of students graded by an earlier, interrupted run. `settings`
    (grading/settings.py): the sandbox's limits; isolate=False runs student code without isolation (only
    where bubblewrap cannot be had): every row is flagged; `workers` worker processes on this machine, or
    the Dask cluster at `scheduler` (grading/engine.py). `task` replaces `worker.grade_student` there,
    called as it is (root, student, prepared=digest); the tests hold a student back with it.
    The run holds the course folder from before it is prepared until the report is written (`course.hold`):
    another run on it raises `course.CourseLockError` at once, naming this one, having changed nothing.
    """
    workers, scheduler = settings.workers, settings.scheduler
    if settings.isolate:
        from .sandbox import require_bwrap, unlimit_file_table

        require_bwrap()  # before any work: without it, say how to get it
        if (problem := unlimit_file_table()) is not None:
            log.warning(problem)
    root = course_dir or course.DEFAULT_COURSE
    if db_url is None and (workers > 1 or scheduler):
        raise ValueError("the SQLite gradebook allows one writer: use --workers 1, or --db with a PostgreSQL URL")
    # one run per course folder, from before it is prepared until the report is written (raises at once,
    # having changed nothing, if another run holds it)
    with course.hold(root, f"autograde {submissions} --out {out}" + (" --resume" if resume else "")):
        out.mkdir(parents=True, exist_ok=True)
        finished = root / FOLDER  # the outcomes of the students graded so far: a resumed run keeps them
        if not resume and finished.exists():
            shutil.rmtree(finished)
        with engine.cluster(workers, scheduler, warm=True) as client:  # the workers start while the course is prepared
            course.prepare_grading_course(root, db_url, settings)
            prepared = course.preparation_digest(root)  # each student's grading checks it against the folder's
            results, loose = intake(Path(submissions), root, students)
            gradable = [r.student for r in results if r.status not in ("failed", "no notebooks")]
            graded = engine.run(root, gradable, progress=progress, client=client,
                                task=functools.partial(task or worker.grade_student, prepared=prepared))
        if course.preparation_digest(root) != prepared:  # after the last student: the gradebook may be another's
            log.error("the course folder %s changed during this run (prepared again?): every grade is flagged", root)
            for outcome in graded.values():
                if worker.PREPARATION_CHANGED not in outcome.flags:
                    outcome.flags.append(worker.PREPARATION_CHANGED)
        db_url = db_url or course.sqlite_url(root)
        results = report(out, root, results, graded, loose, db_url)
    for r in results:
        log.info("%s: %s (%.1f s)", r.student, r.status, r.seconds)
    if loose:
        log.warning("ignored files outside student folders: %s", ", ".join(loose))
    return results
