"""Grade one student: nbgrader's autograde and feedback, driven through its Python API.

`grade_student(run, student)` is the task the engine (grading/engine.py) runs on a Dask worker; `run` is the
run's `course.GradingRun` (the course folder, the settings, the course's files, the preparation digest, the
gradebook), the same for every student. It opens the student's sandbox (grading/sandbox.py) and makes the one value
nbgrader's steps receive, `StudentGrading(run, student, sandbox, judged)`, then: nbgrader's autograde of the
student (`StudentAutograde`), the feedback pages (`StudentFeedback`), the review flags, and the student's outcome
(grading/outcome.py), written to `outcomes/<student>.json` as soon as the student is done (what `--resume` reads).

The course's configuration puts the kit's steps in nbgrader's pipelines: `GradeNotebook` in the place of Execute, a
thin adapter around `grade_notebook`, which runs one notebook in the student's sandbox and has the judge
(grading/judge.py) score it, appending the judge's record to `StudentGrading.judged`; `SaveJudgedScores` in the place
of SaveAutoGrades, which writes the points of those records into the gradebook; and `feedback.RedactHiddenTests`,
whose test cells show the judge's lines from them. Each step gets the `StudentGrading` in the `resources` of the
notebook it works on (`feedback.GRADING`), where the kit's app that runs it put it. This process never runs student code itself. The API (importing nbgrader
costs seconds) is made once per worker process (`course.api`).

Grading compares the course folder's preparation digest with the run's (`GradingRun.prepared`) before and after the
student, so a course prepared again or changed under the run (another run on the folder, a hand edit) is flagged in
`review`, never a silent 0.
"""
from __future__ import annotations

import functools
import html
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, cast

from nbgrader import utils as nbgrader_utils
from nbgrader.converters import Autograde, GenerateFeedback
from nbgrader.converters.base import NbGraderException
from nbgrader.preprocessors import NbGraderPreprocessor, SaveAutoGrades
from traitlets.config import Config

from starter.notebook_loader import read_cells

from . import course, judge, late, notebooks, sandbox, trained_model
from .course import CourseFiles, GradingRun
from .feedback import GRADING
from .host_bounds import Bound, PastBound, each_bounded, run_bounded
from .judge import NOT_RUN, NotebookRecord
from .notebooks import ASSIGNMENT
from .outcome import FOLDER, ROSTER, Status, StudentOutcome, read_outcome, write_outcome
from .results import student_keys
from .sandbox import StudentSandbox
from .scan import Findings, scan_notebook
from .settings import Settings

# What the review scan of one notebook and the feedback pages of one student may take on the host (in a child
# process, grading.host_bounds). Honest work is far under: the scan of a student's seven notebooks takes 0.15 s,
# their feedback pages about 1.5 s (docs/benchmarks.md); one extra cell of 4 MB of code (past intake's limits)
# cost the scan 17 s of CPU and 530 MB, the highlighting 109 s and 1 GB, on 2 busy cores.
SCAN_BOUND = Bound(seconds=5, memory_mb=512)
FEEDBACK_BOUND = Bound(seconds=60, memory_mb=1024)


def scanned(paths: list[Path]) -> list[Findings | PastBound]:
    """The review scan's findings in each submitted (rebuilt) notebook: the student's answer and extra cells, each
    read on its own, in a child process within SCAN_BOUND per notebook; PastBound for one past it."""
    found = each_bounded(lambda path: asdict(scan_notebook(read_cells(path))), paths, SCAN_BOUND)
    return [f if isinstance(f, PastBound) else Findings(**cast(dict, f)) for f in found]


PREPARATION_CHANGED = ("the course folder was prepared again or changed during this run (another run on it?): "
                       "its hidden-case inputs, configuration or references differ from those the run started "
                       "with; grade again before trusting this row")

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


def no_case_ran(rec: NotebookRecord) -> str | None:
    """Why a notebook's score is not to be trusted when its sandbox run finished and yet no case ran in any of its
    test cells, public or hidden: the checks could not run (the kit not importable in the sandbox, or code that
    stopped them), or every answer is missing (a name the test cell uses never defined). None when a case ran."""
    if rec.sandbox != "finished" or not rec.cells:
        return None
    if any(k.diagnosis != NOT_RUN for c in rec.cells for k in c.cases):
        return None
    return (f"{rec.notebook}: no case ran in any of its {len(rec.cells)} test cells, though the notebook ran to the "
            "end: the checks could not run (the kit's starter not importable in the sandbox, or code that stopped "
            "them) or no answer is defined; look at the notebook before trusting this score")


# notebook 06's cells that train the model: its step, its loop, its script
TRAINING_CELLS = ("06_training", ("test_train_step", "test_fit", "test_train_script"))


def trained_without_training(judged: list[NotebookRecord]) -> str | None:
    """Why a trained-model mark is worth a look: the student's notebook 06, which trains the model, was not graded or
    earned no point in any of its training tasks. Code that fails every hidden case can still train, so this decides
    nothing: the mark measures the weights and stands (no student code runs on the hidden scenes), and a person
    looks at where the file came from. None when the mark is zero or a training task earned a point."""
    by_notebook = {rec.notebook: rec for rec in judged}
    marked = [c for c in getattr(by_notebook.get(notebooks.TRAINED_MODEL_CELL[0]), "cells", [])
              if c.grade_id == notebooks.TRAINED_MODEL_CELL[1] and c.points > 0]
    if not marked:
        return None
    notebook, names = TRAINING_CELLS
    training = [c for c in getattr(by_notebook.get(notebook), "cells", []) if c.grade_id in names]
    if training and any(c.points > 0 for c in training):
        return None
    why = ("was not graded" if not training else
           f"earned no point in its training tasks ({', '.join(c.grade_id.removeprefix('test_') for c in training)})")
    return (f"{notebooks.TRAINED_MODEL_CELL[0]}: the trained-model mark ({marked[0].points:g}/{marked[0].max_points:g}) "
            f"was earned by a checkpoint, while notebook 06, which trains it, {why}; the mark measures the weights "
            "and stands, worth a look at where the file came from")


def review_flags(root: Path, student: str, judged: list[NotebookRecord]) -> list[str]:
    """What an instructor should look at: sandbox runs that did not finish, unreadable results,
    hidden cases that did not run where public ones did, grading without the sandbox, a trained-model mark that
    notebook 06 cannot have made, and code that reaches for the checks (grading.scan)."""
    flags = []
    for rec in judged:
        if not rec.isolated:
            flags.append(f"{rec.notebook}: graded without the sandbox (--no-sandbox)")
        if rec.sandbox != "finished":
            flags.append(f"{rec.notebook}: {rec.sandbox}: {rec.sandbox_message}"[:300])
        not_run = hidden_cases_not_run(rec) or no_case_ran(rec)
        if not_run:
            flags.append(not_run)
        flags += [f"{rec.notebook}: {p}" for p in rec.problems[:3]]
    unmade = trained_without_training(judged)
    if unmade:
        flags.append(unmade)
    submitted = sorted((root / "submitted" / student / ASSIGNMENT).glob("*.ipynb"))
    for nb, found in zip(submitted, scanned(submitted)):
        if isinstance(found, PastBound):
            flags.append(f"{nb.stem}: too large to scan: the review scan went past the host's limit ({SCAN_BOUND}: "
                         f"{found}); graded as usual, its code not scanned, worth a look")
            continue
        if found.reasons:
            flags.append(f"{nb.stem}: code that reaches for the checks ({'; '.join(found.reasons[:3])}); "
                         "no effect on the score (the judge decides), worth a look")
        if found.not_python:
            flags.append(f"{nb.stem}: {'; '.join(found.not_python[:3])}; the kernel cannot run it either, "
                         "and the scan read the other cells, worth a look")
    return flags


def plain_code(source: str, language: str | None = None, metadata: dict | None = None) -> str:
    """A code cell as a feedback page shows it without highlighting: escaped text in the page's code box (the
    markup of nbconvert's `highlight_code` filter, which this replaces where highlighting is past its bound)."""
    return f'<div class="highlight"><pre>{html.escape(source, quote=False)}</pre></div>'


@dataclass(frozen=True)
class StudentGrading:
    """One student's grading, the one value nbgrader's steps receive (in each notebook's `resources`, from the app
    that runs them): the run, the student, the sandbox all of the student's notebooks run in, and the judge's
    record of each notebook (`judged`, in order: GradeNotebook appends to it, SaveJudgedScores and the feedback
    pages read it)."""

    run: GradingRun
    student: str
    sandbox: StudentSandbox
    judged: list[NotebookRecord] = field(default_factory=list)

    def __deepcopy__(self, memo: dict) -> StudentGrading:
        return self  # nbconvert deep-copies `resources` before its steps: they must all share this one

    @functools.cached_property
    def _handed_in(self) -> StudentOutcome | None:
        """Intake's record of the student (the roster in the course folder): what they handed in, the LMS's mark."""
        try:
            return read_outcome(self.run.root / ROSTER / f"{self.student}.json")
        except (OSError, ValueError, TypeError, KeyError):
            return None

    @property
    def missing_work(self) -> list[str]:
        """What the student did not hand in (`outcome.missing_work`)."""
        return self._handed_in.missing_work if self._handed_in else []

    @property
    def late_line(self) -> str:
        """How late, under the course folder's late policy (`grading.late`), in one line; "" when nothing to say."""
        if self._handed_in is None:
            return ""
        policy = late.read_policy(self.run.root)
        try:
            lateness = late.LateFacts.read(policy).of(student_keys(self._handed_in), self._handed_in.lms_late)
        except late.PolicyError:  # a file changed since the run checked it: `report` says so, and remakes the page
            return ""
        return late.late_line(policy, lateness)


@dataclass(frozen=True)
class PageOf:
    """What a student's feedback pages are made from after the run (`grading.report.refresh_feedback`): who, the
    judge's records, what they did not hand in, how late."""

    student: str
    judged: Sequence[NotebookRecord]
    missing_work: Sequence[str]
    late_line: str

    def __deepcopy__(self, memo: dict) -> PageOf:
        return self  # as StudentGrading's


class JudgedStudent(Protocol):
    """What the feedback pages of a student need: who, the judge's records of their notebooks, what they did not
    hand in, and how late. A
    StudentGrading during a run; `grading.report` makes the pages again from a run's outcome (no sandbox)."""

    @property
    def student(self) -> str: ...

    @property
    def judged(self) -> Sequence[NotebookRecord]: ...

    @property
    def missing_work(self) -> Sequence[str]: ...

    @property
    def late_line(self) -> str: ...


class StudentFeedback(GenerateFeedback):
    """nbgrader's generate_feedback of one student, whose RedactHiddenTests step gets the student's grading (its test
    cells show the judge's lines from `judged`). Its GetGrades step reads the scores from the gradebook as it is
    when it runs, a person's included."""

    def __init__(self, grading: JudgedStudent, **kwargs) -> None:
        super().__init__(**kwargs)
        self.grading = grading

    def init_single_notebook_resources(self, notebook_filename: str) -> dict:
        return with_grading(super().init_single_notebook_resources(notebook_filename), self.grading)


def generate_feedback(api, grading: JudgedStudent, plain: bool) -> dict:
    """nbgrader's generate_feedback of the student (what `NbGraderAPI.generate_feedback` does, with StudentFeedback),
    its code as plain text if `plain`: its result (success, error, log)."""
    config = Config()
    config.HTMLExporter.template_name = "feedback"  # as nbgrader's API sets it
    if plain:
        config.FeedbackHTMLExporter.filters = {"highlight_code": plain_code}
    with nbgrader_utils.temp_attrs(api.coursedir, assignment_id=ASSIGNMENT, student_id=grading.student):
        app = StudentFeedback(grading, coursedir=api.coursedir, parent=api)
        app.update_config(config)
        app.force = True
        return nbgrader_utils.capture_log(app)


def _feedback(api, grading: JudgedStudent, plain: bool) -> dict:
    """The feedback pages (run in the bounded child); a MemoryError that nbgrader caught is raised again."""
    result = generate_feedback(api, grading, plain)
    if not result.get("success") and "MemoryError" in f"{result.get('error')}{result.get('log')}":
        raise MemoryError("past the memory limit (nbgrader caught it)")
    return result


def feedback_pages(api, grading: JudgedStudent) -> list[str]:
    """Make the student's feedback pages (the course folder's feedback/<student>/<assignment>/), in a child process
    within FEEDBACK_BOUND; past it, again with the code as plain text (highlighting is what a large notebook costs
    most). Returns the notes for the outcome. Runs no student code (it converts the autograded notebooks): the
    worker calls it after autograde, `grading.report.refresh_feedback` after a person graded in formgrader."""
    notes = []
    try:
        result = run_bounded(lambda: _feedback(api, grading, plain=False), FEEDBACK_BOUND)
    except PastBound as exc:
        notes.append(f"the feedback pages show the code as plain text: highlighting it went past the host's limit "
                     f"({FEEDBACK_BOUND}: {exc})")
        try:
            result = run_bounded(lambda: _feedback(api, grading, plain=True), FEEDBACK_BOUND)
        except PastBound as again:
            return [f"no feedback page: making it went past the host's limit ({FEEDBACK_BOUND}), even with the code "
                    f"as plain text: {again}"]
    result = cast(dict, result)
    if not result.get("success"):
        notes.append(f"no feedback page: {course.last_error(result)}")
    return notes


def grade_notebook(nb, student: str, notebook: str, folder: Path | None, settings: Settings,
                   files: CourseFiles, student_sandbox: StudentSandbox | None = None) -> NotebookRecord:
    """One notebook of a student, as nbgrader restored it (`nb`, changed in place): run in the student's sandbox
    (`student_sandbox`; one of its own when None) with the files handed in beside it in `folder`, then scored by
    the judge from what the checks observed there; the test cells' outputs become the judge's lines and score.
    Returns the judge's record of the notebook."""
    ran = sandbox.run_in_sandbox(nb, notebook, folder, settings, files, student_sandbox)
    # notebook 07's hidden trained-model cases: measured here from the checkpoint handed in, with the kit's model
    # and decoding (grading.trained_model); whatever the sandbox recorded under their names does not count
    measured = trained_model.measure_notebook(notebook, folder, list(files.reference_dirs), judge.public_case_names())
    return judge.judge_into(nb, ran, list(files.reference_dirs), student, notebook, measured)


NOT_IN_A_RUN = ("the kit's grading steps run within `python -m grading autograde` (which gives them the student's "
                "sandbox and keeps the judge's records), not from nbgrader's own autograde")


def with_grading(resources: dict, grading: JudgedStudent) -> dict:
    resources[GRADING] = grading
    return resources


def grading_of(resources: dict) -> StudentGrading:
    """The student's grading a step of the kit's autograde needs; under nbgrader's own autograde, an error that says
    where it must run."""
    grading = resources.get(GRADING)
    if grading is None:
        raise NbGraderException(NOT_IN_A_RUN)
    return grading


class GradeNotebook(NbGraderPreprocessor):
    """nbgrader's Execute step, done by `grade_notebook` in the student's sandbox with the run's settings and the
    course's files, all from the student's grading (the StudentGrading that StudentAutograde puts in `resources`),
    where the judge's record of the notebook is kept. Nothing of it is configured in the course's configuration."""

    def preprocess(self, nb, resources):
        grading = grading_of(resources)
        run = grading.run
        folder = (resources.get("metadata") or {}).get("path") or ""
        record = grade_notebook(nb, resources["nbgrader"]["student"], resources["nbgrader"]["notebook"],
                                Path(folder) if folder else None, run.settings, run.files, grading.sandbox)
        grading.judged.append(record)
        return nb, resources


class SaveJudgedScores(SaveAutoGrades):
    """nbgrader's SaveAutoGrades, but a test cell's points are the judge's number from its record of the notebook
    (`grading.judged`), not parsed back from the cell's output; written answers and comments as nbgrader does."""

    def _add_score(self, cell, resources) -> None:
        if not notebooks.is_test(cell):  # a written answer: 0 if left as released, else for a person to grade
            return super()._add_score(cell, resources)
        grading = grading_of(resources)
        grade_id = cell.metadata.nbgrader["grade_id"]
        points = {c.grade_id: c.points for r in grading.judged if r.notebook == self.notebook_id for c in r.cells}
        if grade_id not in points:
            raise NbGraderException(f"the judge has no score for test cell {grade_id} of {self.notebook_id}")
        grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
        grade.auto_score = points[grade_id]
        grade.needs_manual_grade = grade.manual_score is not None  # a person's earlier score: to be looked at again
        self.gradebook.db.commit()


class StudentAutograde(Autograde):
    """nbgrader's autograde of one student (the gradebook's rows, the autograded copies), whose notebooks all run in
    one sandbox: the course's configuration puts the kit's two steps in its pipeline, GradeNotebook in the place of
    Execute and SaveJudgedScores in the place of SaveAutoGrades, and this gives them the student's grading (the run,
    the sandbox, the judge's records) in each notebook's `resources`."""

    def __init__(self, grading: StudentGrading, **kwargs) -> None:
        super().__init__(**kwargs)
        self.grading = grading

    def init_single_notebook_resources(self, notebook_filename: str) -> dict:
        return with_grading(super().init_single_notebook_resources(notebook_filename), self.grading)


def autograde_student(api, grading: StudentGrading) -> dict:
    """nbgrader's autograde of the student (what `NbGraderAPI.autograde` does, with StudentAutograde): its result
    (success, error, log); the judge's record of each notebook is in `grading.judged`."""
    with nbgrader_utils.temp_attrs(api.coursedir, assignment_id=ASSIGNMENT, student_id=grading.student):
        app = StudentAutograde(grading, coursedir=api.coursedir, parent=api)
        app.force, app.create_student = True, True
        return nbgrader_utils.capture_log(app)


def warm_up(settings: Settings, files: CourseFiles) -> str:
    """On a worker, while the run prepares the rest of the course, what would otherwise be its first student's wait:
    start the sandbox that student will take (`sandbox.WARM`; first, as its imports run in a process of its own while
    this one goes on) and load what measuring a trained model needs (`trained_model.warm`). (The references the judge
    compares with come from the run: `judge.keep_references`.) Says what it did with the sandbox; one that cannot
    start here is started again for the student, whose grading then records why."""
    said = "no sandbox kept between students: none started ahead"
    if settings.isolate and settings.reuse_sandbox:
        try:
            said = "started" if sandbox.WARM.start(files.case_inputs, settings.limits, files.data_dir) else \
                "one was kept for these settings already"
        except Exception as exc:  # the student's grading meets it again, and records it
            said = f"not started ahead: {type(exc).__name__}: {exc}"
    trained_model.warm()
    return said


def grade_student(run: GradingRun, student: str) -> StudentOutcome:
    """Grade `student`, staged by intake in the course folder `run.root`: nbgrader's autograde (the student's sandbox
    runs the notebooks, the judge scores them, its points go into the gradebook), the feedback pages, the review
    flags; returns the student's outcome and writes it (`outcomes/<student>.json`). The folder's preparation digest
    is compared with the run's (`run.prepared`) before and after the student."""
    api = course.api(run.root)
    start = time.perf_counter()
    outcome = StudentOutcome(student, status=Status.FAILED)
    changed = course.preparation_digest(run.root) != run.prepared
    try:
        with StudentSandbox() as student_sandbox:  # one sandbox for all of the student's notebooks
            grading = StudentGrading(run, student, student_sandbox)
            result = autograde_student(api, grading)
        outcome.sandboxes_started = student_sandbox.sandboxes_started  # 0: the worker's warm one
        outcome.judged = grading.judged
        if result.get("success"):
            outcome.status = Status.GRADED
            outcome.notes += feedback_pages(api, grading)
        else:
            outcome.error = course.last_error(result)
        outcome.flags = review_flags(run.root, student, grading.judged)
        if student_sandbox.left_behind:
            outcome.flags.append("the sandbox was not clean after this student's notebooks, so it ended instead of "
                                 f"being kept for the next student: {'; '.join(student_sandbox.left_behind)}")
    except Exception as exc:
        outcome.status, outcome.error = Status.FAILED, f"{type(exc).__name__}: {exc}"
        outcome.traceback = traceback.format_exc()[-4000:]
    if changed or course.preparation_digest(run.root) != run.prepared:
        outcome.flags.append(PREPARATION_CHANGED)
    outcome.seconds = round(time.perf_counter() - start, 2)
    write_outcome(run.root / FOLDER, outcome)
    return outcome
