"""A score a person gives in formgrader after the run (a written answer graded, an automatic score overridden)
reaches the student's feedback page as it reaches grades.csv and the LMS's files: `python -m grading report` and
`export` make the pages again from the gradebook (nbgrader's generate_feedback of the autograded notebooks, no
student code run) where it changed since they were made, before writing anything.

One real grading run (one student from a Moodle download, notebook 01, the solution; about a minute), then
scores given by hand with nbgrader's gradebook API, as formgrader gives them.
"""
from __future__ import annotations

import html
import re
import zipfile

import nbformat
import pytest
from conftest import filled_submission

from grading import notebooks as nbs
from grading.spreadsheet import read_csv

NB = "01_scaled_dot_product_attention"
NAME, LMS_ID = "John Smith", "12345"
TEST_CELL, WRITTEN = "test_sdpa", "q_scaling"  # 3 points, all the judge's; 2 points, for a person to give


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    from grading.autograde import autograde
    from grading.settings import Settings

    tmp = tmp_path_factory.mktemp("override")
    download = tmp / "moodle.zip"
    with zipfile.ZipFile(download, "w") as zf:
        zf.writestr(f"{NAME}_{LMS_ID}_assignsubmission_file_/{NB}.ipynb", nbformat.writes(filled_submission(NB)))
    out, course = tmp / "out", tmp / "course"
    (result,) = autograde(download, out, course_dir=course, settings=Settings(workers=1))
    assert result.status == "graded", result.notes
    return {"out": out, "course": course, "student": result.student, "db_url": f"sqlite:///{course / 'gradebook.db'}"}


def _give(db_url: str, student: str, task: str, score: float) -> None:
    """What formgrader does when a person types a score: the grade's manual score."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        gb.find_grade(task, NB, nbs.ASSIGNMENT, student).manual_score = score
        gb.db.commit()


def _score(page: str, task: str) -> str:
    """The score the page's table of contents gives a cell: '<points> / <max>'."""
    found = re.search(rf'href="#{task}">[^<]*</a> \(Score: ([^)]*)\)', page)
    assert found, f"{task} not in the page's table of contents"
    return found.group(1)


def _total(page: str) -> str:
    found = re.search(rf"{NB} \(Score: ([^)]*)\)", page)
    assert found, "no notebook score on the page"
    return found.group(1)


def _run(capsys, *argv: str) -> str:
    from grading.__main__ import main

    assert main(list(argv)) == 0, capsys.readouterr()
    return capsys.readouterr().out


def _notebook_points() -> float:
    """The notebook's points: its test cells' and its written questions'."""
    return sum(p for stem, _, p in nbs.graded_columns() + nbs.written_columns() if stem == NB)


def _assert_judges_lines_only(page: str) -> None:
    from starter.compare import case_names

    assert "\u2713 " in page and "passed" in page, "the judge's lines are not on the page"
    shown = [n for n in case_names(nbs.HIDDEN_REFERENCES) if n in page]
    assert shown == [], f"hidden case names on the page: {shown[:3]}"


def test_scores_given_in_formgrader_reach_the_feedback_page_and_the_lms_zip(graded, capsys):
    out, course, student, db_url = graded["out"], str(graded["course"]), graded["student"], graded["db_url"]
    page_file = out / "feedback" / student / f"{NB}.html"
    before = page_file.read_text(encoding="utf-8")
    assert (_score(before, TEST_CELL), _score(before, WRITTEN), _total(before)) == ("3.0 / 3.0", "not graded yet / 2.0",
                                                                                     f"11.0 / {_notebook_points():.1f}")

    _give(db_url, student, TEST_CELL, 1.5)  # an override of the judge's points
    _give(db_url, student, WRITTEN, 2.0)  # a written answer graded
    said = _run(capsys, "report", str(out), "--course", course)
    assert "feedback pages made again with the gradebook's scores: 1 student(s)" in said, said
    page = page_file.read_text(encoding="utf-8")
    assert (_score(page, TEST_CELL), _score(page, WRITTEN), _total(page)) == ("1.5 / 3.0", "2.0 / 2.0",
                                                                               f"11.5 / {_notebook_points():.1f}")
    assert f"<title>{html.escape(NAME, quote=False)}: " in page, "the page's title lost the student's name"
    _assert_judges_lines_only(page)
    row = {r["id"]: r for r in read_csv(out / "grades.csv")[1:]}[student]
    assert float(row["total"]) == 11.5, row  # the page and the grades table agree
    assert {p.suffix for p in (out / "feedback").rglob("*") if p.is_file()} == {".html"}, "only pages in feedback/"
    course_page = graded["course"] / "feedback" / student / nbs.ASSIGNMENT / f"{NB}.html"
    assert _score(course_page.read_text(encoding="utf-8"), TEST_CELL) == "1.5 / 3.0", "the course folder's page"

    # nothing changed since: the export zips the report's pages without making them again
    said = _run(capsys, "export", str(out), "--to", "moodle", "--course", course)
    assert "made again" not in said, said
    with zipfile.ZipFile(out / "moodle" / "feedback_files.zip") as zf:
        member = f"{NAME}_{LMS_ID}_assignsubmission_file_/{NB}.html"
        assert zf.read(member).decode("utf-8") == page
    worksheet = read_csv(out / "moodle" / "grading_worksheet.csv")
    assert float(worksheet[0]["Grade"]) == 11.5, worksheet

    # a score given after the report: the export alone makes the page again before zipping it; OUT remembers the
    # course folder it was graded in, so the export needs no --course
    _give(db_url, student, TEST_CELL, 2.5)
    said = _run(capsys, "export", str(out), "--to", "moodle")
    assert f"course folder {graded['course'].resolve()} (where the run in {out} graded)" in said, said
    assert "feedback pages made again with the gradebook's scores: 1 student(s)" in said, said
    with zipfile.ZipFile(out / "moodle" / "feedback_files.zip") as zf:
        zipped = zf.read(f"{NAME}_{LMS_ID}_assignsubmission_file_/{NB}.html").decode("utf-8")
    assert (_score(zipped, TEST_CELL), _total(zipped)) == ("2.5 / 3.0", f"12.5 / {_notebook_points():.1f}")
    assert zipped == page_file.read_text(encoding="utf-8")
    _assert_judges_lines_only(zipped)
    assert float(read_csv(out / "moodle" / "grading_worksheet.csv")[0]["Grade"]) == 12.5


def test_a_late_policy_given_after_the_run_reaches_the_page_and_the_grade(graded, capsys, tmp_path):
    """Due dates and submission times given to `report` after grading: the page is made again with how late and the
    rule (a change of the policy is a change of the page), and the export writes the total less the penalty."""
    out = graded["out"]
    times = tmp_path / "submitted.csv"
    times.write_text(f"student,submitted\n{LMS_ID},2026-12-02 08:00\n", encoding="utf-8")
    said = _run(capsys, "report", str(out), "--due", "2026-12-01 23:59", "--late-penalty", "zero",
                "--submitted", str(times))
    assert "feedback pages made again with the gradebook's scores: 1 student(s)" in said, said
    page = (out / "feedback" / graded["student"] / f"{NB}.html").read_text(encoding="utf-8")
    assert "Late work:" in page and "handed in 2026-12-02 08:00, 1 day late (due 2026-12-01 23:59); late work gets 0" in page
    row = {r["id"]: r for r in read_csv(out / "grades.csv")[1:]}[graded["student"]]
    assert float(row["final"]) == 0.0 < float(row["total"]) == float(row["late_penalty"]), row
    _run(capsys, "export", str(out), "--to", "moodle")
    assert float(read_csv(out / "moodle" / "grading_worksheet.csv")[0]["Grade"]) == 0.0
    _run(capsys, "report", str(out), "--late-penalty", "none")  # the rule taken back: the page says so again
    page = (out / "feedback" / graded["student"] / f"{NB}.html").read_text(encoding="utf-8")
    assert "1 day late (due 2026-12-01 23:59); no late penalty" in page
