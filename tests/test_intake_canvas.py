"""Intake of Canvas's download keeps, per notebook, the attachment id of the file the student handed in.

Canvas names each file `<lastfirst>_[LATE_]<user id>_<attachment id>_<file>`; its re-upload of feedback files
matches a file to a submission by the user id and the attachment id (grading/lms_export.py), so the name of the
file a notebook was graded from is kept as Canvas wrote it. Fast: intake only, no grading.
"""
from __future__ import annotations

import nbformat
from conftest import filled_submission, write_nb

from grading.intake import canvas_ids, intake, lms_readings

NB1 = "01_scaled_dot_product_attention"
NB2 = "02_positional_encoding"


def test_the_name_of_each_canvas_file_is_kept_with_its_attachment_id(tmp_path):
    subs = tmp_path / "canvas"
    smith = {NB1: f"smithjohn_12345_67890_{NB1}.ipynb", NB2: f"smithjohn_12345_67891_{NB2}-1.ipynb"}
    late = {NB1: f"obrienzoe_LATE_678_999_{NB1}.ipynb"}
    for stem, name in [*smith.items(), *late.items()]:
        write_nb(filled_submission(stem), subs / name)
    (subs / "smithjohn_12345_67892_notes.txt").write_text("my notes")
    # a folder's file whose name only looks like Canvas's is not one of Canvas's download
    write_nb(filled_submission(NB1), subs / "alice" / f"a_1_2_{NB1}.ipynb")
    results = {r.name: r for r in intake(subs, tmp_path / "course")[0]}
    assert results["smithjohn"].notebooks == smith, results["smithjohn"].notes
    assert results["obrienzoe"].notebooks == late, results["obrienzoe"].notes
    assert results["alice"].notebooks == {NB1: f"a_1_2_{NB1}.ipynb"} and results["alice"].lms_id == ""
    assert {stem: canvas_ids(name) for stem, name in results["smithjohn"].notebooks.items()} == {
        NB1: ("12345", "67890"), NB2: ("12345", "67891")}
    assert canvas_ids(late[NB1]) == ("678", "999")
    assert "notes.txt: ignored (not a notebook)" in results["smithjohn"].notes, "notes name the file as handed in"


def test_canvas_ids_are_read_only_from_canvas_names():
    assert canvas_ids(f"smithjohn_LATE_12_34_{NB1}.ipynb") == ("12", "34")
    assert canvas_ids(f"Jo Li_7_assignsubmission_file_{NB1}.ipynb") is None
    assert canvas_ids(f"{NB1}.ipynb") is None
    assert lms_readings(f"smithjohn_12_34_{NB1}.ipynb", folder=False) == [("smithjohn", "12", f"{NB1}.ipynb", False)]


def test_a_disputed_file_keeps_no_attachment(tmp_path):
    """A flat name with a Canvas and a Moodle reading is nobody's: no student records it."""
    subs = tmp_path / "flat"
    disputed = f"smithjohn_12_34_x_5_assignsubmission_file_{NB1}.ipynb"
    subs.mkdir()
    (subs / disputed).write_text(nbformat.writes(filled_submission(NB1)))
    results = intake(subs, tmp_path / "course")[0]
    assert results and all(not r.notebooks for r in results), [(r.name, r.notebooks) for r in results]
