"""One student's outcome: everything grading found out about them, in one record (student > notebook > test
cell > case).

Intake starts it (who the student is, which notebooks they handed in, what was wrong with the files); the
worker that grades the student fills in how grading went and the judge's record of each notebook
(`judge.NotebookRecord`: per test cell its points, per case whether it passed and why not), and writes it once,
when the student is done (`outcomes/<student>.json` in the course folder: what `--resume` reads); the run joins
the two (`joined`) and writes it once into OUT (`OUT/outcomes/<student>.json`, for instructors: it names the
hidden cases). With the points read from nbgrader's gradebook (where SaveJudgedScores wrote the judge's and
where formgrader keeps a person's: a written answer's, or an override of an automatic score) these records make
the class's results (`grading.results.ClassResults`), which the rest of OUT is written from: `report.json`
(each outcome without its notebooks), `grades.csv`, `failures.csv` and the class report.
"""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path

from .judge import NotebookRecord

FOLDER = "outcomes"  # in the course folder and in OUT


class Status(str, Enum):
    """How a student's grading went. A str: the files and the CSVs write its value."""

    PENDING = "pending"  # not graded yet
    GRADED = "graded"
    FAILED = "failed"  # refused at intake, or grading raised (`error` says why)
    NO_NOTEBOOKS = "no notebooks"  # the submission holds none of the assignment's notebooks

    def __str__(self) -> str:  # the value in f-strings and logs, on every Python (3.12 changed the mixin's)
        return self.value


@dataclass
class StudentOutcome:
    student: str  # the id graded under (`intake.student_id`); a refused name as it was given
    notebooks: dict[str, str] = field(default_factory=dict)  # notebook stem -> file graded
    notes: list[str] = field(default_factory=list)  # what was wrong with the submission, per file
    flags: list[str] = field(default_factory=list)  # for manual review (suspected tampering, a sandbox stopped)
    status: Status = Status.PENDING
    seconds: float = 0.0  # spent grading the student
    name: str = ""  # the student's name as the export gives it (the id if empty)
    lms_id: str = ""  # the LMS's participant id, where the export gives one
    # which LMS's export `lms_id` was read from: "moodle" (a participant id, from Moodle's names), "canvas" (a user
    # id, from Canvas's); "" where not known (no id, or an outcome written before this was recorded)
    lms: str = ""
    # False: every file whose name reads as this student's reads as another's too (none taken in), so the row
    # rests on no file of its own: its id may be a classmate's, and it is never exported under it
    own_files: bool = True
    # what the student did not hand in, as intake found it: the assignment's notebooks with no copy in the submission
    # (one handed in but unreadable is in `notes` instead), and whether notebook 06's trained model was kept for
    # measuring (False: none handed in, or one too large to keep); shown in the row, the feedback page, the LMS comment
    missing: list[str] = field(default_factory=list)
    model_kept: bool = True
    lms_late: bool = False  # the LMS's export marks the submission late (Canvas's LATE); grading/late.py says how late
    error: str = ""  # why grading failed (Status.FAILED)
    traceback: str = ""  # where, when grading raised
    sandboxes_started: int = 0  # 0: graded in a sandbox kept warm from the worker's previous student
    judged: list[NotebookRecord] = field(default_factory=list)  # the judge's record of each notebook, in order

    @property
    def missing_work(self) -> list[str]:
        """What the student did not hand in, a line each, with the points it costs (`missing_work`)."""
        return missing_work(self)

    def summary(self) -> dict:
        """The outcome without the judge's records and the traceback: an entry of report.json."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("judged", "traceback")}

    @classmethod
    def from_dict(cls, raw: dict) -> StudentOutcome:
        known = {f.name for f in fields(cls)}
        outcome = cls(**{k: v for k, v in raw.items() if k in known and k != "judged"})
        outcome.status = Status(outcome.status)  # an unknown one raises ValueError, as a damaged file does
        outcome.judged = [NotebookRecord.from_dict(r) for r in raw.get("judged", [])]
        return outcome


def missing_work(outcome: StudentOutcome) -> list[str]:
    """A line for each piece of work the student did not hand in and the points it costs: a notebook, or notebook
    06's trained model where 07 came without one. None for a student with no notebook at all (the status says it)."""
    from .notebooks import TRAINED_MODEL_CELL

    if outcome.status == Status.NO_NOTEBOOKS or not outcome.notebooks:
        return []
    points = _points()
    lines = [f"{stem} not handed in: its {points.get(stem, 0.0):g} points are 0" for stem in outcome.missing]
    training, cell = TRAINED_MODEL_CELL
    if not outcome.model_kept and training in outcome.notebooks:
        lines.append(f"no trained model to measure (not handed in, or not kept: see the notes): {training}'s "
                     f"{cell} ({points.get(TRAINED_MODEL_CELL, 0.0):g} points) is 0")
    return lines


@functools.cache
def _points() -> dict[str | tuple[str, str], float]:
    """{notebook: its points, (notebook, grade_id): a cell's}, read from the solution notebooks once a process
    (each student's lines use them: reading every notebook each time cost 16 ms a line)."""
    from .notebooks import graded_columns, written_columns

    points: dict[str | tuple[str, str], float] = {}
    for stem, task, worth in graded_columns() + written_columns():
        points[stem] = points.get(stem, 0.0) + worth
        points[(stem, task)] = worth
    return points


def joined(intake: StudentOutcome, graded: StudentOutcome | None) -> StudentOutcome:
    """The outcome of a student as intake found them and a worker graded them (None: not graded)."""
    if graded is None:
        return intake
    failed = graded.status != Status.GRADED
    return StudentOutcome(
        student=intake.student, notebooks=intake.notebooks, status=Status.FAILED if failed else Status.GRADED,
        notes=intake.notes + graded.notes + ([graded.error or "unknown error"] if failed else []),
        flags=intake.flags + graded.flags, seconds=graded.seconds, name=intake.name, lms_id=intake.lms_id,
        lms=intake.lms, own_files=intake.own_files, missing=intake.missing, model_kept=intake.model_kept,
        lms_late=intake.lms_late, error=graded.error, traceback=graded.traceback, sandboxes_started=graded.sandboxes_started,
        judged=graded.judged)


def write_outcome(folder: Path, outcome: StudentOutcome) -> Path:
    """`folder/<student>.json`, replaced whole (a reader never sees half of it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{outcome.student}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(outcome), indent=1))
    tmp.replace(path)
    return path


def read_outcome(path: Path) -> StudentOutcome:
    """An outcome as `write_outcome` wrote it; a damaged file raises (ValueError, TypeError, KeyError)."""
    return StudentOutcome.from_dict(json.loads(path.read_text()))


ROSTER = "roster"  # in the course folder: intake's outcome of each student (who handed in what), for the workers


def read_outcomes(folder: Path) -> dict[str, StudentOutcome]:
    """{student: outcome} of every outcome in `folder`; an unreadable file is left out (that student is graded
    again by a resumed run, and a report of a damaged folder still comes out, without them)."""
    found = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            outcome = read_outcome(path)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
        found[outcome.student] = outcome
    return found
