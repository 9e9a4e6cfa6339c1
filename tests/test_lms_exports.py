"""A class as an LMS exports it is graded, each student under a safe id and shown under the name as given.

Moodle's "Download all submissions" zip has a folder per student and plugin, `First Last_<participant
id>_assignsubmission_file_`; Canvas's zip has every file in one folder, `lastfirst_<user id>_<submission
id>_<file>` (`lastfirst_LATE_...` when late). One grading run of each (notebook 01, the solution), then fast
checks of the id mapping and of intake's refusals.
"""
from __future__ import annotations

import csv
import html
import json
import os
import zipfile

import nbformat
import pytest
from conftest import filled_submission, write_nb

from grading import intake as intake_module
from grading.intake import DISPUTED, DISPUTED_FLAG, STUDENT_ID, intake, lms_readings, student_id, unusable_name
from grading.notebooks import ASSIGNMENT, RELEASE, solution_sources
from grading.settings import Settings
from grading.spreadsheet import FORMULA_START, read_csv

NB = "01_scaled_dot_product_attention"
FORMULA = "=SUM(1+1)*cmd|' -C calc'!A0"  # a spreadsheet would run it; no slash, so a folder may bear it

# (name as given, LMS id) of each student, and the zip members of the export
MOODLE = {
    ("John Smith", "12345"): {f"John Smith_12345_assignsubmission_file_/{NB}.ipynb": "solution",
                              "John Smith_12345_assignsubmission_onlinetext_/onlinetext.html": "<p>see the file</p>"},
    ("Zoë O'Brien, Jr.", "67890"): {f"Zoë O'Brien, Jr._67890_assignsubmission_file_/{NB} (1).ipynb": "solution"},
    (FORMULA, "555"): {f"{FORMULA}_555_assignsubmission_file_/{NB}.ipynb": "solution"},
}
CANVAS = {
    ("smithjohn", "12345"): {f"smithjohn_12345_67890_{NB}.ipynb": "solution",
                             "smithjohn_12345_67890_notes.txt": "my notes"},
    ("obrienzoe", "678"): {f"obrienzoe_LATE_678_999_{NB}-1.ipynb": "solution"},
}


def _export(path, students: dict) -> None:
    solution = nbformat.writes(filled_submission(NB))
    with zipfile.ZipFile(path, "w") as zf:
        for members in students.values():
            for name, content in members.items():
                zf.writestr(name, solution if content == "solution" else content)


def _grade(tmp_path_factory, grading_db, students: dict, lms: str) -> dict:
    from grading.autograde import autograde

    tmp = tmp_path_factory.mktemp(lms)
    _export(tmp / f"{lms}.zip", students)
    db_url, workers = grading_db
    autograde(tmp / f"{lms}.zip", tmp / "out", course_dir=tmp / "course", db_url=db_url, settings=Settings(workers=workers))
    return {"out": tmp / "out", "students": students}


def _full_points() -> float:
    from grading.notebooks import graded_columns

    return sum(p for stem, _, p in graded_columns() if stem == NB)


@pytest.mark.parametrize("export", ["moodle", "canvas"])
def test_every_student_of_the_export_is_graded_under_the_name_given(export, request):
    graded = request.getfixturevalue(f"{export}_graded")  # conftest.py: graded once
    out = graded["out"]
    rows = {(r["student"], r["lms_id"]): r for r in read_csv(out / "grades.csv")[1:]}
    assert set(rows) == set(graded["students"]), f"grades.csv students {sorted(rows)}"
    report = json.loads((out / "class_report.json").read_text())
    page = (out / "class_report.html").read_text(encoding="utf-8")
    for (name, lms_id), row in rows.items():
        assert row["status"] == "graded", f"{name} not graded: {row['notes']}"
        assert float(row[f"{NB}:total"]) == _full_points(), f"{name} lost points: {row['notes']}"
        assert STUDENT_ID.match(row["id"]) and not row["id"].startswith(FORMULA_START), f"unsafe id {row['id']!r}"
        feedback = (out / "feedback" / row["id"] / f"{NB}.html").read_text(encoding="utf-8")
        assert f"<title>{html.escape(name, quote=False)}: " in feedback, f"{name} not in the feedback page's title"
        assert report["totals"][f"{name} ({lms_id})"] == _full_points(), f"{name} missing from the class report"
        assert html.escape(f"{name} ({lms_id})") in page, f"{name} not shown in class_report.html"
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        cells = [cell for line in csv.reader(f) for cell in line]
    assert not [c for c in cells if c.startswith(FORMULA_START)], "a grades.csv cell starts a formula"


def test_moodle_folders_of_one_student_are_one_student(moodle_graded):
    rows = {r["student"]: r for r in read_csv(moodle_graded["out"] / "grades.csv")[1:]}
    assert "onlinetext.html: ignored (not a notebook)" in rows["John Smith"]["notes"], rows["John Smith"]["notes"]


def test_canvas_notes_a_late_file_and_the_files_as_handed_in(canvas_graded):
    rows = {r["student"]: r for r in read_csv(canvas_graded["out"] / "grades.csv")[1:]}
    assert rows["obrienzoe"]["late"].startswith("marked late by the LMS"), rows["obrienzoe"]["late"]
    assert rows["smithjohn"]["late"] == "", rows["smithjohn"]["late"]
    page = (canvas_graded["out"] / "feedback" / rows["obrienzoe"]["id"] / f"{NB}.html").read_text(encoding="utf-8")
    assert "Late work:" in page and "marked late by the LMS; no late penalty" in page
    assert rows["smithjohn"]["notes"] == "notes.txt: ignored (not a notebook)", rows["smithjohn"]["notes"]


# -- the id mapping and the layouts, fast ------------------------------------------------------------------

HOSTILE = ["=cmd|' /C calc'!A0", "../x", "x" * 300, "x" * 299 + "y", "+1", "@SUM(A1)", "-x", "..", "", "a\nb",
           "zoë", "zoe\u0308", "john smith", "John Smith", "John  Smith", "john-smith", "名前", "\U0001f600"]


def test_every_name_gets_its_own_safe_and_stable_id():
    ids = [student_id(name) for name in HOSTILE]
    assert [i for i in ids if not STUDENT_ID.match(i)] == [], "an id that is not a usable student id"
    assert len(set(ids)) == len(HOSTILE), "two names share an id"
    assert ids == [student_id(name) for name in HOSTILE], "an id changed between two calls"
    assert student_id("john smith") == "john-smith-32ddaf65cc", "the id of a name changed (not stable across runs)"
    assert student_id("alice") == "alice" and student_id("s.jones@uni.edu") == "s.jones@uni.edu"
    made = student_id("zoë")
    assert student_id(made) not in (made, student_id("zoë")), "a name spelt as another's id took that id"


def test_only_a_name_that_cannot_be_a_folder_is_refused():
    for name in ("=cmd|' /C calc'!A0", "../x", "", ".", "..", "a\x00b", "a\nb"):
        assert unusable_name(name), f"{name!r} accepted"
    for name in ("john smith", "zoë", "O'Brien, Jr.", FORMULA, "x" * 300, "-x", "名前"):
        assert unusable_name(name) is None, f"{name!r} refused: {unusable_name(name)}"


def test_the_layouts_of_the_exports_are_read():
    assert lms_readings("John Smith_12345_assignsubmission_file_", folder=True) == [("John Smith", "12345", "", False)]
    assert lms_readings("John Smith_12345_assignsubmission_file", folder=True) == [("John Smith", "12345", "", False)]
    assert lms_readings("Ann_B_1_assignsubmission_file_", folder=True) == [("Ann_B", "1", "", False)]
    assert lms_readings("A_1_assignsubmission_file_2_assignsubmission_file", folder=True) == [
        ("A_1_assignsubmission_file", "2", "", False)], "a folder's name is read from its right"
    assert lms_readings("john smith", folder=True) == [("john smith", "", "", False)]
    assert lms_readings(f"smithjohn_12345_67890_{NB}.ipynb", folder=False) == [
        ("smithjohn", "12345", f"{NB}.ipynb", False)]
    assert lms_readings("smithjohn_LATE_12_34_01_x.ipynb", folder=False) == [("smithjohn", "12", "01_x.ipynb", True)]
    assert lms_readings("Jo Li_7_assignsubmission_file_a_b.ipynb", folder=False) == [("Jo Li", "7", "a_b.ipynb", False)]
    assert lms_readings("Jo Li_7_assignsubmission_onlinetext_onlinetext.html", folder=False) == [
        ("Jo Li", "7", "onlinetext.html", False)]
    assert lms_readings("notes.txt", folder=False) == [] and lms_readings(f"{NB}.ipynb", folder=False) == []


def test_a_flat_name_with_two_readings_is_both_students(tmp_path):
    """A flat file's own name is at its right and may hold the fields that Moodle's names hold (or Canvas's
    file a Moodle name): every reading of it is listed, none is picked."""
    moodle = "Alice Smith_1001_assignsubmission_file_x_2002_assignsubmission_file_01.ipynb"
    assert lms_readings(moodle, folder=False) == [
        ("Alice Smith", "1001", "x_2002_assignsubmission_file_01.ipynb", False),
        ("Alice Smith_1001_assignsubmission_file_x", "2002", "01.ipynb", False)]
    canvas = "smithjohn_12_34_x_5_assignsubmission_file_01.ipynb"
    assert lms_readings(canvas, folder=False) == [("smithjohn_12_34_x", "5", "01.ipynb", False),
                                                  ("smithjohn", "12", "x_5_assignsubmission_file_01.ipynb", False)]


def test_moodle_41_folders_without_their_last_underscore_are_one_student(tmp_path):
    """Moodle 4.1 on names a student's folders `First Last_<id>_assignsubmission_file` (no `_` at the end)."""
    subs = tmp_path / "subs"
    write_nb(filled_submission(NB), subs / "John Smith_12345_assignsubmission_file" / f"{NB}.ipynb")
    (subs / "John Smith_12345_assignsubmission_onlinetext").mkdir()
    (subs / "John Smith_12345_assignsubmission_onlinetext" / "onlinetext.html").write_text("<p>see the file</p>")
    results, loose = intake(subs, tmp_path / "course")
    assert [(r.name, r.lms_id, r.status) for r in results] == [("John Smith", "12345", "pending")], results
    assert results[0].notebooks == {NB: f"John Smith_12345_assignsubmission_file/{NB}.ipynb"}, results[0].notes


def test_a_moodle_display_name_cannot_take_another_students_file(tmp_path):
    """Participant 2002, display name `Alice Smith_1001_assignsubmission_file_x`, hands in a notebook: in a flat
    Moodle export its name reads as Alice's file too. Read lazily it was Alice's, and newer than her own, the one
    graded (Alice 0, the impostor no row). Now Alice's own file is hers, the other is nobody's: both students
    have a row, the impostor's refused with the reason, both flagged for review, nothing staged from it."""
    impostor = "Alice Smith_1001_assignsubmission_file_x"
    alices = f"Alice Smith_1001_assignsubmission_file_{NB} (1).ipynb"
    theirs = f"{impostor}_2002_assignsubmission_file_{NB}.ipynb"
    export = tmp_path / "moodle.zip"
    with zipfile.ZipFile(export, "w") as zf:  # unpacked in this order: the impostor's file is the newer
        zf.writestr(alices, nbformat.writes(filled_submission(NB)))
        zf.writestr(theirs, nbformat.writes(nbformat.read(str(RELEASE / f"{NB}.ipynb"), as_version=4)))
    results, loose = intake(export, tmp_path / "course")
    rows = {(r.name, r.lms_id): r for r in results}
    assert set(rows) == {("Alice Smith", "1001"), (impostor, "2002")} and loose == [], (set(rows), loose)
    alice, other = rows[("Alice Smith", "1001")], rows[(impostor, "2002")]
    assert alice.status == "pending" and alice.notebooks == {NB: f"{NB} (1).ipynb"}, (alice.notebooks, alice.notes)
    staged = nbformat.read(str(tmp_path / "course" / "submitted" / alice.student / ASSIGNMENT / f"{NB}.ipynb"), 4)
    answer = next(iter(solution_sources(NB).values()))
    assert [c for c in staged.cells if c.source == answer], "the notebook staged for Alice is not her own"
    assert [n for n in alice.notes if theirs in n and DISPUTED in n] and alice.flags == [DISPUTED_FLAG], alice
    assert other.status == "failed" and not other.notebooks and other.flags == [DISPUTED_FLAG], other
    assert other.notes[0] == f"{theirs} (the file of Alice Smith (1001) or {impostor} (2002)): {DISPUTED}", other.notes
    assert other.notes[-1].startswith("refused: no file is this student's alone"), other.notes
    assert not (tmp_path / "course" / "submitted" / other.student).exists(), "a disputed file was staged"


def test_a_disputed_file_cannot_stop_the_class_export(tmp_path):
    """Participant 2002 (Bob) uploads `x_1001_assignsubmission_file_<nb>.ipynb`; in a flat Moodle export it reads
    as Bob's and as the file of a student `Bob_2002_assignsubmission_file_x` with participant id 1001, Alice's.
    That row rests on no file of its own: it takes no part in the shared-id check (which refused the whole
    export) and is not exported under Alice's id; Alice is, and Bob, whose prefix the file carries, is flagged
    (and, with no file of his own either, not exported: a person decides whose the file is)."""
    from grading.lms_export import NO_OWN_FILE, exported
    from grading.results import class_results

    alices = f"Alice Smith_1001_assignsubmission_file_{NB}.ipynb"
    bobs = f"Bob_2002_assignsubmission_file_x_1001_assignsubmission_file_{NB}.ipynb"
    export = tmp_path / "moodle.zip"
    with zipfile.ZipFile(export, "w") as zf:
        zf.writestr(alices, nbformat.writes(filled_submission(NB)))
        zf.writestr(bobs, nbformat.writes(filled_submission(NB)))
    results, loose = intake(export, tmp_path / "course")
    rows = {(r.name, r.lms_id): r for r in results}
    phantom, bob = rows[("Bob_2002_assignsubmission_file_x", "1001")], rows[("Bob", "2002")]
    assert not phantom.own_files and not bob.own_files and rows[("Alice Smith", "1001")].own_files, rows
    assert DISPUTED_FLAG in bob.flags and DISPUTED_FLAG in phantom.flags, (bob.flags, phantom.flags)
    written, missing = exported(class_results(results, {}), "moodle")  # refused the whole class before
    assert [(s.outcome.name, s.outcome.lms_id) for s in written] == [("Alice Smith", "1001")], written
    assert {s.outcome.name: why for s, why in missing} == {"Bob_2002_assignsubmission_file_x": NO_OWN_FILE,
                                                           "Bob": NO_OWN_FILE}, missing


def test_intake_refuses_only_what_cannot_be_a_folder(tmp_path):
    """A link for a folder and a flat file whose name part is `..` are refused; odd names are taken in, each
    under its own id; a folder name that is not UTF-8 is shown with its bad bytes replaced."""
    subs = tmp_path / "subs"
    for name in ("john smith", "zoë", "O'Brien, Jr.", FORMULA):
        write_nb(filled_submission(NB), subs / name / f"{NB}.ipynb")
    os.symlink(subs / "zoë", subs / "link")
    write_nb(filled_submission(NB), subs / f".._1_2_{NB}.ipynb")
    os.mkdir(os.fsencode(subs) + b"/caf\xe9")
    write_nb(filled_submission(NB), subs / os.fsdecode(b"caf\xe9") / f"{NB}.ipynb")
    results = {r.name: r for r in intake(subs, tmp_path / "course")[0]}
    assert set(results) == {"john smith", "zoë", "O'Brien, Jr.", FORMULA, "link", "..", "caf\ufffd"}, set(results)
    for name in ("john smith", "zoë", "O'Brien, Jr.", FORMULA, "caf\ufffd"):
        assert results[name].status == "pending" and NB in results[name].notebooks, (name, results[name].notes)
        assert (tmp_path / "course" / "submitted" / results[name].student).is_dir(), f"{name} not staged"
    assert results["link"].status == "failed" and "symbolic link" in results["link"].notes[0], results["link"]
    assert results[".."].status == "failed" and "cannot be a folder" in results[".."].notes[0], results[".."]


def test_two_students_never_share_an_id(tmp_path, monkeypatch):
    """Were two names ever to hash alike, the second is refused rather than graded into the first's folder."""
    monkeypatch.setattr(intake_module, "student_id", lambda name: "same-0123456789")
    subs = tmp_path / "subs"
    for name in ("ann lee", "bo li"):
        write_nb(filled_submission(NB), subs / name / f"{NB}.ipynb")
    results = {r.name: r for r in intake(subs, tmp_path / "course")[0]}
    assert results["ann lee"].status == "pending", results["ann lee"].notes
    assert results["bo li"].status == "failed" and "another student's" in results["bo li"].notes[0], results["bo li"]
