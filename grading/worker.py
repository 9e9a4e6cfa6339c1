"""A grading worker: autogrades and writes feedback for a list of students, in one process.

    python -m grading.worker COURSE_ROOT STUDENT [STUDENT ...]

Importing nbgrader costs seconds, so one worker grades many students in turn; each student's
notebooks still run in their own fresh kernel. For every student the worker writes
`status/<student>.started` before and `status/<student>.json` after, so the parent can tell which
student a crashed or stuck worker was on, and a rerun can skip the finished ones.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from .notebooks import ASSIGNMENT


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


def grade(root: Path, students: list[str]) -> None:
    os.chdir(root)
    api = _api(root)
    status = root / "status"
    status.mkdir(exist_ok=True)
    for student in students:
        (status / f"{student}.started").write_text(str(time.time()))
        start = time.perf_counter()
        record = {"student": student, "ok": False}
        try:
            result = api.autograde(ASSIGNMENT, student, force=True, create=True)
            record["autograde_log"] = result.get("log", "")[-20000:]
            if result.get("success"):
                fb = api.generate_feedback(ASSIGNMENT, student, force=True)
                record["ok"] = True
                if not fb.get("success"):
                    record["feedback_error"] = _last_error(fb)
            else:
                record["error"] = _last_error(result)
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
