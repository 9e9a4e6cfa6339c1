"""Autograde a folder or zip of student submissions: the whole flow, read top to bottom in `autograde`.

One student's way through it, from the zip to each output by the calls that carry them, with why each step is as
it is, is told once, in docs/grading.md ("The steps").

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
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import course, engine, judge, similarity, worker
from .course import GradingRun
from .intake import intake
from .late import update_policy
from .notebooks import graded_columns
from .outcome import FOLDER, ROSTER, Status, StudentOutcome, write_outcome
from .report import report
from .settings import Settings

log = logging.getLogger(__name__)

__all__ = ["autograde", "graded_columns", "StudentOutcome"]


def autograde(submissions: Path, out: Path, course_dir: Path | None = None, db_url: str | None = None,
              students: list[str] | None = None, resume: bool = False, settings: Settings = Settings(),
              progress: bool = False, task: Callable[[GradingRun, str], Any] | None = None,
              late: dict | None = None) -> list[StudentOutcome]:
    """Grade every student in `submissions` (folder or zip). Returns one outcome per student folder.

    resume=True keeps the results of students graded by an earlier, interrupted run. `students` (names as given,
    ids, or folder names) are graded again, and every other student keeps the results of the course folder's last
    run (one never graded there is graded now): OUT always holds the whole class. `settings`
    (grading/settings.py): the sandbox's limits; isolate=False runs student code without isolation (only
    where bubblewrap cannot be had): every row is flagged; `workers` worker processes on this machine, or
    the Dask cluster at `scheduler` (grading/engine.py). `task` replaces `worker.grade_student` there,
    called as it is, `task(run, student)`; the tests hold a student back with it.
    `late`: parts of the late policy to record in the course folder first (`grading.late.update_policy`'s
    arguments; a part that cannot be used raises PolicyError before anything is graded).
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
    gradebook = db_url or course.sqlite_url(root)
    # one run per course folder, from before it is prepared until the report is written (raises at once,
    # having changed nothing, if another run holds it)
    with course.hold(root, f"autograde {submissions} --out {out}" + (" --resume" if resume else "")) as held:
        if late:
            update_policy(root, **late)
        out.mkdir(parents=True, exist_ok=True)
        finished = root / FOLDER  # the outcomes of the students graded so far: a resumed run keeps them
        if not resume and not students:  # a fresh run: the folder's class is this zip's, from nothing
            for folder in (finished, root / ROSTER):
                shutil.rmtree(folder, ignore_errors=True)
        with engine.cluster(workers, scheduler, warm=True) as client:  # the workers start while the course is prepared
            # each worker starts its first student's sandbox once what it mounts is in place (sent from a thread, as
            # a local cluster's workers may still be starting: the course's preparation and intake go on meanwhile),
            # and is sent the judge's references, read here once
            started: list = []

            def mounted(files: course.CourseFiles) -> None:
                started.append(_meanwhile(engine.on_each_worker, client, worker.warm_up, settings, files))
                started.append(_meanwhile(_send_references, client, files))

            files = course.prepare_grading_course(root, gradebook, held, mounted=mounted)
            # each student's grading checks the digest against the folder's
            run = GradingRun(root, settings, files, course.preparation_digest(root), gradebook)
            results, loose = intake(Path(submissions), root)  # the whole class: OUT is always the class's
            for handed_in in results:  # who handed in what, where the workers read it (the feedback pages say it)
                write_outcome(root / ROSTER, handed_in)
            # every pair's answers compared (staged notebooks read as JSON, no student code), while the class is graded
            similar = _meanwhile(similarity.check_class, root, out)
            if students:  # a re-grade of some: theirs are made again, the rest of the class's are kept
                chosen = intake(Path(submissions), root, students)[0]
                if not chosen:
                    raise ValueError(f"no student of {submissions} is named {', '.join(students)} (--student takes "
                                     "the name as the export gives it, or the id in grades.csv); nothing was graded")
                for student in chosen:
                    (finished / f"{student.student}.json").unlink(missing_ok=True)
            gradable = [r.student for r in results if r.status not in (Status.FAILED, Status.NO_NOTEBOOKS)]
            kept = set(engine.finished(root)) & set(gradable)  # graded by an earlier run, not again by this one
            for sending in started:  # each worker's warm-up done before any student is sent (`engine.settle`)
                if sending.exception() is None:  # (one not sent is done by its worker's first student instead)
                    engine.settle(sending.result())
            graded = engine.run(root, gradable, functools.partial(task or worker.grade_student, run),
                                progress=progress, client=client)
            started.clear()  # held until here: a future no one holds is cancelled
            if course.preparation_digest(root) != run.prepared:  # after the last student: the gradebook may be another's
                log.error("the course folder %s changed during this run (prepared again?): every grade is flagged", root)
                for outcome in graded.values():
                    if worker.PREPARATION_CHANGED not in outcome.flags:
                        outcome.flags.append(worker.PREPARATION_CHANGED)
            _similarity_flags(similar, results)
            # the report is written while the cluster closes (its workers and their sandboxes take seconds to end)
            reporting = _meanwhile(report, out, root, results, graded, loose, run.gradebook)
        results = reporting.result()
    for r in results:
        if r.student in kept:
            log.info("%s: %s (kept from the course folder's last run)", r.student, r.status)
        else:
            log.info("%s: %s (%.1f s)", r.student, r.status, r.seconds)
    if loose:
        log.warning("ignored files outside student folders: %s", ", ".join(loose))
    return results


def _send_references(client, files: course.CourseFiles) -> list:
    """Read the references the judge compares with in this process, while its workers start, and send them to each
    worker (`judge.keep_references`): each reading them itself took 2 s of CPU a worker, at the start, where the
    workers' sandboxes were starting beside them and the CPU was short. A worker that does not get them (one
    started later) reads each as it needs it."""
    return engine.on_each_worker(client, judge.keep_references, judge.read_references(list(files.reference_dirs)))


def _similarity_flags(similar: Future, results: list[StudentOutcome]) -> None:
    """The similarity check's review flags added to the students' outcomes; a check that failed is logged, and the
    grades and the rest of the report are made as they would be without it."""
    try:
        flags = similar.result()
    except Exception:
        log.exception("the similarity check failed: no similarity flags in this run")
        return
    for outcome in results:
        outcome.flags += flags.get(outcome.student, [])


def _meanwhile(work: Callable[..., Any], *args: Any) -> Future:
    """`work(*args)` started in a thread of its own; its result (or its exception) is the future's."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=getattr(work, "__name__", "work"))
    try:
        return pool.submit(work, *args)
    finally:
        pool.shutdown(wait=False)  # the thread ends with the work
