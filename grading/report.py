"""Report: the grades table, the class's most-failed tests, the class report and the feedback pages of a run.

Reads only what grading recorded (the gradebook, the students' records); runs nothing.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path

from . import class_report
from .intake import StudentResult
from .notebooks import ASSIGNMENT, graded_columns, written_columns
from .spreadsheet import read_csv, write_csv

TITLE = re.compile(r"<title>(.*?)</title>", re.S)


def copy_feedback(root: Path, out: Path, student: str, name: str = "") -> None:
    """Only the HTML pages: the feedback folder also receives copies of the (hidden) source files. Each
    page's title names the student as the export gave the name (the folder is named by the id)."""
    src = root / "feedback" / student / ASSIGNMENT
    dst = out / "feedback" / student
    if dst.exists():
        shutil.rmtree(dst)
    whose = html.escape(f"{name or student}: ", quote=False)
    for page in sorted(src.glob("*.html")) if src.is_dir() else []:
        dst.mkdir(parents=True, exist_ok=True)
        text = page.read_text(encoding="utf-8")
        (dst / page.name).write_text(TITLE.sub(lambda m: f"<title>{whose}{m.group(1)}</title>", text, count=1),
                                     encoding="utf-8")


def scores_from_gradebook(gb, student: str) -> dict[tuple[str, str], float | None]:
    """{(notebook, grade_id): score} of one student, from an open nbgrader Gradebook; None for a written
    answer nobody has graded yet."""
    from nbgrader.api import MissingEntry

    try:
        submission = gb.find_submission(ASSIGNMENT, student)
    except MissingEntry:
        return {}
    scores: dict[tuple[str, str], float | None] = {}
    for nb in submission.notebooks:
        for grade in nb.grades:
            pending = grade.auto_score is None and grade.manual_score is None
            scores[(nb.name, grade.name)] = None if pending else float(grade.score or 0.0)
    return scores


GradesRow = tuple[str, str, str, str, str, str]  # id, name as given, LMS id, status, review flags, notes
MAX_ROW = "(max points)"  # the first row's student: the points of each column


def write_grades(out: Path, results: list[StudentResult], db_url: str) -> Path:
    """`grades.csv`: one row per student with every test cell's and written question's score, per-notebook
    and overall totals, and the points of written questions still awaiting a person's grade. `student` is
    the name as the export gave it, `lms_id` the LMS's participant id (if the export gives one), `id` the
    id graded under (the gradebook's, the name of the student's feedback folder)."""
    return _write_grades(out, [(r.student, r.name or r.student, r.lms_id, r.status, " | ".join(r.flags),
                                " | ".join(r.notes)) for r in results], db_url)


def refresh_grades(out: Path, db_url: str) -> Path:
    """Rewrite `grades.csv` of a graded run from the gradebook: written answers graded in formgrader since
    the run now count. Students, statuses, flags and notes are the run's."""
    rows = read_csv(out / "grades.csv")
    rows = rows[1:] if rows and rows[0]["student"] == MAX_ROW else rows  # a student may be named so too
    return _write_grades(out, [(r.get("id") or r["student"], r["student"], r.get("lms_id", ""), r["status"],
                                r["review"], r["notes"]) for r in rows], db_url, same_run=True)


def _write_grades(out: Path, students: list[GradesRow], db_url: str, same_run: bool = False) -> Path:
    tests, answers = graded_columns(), written_columns()
    cols = tests + answers
    written = {(s, g) for s, g, _ in answers}
    stems = list(dict.fromkeys(c[0] for c in tests))
    header = ["student", "lms_id", "id", "status"] + [f"{s}:{g}" for s, g, _ in cols] + [f"{s}:total" for s in stems]
    header += ["total", "max_total", "written_pending", "review", "notes"]
    maximum = sum(p for *_, p in cols)
    rows: list[list] = [[MAX_ROW, "", "", ""] + [p for _, _, p in cols]
                        + [sum(p for s2, _, p in cols if s2 == s) for s in stems]
                        + [maximum, maximum, sum(p for s, g, p in cols if (s, g) in written), "", ""]]
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    # nbgrader's ORM use makes SQLAlchemy 2 warn about autoflush on reads: harmless, and noise for the user
    with Gradebook(db_url) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore", SAWarning)
        graded = {s: scores_from_gradebook(gb, s) for s, _, _, status, *_ in students if status == "graded"}
    absent = sorted(s for s, scores in graded.items() if not scores)
    if same_run and absent:  # another run's gradebook: its scores must not replace this run's
        raise ValueError(f"the gradebook {db_url} holds no grades of {', '.join(absent[:3])}"
                         f"{' …' if len(absent) > 3 else ''}: it is not this run's (give the run's --course or --db)")
    for student, name, lms_id, status, review, notes in sorted(students, key=lambda r: (r[1].casefold(), r)):
        scores = graded.get(student, {})
        per = [scores.get((s, g), None if (s, g) in written else 0.0) for s, g, _ in cols]
        given = [v or 0.0 for v in per]
        pending = sum(p for (s, g, p), v in zip(cols, per) if (s, g) in written and v is None)
        totals = [sum(v for (s2, _, _), v in zip(cols, given) if s2 == s) for s in stems]
        rows.append([name, lms_id, student, status] + ["" if v is None else v for v in per] + totals
                    + [sum(given), maximum, pending if status == "graded" else 0.0, review, notes])
    return write_csv(out / "grades.csv", [header] + rows)  # no cell a spreadsheet would run (grading.spreadsheet)


def write_failure_summary(out: Path, grades_csv: Path) -> tuple[Path, Path]:
    """Which tests failed most often across the class: a table and a bar chart, most failed first.

    Only students whose notebook was graded count for that notebook's tests (a missing notebook is
    not evidence about a concept).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_csv(grades_csv)
    maxima, students = rows[0], rows[1:]
    columns = [f"{s}:{g}" for s, g, _ in graded_columns()]  # tests only: a written answer is not a test
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {"students": []}
    submitted = {s["student"]: set(s["notebooks"]) for s in report["students"]}
    table = []
    for col in columns:
        stem = col.split(":")[0]
        took = [r for r in students if r["status"] == "graded" and stem in submitted.get(r["id"], {stem})]
        failed = [r for r in took if float(r[col] or 0) < float(maxima[col])]
        table.append((col, float(maxima[col]), len(took), len(failed), len(failed) / len(took) if took else 0.0))
    table.sort(key=lambda t: (-t[4], t[0]))
    csv_path = write_csv(out / "failures.csv", [["test", "points", "students_graded", "students_failed", "fail_rate"]]
                         + [[c, p, n, k, round(r, 3)] for c, p, n, k, r in table])
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(4, len(table)) + 1.2))
    labels = [c for c, *_ in table][::-1]
    ax.barh(labels, [100 * r for *_, r in table][::-1], color="tab:red")
    ax.set_xlabel("students who lost points on this test (%)")
    ax.set_xlim(0, 100)
    ax.set_title(f"Most-failed tests across the class ({len(students)} students)")
    for i, (_, _, n, k, r) in enumerate(table[::-1]):
        ax.text(min(100 * r + 1, 92), i, f"{k}/{n}", va="center", fontsize=8)
    fig.tight_layout()
    png_path = out / "failures.png"
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return csv_path, png_path



def report(out: Path, root: Path, results: list[StudentResult], records: dict[str, dict], loose: list[str],
           db_url: str) -> None:
    """Merge each student's grading record into its result, then write the feedback pages,
    `report.json`, `grades.csv` and the failure summary into `out`."""
    for r in results:
        record = records.get(r.student)
        if record is None:
            continue
        r.seconds = record.get("seconds", 0.0)
        r.notes += record.get("notes", [])
        r.flags += record.get("flags", [])
        if record.get("ok"):
            r.status = "graded" if r.status != "no notebooks" else r.status
            copy_feedback(root, out, r.student, r.name)
        else:
            r.status = "failed"
            r.notes.append(record.get("error", "unknown error"))
        copy_records(root, out, r.student)
    (out / "report.json").write_text(json.dumps(
        {"students": [asdict(r) for r in results], "ignored_loose_files": loose}, indent=2))
    write_failure_summary(out, write_grades(out, results, db_url))
    class_report.write(out)


def copy_records(root: Path, out: Path, student: str) -> None:
    """The judge's per-case records, for the class report (they name hidden cases: instructors only)."""
    src, dst = root / "records" / student, out / "records" / student
    if dst.exists():
        shutil.rmtree(dst)
    if src.is_dir():
        shutil.copytree(src, dst)
