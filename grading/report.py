"""Report: each student's outcome in OUT, the feedback pages, and the views of the class's results
(grading/results.py): report.json, the grades table, the class's most-failed tests and the class report.

Every view is written from one `ClassResults` (the outcomes and the gradebook's points), none from another
view; runs nothing.
"""
from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

from . import class_report
from .notebooks import ASSIGNMENT
from .outcome import FOLDER, Status, StudentOutcome, joined, write_outcome
from .results import ClassResults, class_results, read_points, write_loose_files
from .spreadsheet import MAX_TEXT, write_csv

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


MAX_ROW = "(max points)"  # the first row's student: the points of each column


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


def write_grades(out: Path, results: ClassResults) -> Path:
    """`grades.csv`: one row per student with every test cell's and written question's score, per-notebook
    and overall totals, and the points of written questions still awaiting a person's grade. `student` is
    the name as the export gave it, `lms_id` the LMS's participant id (if the export gives one), `id` the
    id graded under (the gradebook's, the name of the student's feedback folder)."""
    cols, stems = results.columns, results.notebooks
    header = ["student", "lms_id", "id", "status"] + [c.name for c in cols] + [f"{s}:total" for s in stems]
    header += ["total", "max_total", "written_pending", "review", "notes"]
    written_max = sum(c.max_points for c in cols if c.written)
    rows: list[list] = [[MAX_ROW, "", "", ""] + [c.max_points for c in cols] + [results.max_total(s) for s in stems]
                        + [results.max_total(), results.max_total(), written_max, "", ""]]
    for s in sorted(results.students, key=lambda s: ((s.outcome.name or s.student).casefold(), s.student)):
        o = s.outcome
        rows.append([o.name or o.student, o.lms_id, o.student, o.status]
                    + ["" if t.points is None else t.points for t in s.tasks] + [s.total(nb) for nb in stems]
                    + [s.total(), results.max_total(), s.pending, fitted(o.flags, o.student),
                       fitted(o.notes, o.student)])
    return write_csv(out / "grades.csv", [header] + rows)  # no cell a spreadsheet would run (grading.spreadsheet)


def failure_table(results: ClassResults) -> list[tuple[str, float, int, int, float]]:
    """(test, points, students graded, students who lost points, fail rate) of every test cell, most failed
    first. Only students whose notebook was graded count for that notebook's tests."""
    table = []
    for col in (c for c in results.columns if not c.written):  # a written answer is not a test
        took = [s.task(col.notebook, col.task) for s in results.graded if s.took(col.notebook)]
        failed = [t for t in took if (t.points or 0.0) < col.max_points]
        table.append((col.name, col.max_points, len(took), len(failed), len(failed) / len(took) if took else 0.0))
    return sorted(table, key=lambda t: (-t[4], t[0]))


def write_failure_summary(out: Path, results: ClassResults) -> tuple[Path, Path]:
    """Which tests failed most often across the class: `failures.csv` and a bar chart, most failed first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = failure_table(results)
    csv_path = write_csv(out / "failures.csv", [["test", "points", "students_graded", "students_failed", "fail_rate"]]
                         + [[c, p, n, k, round(r, 3)] for c, p, n, k, r in table])
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(4, len(table)) + 1.2))
    labels = [c for c, *_ in table][::-1]
    ax.barh(labels, [100 * r for *_, r in table][::-1], color="tab:red")
    ax.set_xlabel("students who lost points on this test (%)")
    ax.set_xlim(0, 100)
    ax.set_title(f"Most-failed tests across the class ({len(results.students)} students)")
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
    `out/outcomes/` with the feedback pages, then the class's results (the outcomes and the gradebook's points)
    and every view of them (`write_outputs`). Returns the joined outcomes."""
    outcomes = [joined(r, graded.get(r.student)) for r in results]
    folder, students = out / FOLDER, {o.student for o in outcomes}
    for stale in folder.glob("*.json") if folder.is_dir() else []:  # another run's students: not this run's
        if stale.stem not in students:
            stale.unlink()
    for o in outcomes:
        if o.status == Status.GRADED:
            copy_feedback(root, out, o.student, o.name)
        write_outcome(folder, o)
    points = read_points(db_url, [o.student for o in outcomes if o.status == Status.GRADED])
    write_outputs(out, class_results(outcomes, points, loose))
    return outcomes


def write_report_json(out: Path, results: ClassResults) -> Path:
    """`report.json`: each outcome without the judge's records, and the files outside any student's folder."""
    path = out / "report.json"
    path.write_text(json.dumps({"students": [s.outcome.summary() for s in results.students],
                                "ignored_loose_files": list(results.loose)}, indent=2))
    return path


def write_outputs(out: Path, results: ClassResults, anonymise: bool = False) -> list[Path]:
    """Every view of the class's results, each written from `results` alone: report.json, grades.csv, the
    failure summary and the class report (and the record of the loose files, for a later `report`)."""
    out.mkdir(parents=True, exist_ok=True)
    return [write_report_json(out, results), write_loose_files(out, results.loose), write_grades(out, results),
            *write_failure_summary(out, results), *class_report.write(out, results, anonymise)]
