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
    error: str = ""  # why grading failed (Status.FAILED)
    traceback: str = ""  # where, when grading raised
    sandboxes_started: int = 0  # 0: graded in a sandbox kept warm from the worker's previous student
    judged: list[NotebookRecord] = field(default_factory=list)  # the judge's record of each notebook, in order

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


def joined(intake: StudentOutcome, graded: StudentOutcome | None) -> StudentOutcome:
    """The outcome of a student as intake found them and a worker graded them (None: not graded)."""
    if graded is None:
        return intake
    failed = graded.status != Status.GRADED
    return StudentOutcome(
        student=intake.student, notebooks=intake.notebooks, status=Status.FAILED if failed else Status.GRADED,
        notes=intake.notes + graded.notes + ([graded.error or "unknown error"] if failed else []),
        flags=intake.flags + graded.flags, seconds=graded.seconds, name=intake.name, lms_id=intake.lms_id,
        lms=intake.lms, error=graded.error, traceback=graded.traceback, sandboxes_started=graded.sandboxes_started,
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
