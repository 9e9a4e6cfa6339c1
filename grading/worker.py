"""Grade one student: nbgrader's autograde and feedback, driven through its Python API.

`grade_student(root, student)` is the task the engine (grading/engine.py) runs on a Dask worker: nbgrader's
autograde of the student, the feedback pages, the review flags, the student's outcome (grading/outcome.py)
written to `outcomes/<student>.json` as soon as the student is done (what `--resume` reads). The course's
configuration puts the kit's two steps in nbgrader's autograde pipeline: `GradeNotebook` in the place of
Execute, a thin adapter around `grade_notebook`, which runs one notebook in the student's sandbox
(grading/sandbox.py) and has the judge (grading/judge.py) score it, and `SaveJudgedScores` in the place of
SaveAutoGrades, which writes the judge's points into the gradebook. `StudentAutograde`, the autograde that
`grade_student` starts, hands both the student's sandbox and the list of the judge's records. This process
never runs student code itself. The API (importing nbgrader costs seconds) is made once per worker
process (`course.api`).

A run passes each task the digest of the course preparation it started with (`prepared`); grading
compares the course folder's with it before and after the student, so a course prepared again or changed
under the run (another run on the folder, a hand edit) is flagged in `review`, never a silent 0.
"""
from __future__ import annotations

import html
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

from nbgrader import utils as nbgrader_utils
from nbgrader.converters import Autograde
from nbgrader.converters.base import NbGraderException
from nbgrader.preprocessors import NbGraderPreprocessor, SaveAutoGrades
from traitlets import Bool, Dict, List, Unicode

from starter.notebook_loader import read_cells

from . import course, judge, notebooks, sandbox, trained_model
from .host_bounds import Bound, PastBound, each_bounded, run_bounded
from .judge import NOT_RUN, NotebookRecord
from .notebooks import ASSIGNMENT
from .outcome import FOLDER, StudentOutcome, write_outcome
from .scan import Findings, scan_notebook
from .settings import Limits, Settings, setting_help

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


def _feedback(api, student: str, plain: bool, records: Sequence[NotebookRecord] = ()) -> dict:
    """nbgrader's generate_feedback of `student` (run in the bounded child), its code as plain text if `plain`;
    its test cells show the judge's lines from `records` (grading.feedback.RedactHiddenTests)."""
    api.config.RedactHiddenTests.records = [asdict(r) for r in records]  # the child's copy of the config
    if plain:
        api.config.FeedbackHTMLExporter.filters = {"highlight_code": plain_code}  # the child's copy of the config
    result = api.generate_feedback(ASSIGNMENT, student, force=True)
    if not result.get("success") and "MemoryError" in f"{result.get('error')}{result.get('log')}":
        raise MemoryError("past the memory limit (nbgrader caught it)")
    return result


def feedback_pages(api, student: str, records: Sequence[NotebookRecord] = ()) -> list[str]:
    """Make the student's feedback pages, in a child process within FEEDBACK_BOUND; past it, again with the
    code as plain text (highlighting is what a large notebook costs most). Returns the notes for the outcome."""
    notes = []
    try:
        result = run_bounded(lambda: _feedback(api, student, plain=False, records=records), FEEDBACK_BOUND)
    except PastBound as exc:
        notes.append(f"the feedback pages show the code as plain text: highlighting it went past the host's limit "
                     f"({FEEDBACK_BOUND}: {exc})")
        try:
            result = run_bounded(lambda: _feedback(api, student, plain=True, records=records), FEEDBACK_BOUND)
        except PastBound as again:
            return [f"no feedback page: making it went past the host's limit ({FEEDBACK_BOUND}), even with the code "
                    f"as plain text: {again}"]
    result = cast(dict, result)
    if not result.get("success"):
        notes.append(f"no feedback page: {course.last_error(result)}")
    return notes


@dataclass(frozen=True)
class CourseFiles:
    """What grading reads of the prepared course: the hidden cases' inputs under opaque ids (the sandbox's), the
    datasets folder (read-only in the sandbox) and the reference files the judge compares with."""

    case_inputs: Path | None
    data_dir: Path | None
    reference_dirs: tuple[Path, ...]


def grade_notebook(nb, student: str, notebook: str, folder: Path | None, settings: Settings,
                   files: CourseFiles, student_sandbox: sandbox.StudentSandbox | None = None) -> NotebookRecord:
    """One notebook of a student, as nbgrader restored it (`nb`, changed in place): run in the student's sandbox
    (`student_sandbox`; one of its own when None) with the files handed in beside it in `folder`, then scored by
    the judge from what the checks observed there; the test cells' outputs become the judge's lines and score.
    Returns the judge's record of the notebook."""
    ran = sandbox.run_in_sandbox(nb, notebook, folder, settings.limits, settings.isolate, files.case_inputs,
                                 files.data_dir, settings.reuse_sandbox, student_sandbox)
    # notebook 05's hidden trained-model cases: measured here from the checkpoint handed in, with the kit's model
    # and decoding (grading.trained_model); whatever the sandbox recorded under their names does not count
    measured = trained_model.measure_notebook(notebook, folder, list(files.reference_dirs), judge.public_case_names())
    return judge.judge_into(nb, ran, list(files.reference_dirs), student, notebook, measured)


NOT_IN_A_RUN = ("the kit's grading steps run within `python -m grading autograde` (which gives them the student's "
                "sandbox and keeps the judge's records), not from nbgrader's own autograde")


class GradeNotebook(NbGraderPreprocessor):
    """nbgrader's Execute step, done by `grade_notebook` in the student's sandbox (`grading`, the `StudentAutograde`
    that runs it, gives the sandbox and keeps the record). Its settings are the course's configuration."""

    isolate = Bool(Settings.isolate, help=setting_help("isolate")).tag(config=True)
    limits = Dict(help="grading.settings.Limits as a dict (missing fields: their defaults)").tag(config=True)
    reuse_sandbox = Bool(Settings.reuse_sandbox, help=setting_help("reuse_sandbox")).tag(config=True)
    case_inputs = Unicode("", help="folder of the hidden cases without expected outputs").tag(config=True)
    data_dir = Unicode("", help="the datasets folder, read-only inside").tag(config=True)
    reference_dirs = List(Unicode(), help="folders of reference files with expected outputs").tag(config=True)
    grading: StudentAutograde | None = None

    def settings(self) -> Settings:
        return Settings(Limits(**self.limits), isolate=self.isolate, reuse_sandbox=self.reuse_sandbox)

    def files(self) -> CourseFiles:
        return CourseFiles(Path(self.case_inputs) if self.case_inputs else None,
                           Path(self.data_dir) if self.data_dir else None,
                           tuple(Path(d) for d in self.reference_dirs)
                           or (notebooks.PUBLIC_REFERENCES, notebooks.HIDDEN_REFERENCES))

    def preprocess(self, nb, resources):
        if self.grading is None:
            raise NbGraderException(NOT_IN_A_RUN)
        folder = (resources.get("metadata") or {}).get("path") or ""
        record = grade_notebook(nb, resources["nbgrader"]["student"], resources["nbgrader"]["notebook"],
                                Path(folder) if folder else None, self.settings(), self.files(), self.grading.sandbox)
        self.grading.judged.append(record)
        return nb, resources


class SaveJudgedScores(SaveAutoGrades):
    """nbgrader's SaveAutoGrades, but a test cell's points are the judge's number from its record of the notebook
    (`grading.judged`), not parsed back from the cell's output; written answers and comments as nbgrader does."""

    grading: StudentAutograde | None = None

    def _add_score(self, cell, resources) -> None:
        if not notebooks.is_test(cell):  # a written answer: 0 if left as released, else for a person to grade
            return super()._add_score(cell, resources)
        if self.grading is None:
            raise NbGraderException(NOT_IN_A_RUN)
        grade_id = cell.metadata.nbgrader["grade_id"]
        points = {c.grade_id: c.points for r in self.grading.judged if r.notebook == self.notebook_id for c in r.cells}
        if grade_id not in points:
            raise NbGraderException(f"the judge has no score for test cell {grade_id} of {self.notebook_id}")
        grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
        grade.auto_score = points[grade_id]
        grade.needs_manual_grade = grade.manual_score is not None  # a person's earlier score: to be looked at again
        self.gradebook.db.commit()


class StudentAutograde(Autograde):
    """nbgrader's autograde of one student (the gradebook's rows, the autograded copies, late penalties), whose
    notebooks all run in one sandbox (`sandbox`): the course's configuration puts the kit's two steps in its
    pipeline, GradeNotebook in the place of Execute and SaveJudgedScores in the place of SaveAutoGrades, and this
    gives them the student's sandbox and the list of the judge's records (`judged`, one per notebook, in order)."""

    def __init__(self, student_sandbox: sandbox.StudentSandbox, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sandbox = student_sandbox
        self.judged: list[NotebookRecord] = []

    def _init_preprocessors(self) -> None:
        super()._init_preprocessors()
        for step in self.exporter._preprocessors:
            if isinstance(step, (GradeNotebook, SaveJudgedScores)):
                step.grading = self


def autograde_student(api, student: str, student_sandbox: sandbox.StudentSandbox) -> tuple[dict, list[NotebookRecord]]:
    """nbgrader's autograde of `student` (what `NbGraderAPI.autograde` does, with StudentAutograde): its result
    (success, error, log) and the judge's record of each notebook."""
    with nbgrader_utils.temp_attrs(api.coursedir, assignment_id=ASSIGNMENT, student_id=student):
        app = StudentAutograde(student_sandbox, coursedir=api.coursedir, parent=api)
        app.force, app.create_student = True, True
        return nbgrader_utils.capture_log(app), app.judged


def grade_student(root: str | Path, student: str, prepared: str | None = None) -> StudentOutcome:
    """Grade `student`, staged by intake in the course folder `root`: nbgrader's autograde (the student's sandbox
    runs the notebooks, the judge scores them, its points go into the gradebook), the feedback pages,
    the review flags; returns the student's outcome and writes it (`outcomes/<student>.json`). `prepared`: the
    digest of the course preparation the run started with (`course.preparation_digest`; None outside a run),
    compared with the folder's before and after the student."""
    root = Path(root)
    api = course.api(root)
    start = time.perf_counter()
    outcome = StudentOutcome(student, status="failed")
    changed = prepared is not None and course.preparation_digest(root) != prepared
    try:
        with sandbox.StudentSandbox() as student_sandbox:  # one sandbox for all of the student's notebooks
            result, judged = autograde_student(api, student, student_sandbox)
        outcome.sandboxes_started = student_sandbox.sandboxes_started  # 0: the worker's warm one
        outcome.judged = judged
        if result.get("success"):
            outcome.status = "graded"
            outcome.notes += feedback_pages(api, student, judged)
        else:
            outcome.error = course.last_error(result)
        outcome.flags = review_flags(root, student, judged)
        if student_sandbox.left_behind:
            outcome.flags.append("the sandbox was not clean after this student's notebooks, so it ended instead of "
                                 f"being kept for the next student: {'; '.join(student_sandbox.left_behind)}")
    except Exception as exc:
        outcome.status, outcome.error = "failed", f"{type(exc).__name__}: {exc}"
        outcome.traceback = traceback.format_exc()[-4000:]
    if prepared is not None and (changed or course.preparation_digest(root) != prepared):
        outcome.flags.append(PREPARATION_CHANGED)
    outcome.seconds = round(time.perf_counter() - start, 2)
    write_outcome(root / FOLDER, outcome)
    return outcome
