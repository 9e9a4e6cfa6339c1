"""The class report counts what was planted: a class of 30 graded for real, each student with a known
bug (or none), an empty submission, a time-out; then a re-submission round.

Notebook 01 only, to keep the run short: the other notebooks are "missing" for everyone, which the
report must say too. The report's counts are compared with the bugs planted, not with its own output.
"""
from __future__ import annotations

import csv
import json
import shutil

import pytest
from conftest import ROOT, filled_submission, solution_sources, write_nb

from grading import class_report
from grading import notebooks as nbs
from grading.autograde import autograde
from grading.results import read_class_results
from grading.settings import Limits, Settings

# the module grades its class once, in the set-up of its first test: 49 s alone on 2 cores
pytestmark = pytest.mark.budget(240, reason="the class, graded once for the module")
NB = "01_scaled_dot_product_attention"
SOURCES = solution_sources(NB)
SDPA, CAUSAL = SOURCES["scaled_dot_product_attention"], SOURCES["causal_mask"]
SCALE = " / math.sqrt(q.shape[-1])"
MASK_BEFORE = '    if mask is not None:\n        scores = scores.masked_fill(~mask, float("-inf"))\n    weights = torch.softmax(scores, dim=-1)\n'
assert SCALE in SDPA and MASK_BEFORE in SDPA and ".tril()" in CAUSAL

# name: (answer cells replaced, how many students, the (task, diagnosis) it must produce)
BUGS = {
    "no_diagonal": ({"causal_mask": CAUSAL.replace(".tril()", ".tril(-1)")}, 5,
                    ("test_causal_mask", "known bug: no_diagonal")),
    "upper": ({"causal_mask": CAUSAL.replace(".tril()", ".triu(1)")}, 3, ("test_causal_mask", "known bug: upper")),
    "no_scale": ({"scaled_dot_product_attention": SDPA.replace(SCALE, "")}, 4, ("test_sdpa", "known bug: no_scale")),
    "mask_after": ({"scaled_dot_product_attention": SDPA.replace(MASK_BEFORE, (
        "    weights = torch.softmax(scores, dim=-1)\n    if mask is not None:\n"
        "        weights = weights.masked_fill(~mask, 0.0)\n"))}, 4, ("test_sdpa_mask", "known bug: mask_after")),
    "fill_zero": ({"scaled_dot_product_attention": SDPA.replace('float("-inf")', "0.0")}, 3,
                  ("test_sdpa_mask", "known bug: fill_zero")),
    "raises": ({"attention_loop": "def attention_loop(query, keys, values):\n    raise ValueError('todo')\n"}, 2,
               ("test_attention_loop", "raises ValueError")),
    "stub": ({"SelfAttention": "class SelfAttention(nn.Module):\n    def __init__(self, embed_dim, head_dim=None):\n"
              "        super().__init__()\n        raise NotImplementedError()\n"}, 1,
             ("test_self_attention", "not implemented")),
    "loops": ({"attention_loop": "def attention_loop(query, keys, values):\n    while True:\n        pass\n"}, 1,
              ("test_attention_loop", "did not run")),
    "correct": ({}, 6, None),
}
CLASS_SIZE = sum(n for _, n, _ in BUGS.values()) + 1  # and one empty submission
SCREENSHOT = ROOT / "build" / "browser" / "class_report.png"


def _student(bug: str, i: int) -> str:
    return f"{bug}-{i}"


@pytest.fixture(scope="module")
def graded(tmp_path_factory, grading_db):
    subs = tmp_path_factory.mktemp("class")
    for bug, (overrides, n, _) in BUGS.items():
        for i in range(n):
            write_nb(filled_submission(NB, overrides), subs / _student(bug, i) / f"{NB}.ipynb")
    (subs / "empty").mkdir()
    out, root = tmp_path_factory.mktemp("out"), tmp_path_factory.mktemp("course")
    db_url, workers = grading_db
    run = dict(course_dir=root, db_url=db_url, settings=Settings(Limits(cell_seconds=3), workers=workers))
    autograde(subs, out, **run)
    first = json.loads((out / "class_report.json").read_text())
    first_outcomes = {p.name: p.read_bytes() for p in (root / "outcomes").glob("*.json")}
    first_rows, first_pages = _rows_and_pages(out)
    # a re-submission round: the no_diagonal students fix their mask, and only they are graded again, by name
    again = [_student("no_diagonal", i) for i in range(BUGS["no_diagonal"][1])]
    for student in again:
        write_nb(filled_submission(NB), subs / student / f"{NB}.ipynb")
    autograde(subs, out, students=again, **run)
    kept = {p.name: p.read_bytes() for p in (root / "outcomes").glob("*.json")}
    return {"out": out, "first": first, "second": json.loads((out / "class_report.json").read_text()),
            "course": root, "db_url": db_url or f"sqlite:///{root / 'gradebook.db'}", "again": again,
            "first_outcomes": first_outcomes, "second_outcomes": kept, "subs": subs,
            "first_rows": first_rows, "first_pages": first_pages}


def _rows_and_pages(out) -> tuple[dict[str, str], dict[str, bytes]]:
    """grades.csv's line of each student (by id), and each feedback page's bytes (by its path in OUT)."""
    with open(out / "grades.csv", newline="") as f:
        rows = {r[2]: ",".join(r) for r in csv.reader(f)}
    return rows, {str(p.relative_to(out)): p.read_bytes() for p in (out / "feedback").rglob("*.html")}


def _entry(report: dict, task: str, diagnosis: str) -> dict | None:
    return next((d for d in report["diagnoses"] + report["no_diagnosis"]
                 if d["task"] == task and d["diagnosis"] == diagnosis), None)


def test_each_planted_bug_is_counted_for_exactly_its_students(graded):
    report = graded["first"]
    assert report["students"] == CLASS_SIZE and report["graded"] == CLASS_SIZE - 1
    for bug, (_, n, (task, diagnosis)) in ((b, v) for b, v in BUGS.items() if v[2]):
        entry = _entry(report, task, diagnosis)
        assert entry is not None, f"{bug}: no {diagnosis!r} under {task}"
        assert entry["students"] == sorted(_student(bug, i) for i in range(n)), (bug, entry["students"])
    named = {d["diagnosis"] for d in report["diagnoses"]}
    assert {"known bug: no_diagonal", "known bug: no_scale", "known bug: mask_after"} <= named
    assert not named & {"raises ValueError", "not implemented", "did not run"}  # those have no diagnosis
    ranked = [len(d["students"]) for d in report["diagnoses"]]
    assert ranked == sorted(ranked, reverse=True)


def test_completion_scores_and_separation_add_up(graded):
    report = graded["first"]
    tasks = {t["task"]: t for t in report["tasks"] if t["notebook"] == NB}
    assert tasks["test_self_attention"]["attempted"] == CLASS_SIZE - 2  # the stub, and the empty submission
    full = CLASS_SIZE - 1 - BUGS["no_diagonal"][1] - BUGS["upper"][1]
    assert tasks["test_causal_mask"]["full_marks"] == full and tasks["test_causal_mask"]["students"] == CLASS_SIZE - 1
    overall = report["distributions"]["overall"]
    assert overall["students"] == CLASS_SIZE - 1 and len(overall["scores"]) == CLASS_SIZE - 1
    assert report["separating_cases"] and all(-1 <= c["separation"] <= 1 for c in report["separating_cases"])


def test_review_flags_and_missing_notebooks_are_listed(graded):
    report = graded["first"]
    flagged = {r["student"] for r in report["review"]}
    assert _student("loops", 0) in flagged and "empty" in flagged
    assert any("timed out" in r["flag"] for r in report["review"] if r["student"] == _student("loops", 0))
    missing = {m["student"]: m["missing"] for m in report["missing_notebooks"]}
    notebooks = len(nbs.solution_notebooks())
    assert len(missing["empty"]) == notebooks and len(missing[_student("correct", 0)]) == notebooks - 1  # only 01 handed in
    graded_count = report["graded"]
    for q in report["written_questions"]:  # only 01 was handed in: another notebook's question has no answer, not a 0
        handed_in = q["notebook"] == NB
        assert (q["graded"] + q["awaiting"], q["not_handed_in"]) == ((graded_count, 0) if handed_in else
                                                                      (0, graded_count)), q
        assert handed_in or f"{graded_count} not handed in" in q["status"], q
    with open(graded["out"] / "grades.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == _student("correct", 0))
    points = {stem: sum(p for s, _, p in nbs.graded_columns() + nbs.written_columns() if s == stem)
              for stem in missing[_student("correct", 0)]}
    assert row["not_handed_in"] == " | ".join(f"{stem} not handed in: its {p:g} points are 0"
                                              for stem, p in points.items()), row["not_handed_in"]


def test_a_public_example_that_is_not_scored_is_marked_so():
    """A cell scored on its hidden cases, all passed: the public example's failure (a student's layer that did
    not load, say) is listed as the public, unscored example it is, not as the task's failure; where a scored case
    failed the same way, the student is counted there once."""
    from grading.judge import CaseResult, CellResult, NotebookRecord
    from grading.outcome import Status, StudentOutcome
    from grading.results import class_results

    def student(name: str, hidden_passes: bool) -> StudentOutcome:
        cases = [CaseResult("example", "example", True, False, "raises LayerLoadError: no layer", "raises LayerLoadError"),
                 CaseResult("h1", "hidden case 1", False, hidden_passes, "" if hidden_passes else "raises LayerLoadError",
                            "" if hidden_passes else "raises LayerLoadError")]
        cell = CellResult("test_sdpa", 3.0 if hidden_passes else 0.0, 3.0, cases)
        record = NotebookRecord(name, NB, "finished", "", True, 1.0, [], [cell])
        return StudentOutcome(name, notebooks={NB: f"{NB}.ipynb"}, status=Status.GRADED, judged=[record])

    results = class_results([student("full", True), student("failed", False)],
                            {"full": {(NB, "test_sdpa"): 3.0}, "failed": {(NB, "test_sdpa"): 0.0}})
    kinds = {d["diagnosis"]: d["students"] for d in class_report.build(results)["no_diagnosis"]}
    assert kinds == {"raises LayerLoadError": ["failed"],
                     "raises LayerLoadError" + class_report.PUBLIC_NOT_SCORED: ["full"]}, kinds


def test_a_resubmission_round_shows_what_changed(graded):
    change = graded["second"]["change"]
    n = BUGS["no_diagonal"][1]
    assert change is not None and change["previous_run"] == graded["first"]["run"]
    assert change["improved"] == n and change["worse"] == 0
    moved = {(m["task"], m["diagnosis"]): (m["before"], m["now"]) for m in change["diagnoses"]}
    assert moved[("test_causal_mask", "known bug: no_diagonal")] == (n, 0)
    assert _entry(graded["second"], "test_causal_mask", "known bug: no_diagonal") is None


def test_a_regrade_of_some_students_keeps_the_whole_class(graded):
    """`autograde --student NAME` grades those students again; every other student keeps the last run's results,
    and OUT (grades.csv, the outcomes, the class report) still holds the whole class."""
    again = {f"{s}.json" for s in graded["again"]}
    first, second = graded["first_outcomes"], graded["second_outcomes"]
    # the course folder's outcomes: every student graded (all but "empty", who handed in no notebook)
    assert set(second) == set(first) and len(first) == CLASS_SIZE - 1, sorted(set(first) ^ set(second))
    assert {name for name in first if first[name] != second[name]} == again, "only the named students graded again"
    with open(graded["out"] / "grades.csv", newline="") as f:
        rows = {r["student"] for r in csv.DictReader(f)} - {"(max points)"}
    assert len(rows) == CLASS_SIZE, sorted(rows)
    assert len(list((graded["out"] / "outcomes").glob("*.json"))) == CLASS_SIZE
    fixed = [r for r in read_class_results(graded["out"], graded["db_url"]).students if f"{r.outcome.student}.json" in again]
    assert len(fixed) == len(again) and all(r.outcome.status == "graded" for r in fixed)
    # everyone else's row of grades.csv and feedback pages are what the first run wrote, byte for byte
    rows, pages = _rows_and_pages(graded["out"])
    changed = {s for s in rows if rows[s] != graded["first_rows"].get(s)}
    assert changed == set(graded["again"]), sorted(changed)
    changed_pages = {p.split("/")[1] for p in pages if pages[p] != graded["first_pages"].get(p)}
    assert pages.keys() == graded["first_pages"].keys() and changed_pages == set(graded["again"]), sorted(changed_pages)


def test_a_report_of_an_out_that_lacks_students_of_the_class_is_refused(graded, tmp_path, capsys):
    """OUT must hold the course folder's whole class (who its last run took in): one whose outcomes lack a student
    (an old run's OUT, a file deleted) is refused by report and export, naming the student, writing nothing."""
    from grading.__main__ import main

    out = tmp_path / "out"
    shutil.copytree(graded["out"], out)
    lost = sorted((out / "outcomes").glob("*.json"))[0]
    lost.unlink()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for command in (["report", str(out)], ["export", str(out), "--to", "moodle"]):
        assert main([*command, "--course", str(graded["course"])]) == 2
        said = capsys.readouterr().err
        assert "holds no outcome of 1 student(s)" in said and lost.stem in said, said
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_regrade_of_a_name_not_in_the_class_is_refused_and_changes_nothing(graded, grading_db):
    out, course = graded["out"], graded["course"]
    before = {p: p.read_bytes() for folder in (out, course / "outcomes") for p in folder.rglob("*") if p.is_file()}
    db_url, workers = grading_db
    with pytest.raises(ValueError, match="no student of .* is named nobody"):
        autograde(graded["subs"], out, course_dir=course, db_url=db_url, students=["nobody"],
                  settings=Settings(Limits(cell_seconds=3), workers=workers))
    after = {p: p.read_bytes() for folder in (out, course / "outcomes") for p in folder.rglob("*") if p.is_file()}
    assert after == before, sorted(set(after) ^ set(before))


def test_anonymised_report_names_nobody(graded, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(graded["out"], out)
    results = read_class_results(out, graded["db_url"])
    first, second = results.students[0], results.students[1]
    # a flag that names a classmate (the similarity check's, a shared run's) names their alias instead
    first.outcome.flags.append(f"shares much of its work with {second.student} (pair 1 of 1 in similarity.html)")
    data, page = class_report.write(out, results, anonymise=True)
    text = data.read_text() + page.read_text()
    assert "no_diagonal-0" not in text and "mask_after-" not in text and "student 01" in text
    assert second.student not in text and "shares much of its work with student" in text


def test_the_page_opens_in_a_browser_without_errors(graded, chromium):
    page_path = graded["out"] / "class_report.html"
    html = page_path.read_text()
    assert "<script" not in html and "http://" not in html and "https://" not in html  # self-contained
    page = chromium.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_path.as_uri())
    assert page.locator("h1").inner_text() == "What the class got wrong"
    assert page.locator("img").count() >= 2 and all(
        page.evaluate("i => i.naturalWidth", el) > 0 for el in page.locator("img").element_handles())
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert not errors, errors


def test_the_report_command(graded, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    shutil.copytree(graded["out"], out)
    (out / "class_report.html").unlink()
    done = subprocess.run([sys.executable, "-m", "grading", "report", str(out), "--course", str(graded["course"]),
                           "--db", graded["db_url"]], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and "class_report.html" in done.stdout and not done.stderr, done.stderr
    assert (out / "class_report.html").is_file()
    empty = subprocess.run([sys.executable, "-m", "grading", "report", str(tmp_path / "nothing")], cwd=ROOT,
                           capture_output=True, text=True)
    assert empty.returncode == 2 and "run autograde first" in empty.stderr and len(empty.stderr.splitlines()) == 1


def test_a_score_given_by_hand_is_the_class_reports_score_too(graded, tmp_path):
    """A TA gives a student whose attention loop raised its 2 points in the gradebook (formgrader's manual score
    on the grade), then runs `report`: the class report's task table and totals say what grades.csv says, and the
    judge's diagnosis stays, marked as overridden by hand."""
    import subprocess
    import sys

    from nbgrader.api import Gradebook

    from grading.spreadsheet import read_csv

    task, student, column = "test_attention_loop", _student("raises", 0), f"{NB}:test_attention_loop"
    out = tmp_path / "out"
    shutil.copytree(graded["out"], out)
    with Gradebook(graded["db_url"]) as gb:
        grade = gb.find_grade(task, NB, nbs.ASSIGNMENT, student)
        assert (grade.auto_score, grade.manual_score) == (0.0, None)
        grade.manual_score = 2.0
        gb.db.commit()
    try:
        done = subprocess.run([sys.executable, "-m", "grading", "report", str(out), "--course", str(graded["course"]),
                               "--db", graded["db_url"]], cwd=ROOT, capture_output=True, text=True)
    finally:  # the gradebook is the module's: the other tests see it as graded
        with Gradebook(graded["db_url"]) as gb:
            gb.find_grade(task, NB, nbs.ASSIGNMENT, student).manual_score = None
            gb.db.commit()
    assert done.returncode == 0, done.stderr
    maxima, *rows = read_csv(out / "grades.csv")
    rows = [r for r in rows if r["status"] == "graded"]
    report = json.loads((out / "class_report.json").read_text())
    assert float(next(r for r in rows if r["id"] == student)[column]) == 2.0

    for t in (t for t in report["tasks"] if t["notebook"] == NB):  # every task, the overridden one among them
        points = [float(r[f"{NB}:{t['task']}"]) for r in rows]
        top = float(maxima[f"{NB}:{t['task']}"])
        assert t["students"] == len(rows) and t["max_points"] == top, t["task"]
        assert t["full_marks"] == sum(p >= top for p in points), (t["task"], t["full_marks"])
        assert t["mean_credit"] == pytest.approx(sum(p / top for p in points) / len(rows)), t["task"]
        assert t["overridden"] == (t["task"] == task), t["task"]
    before = next(t for t in graded["second"]["tasks"] if t["task"] == task)
    now = next(t for t in report["tasks"] if t["task"] == task)
    assert now["full_marks"] == before["full_marks"] + 1
    assert report["totals"] == {r["id"]: float(r["total"]) for r in rows}
    assert sorted(report["distributions"]["overall"]["scores"]) == sorted(float(r["total"]) for r in rows)
    assert sorted(report["distributions"][NB]["scores"]) == sorted(float(r[f"{NB}:total"]) for r in rows)

    raised = _entry(report, task, "raises ValueError")  # what went wrong is still the judge's finding
    assert raised is not None and raised["students"] == [_student("raises", i) for i in range(BUGS["raises"][1])]
    assert raised["overridden"] == [student]
    page = (out / "class_report.html").read_text()
    assert f"overridden by hand: 1 of {len(raised['students'])}" in page and f"1 of {len(rows)}" in page
