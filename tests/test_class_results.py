"""Every output of a run is written from one value, the class's results (grading/results.py): the students'
outcomes and the gradebook's points. A score a person gives in the gradebook (formgrader's manual score) is
then the score of grades.csv, report.json's run, the failure summary and the class report alike.

Fast: no grading. Two students' outcomes are made by hand (the judge's records of notebook 01) and the
gradebook is a small SQLite one made with nbgrader's API, holding the judge's points as SaveJudgedScores
writes them.
"""
from __future__ import annotations

import json
import shutil

import pytest

from grading import notebooks as nbs
from grading.judge import CaseResult, CellResult, NotebookRecord
from grading.outcome import StudentOutcome
from grading.results import class_results
from grading.spreadsheet import read_csv

NB = "01_scaled_dot_product_attention"
TASK = "test_attention_loop"  # bob's raises; a person gives him its points by hand
RAISED = "raises ValueError"
LOOSE = ["notes.txt"]


def _cell(task: str, points: float, passed: bool) -> CellResult:
    case = CaseResult(f"{task}-hidden", "hidden case 1", False, passed, "" if passed else "`f`: raises ValueError: todo",
                      "" if passed else RAISED)
    return CellResult(task, points if passed else 0.0, points, [case])


def _outcome(student: str, failing: str | None = None) -> StudentOutcome:
    cells = [_cell(task, points, task != failing) for stem, task, points in nbs.graded_columns() if stem == NB]
    record = NotebookRecord(student, NB, "finished", "", True, 1.0, [], cells)
    return StudentOutcome(student, notebooks={NB: f"{NB}.ipynb"}, status="graded", name=student.title(),
                          judged=[record])


def _outcomes() -> list[StudentOutcome]:  # conftest's blank_gradebook scores these (and NB)
    return [_outcome("alice"), _outcome("bob", failing=TASK)]


@pytest.fixture
def run(blank_gradebook, tmp_path) -> dict:
    """A graded run's OUT, written by autograde's report step, and its gradebook (a copy of its own)."""
    from grading.report import report

    shutil.copy(blank_gradebook, tmp_path / "gradebook.db")
    db_url, out = f"sqlite:///{tmp_path / 'gradebook.db'}", tmp_path / "out"
    report(out, tmp_path / "course", _outcomes(), {}, LOOSE, db_url)
    return {"out": out, "db_url": db_url, "class_report": json.loads((out / "class_report.json").read_text())}


def _give_by_hand(db_url: str, student: str, task: str, score: float) -> None:
    """What formgrader does when a person types a score: the grade's manual score."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        grade = gb.find_grade(task, NB, nbs.ASSIGNMENT, student)
        assert (grade.auto_score, grade.manual_score) == (0.0, None)
        grade.manual_score = score
        gb.db.commit()


def _report_command(run: dict) -> None:
    from grading.__main__ import main

    assert main(["report", str(run["out"]), "--db", run["db_url"]]) == 0


def test_a_score_given_by_hand_is_every_outputs_score(run):
    """bob's attention loop raised (0 of 2); a person gives him 2 in the gradebook and runs `report`: grades.csv,
    the class report's task table and totals, and the failure summary all say 2, and the judge's diagnosis stays,
    marked as overridden by hand."""
    out = run["out"]
    _give_by_hand(run["db_url"], "bob", TASK, 2.0)
    _report_command(run)

    maxima, *rows = read_csv(out / "grades.csv")
    by_id = {r["id"]: r for r in rows}
    assert float(by_id["bob"][f"{NB}:{TASK}"]) == 2.0
    tests = sum(points for stem, _, points in nbs.graded_columns() if stem == NB)  # no written answer graded yet
    assert float(by_id["bob"][f"{NB}:total"]) == float(by_id["bob"]["total"]) == float(by_id["alice"]["total"]) == tests

    report = json.loads((out / "class_report.json").read_text())
    for t in (t for t in report["tasks"] if t["notebook"] == NB):  # every task agrees with grades.csv
        points = [float(r[f"{NB}:{t['task']}"]) for r in rows]
        top = float(maxima[f"{NB}:{t['task']}"])
        assert (t["students"], t["max_points"]) == (2, top), t["task"]
        assert t["full_marks"] == sum(p >= top for p in points) == 2, t["task"]
        assert t["mean_credit"] == pytest.approx(sum(p / top for p in points) / 2) == 1.0, t["task"]
        assert t["overridden"] == (t["task"] == TASK), t["task"]
    assert report["totals"] == {r["student"]: float(r["total"]) for r in rows}
    assert sorted(report["distributions"][NB]["scores"]) == sorted(float(r[f"{NB}:total"]) for r in rows)
    raised = next(d for d in report["no_diagnosis"] if (d["task"], d["diagnosis"]) == (TASK, RAISED))
    assert raised["students"] == raised["overridden"] == ["Bob"]  # what went wrong is still the judge's finding
    assert report["run"] != run["class_report"]["run"], "the scores changed, and the run id did not"

    failures = {r["test"]: r for r in read_csv(out / "failures.csv")}
    assert (failures[f"{NB}:{TASK}"]["students_graded"], failures[f"{NB}:{TASK}"]["students_failed"]) == ("2", "0")
    assert all(r["students_failed"] == "0" for r in failures.values())
    summary = json.loads((out / "report.json").read_text())
    assert [s["student"] for s in summary["students"]] == ["alice", "bob"]
    assert summary["ignored_loose_files"] == LOOSE


def test_report_builds_the_runs_outputs_again_from_its_records(run):
    """`report` writes every output from the outcomes and the gradebook, none from another output: with the
    tables gone it writes them again as the run wrote them, and the class report is of the same run."""
    out = run["out"]
    written = {name: (out / name).read_bytes() for name in ("grades.csv", "failures.csv", "report.json")}
    for name in (*written, "class_report.json", "class_report.html"):
        (out / name).unlink()
    _report_command(run)
    assert {name: (out / name).read_bytes() for name in written} == written
    again = json.loads((out / "class_report.json").read_text())
    assert again["run"] == run["class_report"]["run"]
    assert {k: v for k, v in again.items() if k not in ("generated", "change")} == {
        k: v for k, v in run["class_report"].items() if k not in ("generated", "change")}


def test_the_gradebooks_points_are_the_results_and_the_judges_records_say_why():
    """One value per student, notebook and task: the gradebook's points (a person's over the judge's), the
    maximum, the status and the judge's lines; written answers nobody graded yet are awaited."""
    table = {"alice": {}, "bob": {(NB, TASK): 1.5}}
    results = class_results(_outcomes()[::-1], table)  # the gradebook has no score of alice's: she scored nothing
    alice, bob = results.students
    assert (alice.student, bob.student) == ("alice", "bob")
    loop = bob.task(NB, TASK)
    assert (loop.points, loop.column.max_points, loop.by_hand) == (1.5, 2.0, True)
    assert loop.messages == ["\u2717 hidden case 1: `f`: raises ValueError: todo"]
    assert bob.total(NB) == bob.total() == 1.5 and alice.total() == 0.0
    written = sum(points for stem, _, points in nbs.written_columns())
    assert bob.pending == alice.pending == written
    assert [bob.took(stem) for stem in results.notebooks] == [stem == NB for stem in results.notebooks]
    assert class_results(_outcomes(), table).run == results.run != class_results(_outcomes(), {}).run


def test_the_gradebook_is_read_in_as_few_queries_for_eight_students_as_for_two(tmp_path):
    """The report reads the points and what each student's feedback was made from with a few queries for the whole
    class (nbgrader's lazy loading asked about 70 a student: minutes of a class of hundreds on PostgreSQL), and reads
    what nbgrader's own `find_grade` reads."""
    from nbgrader.api import Gradebook
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from support.gradebooks import judged_gradebook

    from grading.report import feedback_made_from
    from grading.results import read_points

    queries = []
    count = lambda *args: queries.append(1)  # noqa: E731
    asked = {}
    event.listen(Engine, "before_cursor_execute", count)
    try:
        for n in (2, 8):
            outcomes = [_outcome(f"s{i:02d}", failing=TASK if i % 2 else None) for i in range(n)]
            db_url = f"sqlite:///{judged_gradebook(tmp_path / f'{n}.db', outcomes, NB)}"
            queries.clear()
            points = read_points(db_url, [o.student for o in outcomes])
            digests = feedback_made_from(db_url, outcomes)
            asked[n] = len(queries)
            assert len(set(digests.values())) == n, "each student's feedback digest is their own"
            with Gradebook(db_url) as gb:
                for o in outcomes:
                    for stem, task, _ in nbs.graded_columns():  # not scored: None (no notebook but NB is)
                        grade = gb.find_grade(task, stem, nbs.ASSIGNMENT, o.student)
                        scored = grade.auto_score is not None or grade.manual_score is not None
                        assert points[o.student][(stem, task)] == (grade.score if scored else None)
                        assert scored == (stem == NB)
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    assert asked[8] == asked[2] < 60, f"queries for 2 and 8 students: {asked}"


def test_out_records_its_course_folder_and_gradebook_but_never_a_password(tmp_path):
    """`report` and `export` find the run's course folder and gradebook in OUT; a PostgreSQL URL is kept without its
    password (the client finds that in ~/.pgpass or PGPASSWORD), and a damaged record is no record."""
    from grading.report import COURSE_RECORD, recorded_course, write_course_record

    url = "postgresql+psycopg2://grader:s3cret-pw@db.example:5432/attention"
    write_course_record(tmp_path, tmp_path / "course", url)
    assert "s3cret-pw" not in (tmp_path / COURSE_RECORD).read_text()
    assert recorded_course(tmp_path) == ((tmp_path / "course").resolve(),
                                         "postgresql+psycopg2://grader@db.example:5432/attention")
    (tmp_path / COURSE_RECORD).write_text("[1, 2]")
    assert recorded_course(tmp_path) == (None, None)
