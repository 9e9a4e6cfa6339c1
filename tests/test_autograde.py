"""Autograde round trip with real nbgrader over canned submissions.

One run grades a class of canned students: the solution (full marks), the untouched release (0),
a known bug in one function (exactly the points of the tests that don't depend on it), and broken
inputs (corrupt notebook, non-notebook file, stripped nbgrader metadata) that are reported with a
reason while everyone else is graded. Nothing in the submissions folder is changed.
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
import re
import shutil
import zipfile
from html import escape as html_escape
from pathlib import Path

import pytest
from conftest import filled_submission, write_nb

from grading import notebooks as nbs
from grading.autograde import autograde, graded_columns
from grading.notebooks import written_columns
from grading.outcome import read_outcomes
from grading.settings import Settings

# the module grades its class once, in the set-up of its first test: 46 s alone on 2 cores
pytestmark = pytest.mark.budget(240, reason="the class of every notebook, graded once for the module")
NB01 = "01_scaled_dot_product_attention"
# the known bug: causal_mask excludes the diagonal. Only test_causal_mask uses causal_mask.
CAUSAL_BUG = '''
def causal_mask(T, device=None):
    """Buggy on purpose: excludes the diagonal."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)
'''


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, grading_db, trained_model_file):
    subs = tmp_path_factory.mktemp("submissions")
    stems = [p.stem for p in nbs.solution_notebooks()]
    for stem in stems:
        write_nb(filled_submission(stem), subs / "alice" / f"{stem}.ipynb")
        (subs / "bob").mkdir(exist_ok=True)
        shutil.copy(nbs.RELEASE / f"{stem}.ipynb", subs / "bob" / f"{stem}.ipynb")
    # alice hands in notebook 05's trained model (built with her layers of 02-03), as the notebook saved it
    (subs / "alice" / "runs").mkdir()
    shutil.copy(trained_model_file, subs / "alice" / nbs.TRAINED_CHECKPOINT)
    write_nb(filled_submission(NB01, {"causal_mask": CAUSAL_BUG}), subs / "carol" / f"{NB01} (1).ipynb")
    (subs / "dave").mkdir()
    (subs / "dave" / f"{NB01}.ipynb").write_text('{"cells": [ this is not json')
    (subs / "dave" / "notes.txt").write_text("I did my best")
    stripped = filled_submission(NB01)
    for cell in stripped.cells:
        cell.metadata.pop("nbgrader", None)
    write_nb(stripped, subs / "erin" / f"{NB01}.ipynb")
    before = _digest(subs)
    out = tmp_path_factory.mktemp("results")
    db_url, workers = grading_db
    course = tmp_path_factory.mktemp("course")
    results = autograde(subs, out, course_dir=course, db_url=db_url, settings=Settings(workers=workers))
    with open(out / "grades.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    return {"results": {r.student: r for r in results}, "rows": rows, "out": out, "subs": subs, "before": before,
            "course": course, "db": db_url or f"sqlite:///{course / 'gradebook.db'}", "workers": workers}


def _points():
    return {f"{s}:{g}": p for s, g, p in graded_columns()}


def test_solution_gets_full_marks(graded):
    """Every automatic point; the written answers wait for a person (formgrader), and grades.csv says so."""
    row = graded["rows"]["alice"]
    written = {f"{s}:{g}": p for s, g, p in written_columns()}
    assert row["status"] == "graded" and len(written) >= 8
    assert all(row[column] == "" for column in written), "a written answer scored before anyone graded it"
    assert float(row["written_pending"]) == sum(written.values())
    assert float(row["total"]) + float(row["written_pending"]) == float(row["max_total"]) > 0


def test_written_answers_graded_in_formgrader_count_after_report(graded, capsys):
    """What formgrader does (a manual score per answer, in the gradebook), then `python -m grading report`:
    grades.csv and the class report take the written scores in; another run's gradebook is refused."""
    from nbgrader.api import Gradebook

    from grading.__main__ import main

    written = written_columns()
    with Gradebook(graded["db"]) as gb:
        for stem, question, points in written:
            gb.find_grade(question, stem, "attention", "alice").manual_score = points
            gb.find_grade(question, stem, "attention", "bob").manual_score = 0.0
        gb.db.commit()
    assert main(["report", str(graded["out"]), "--db", graded["db"]]) == 0
    with open(graded["out"] / "grades.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    alice, bob = rows["alice"], rows["bob"]
    assert float(alice["total"]) == float(alice["max_total"]) and float(alice["written_pending"]) == 0
    assert float(bob["total"]) == 0.0 and all(bob[f"{s}:{g}"] == "0.0" for s, g, _ in written)
    assert float(rows["carol"]["total"]) == float(graded["rows"]["carol"]["total"])  # nothing else moved
    report = json.loads((graded["out"] / "class_report.json").read_text())
    first = report["written_questions"][0]
    waiting = sum(r["status"] == "graded" and r[f"{first['notebook']}:{first['question']}"] == "" for r in rows.values())
    assert first["graded"] == 2 and first["awaiting"] == waiting >= 1 and "mean 1.00 of 2" in first["status"], first
    other = Path(str(graded["course"]) + "-other")
    other.mkdir()
    assert main(["report", str(graded["out"]), "--db", f"sqlite:///{other / 'gradebook.db'}"]) == 2
    assert "is not this run's" in capsys.readouterr().err


def test_each_worker_starts_one_sandbox_ahead_and_keeps_it_warm(graded):
    """Nobody here ends their own sandbox, so each worker starts one while the course is still being prepared
    (grading.worker.warm_up) and grades every student in it, reset between them
    (grading.sandbox.StudentSandbox): no student waits for a sandbox to start, which costs seconds."""
    started = {s: o.sandboxes_started for s, o in read_outcomes(graded["course"] / "outcomes").items()}
    graded_here = [s for s, r in graded["results"].items() if r.status == "graded"]
    assert len(graded_here) >= 3 and all(isinstance(started.get(s), int) for s in graded_here), started
    assert sum(started[s] for s in graded_here) == 0, f"students who had to start a sandbox: {started}"


def test_untouched_release_gets_zero(graded):
    row = graded["rows"]["bob"]
    assert row["status"] == "graded" and float(row["total"]) == 0.0


def test_the_trained_model_is_graded_from_the_checkpoint_handed_in(graded):
    """alice's checkpoint (layers from her notebooks 02-03, which the sandbox puts beside 07) earns the
    trained-model points; bob handed in none, and his feedback says so."""
    column = "07_generation_and_evaluation:test_trained_model"
    assert float(graded["rows"]["alice"][column]) == _points()[column] > 0
    html = (graded["out"] / "feedback" / "bob" / "07_generation_and_evaluation.html").read_text()
    assert "no trained model was handed in" in html


def test_known_bug_loses_exactly_the_dependent_tests(graded):
    row = graded["rows"]["carol"]
    points = _points()
    nb01 = {k: v for k, v in points.items() if k.startswith(NB01)}
    for column, max_points in nb01.items():
        expected = 0.0 if column.endswith(":test_causal_mask") else max_points
        assert float(row[column]) == expected, column
    assert float(row[f"{NB01}:total"]) == sum(nb01.values()) - nb01[f"{NB01}:test_causal_mask"]


def test_broken_inputs_are_reported_and_the_rest_graded(graded):
    dave = graded["results"]["dave"]
    assert any("corrupt notebook" in n for n in dave.notes), dave.notes
    assert any("notes.txt" in n and "not a notebook" in n for n in dave.notes), dave.notes
    assert graded["rows"]["dave"]["total"] == "" and graded["rows"]["dave"]["notes"]  # no notebook: not graded, not 0
    # metadata stripped by an editor: reported, and the answers recovered and graded
    erin = graded["results"]["erin"]
    assert any("metadata was missing" in n for n in erin.notes), erin.notes
    assert float(graded["rows"]["erin"][f"{NB01}:total"]) == sum(
        v for k, v in _points().items() if k.startswith(NB01))
    assert len(graded["rows"]) == 1 + 5  # the max-points row and every student


def test_submissions_are_left_untouched(graded):
    assert _digest(graded["subs"]) == graded["before"]


def test_feedback_hides_hidden_tests(graded):
    pages = list((graded["out"] / "feedback").rglob("*"))
    assert {p.suffix for p in pages if p.is_file()} == {".html"}, "only HTML pages in the feedback"
    html = (graded["out"] / "feedback" / "bob" / f"{NB01}.html").read_text()
    assert "BEGIN HIDDEN TESTS" not in html and "hidden tests ran here" in html
    source = nbs.read(nbs.SOLUTIONS / f"{NB01}.ipynb")
    for cell in nbs.test_cells(source):
        hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
        for line in filter(None, (ln.strip() for ln in hidden.splitlines())):
            assert html_escape(line) not in html and line not in html, f"hidden test line in feedback: {line}"
    report = json.loads((graded["out"] / "report.json").read_text())
    assert {s["student"] for s in report["students"]} == {"alice", "bob", "carol", "dave", "erin"}


def test_each_students_outcome_is_what_every_table_shows(graded):
    """OUT/outcomes/<student>.json holds the one record of each student; the grades table's scores, status,
    review and notes, report.json and the course folder's copy (what --resume reads) agree with it."""
    outcomes = read_outcomes(graded["out"] / "outcomes")
    assert set(outcomes) == {"alice", "bob", "carol", "dave", "erin"}
    in_course = read_outcomes(graded["course"] / "outcomes")  # the graded part, as each worker wrote it
    assert "alice" in in_course and all(outcomes[s].judged == o.judged for s, o in in_course.items())
    report = {s["student"]: s for s in json.loads((graded["out"] / "report.json").read_text())["students"]}
    points = _points()
    for student, outcome in outcomes.items():
        row = graded["rows"][outcome.name or student]
        assert (row["status"], row["review"], row["notes"]) == (outcome.status, " | ".join(outcome.flags),
                                                                " | ".join(outcome.notes)), student
        assert report[student] == outcome.summary()
        for record in outcome.judged:  # every test cell's points, as the judge gave them
            for cell in record.cells:
                assert float(row[f"{record.notebook}:{cell.grade_id}"]) == pytest.approx(cell.points), cell
                assert cell.max_points == points[f"{record.notebook}:{cell.grade_id}"]
    assert {r.notebook for r in outcomes["alice"].judged} == {p.stem for p in nbs.solution_notebooks()}
    carol = {c.grade_id: c for c in outcomes["carol"].judged[0].cells}["test_causal_mask"]
    assert any(k.diagnosis.startswith("known bug") for k in carol.cases if not k.passed), carol


def test_zip_of_submissions(tmp_path, graded, caplog):
    archive = tmp_path / "subs.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for p in (graded["subs"] / "carol").rglob("*"):
            zf.write(p, Path("class") / "carol" / p.relative_to(graded["subs"] / "carol"))
        zf.writestr("class/notes.txt", "a file outside any student folder")
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="grading"):
        results = autograde(archive, out, course_dir=tmp_path / "course")
    assert [r.student for r in results] == ["carol"] and results[0].status == "graded"
    logged = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("grading")]
    assert ("grading.autograde", "INFO", f"carol: graded ({results[0].seconds:.1f} s)") in logged  # through logging
    assert any(level == "WARNING" and "notes.txt" in message for _, level, message in logged), logged


def test_nbgraders_session_warnings_are_not_shown(tmp_path):
    """SQLAlchemy's warning about nbgrader's gradebook code, once per student graded, is filtered where the
    gradebook API is made; other warnings still show."""
    import warnings

    from sqlalchemy.exc import SAWarning

    from grading import course

    course.prepare_grading_course(tmp_path / "course")
    course.api(tmp_path / "course")
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn(SAWarning("Object of type <SubmittedNotebook> not in session, add operation along "
                                "'Notebook.submissions' will not proceed"), stacklevel=1)
        warnings.warn(SAWarning("another warning"), stacklevel=1)
    assert [str(w.message) for w in seen] == ["another warning"]


def test_the_similarity_page_compares_the_class_and_flags_nothing_the_class_shares(graded):
    """grading/similarity.py runs beside the grading: OUT holds its page; alice, carol and erin handed in the same
    solution of notebook 01, which is what this class's pairs share anyway, so no one is flagged for it."""
    from grading import similarity

    page = (graded["out"] / similarity.PAGE).read_text(encoding="utf-8")
    assert int(re.search(r"(\d+) students, (\d+) pairs", page).group(1)) >= 2
    assert not any("shares much of its work" in row["review"] for row in graded["rows"].values())
