"""Report: each student's outcome in OUT, the feedback pages, and the views of the class's results
(grading/results.py): report.json, the grades table, the class's most-failed tests and the class report.

Every view is written from one `ClassResults` (the outcomes and the gradebook's points), none from another
view; runs no student code. The feedback pages show the gradebook's scores too: `refresh_feedback` makes a
student's pages again (nbgrader's generate_feedback of the autograded notebooks, `worker.feedback_pages`) when the
gradebook changed for them since their pages were made (a person's score or comment in formgrader), before
`python -m grading report` or `export` writes anything.
"""
from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from . import class_report
from .late import read_policy
from .notebooks import ASSIGNMENT
from .outcome import FOLDER, Status, StudentOutcome, joined, write_outcome
from .results import ClassResults, class_results, read_points, submissions, write_loose_files
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


# in OUT, beside feedback/ (which holds HTML pages only): {student: the digest of what their pages were made from}
MADE_FROM = "feedback_made_from.json"
COURSE_RECORD = "course.json"  # the course folder the run in OUT graded in: `report` and `export` read it there


def write_course_record(out: Path, root: Path, db_url: str) -> Path:
    """Record in OUT the course folder the run graded in and its gradebook's URL, without any password (PostgreSQL
    finds it again in ~/.pgpass or PGPASSWORD, as for any client)."""
    from sqlalchemy.engine import make_url

    path = out / COURSE_RECORD
    gradebook = make_url(db_url)._replace(password=None).render_as_string(hide_password=False)  # set() keeps it
    path.write_text(json.dumps({"course": str(root.resolve()), "gradebook": gradebook}) + "\n")
    return path


def recorded_course(out: Path) -> tuple[Path | None, str | None]:
    """The course folder the run in `out` graded in and its gradebook's URL, as autograde recorded them (None: no
    record, or unreadable)."""
    try:
        record = json.loads((out / COURSE_RECORD).read_text())
        return Path(record["course"]), record.get("gradebook") if isinstance(record.get("gradebook"), str) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, None


def made_from(submission, outcome: StudentOutcome, page: Sequence[str] = ()) -> str:
    """A digest of what a student's feedback pages show: the gradebook's scores (the judge's, a person's, extra
    credit), comments and late penalty of each of their notebooks (`submission`, their nbgrader SubmittedAssignment
    or None), the judge's records, the name (the title) and the page's lines about the submission (`page`: what
    was not handed in, how late)."""
    rows: list[list] = []
    for nb in submission.notebooks if submission is not None else []:
        rows.append([nb.name, nb.late_submission_penalty])
        rows += [[nb.name, g.name, g.auto_score, g.manual_score, g.extra_credit] for g in nb.grades]
        rows += [[nb.name, c.name, c.auto_comment, c.manual_comment] for c in nb.comments]
    content = {"gradebook": sorted(rows, key=repr), "judged": [asdict(r) for r in outcome.judged],
               "name": outcome.name, "page": list(page)}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def page_lines(results: ClassResults) -> dict[str, list[str]]:
    """{student: what their pages say of the submission besides the notebooks (what they did not hand in, how
    late)} for each graded student."""
    return {s.student: [*s.outcome.missing_work, s.late_line] for s in results.graded}


def feedback_made_from(db_url: str, outcomes: list[StudentOutcome],
                       pages: dict[str, list[str]] | None = None) -> dict[str, str]:
    """{student: `made_from`} of each of `outcomes` (`pages`: their pages' lines about the submission), read from
    the gradebook once."""
    if not outcomes:
        return {}
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    with Gradebook(db_url) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's own ORM use (grading.results.read_points)
        found = submissions(gb, [o.student for o in outcomes])
        return {o.student: made_from(found.get(o.student), o, (pages or {}).get(o.student, ())) for o in outcomes}


def read_made_from(out: Path) -> dict[str, str]:
    """{student: `made_from` of their pages in OUT}; an unreadable record is none (the pages are made again)."""
    try:
        made = json.loads((out / MADE_FROM).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in made.items() if isinstance(v, str)} if isinstance(made, dict) else {}


def write_made_from(out: Path, made: dict[str, str]) -> Path:
    path, tmp = out / MADE_FROM, out / f"{MADE_FROM}.tmp"
    out.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(dict(sorted(made.items())), indent=1))
    tmp.replace(path)
    return path


def same_gradebook(url: str, other: str) -> bool:
    """Whether two gradebook URLs are one gradebook (SQLite files compared by their resolved paths)."""
    sqlite = "sqlite:///"
    if url.startswith(sqlite) and other.startswith(sqlite):
        return Path(url[len(sqlite):]).resolve() == Path(other[len(sqlite):]).resolve()
    return url == other


def refresh_feedback(out: Path, root: Path | None, results: ClassResults,
                     db_url: str) -> tuple[list[str], list[str]]:
    """Make the feedback pages of each graded student again from the gradebook as it is now, where it changed for
    them since their pages in OUT were made (`made_from`, kept in OUT/feedback_made_from.json): nbgrader's
    generate_feedback of the course folder `root`'s autograded notebooks, through the worker's
    (`worker.feedback_pages`, within the host's bound; no student code runs), the judge's lines from the student's
    outcome; then the pages are copied into OUT (`copy_feedback`), where `export` takes them from. Returns (the
    students made again, notes for the instructor). No course folder (None: not held), or one whose gradebook is
    not `db_url`, is left alone (a note says so)."""
    graded = [s.outcome for s in results.graded]
    late_lines = {s.student: s.late_line for s in results.graded}
    digests, recorded = feedback_made_from(db_url, graded, page_lines(results)), read_made_from(out)
    stale = [o for o in graded if recorded.get(o.student) != digests[o.student]]
    if not stale:
        return [], []
    if root is None or not (root / "nbgrader_config.py").is_file():
        return [], [f"feedback pages not made again: {root} is not a course folder (give the run's --course); "
                    f"those of {len(stale)} student(s) in {out / 'feedback'} may show scores older than the "
                    "gradebook's"]
    from . import course, worker

    api = course.api(root.resolve())
    if not same_gradebook(api.coursedir.db_url, db_url):
        return [], [f"feedback pages not made again: the course folder {root} keeps its grades in "
                    f"{api.coursedir.db_url}, not {db_url} (give the run's --course); those of {len(stale)} "
                    f"student(s) in {out / 'feedback'} may show scores older than the gradebook's"]
    made, notes = [], []
    for o in stale:
        pages = root / "feedback" / o.student / ASSIGNMENT
        if not (root / "autograded" / o.student / ASSIGNMENT).is_dir():
            notes.append(f"{o.student}: feedback pages not made again: no autograded notebooks in {root}")
            continue
        for page in pages.glob("*.html") if pages.is_dir() else []:  # a failed attempt must not leave old scores
            page.unlink()
        recorded.pop(o.student, None)
        made_of = worker.PageOf(o.student, o.judged, o.missing_work, late_lines[o.student])
        notes += [f"{o.student}: {note}" for note in worker.feedback_pages(api, made_of)]
        copy_feedback(root, out, o.student, o.name)
        if any(pages.glob("*.html")):
            recorded[o.student] = digests[o.student]
            made.append(o.student)
        write_made_from(out, recorded)  # after each student: an interrupted refresh keeps what it made
    return made, notes


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
    id graded under (the gradebook's, the name of the student's feedback folder). A student not graded (no
    notebook handed in, or grading failed) has empty points, not 0, as the LMS export writes them. Points are
    written as floats (`0.0`, never `0`). `late`: how late and the rule (the max row: the rule), `late_penalty` the
    points it takes off the total now, `final` the grade the LMS exports write (grading/late.py). `not_handed_in`:
    each notebook (or notebook 06's trained model) the student did not hand in, with the points it costs."""
    cols, stems = results.columns, results.notebooks
    header = ["student", "lms_id", "id", "status"] + [c.name for c in cols] + [f"{s}:total" for s in stems]
    header += ["total", "max_total", "written_pending", "late", "late_penalty", "final", "review", "not_handed_in",
               "notes"]
    written_max = float(sum(c.max_points for c in cols if c.written))
    rows: list[list] = [[MAX_ROW, "", "", ""] + [c.max_points for c in cols] + [results.max_total(s) for s in stems]
                        + [results.max_total(), results.max_total(), written_max, results.late_policy.describe(), "",
                           results.max_total(), "", "", ""]]
    for s in sorted(results.students, key=lambda s: ((s.outcome.name or s.student).casefold(), s.student)):
        o = s.outcome
        points: list = [""] * (len(s.tasks) + len(stems) + 1)  # not graded is not 0: empty, as the export writes it
        if s.graded:
            points = (["" if t.points is None else float(t.points) for t in s.tasks]
                      + [float(s.total(nb)) for nb in stems] + [float(s.total())])
        rows.append([o.name or o.student, o.lms_id, o.student, o.status] + points
                    + [results.max_total(), float(s.pending) if s.graded else "", s.late_line,
                       float(s.late_penalty) if s.graded else "", float(s.final()) if s.graded else "",
                       fitted(o.flags, o.student),
                       fitted(o.missing_work, o.student), fitted(o.notes, o.student)])
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
    from matplotlib.figure import Figure  # not pyplot: no backend chosen, none changed, safe in a thread

    table = failure_table(results)
    csv_path = write_csv(out / "failures.csv", [["test", "points", "students_graded", "students_failed", "fail_rate"]]
                         + [[c, p, n, k, round(r, 3)] for c, p, n, k, r in table])
    fig = Figure(figsize=(9, 0.35 * max(4, len(table)) + 1.2))
    ax = fig.subplots()
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
    graded_now = [o for o in outcomes if o.status == Status.GRADED]
    class_ = class_results(outcomes, read_points(db_url, [o.student for o in graded_now]), loose, read_policy(root))
    # the pages were just made from the gradebook as it is
    digests = feedback_made_from(db_url, graded_now, page_lines(class_))
    for o in outcomes:
        if o.status == Status.GRADED:
            copy_feedback(root, out, o.student, o.name)
        write_outcome(folder, o)
    write_made_from(out, {o.student: digests[o.student] for o in graded_now
                          if (out / "feedback" / o.student).is_dir()})
    write_outputs(out, class_)
    write_course_record(out, root, db_url)
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
