"""What grading notes about a student fits a spreadsheet: a folder of 20 000 extra files is one note, not 20 000
(their notes made a cell of 820 000 characters), and a cell of grades.csv or failures.csv holds at most MAX_TEXT
characters (a spreadsheet's cell holds 32 767), the notes cut with a pointer to the outcome file that has them all.
"""
from __future__ import annotations

import contextlib
import csv
import json

from conftest import filled_submission, write_nb

from grading.intake import MAX_FILES_NOTED, intake
from grading.outcome import FOLDER, StudentOutcome
from grading.report import report
from grading.spreadsheet import CUT, MAX_TEXT, read_csv, to_cell

NB = "01_scaled_dot_product_attention"


def test_twenty_thousand_extra_files_are_one_note(tmp_path):
    subs = tmp_path / "subs"
    for student, extra in (("hoarder", 20_000), ("tidy", 3)):
        write_nb(filled_submission(NB), subs / student / f"{NB}.ipynb")
        (subs / student / "data").mkdir()
        for i in range(extra):
            (subs / student / "data" / f"part{i:05}.txt").touch()
    results = {r.student: r for r in intake(subs, tmp_path / "course")[0]}
    hoarder, tidy = results["hoarder"], results["tidy"]
    assert hoarder.status == "pending" and NB in hoarder.notebooks, hoarder.notes[:3]
    assert len(hoarder.notes) == 1 and len(hoarder.notes[0]) < 1000, (len(hoarder.notes), hoarder.notes[:2])
    assert hoarder.notes[0].startswith("20000 files: ignored (not a notebook); the first 10: data/part00000.txt, ")
    assert hoarder.notes[0].count("data/part") == MAX_FILES_NOTED, hoarder.notes[0]
    assert tidy.notes == [f"data/part{i:05}.txt: ignored (not a notebook)" for i in range(3)], tidy.notes


def test_every_cell_of_the_grades_table_fits_a_spreadsheet(tmp_path, monkeypatch):
    """Notes of 300 000 characters and a name of 40 000 (a zip member's name may be 65 535 bytes) are cut to fit;
    the notes cell ends by saying where all of them are, and that outcome file has them all."""
    import nbgrader.api

    # nobody here was graded, so no score is read: an empty gradebook would only cost its creation (~20 s)
    monkeypatch.setattr(nbgrader.api, "Gradebook", contextlib.nullcontext)
    notes = [f"note {i}: " + "x" * 990 for i in range(300)]
    long_name = "N" * 40_000
    outcomes = [StudentOutcome(student="verbose", status="no notebooks", notes=notes),
                StudentOutcome(student="longname-0123456789", name=long_name, status="no notebooks", notes=["ok"])]
    out = tmp_path / "out"
    report(out, tmp_path / "course", outcomes, {}, [], "sqlite:///unused.db")
    for table in ("grades.csv", "failures.csv"):
        with open(out / table, newline="", encoding="utf-8") as f:
            longest = max(len(cell) for row in csv.reader(f) for cell in row)
        assert longest <= MAX_TEXT + 1, f"{table}: a cell of {longest} characters"  # +1: a formula's quote
    rows = {r["id"]: r for r in read_csv(out / "grades.csv")[1:]}
    cell = rows["verbose"]["notes"]
    assert cell.startswith("note 0: ") and cell.endswith(f" more, all in {FOLDER}/verbose.json"), cell[-100:]
    kept = cell.count(" | ")  # the notes kept, each followed by a separator
    assert cell.split(" | ")[-1] == f"… {300 - kept} more, all in {FOLDER}/verbose.json", cell[-100:]
    assert json.loads((out / FOLDER / "verbose.json").read_text())["notes"] == notes, "the full notes are not in OUT"
    assert rows["longname-0123456789"]["student"] == long_name[:MAX_TEXT - len(CUT)] + CUT
    assert rows["longname-0123456789"]["notes"] == "ok"


def test_a_cut_cell_still_cannot_start_a_formula():
    cell = to_cell("=HYPERLINK(" + "x" * 50_000)
    assert cell.startswith("'=HYPERLINK(") and cell.endswith(CUT) and len(cell) == MAX_TEXT + 1, cell[:20]
