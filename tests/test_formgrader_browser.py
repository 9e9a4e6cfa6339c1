"""Written answers are graded in nbgrader's formgrader, in a real browser, as the README tells a TA to:
a course graded by the kit (notebook 01 of two students), `jupyter server` started in the course folder,
`/formgrader` opened in Debian's Chromium, Manual Grading → attention → notebook 01 → alice, a score
and a comment typed into her first written answer; then `python -m grading report OUT --course COURSE`
puts the score into grades.csv and the class report, and moves nothing else. The screenshot of the
saved score is left in build/browser/ for CI to keep.
"""
from __future__ import annotations

import json
import shutil
import urllib.request
from html import escape
from pathlib import Path

import pytest
from conftest import ROOT, filled_submission, jupyter_server, private_jupyter_env, write_nb

from grading import notebooks as nbs
from grading.notebooks import ASSIGNMENT

NB01 = "01_scaled_dot_product_attention"
QUESTION = "q_scaling"  # notebook 01's first written answer, 2 points
COLUMN = f"{NB01}:{QUESTION}"
SCORE, COMMENT = 1.5, "Right idea; say why the variance grows with d_k."
SCREENSHOT = ROOT / "build" / "browser" / "formgrader_score.png"


@pytest.fixture(scope="module")
def graded_run(tmp_path_factory):
    """(course folder, OUT) of a run that graded notebook 01 of alice (the solution) and bob (the release)."""
    from grading.autograde import autograde

    subs = tmp_path_factory.mktemp("submissions")
    write_nb(filled_submission(NB01), subs / "alice" / f"{NB01}.ipynb")
    (subs / "bob").mkdir()
    shutil.copy(nbs.RELEASE / f"{NB01}.ipynb", subs / "bob" / f"{NB01}.ipynb")
    course, out = tmp_path_factory.mktemp("course"), tmp_path_factory.mktemp("results")
    results = autograde(subs, out, course_dir=course)
    assert [r.status for r in results] == ["graded", "graded"], f"not graded: {[(r.student, r.status) for r in results]}"
    return course, out


def _lists_the_assignment(base: str, token: str) -> None:
    with urllib.request.urlopen(f"{base}/formgrader/api/assignments?token={token}", timeout=5) as r:
        assert ASSIGNMENT in {a["name"] for a in json.load(r)}, "formgrader does not list the assignment"


@pytest.fixture
def formgrader(graded_run, tmp_path):
    """(base URL, token) of `jupyter server` started in the course folder, as the README says (the
    formgrader extension is enabled in the venv's own config)."""
    course, _ = graded_run
    with jupyter_server("jupyter server", course, private_jupyter_env(tmp_path / "jupyter"), tmp_path / "server.log",
                        ready=_lists_the_assignment) as server:
        yield server


def _grade_in_browser(page, base: str, token: str) -> None:
    """What a TA does: open /formgrader, click through to alice's notebook 01, type the score and the
    comment (each is saved when the field is left), and see the server accept both."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    # nothing outside the server: formgrader loads MathJax from a CDN, and the page must not behave one way
    # with a network and another without (without it, math stays TeX and formgrader's keyboard shortcuts
    # are off, but scores and comments save as below)
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort())
    page.goto(f"{base}/formgrader?token={token}")  # logs in: later pages and API calls go by the cookie
    page.get_by_role("link", name="Manual Grading").click()
    page.get_by_role("link", name=ASSIGNMENT, exact=True).click()
    page.get_by_role("link", name=NB01, exact=True).click()
    page.get_by_role("link", name="Submission #1").wait_for()  # the table is filled in after the page loads
    page.get_by_role("button", name="Show All Names").click()
    page.get_by_role("link", name="alice", exact=True).click()
    # a field saves only once the page has fetched the grade or comment it edits; nothing visible says so
    page.wait_for_function("window.formgrader?.grades?.loaded && formgrader.comments?.loaded")

    for field, value, api in ((page.locator(f"input.score#{QUESTION}"), str(SCORE), "grade"),
                              (page.locator(f"textarea#{QUESTION}-comment"), COMMENT, "comment")):
        try:
            with page.expect_response(lambda r, api=api: f"/formgrader/api/{api}/" in r.url
                                      and r.request.method == "PUT") as saved:
                field.fill(value)
                field.press("Tab")
        except PlaywrightTimeout:
            pytest.fail(f"formgrader did not save the {api} when the field was left (no PUT within 30 s)")
        assert saved.value.ok, f"formgrader refused the {api}: HTTP {saved.value.status}"
    page.locator(f"input.score#{QUESTION}").scroll_into_view_if_needed()
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))


def _written_status(out: Path) -> dict:
    report = json.loads((out / "class_report.json").read_text())
    return next(q for q in report["written_questions"] if (q["notebook"], q["question"]) == (NB01, QUESTION))


def test_score_given_in_formgrader_reaches_grades_and_class_report(chromium, graded_run, formgrader):
    from nbgrader.api import Gradebook

    from grading.__main__ import main
    from grading.spreadsheet import read_csv

    course, out = graded_run
    before = {r["student"]: r for r in read_csv(out / "grades.csv")}
    status_before = _written_status(out)
    assert before["alice"][COLUMN] == "" and status_before["awaiting"] == 1, "alice's answer was graded before a TA"

    SCREENSHOT.unlink(missing_ok=True)  # no stale picture if this run fails before taking one
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    _grade_in_browser(page, *formgrader)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assert gb.find_comment(QUESTION, NB01, ASSIGNMENT, "alice").manual_comment == COMMENT, "comment not saved"

    assert main(["report", str(out), "--course", str(course)]) == 0
    after = {r["student"]: r for r in read_csv(out / "grades.csv")}
    alice = after["alice"]
    assert float(alice[COLUMN] or "nan") == SCORE, f"grades.csv has {alice[COLUMN]!r} for the score given"
    for total in (f"{NB01}:total", "total", "final"):  # no late penalty: the final grade is the total
        assert float(alice[total]) == float(before["alice"][total]) + SCORE, f"{total} did not take the score in"
    assert float(alice["written_pending"]) == float(before["alice"]["written_pending"]) - 2, "written_pending did not drop by the 2 points graded"
    moved = {c for c in alice if alice[c] != before["alice"][c]} - {COLUMN, f"{NB01}:total", "total", "final",
                                                                     "written_pending"}
    assert not moved, f"columns changed that no one graded: {sorted(moved)}"
    assert after["bob"] == before["bob"], "bob's row changed, only alice was graded"

    status = _written_status(out)
    graded = [float(r[COLUMN]) for r in after.values() if r["student"] != "(max points)" and r[COLUMN] != ""]
    assert (status["graded"], status["awaiting"]) == (status_before["graded"] + 1, 0), status
    assert f"mean {sum(graded) / len(graded):.2f} of 2" in status["status"], status
    assert escape(status["status"]) in (out / "class_report.html").read_text(), "the class report page lacks it"
