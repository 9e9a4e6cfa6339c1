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
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

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


CLEANROOM_BUDGET = 600  # seconds for one notebook's clean-room re-check
# "auto": re-check notebooks whose code could tamper (grading.scan); "always"; "never"
CLEANROOM = os.environ.get("GRADING_CLEANROOM", "auto")


def student_code(path: Path) -> str:
    """The student's own code in a submitted (rebuilt) notebook: answer cells and extra cells."""
    parts = []
    for cell in read_cells(path):
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if cell.get("cell_type") == "code" and (meta.get("solution") or not meta):
            parts.append(python_source(cell))
    return "\n\n".join(parts)


def start_cleanrooms(root: Path, student: str, only: set[str] | None = None,
                     skip: set[str] = frozenset()) -> dict[str, subprocess.Popen]:
    """Clean-room re-checks of the student's notebooks (those in `only`, default all), in the background."""
    source = root / "source" / ASSIGNMENT
    rooms = {}
    for nb in sorted((root / "submitted" / student / ASSIGNMENT).glob("*.ipynb")):
        if (only is None or nb.stem in only) and nb.stem not in skip and (source / nb.name).exists():
            rooms[nb.stem] = subprocess.Popen(
                [sys.executable, "-m", "grading.cleanroom", str(source / nb.name), str(nb),
                 str(source / "hidden_references")],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
    return rooms


def collect_cleanrooms(rooms: dict[str, subprocess.Popen], notes: list[str]) -> dict[str, dict]:
    verdicts = {}
    for stem, proc in rooms.items():
        try:
            out, _ = proc.communicate(timeout=CLEANROOM_BUDGET)
            verdicts[stem] = json.loads(out)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            notes.append(f"{stem}: clean-room re-check timed out; scores not verified")
        except (json.JSONDecodeError, ValueError):
            notes.append(f"{stem}: the student's code ended the clean-room re-check; scores not verified")
    return verdicts


def _graded_cells(gb, student: str, verdicts: dict[str, dict]):
    """(stem, grade_id, clean-room verdict, gradebook Grade or None) for every verified test cell."""
    from nbgrader.api import MissingEntry

    for stem, verdict in verdicts.items():
        for grade_id, v in verdict.items():
            try:
                yield stem, grade_id, v, gb.find_grade(grade_id, stem, ASSIGNMENT, student)
            except MissingEntry:
                yield stem, grade_id, v, None


def reconcile(db_url: str, student: str, verdicts: dict[str, dict], notes: list[str], flags: list[str]) -> None:
    """Where a test passed in the notebook but fails in the clean room, the student's code tampered
    with the checks: score the real code (0 for that cell, as a manual score) and flag for review."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        for stem, grade_id, v, grade in _graded_cells(gb, student, verdicts):
            if grade is None:
                continue
            passed_in_notebook = (grade.auto_score or 0) >= grade.max_score
            if v["passed"] is False and passed_in_notebook:
                grade.manual_score = 0.0
                flags.append(f"{stem}:{grade_id} passed in the notebook but fails in a clean room "
                             f"({v['message']}): scored 0, tampering suspected")
            elif v["passed"] and not passed_in_notebook:
                notes.append(f"{stem}:{grade_id} failed in the notebook but passes in a clean room "
                             "(state changed by other cells?): notebook score kept")
        gb.db.commit()


def score_from_cleanroom(db_url: str, student: str, verdicts: dict[str, dict], reason: str, flags: list[str]) -> bool:
    """nbgrader could not run a notebook to the end (e.g. the kernel died): score the student's real
    code from the clean-room re-check instead, and flag it for review. False if impossible."""
    from nbgrader.api import Gradebook

    if not verdicts:
        return False
    with Gradebook(db_url) as gb:
        cells = list(_graded_cells(gb, student, verdicts))
        if any(grade is None for *_, grade in cells):
            return False
        for _, _, v, grade in cells:
            grade.manual_score = grade.max_score if v["passed"] else 0.0
        gb.db.commit()
    flags.append(f"nbgrader could not finish ({reason}): scored from the clean-room re-check")
    return True


def grade(root: Path, students: list[str]) -> None:
    os.chdir(root)
    api = _api(root)
    status = root / "status"
    status.mkdir(exist_ok=True)
    for student in students:
        (status / f"{student}.started").write_text(str(time.time()))
        start = time.perf_counter()
        record = {"student": student, "ok": False, "notes": [], "flags": []}
        try:
            suspects = {}
            for nb in sorted((root / "submitted" / student / ASSIGNMENT).glob("*.ipynb")):
                reasons = suspicious(student_code(nb)) if CLEANROOM == "auto" else ["always"]
                if reasons and CLEANROOM != "never":
                    suspects[nb.stem] = reasons
            rooms = start_cleanrooms(root, student, set(suspects))  # in parallel with nbgrader
            result = api.autograde(ASSIGNMENT, student, force=True, create=True)
            verdicts = collect_cleanrooms(rooms, record["notes"])
            if not result.get("success"):  # the fallback needs every notebook verified
                verdicts.update(collect_cleanrooms(start_cleanrooms(root, student, skip=set(verdicts)),
                                                   record["notes"]))
            record["cleanroom"] = suspects
            record["autograde_log"] = result.get("log", "")[-20000:]
            if result.get("success"):
                reconcile(api.coursedir.db_url, student, verdicts, record["notes"], record["flags"])
                fb = api.generate_feedback(ASSIGNMENT, student, force=True)
                record["ok"] = True
                if not fb.get("success"):
                    record["feedback_error"] = _last_error(fb)
            else:
                record["error"] = _last_error(result)
                if score_from_cleanroom(api.coursedir.db_url, student, verdicts, record["error"], record["flags"]):
                    record["ok"] = True
                    fb = api.generate_feedback(ASSIGNMENT, student, force=True)
                    if not fb.get("success"):
                        record["notes"].append("no feedback page: the notebook could not be run to the end")
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
