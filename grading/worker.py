"""A grading worker: autogrades and writes feedback for a list of students, in one process.

    python -m grading.worker COURSE_ROOT STUDENT [STUDENT ...]

nbgrader is driven through its Python API, with the course's configuration: its Execute step is the
sandbox (grading/sandbox.py) and the judge (grading/judge.py) scores the test cells before
SaveAutoGrades records them. This process never runs student code itself. Importing nbgrader costs
seconds, so one worker grades many students in turn. For every student it writes
`status/<student>.started` before and `status/<student>.json` after, so the parent can tell which
student a crashed or stuck worker was on, and a rerun can skip the finished ones.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from .judge import read_records
from .notebooks import ASSIGNMENT
from .scan import suspicious
from starter.notebook_loader import python_source, read_cells


def _api(root: Path):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    coursedir = CourseDirectory(config=config)
    coursedir.root = str(root)
    return NbGraderAPI(coursedir, config=config)


def _last_error(result: dict) -> str:
    text = (result.get("error") or "") + "\n" + (result.get("log") or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    causes = [ln for ln in lines if ln.split(":")[0].endswith(("Error", "Exception"))]
    errors = [ln for ln in lines if ln.startswith("[ERROR]") and "see the" not in ln]
    return ((causes or errors or lines or ["unknown error"])[-1])[:400]


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
    grading without the sandbox, and code that tries to reach the checks (grading.scan)."""
    flags = []
    for rec in read_records(root / "records", student):
        if not rec.isolated:
            flags.append(f"{rec.notebook}: graded without the sandbox (--no-sandbox)")
        if rec.sandbox not in ("finished",):
            flags.append(f"{rec.notebook}: {rec.sandbox}: {rec.sandbox_message}"[:300])
        flags += [f"{rec.notebook}: {p}" for p in rec.problems[:3]]
    for nb in sorted((root / "submitted" / student / ASSIGNMENT).glob("*.ipynb")):
        reasons = suspicious(student_code(nb))
        if reasons:
            flags.append(f"{nb.stem}: code that reaches for the checks ({'; '.join(reasons[:3])}); "
                         "no effect on the score (the judge decides), worth a look")
    return flags


def grade(root: Path, students: list[str]) -> None:
    os.chdir(root)
    api = _api(root)
    status = root / "status"
    status.mkdir(exist_ok=True)
    for student in students:
        (status / f"{student}.started").write_text(str(time.time()))
        start = time.perf_counter()
        record = {"student": student, "ok": False, "notes": [], "flags": []}
        shutil.rmtree(root / "records" / student, ignore_errors=True)  # the judge's records of an earlier run
        try:
            result = api.autograde(ASSIGNMENT, student, force=True, create=True)
            record["autograde_log"] = result.get("log", "")[-20000:]
            if result.get("success"):
                record["ok"] = True
                fb = api.generate_feedback(ASSIGNMENT, student, force=True)
                if not fb.get("success"):
                    record["notes"].append(f"no feedback page: {_last_error(fb)}")
            else:
                record["error"] = _last_error(result)
            record["flags"] = review_flags(root, student)
        except Exception as exc:  # noqa: BLE001 - recorded for this student, the others go on
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["traceback"] = traceback.format_exc()[-4000:]
        record["seconds"] = round(time.perf_counter() - start, 2)
        tmp = status / f"{student}.json.tmp"
        tmp.write_text(json.dumps(record))
        tmp.replace(status / f"{student}.json")
        (status / f"{student}.started").unlink(missing_ok=True)
        print(json.dumps({"student": student, "ok": record["ok"], "seconds": record["seconds"]}), flush=True)


if __name__ == "__main__":
    grade(Path(sys.argv[1]).resolve(), sys.argv[2:])
