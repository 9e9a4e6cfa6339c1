"""Grade one student: nbgrader's autograde and feedback, driven through its Python API.

`grade_student(root, student)` is the task the engine (grading/engine.py) runs on a Dask worker. The
course's configuration makes nbgrader's Execute step the sandbox (grading/sandbox.py) and adds the
judge (grading/judge.py) before SaveAutoGrades records the scores, so this process never runs
student code itself. The API (importing nbgrader costs seconds) is made once per worker process (`course.api`).
The student's record goes to `status/<student>.json` as soon as it is done, for `--resume`.
"""
from __future__ import annotations

import json
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from starter.notebook_loader import python_source, read_cells

from . import course, sandbox
from .judge import read_records
from .notebooks import ASSIGNMENT
from .scan import suspicious


def student_code(path: Path) -> str:
    """The student's own code in a submitted (rebuilt) notebook: answer cells and extra cells."""
    parts = []
    for cell in read_cells(path):
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if cell.get("cell_type") == "code" and (meta.get("solution") or not meta):
            parts.append(python_source(cell))
    return "\n\n".join(parts)


def review_flags(root: Path, student: str) -> list[str]:
    """What an instructor should look at: sandbox runs that did not finish, unreadable results,
    grading without the sandbox, and code that reaches for the checks (grading.scan)."""
    flags = []
    for rec in read_records(root / "records", student):
        if not rec.isolated:
            flags.append(f"{rec.notebook}: graded without the sandbox (--no-sandbox)")
        if rec.sandbox != "finished":
            flags.append(f"{rec.notebook}: {rec.sandbox}: {rec.sandbox_message}"[:300])
        flags += [f"{rec.notebook}: {p}" for p in rec.problems[:3]]
    for nb in sorted((root / "submitted" / student / ASSIGNMENT).glob("*.ipynb")):
        reasons = suspicious(student_code(nb))
        if reasons:
            flags.append(f"{nb.stem}: code that reaches for the checks ({'; '.join(reasons[:3])}); "
                         "no effect on the score (the judge decides), worth a look")
    return flags


def grade_student(root: str | Path, student: str) -> dict:
    """Autograde `student` and write the feedback; returns (and writes) the student's record."""
    root = Path(root)
    api = course.api(root)
    start = time.perf_counter()
    record: dict[str, Any] = {"student": student, "ok": False, "notes": [], "flags": []}
    shutil.rmtree(root / "records" / student, ignore_errors=True)  # the judge's records of an earlier run
    try:
        with sandbox.student_session() as scope:  # one sandbox for all of this student's notebooks
            result = api.autograde(ASSIGNMENT, student, force=True, create=True)
        record["sandboxes_started"] = scope.sandboxes_started  # 0: the worker's warm one, reset after the last student
        if result.get("success"):
            record["ok"] = True
            feedback = api.generate_feedback(ASSIGNMENT, student, force=True)
            if not feedback.get("success"):
                record["notes"].append(f"no feedback page: {course.last_error(feedback)}")
        else:
            record["error"] = course.last_error(result)
        record["flags"] = review_flags(root, student)
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()[-4000:]
    record["seconds"] = round(time.perf_counter() - start, 2)
    status = root / "status"
    status.mkdir(exist_ok=True)
    tmp = status / f"{student}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(status / f"{student}.json")
    return record
