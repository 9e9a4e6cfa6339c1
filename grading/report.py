"""Report: each student's outcome in OUT, and its views: report.json, the grades table, the class's most-failed
tests, the class report and the feedback pages of a run.

Reads only what grading recorded (the students' outcomes, the gradebook's scores); runs nothing.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import warnings
from pathlib import Path

from . import class_report
from .notebooks import ASSIGNMENT, graded_columns, written_columns
from .outcome import FOLDER, StudentOutcome, joined, read_outcomes, write_outcome
from .spreadsheet import MAX_TEXT, read_csv, write_csv

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


def write_grades(out: Path, results: list[StudentOutcome], db_url: str) -> Path:
    """`grades.csv`: one row per student with every test cell's and written question's score, per-notebook
    and overall totals, and the points of written questions still awaiting a person's grade. `student` is
    the name as the export gave it, `lms_id` the LMS's participant id (if the export gives one), `id` the
    id graded under (the gradebook's, the name of the student's feedback folder)."""
    return _write_grades(out, _rows(results), db_url)


def refresh_grades(out: Path, db_url: str) -> Path:
    """Rewrite `grades.csv` of a graded run from the gradebook: written answers graded in formgrader since
    the run now count. Students, statuses, flags and notes are the run's (its outcomes)."""
    return _write_grades(out, _rows(list(read_outcomes(out / FOLDER).values())), db_url, same_run=True)


def _rows(outcomes: list[StudentOutcome]) -> list[GradesRow]:
    return [(o.student, o.name or o.student, o.lms_id, o.status, fitted(o.flags, o.student), fitted(o.notes, o.student))
            for o in outcomes]


def fitted(items: list[str], student: str) -> str:
    """A student's notes (or review flags) as one cell of the grades table: joined by ` | `, and if longer than a
    spreadsheet's cell holds (MAX_TEXT), those that fit and where all of them are: the student's outcome file."""
    text = " | ".join(items)
    if len(text) <= MAX_TEXT:
        return text
    where = f"{FOLDER}/{student}.json"
    length = 0  # of the items kept, joined
    for kept, item in enumerate(items):
        tail = f"… {len(items) - kept} more, all in {where}"
        if length + len(" | ") + len(item) + len(" | ") + len(tail) > MAX_TEXT:
            return " | ".join(items[:kept] + [tail])
        length += len(" | ") * bool(kept) + len(item)
    return text  # not reached: the whole text is longer than MAX_TEXT


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


def write_failure_summary(out: Path, grades_csv: Path, outcomes: list[StudentOutcome]) -> tuple[Path, Path]:
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
    submitted = {o.student: set(o.notebooks) for o in outcomes}
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


def report(out: Path, root: Path, results: list[StudentOutcome], graded: dict[str, StudentOutcome],
           loose: list[str], db_url: str) -> list[StudentOutcome]:
    """Join each student's outcome from intake (`results`) with the one from grading (`graded`), write it into
    `out/outcomes/`, then its views: the feedback pages, `report.json`, `grades.csv`, the failure summary and
    the class report. Returns the joined outcomes."""
    outcomes = [joined(r, graded.get(r.student)) for r in results]
    folder, students = out / FOLDER, {o.student for o in outcomes}
    for stale in folder.glob("*.json") if folder.is_dir() else []:  # another run's students: not this run's
        if stale.stem not in students:
            stale.unlink()
    for o in outcomes:
        if o.status == "graded":
            copy_feedback(root, out, o.student, o.name)
        write_outcome(folder, o)
    (out / "report.json").write_text(json.dumps(
        {"students": [o.summary() for o in outcomes], "ignored_loose_files": loose}, indent=2))
    write_failure_summary(out, write_grades(out, outcomes, db_url), outcomes)
    class_report.write(out)
    return outcomes
