"""The results of a graded class: one value that every output of a run is written from.

`ClassResults` is built once from two sources and never from an output:
- the students' outcomes (grading/outcome.py): who they are, how grading went, the judge's record of each
  notebook (per test cell its points, per case its message and diagnosis);
- one points table, read once from nbgrader's gradebook: the judge's points as SaveJudgedScores wrote them,
  and a person's where formgrader gave one (a written answer, or an override of an automatic score). The
  gradebook is the truth for points; the outcomes say what went wrong and why.

report.json, grades.csv, the failure summary and the class report (grading/report.py, grading/class_report.py)
are views of it, and so is any export to come: per student, per notebook, per task its points, maximum,
status and messages. Autograde builds it from the run in memory (`class_results`); `python -m grading report
OUT` builds the same value from what the run recorded in OUT and the gradebook (`read_class_results`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from .judge import CellResult, NotebookRecord
from .late import NO_LATE_POLICY, ON_TIME, LateFacts, Lateness, LatePolicy, late_line, penalty
from .notebooks import ASSIGNMENT, graded_columns, written_columns
from .outcome import FOLDER, ROSTER, Status, StudentOutcome, read_outcomes

LOOSE_FILES = "loose_files.json"  # in OUT: the files intake found outside any student's folder

Points = dict[tuple[str, str], "float | None"]  # (notebook, task) -> the gradebook's score; None: not graded yet


@dataclass(frozen=True)
class Column:
    """A graded cell of the assignment: a column of the grades table."""
    notebook: str
    task: str  # the cell's nbgrader grade_id
    max_points: float
    written: bool  # a written question, graded by a person; else a test cell, scored by the judge

    @property
    def name(self) -> str:
        return f"{self.notebook}:{self.task}"


@dataclass(frozen=True)
class TaskResult:
    """One student's result on one graded cell."""
    column: Column
    points: float | None  # the gradebook's (a person's where one was given); None: a written answer not graded yet
    judged: CellResult | None  # the judge's record of the test cell; None for a written answer or a notebook not judged

    @property
    def by_hand(self) -> bool:
        """Whether a person gave the cell another score than the judge's (formgrader's manual score). A person
        who gave the judge's own score changed nothing and is not told apart."""
        if self.column.written or self.points is None:
            return False
        judged = self.judged.points if self.judged else 0.0
        return not math.isclose(self.points, judged, rel_tol=1e-9, abs_tol=1e-9)

    @property
    def messages(self) -> list[str]:
        """The judge's line per case, as the student's feedback page shows them."""
        return self.judged.lines() if self.judged else []


@dataclass(frozen=True)
class StudentResult:
    outcome: StudentOutcome
    tasks: tuple[TaskResult, ...]  # one per column of the class, in its order
    lateness: Lateness = ON_TIME  # under the class's policy (grading/late.py)
    late_policy: LatePolicy = NO_LATE_POLICY

    @property
    def student(self) -> str:
        return self.outcome.student

    @property
    def graded(self) -> bool:
        return self.outcome.status == Status.GRADED

    @functools.cached_property
    def records(self) -> dict[str, NotebookRecord]:
        """{notebook: the judge's record of it}."""
        return {r.notebook: r for r in self.outcome.judged}

    def took(self, notebook: str) -> bool:
        """Whether the student's notebook was graded: only then do its tasks say anything about them (a missing
        notebook is not evidence about a concept)."""
        return self.graded and notebook in self.records

    @functools.cached_property
    def _by_task(self) -> dict[tuple[str, str], TaskResult]:
        return {(t.column.notebook, t.column.task): t for t in self.tasks}

    def task(self, notebook: str, task: str) -> TaskResult:
        return self._by_task[(notebook, task)]

    def total(self, notebook: str | None = None) -> float:
        """Points given so far, in one notebook or in all."""
        return sum(t.points or 0.0 for t in self.tasks if notebook in (None, t.column.notebook))

    @property
    def late_penalty(self) -> float:
        """Points the late policy takes off the total as it is now (0 for a student not graded)."""
        return penalty(self.late_policy, self.lateness, self.total()) if self.graded else 0.0

    def final(self) -> float:
        """The grade: the total less the late penalty."""
        return round(self.total() - self.late_penalty, 4)

    @property
    def late_line(self) -> str:
        """How late, and the rule, in one line for the student ("" when nothing to say)."""
        return late_line(self.late_policy, self.lateness)

    @property
    def pending(self) -> float:
        """Points of the written answers still awaiting a person's grade (none for a student not graded)."""
        waiting = [t.column.max_points for t in self.tasks if t.column.written and t.points is None]
        return sum(waiting) if self.graded else 0.0


@dataclass(frozen=True)
class ClassResults:
    columns: tuple[Column, ...]  # the test cells, then the written questions, each in notebook order
    students: tuple[StudentResult, ...]  # by id
    loose: tuple[str, ...] = ()  # files intake found outside any student's folder
    late_policy: LatePolicy = NO_LATE_POLICY  # the course folder's, as it was when these results were made

    @property
    def notebooks(self) -> list[str]:
        return list(dict.fromkeys(c.notebook for c in self.columns))

    @property
    def graded(self) -> list[StudentResult]:
        return [s for s in self.students if s.graded]

    def max_total(self, notebook: str | None = None) -> float:
        return sum(c.max_points for c in self.columns if notebook in (None, c.notebook))

    @functools.cached_property
    def run(self) -> str:
        """Which grading run this is: a digest of the points table and the outcomes, so a person's score given
        since, or a student graded again, makes another."""
        content = {"points": [[s.student, t.column.name, t.points] for s in self.students for t in s.tasks],
                   "outcomes": [asdict(s.outcome) for s in self.students],
                   "late": [[s.student, s.late_penalty] for s in self.students if s.late_penalty]}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def columns() -> tuple[Column, ...]:
    """The assignment's graded cells: the test cells, then the written questions."""
    return tuple(Column(nb, task, points, False) for nb, task, points in graded_columns()) + tuple(
        Column(nb, task, points, True) for nb, task, points in written_columns())


def class_results(outcomes: list[StudentOutcome], points: dict[str, Points],
                  loose: list[str] | tuple[str, ...] = (), late: LatePolicy = NO_LATE_POLICY) -> ClassResults:
    """The class from its outcomes and the gradebook's points of each graded student (`read_points`), under the
    late policy `late` (its files read here, once). A test cell the gradebook has no score for scored nothing; a
    written answer without one awaits a person."""
    cols = columns()
    facts = LateFacts.read(late)

    def student(outcome: StudentOutcome) -> StudentResult:
        given = points.get(outcome.student, {})
        cells = {(r.notebook, c.grade_id): c for r in outcome.judged for c in r.cells}
        return StudentResult(outcome, tuple(
            TaskResult(c, given.get((c.notebook, c.task), None if c.written else 0.0), cells.get((c.notebook, c.task)))
            for c in cols), facts.of(student_keys(outcome), outcome.lms_late), late)

    return ClassResults(cols, tuple(student(o) for o in sorted(outcomes, key=lambda o: o.student)), tuple(loose), late)


def student_keys(outcome: StudentOutcome) -> list[str]:
    """The ways the instructor's files (extensions, submission times) may name a student: name, id, LMS id."""
    return [k for k in (outcome.name, outcome.student, outcome.lms_id) if k]


def submissions(gb, students: list[str]) -> dict:
    """{student: their nbgrader SubmittedAssignment} of each of `students` who handed in, from an open Gradebook, with
    each notebook's grades and comments, and those's cells, loaded with it: a few queries for the whole class,
    where nbgrader's lazy loading asked about 70 for each student."""
    from nbgrader.api import Assignment, Comment, Grade, SubmittedAssignment, SubmittedNotebook
    from sqlalchemy.orm import selectinload

    notebooks = selectinload(SubmittedAssignment.notebooks)
    query = (gb.db.query(SubmittedAssignment).join(Assignment).filter(Assignment.name == ASSIGNMENT)
             .options(notebooks.joinedload(SubmittedNotebook.notebook),
                      notebooks.selectinload(SubmittedNotebook.grades).joinedload(Grade.cell),
                      notebooks.selectinload(SubmittedNotebook.comments).joinedload(Comment.cell)))
    wanted = set(students)
    return {s.student_id: s for s in query if s.student_id in wanted}


def scores_of(submission) -> Points:
    """{(notebook, grade_id): score} of one nbgrader SubmittedAssignment (`submissions`); None for a written
    answer nobody has graded yet."""
    scores: Points = {}
    for nb in submission.notebooks:
        for grade in nb.grades:
            pending = grade.auto_score is None and grade.manual_score is None
            scores[(nb.name, grade.name)] = None if pending else float(grade.score or 0.0)
    return scores


def read_points(db_url: str, students: list[str], same_run: bool = False) -> dict[str, Points]:
    """The points table: {student: their scores} of each of `students` (the graded ones), read once from the
    gradebook. same_run: the gradebook must be the run's, holding every one of them (else ValueError), as
    when a later command reads it for a run graded before."""
    if not students:
        return {}
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    # nbgrader's ORM use makes SQLAlchemy 2 warn about autoflush on reads: harmless, and noise for the user
    with Gradebook(db_url) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore", SAWarning)
        found = submissions(gb, students)
        table = {s: scores_of(found[s]) if s in found else {} for s in students}
    absent = sorted(s for s, scores in table.items() if not scores)
    if same_run and absent:  # another run's gradebook: its scores must not replace this run's
        raise ValueError(f"the gradebook {db_url} holds no grades of {', '.join(absent[:3])}"
                         f"{' …' if len(absent) > 3 else ''}: it is not this run's (give the run's --course or --db)")
    return table


def write_loose_files(out: Path, loose: tuple[str, ...]) -> Path:
    """Record what intake found outside the students' folders beside their outcomes, for a later `report`."""
    path = out / LOOSE_FILES
    path.write_text(json.dumps(list(loose)))
    return path


def missing_from_out(out: Path, root: Path | None) -> list[str]:
    """The students of the course folder's class (its roster: who the last run took in) with no outcome in OUT: a
    report or export of OUT would leave them out."""
    if root is None or not (root / ROSTER).is_dir():
        return []
    have = {p.stem for p in (out / FOLDER).glob("*.json")}
    return sorted(p.stem for p in (root / ROSTER).glob("*.json") if p.stem not in have)


def read_class_results(out: Path, db_url: str, late: LatePolicy = NO_LATE_POLICY) -> ClassResults:
    """The results of the run recorded in OUT (its outcomes and loose files) with the gradebook's points now, under
    the late policy `late`: scores a person gave in formgrader since the run count."""
    outcomes = list(read_outcomes(out / FOLDER).values())
    loose_record = out / LOOSE_FILES
    loose = json.loads(loose_record.read_text()) if loose_record.is_file() else []
    graded = [o.student for o in outcomes if o.status == Status.GRADED]
    return class_results(outcomes, read_points(db_url, graded, same_run=True), loose, late)
