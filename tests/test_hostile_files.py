"""Hostile *files*: one student's malformed notebook or zip member refuses that student only, and nothing of a
student's making reaches a page or a spreadsheet as something that runs.

Fast checks of each piece (reading, intake, the CSV cells, the feedback page's outputs), then ONE autograde run
of a zipped class (notebook 01) that holds every case: a bad CRC, a file and a folder of the same name, nbgrader
metadata that is a string (graded all the same), a folder whose name is a formula, a file name that is a
formula, image outputs whose size metadata is script, a Mermaid output, a written answer that links to
`javascript:` and shows a picture from elsewhere, and a function that reads the hidden tests of the test cell
calling it (through its call stack) for later cells to print. Its feedback pages are opened in Chromium (no
dialog, no console error, no request) and read for the hidden lines in any encoding; its CSVs are read raw.
"""
from __future__ import annotations

import base64
import csv
import json
import re
import zipfile

import nbformat
import pytest
from conftest import filled_submission, solution_sources, write_nb

from grading import notebooks as nbs
from grading.settings import Limits, Settings
from grading.spreadsheet import FORMULA_START, from_cell, read_csv, to_cell, write_csv
from grading.submission import read_any, rebuild

NB = "01_scaled_dot_product_attention"
PNG = base64.b64encode(bytes.fromhex(  # a 1x1 picture: it loads, so an injected onload= would run
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")).decode()
FORMULA_NAME = '=HYPERLINK("example.invalid","click")'  # no slash: it names a folder and a file too


def _raw(nb) -> dict:
    return json.loads(nbformat.writes(nb))


def _string_metadata() -> dict:
    """Notebook 01, filled in, whose first answer cell's nbgrader metadata is a string and second's metadata
    is a string (the attack that stopped the class), and other malformed details."""
    raw = _raw(filled_submission(NB))
    answers = [c for c in raw["cells"] if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("solution")]
    answers[0]["metadata"]["nbgrader"] = "solution"
    answers[1]["metadata"] = "metadata"
    answers[2]["outputs"] = "not a list"
    raw["cells"].append(["not", "a", "cell"])
    raw["cells"].append({"cell_type": "code", "metadata": {}, "source": {"not": "text"}, "outputs": []})
    return raw


# -- reading a malformed notebook ------------------------------------------------------------------------

def test_malformed_metadata_is_read_as_stripped(tmp_path):
    path = tmp_path / f"{NB}.ipynb"
    path.write_text(json.dumps(_string_metadata()))
    repairs: list[str] = []
    result = rebuild(read_any(path, repairs), nbs.read(nbs.RELEASE / f"{NB}.ipynb"))
    graded = {nbs.nbgrader_meta(c)["grade_id"]: c.source for c in result.notebook.cells if nbs.is_solution(c)}
    assert graded == solution_sources(NB)  # every answer found, the two without metadata by their first line
    said = " ".join(repairs)
    for what in ("nbgrader metadata is not a dictionary", "metadata is not a dictionary", "not cells",
                 "source is not text"):
        assert what in said, said
    nbformat.validate(result.notebook)


def test_the_rebuild_reads_malformed_metadata_as_absent():
    """Without the reading's repairs too (a notebook built in memory): metadata of the wrong type is no metadata."""
    assert [nbs.nbgrader_meta(c) for c in ({"metadata": "x"}, {"metadata": {"nbgrader": "x"}}, {}, "cell")] == [{}] * 4
    nb = nbformat.from_dict(_string_metadata())
    nb.cells = [c for c in nb.cells if isinstance(c, dict) and isinstance(c.get("source"), (str, list))]
    result = rebuild(nb, nbs.read(nbs.RELEASE / f"{NB}.ipynb"))
    graded = {nbs.nbgrader_meta(c)["grade_id"]: c.source for c in result.notebook.cells if nbs.is_solution(c)}
    assert graded == solution_sources(NB)


@pytest.mark.parametrize("content, why", [
    ('["a list"]', "not a notebook"),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": "text"}', "cells are not a list"),
    ("[" * 100_000, "RecursionError"),
])
def test_a_file_that_is_no_notebook_is_refused_with_its_reason(tmp_path, content, why):
    from grading.intake import read_submission

    path = tmp_path / f"{NB}.ipynb"
    path.write_text(content)
    nb, problem = read_submission(path)
    assert nb is None and why in problem and "\n" not in problem, problem


# -- intake: one student's broken files refuse that student only -----------------------------------------

def _corrupt(archive, member: str) -> None:
    """Flip a byte of `member`'s stored data: its CRC no longer matches (found when it is read to the end)."""
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo(member)
    data = bytearray(archive.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0xFF
    archive.write_bytes(bytes(data))


def _zip_class(path, members: dict[str, str | bytes], corrupt: str | None = None):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, content in members.items():
            zf.writestr(name, content)
    if corrupt:
        _corrupt(path, corrupt)
    return path


def test_a_broken_zip_member_refuses_only_its_student(tmp_path):
    from grading.intake import intake

    good = nbformat.writes(filled_submission(NB))
    archive = _zip_class(tmp_path / "class.zip", {
        f"class/honest/{NB}.ipynb": good,
        f"class/bad_crc/{NB}.ipynb": good,
        f"class/file_then_folder/{NB}.ipynb": good,
        f"class/file_then_folder/{NB}.ipynb/notes.txt": "a folder where a file is",
        f"class/folder_then_file/{NB}.ipynb/notes.txt": "a folder where a file is",
        f"class/folder_then_file/{NB}.ipynb": good,
    }, corrupt=f"class/bad_crc/{NB}.ipynb")
    results = {r.student: r for r in intake(archive, tmp_path / "course")[0]}
    assert results["honest"].status == "pending" and results["honest"].notebooks == {NB: f"{NB}.ipynb"}
    for student, why in (("bad_crc", "Bad CRC"), ("file_then_folder", "cannot be unpacked"),
                         ("folder_then_file", "cannot be unpacked")):
        notes = results[student].notes
        assert results[student].status == "failed", (student, notes)
        assert len(notes) == 1 and why in notes[0] and f"class/{student}/{NB}.ipynb" in notes[0], notes
    assert not (tmp_path / "course" / "submitted" / "bad_crc").exists()


def test_any_error_while_taking_a_student_in_refuses_only_that_student(tmp_path, monkeypatch):
    """Whatever goes wrong with one student's files (here: the rebuild raises, as it did on string metadata)
    refuses that student, with the file and the problem on one line, and stages nothing of theirs."""
    from grading import intake as intake_module

    def rebuild_that_breaks(student, template):
        if any("BREAK-THE-REBUILD" in "".join(c.get("source", "")) for c in student.cells):
            raise AttributeError("'str' object has no attribute 'get'\nsecond line")
        return rebuild(student, template)

    monkeypatch.setattr(intake_module, "rebuild", rebuild_that_breaks)
    subs = tmp_path / "subs"
    write_nb(filled_submission(NB), subs / "honest" / f"{NB}.ipynb")
    breaks = filled_submission(NB)
    breaks.cells.append(nbformat.v4.new_code_cell("# BREAK-THE-REBUILD"))
    write_nb(breaks, subs / "breaks" / "work" / f"{NB} (1).ipynb")
    (subs / "weird\nname").mkdir()
    write_nb(filled_submission(NB), subs / "weird\nname" / f"{NB}.ipynb")
    results = {r.student: r for r in intake_module.intake(subs, tmp_path / "course")[0]}
    assert results["honest"].status == "pending" and NB in results["honest"].notebooks
    notes = results["breaks"].notes
    assert results["breaks"].status == "failed" and len(notes) == 1, notes
    assert notes[0] == (f"refused: work/{NB} (1).ipynb: could not be rebuilt on the release "
                        "(AttributeError: 'str' object has no attribute 'get')"), notes
    assert not (tmp_path / "course" / "submitted" / "breaks").exists()
    assert results["weird\nname"].status == "failed"


def test_a_string_as_nbgrader_metadata_is_taken_in(tmp_path):
    from grading.intake import intake

    (tmp_path / "subs" / "string_meta").mkdir(parents=True)
    (tmp_path / "subs" / "string_meta" / f"{NB}.ipynb").write_text(json.dumps(_string_metadata()))
    [result], _ = intake(tmp_path / "subs", tmp_path / "course")
    assert result.status == "pending" and NB in result.notebooks, result.notes
    assert any("not a dictionary" in n for n in result.notes), result.notes


# -- CSV cells -----------------------------------------------------------------------------------------------

TRICKY = ["=1+1", "+1", "-1", "@SUM(A1)", "\t=1", "\r=1", "\uff1d1+1", "'=1", "''+x", "'quoted", "plain", "",
          FORMULA_NAME, "a,b;=c", 'say "hi"', "two\nlines"]


def test_csv_cells_never_start_a_formula_and_read_back_as_written(tmp_path):
    path = write_csv(tmp_path / "t.csv", [["name", "score"]] + [[text, -1.5] for text in TRICKY])
    with open(path, newline="") as f:
        cells = [cell for row in csv.reader(f) for cell in row]
    formulas = [c for c in cells if c.startswith(FORMULA_START) and c != "-1.5"]
    assert not formulas, formulas
    assert "-1.5" in path.read_text().splitlines()[1]  # a number is written unquoted: a spreadsheet's number
    assert [(r["name"], r["score"]) for r in read_csv(path)] == [(t, "-1.5") for t in TRICKY]
    assert [from_cell(to_cell(t)) for t in TRICKY] == TRICKY and to_cell(2.0) == 2.0


# -- the feedback page's outputs ------------------------------------------------------------------------------

def test_links_that_would_run_are_defused():
    from grading.feedback import defuse_urls

    page = ('<a href="javascript:alert(1)">a</a><a href=" java\tscript:alert(2)">b</a>'
            '<a href="&#106;avascript:alert(3)">c</a><img src="data:text/html;base64,PHNjcmlwdD4=">'
            "<a href='vbscript:x'>d</a><a href=\"https://example.org/\">e</a><a href=\"#top\">f</a>"
            f'<img src="data:image/png;base64,{PNG}"><a href="mailto:x@example.org">g</a>'
            '<img src="https://example.org/beacon.png"><img src=" http://example.org/b"><video poster="b.png">')
    assert defuse_urls(page) == (  # a link keeps the web's schemes; what is fetched on opening, inline pictures only
        '<a href="#">a</a><a href="#">b</a><a href="#">c</a><img src=""><a href="#">d</a>'
        '<a href="https://example.org/">e</a><a href="#top">f</a>'
        f'<img src="data:image/png;base64,{PNG}"><a href="mailto:x@example.org">g</a>'
        '<img src=""><img src=""><video poster="">')


# -- one graded class that holds every case ---------------------------------------------------------------------

HOSTILE_OUTPUTS = f'''
import base64
from IPython.display import display
_png = "{PNG}"
display({{"image/png": _png, "text/plain": "a picture"}}, raw=True,
        metadata={{"image/png": {{"width": "1 onload=alert('width')//", "height": "1 onload=alert('height')//"}}}})
display({{"image/png": _png}}, raw=True, metadata={{"width": "1 onload=alert('top-level width')//"}})
display({{"text/vnd.mermaid": "<img src=x onerror=alert('mermaid')>", "text/plain": "m"}}, raw=True)
display({{"application/vnd.jupyter.widget-view+json": {{"model_id": "</script><script>alert('widget')</script>"}}}},
        raw=True)

class Hostile:
    def _repr_png_(self):
        return base64.b64decode(_png), {{"width": "1 onload=alert('repr')//"}}
'''
JS_ANSWER = ("[click me](javascript:alert('link')) ![pic](javascript:alert('pic')) "
             "<img src=x onerror=alert('answer')> ![beacon](http://tracker.example/beacon.png) $\\sqrt{d_k}$")


def _hostile_outputs():
    nb = filled_submission(NB, {"q_scaling": JS_ANSWER})
    nb.cells += [nbformat.v4.new_code_cell(HOSTILE_OUTPUTS), nbformat.v4.new_code_cell("Hostile()")]
    return nb


# The function a test cell calls reads that cell (hidden lines included) through its call stack and keeps it; the
# lines reach later cells' outputs, plain and encoded, and the judge's line of every case it is called in.
READS_HIDDEN_TESTS = """
import base64 as _b64, inspect as _inspect, linecache as _linecache
_stashed = []
_attention_loop = attention_loop

def attention_loop(*args, **kwargs):
    for _frame in _inspect.stack():
        _cell = "".join(_linecache.getlines(_frame.filename))
        if "HIDDEN TESTS" in _cell and _cell not in _stashed:
            _stashed.append(_cell)
    if _stashed:
        raise ValueError("LEAK " + _b64.b64encode(_stashed[-1].encode()).decode())
    return _attention_loop(*args, **kwargs)
"""
PRINTS_HIDDEN_TESTS = """
_leak = "".join(_stashed)
print("PLAIN", _leak)
print("B64", _b64.b64encode(_leak.encode()).decode())
raise RuntimeError("ERR " + _b64.b32encode(_leak.encode()).decode())
"""


def _reads_hidden_tests():
    nb = filled_submission(NB, {"attention_loop": solution_sources(NB)["attention_loop"] + READS_HIDDEN_TESTS})
    nb.cells.append(nbformat.v4.new_code_cell(PRINTS_HIDDEN_TESTS))
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory, grading_db):
    from grading.autograde import autograde

    tmp = tmp_path_factory.mktemp("hostile")
    good = nbformat.writes(filled_submission(NB))
    archive = _zip_class(tmp / "class.zip", {
        f"class/control/{NB}.ipynb": good,
        f"class/hostile_outputs/{NB}.ipynb": nbformat.writes(_hostile_outputs()),
        f"class/hostile_outputs/{FORMULA_NAME}.txt": "a file named like a formula",
        f"class/reads_hidden_tests/{NB}.ipynb": nbformat.writes(_reads_hidden_tests()),
        f"class/string_metadata/{NB}.ipynb": json.dumps(_string_metadata()),
        f"class/bad_crc/{NB}.ipynb": good,
        f"class/file_and_folder/{NB}.ipynb": good,
        f"class/file_and_folder/{NB}.ipynb/notes.txt": "a folder where a file is",
        f"class/{FORMULA_NAME}/{NB}.ipynb": good,
    }, corrupt=f"class/bad_crc/{NB}.ipynb")
    out, course_dir = tmp / "out", tmp / "course"
    db_url, workers = grading_db
    results = autograde(archive, out, course_dir=course_dir, db_url=db_url,
                        settings=Settings(Limits(cell_seconds=10, notebook_seconds=120), workers=workers))
    return {"results": {r.student: r for r in results}, "out": out, "course": course_dir,
            "db_url": db_url or f"sqlite:///{course_dir / 'gradebook.db'}"}


def test_the_class_is_graded_around_the_broken_students(graded):
    from grading.autograde import graded_columns

    full = sum(p for s, _, p in graded_columns() if s == NB)
    rows = {r["student"]: r for r in read_csv(graded["out"] / "grades.csv")}
    # a folder named like a formula is graded under a safe id and shown as given (neutralised in the CSV)
    for student in ("control", "hostile_outputs", "string_metadata", FORMULA_NAME):
        assert rows[student]["status"] == "graded", rows[student]
        assert float(rows[student][f"{NB}:total"]) == full, (student, rows[student]["notes"])
    assert "not a dictionary" in rows["string_metadata"]["notes"]
    for student, why in (("bad_crc", "Bad CRC"), ("file_and_folder", "cannot be unpacked")):
        assert rows[student]["status"] == "failed" and why in rows[student]["notes"], rows[student]


def test_no_csv_cell_starts_a_formula(graded):
    for name in ("grades.csv", "failures.csv"):
        with open(graded["out"] / name, newline="") as f:
            cells = [cell for row in csv.reader(f) for cell in row]
        assert not [c for c in cells if c.startswith(FORMULA_START)], name
    rows = {r["student"]: r for r in read_csv(graded["out"] / "grades.csv")}  # read back as written
    assert FORMULA_NAME in rows and f"{FORMULA_NAME}.txt: ignored" in rows["hostile_outputs"]["notes"]


def test_the_results_read_back_from_the_run_are_the_runs(graded):
    """`python -m grading report` builds the class's results again from the outcomes the run recorded (names
    that start a formula among them) and the gradebook: the outputs it writes are the run's."""
    from grading.report import write_outputs
    from grading.results import read_class_results

    before = read_csv(graded["out"] / "grades.csv")
    run = json.loads((graded["out"] / "class_report.json").read_text())["run"]
    write_outputs(graded["out"], read_class_results(graded["out"], graded["db_url"]))
    assert read_csv(graded["out"] / "grades.csv") == before
    report = json.loads((graded["out"] / "class_report.json").read_text())
    assert report["run"] == run and report["totals"].keys() == {"control", "hostile_outputs", "string_metadata",
                                                                 "reads_hidden_tests", FORMULA_NAME}


def test_the_feedback_page_runs_nothing_of_the_students(graded, chromium):
    page_file = graded["out"] / "feedback" / "hostile_outputs" / f"{NB}.html"
    html = page_file.read_text()
    assert f'src="data:image/png;base64,{PNG}' not in html  # no output of the grading run (its pictures)
    dialogs, console_errors, page_errors, requests = [], [], [], []
    page = chromium.new_page()
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(page_file.as_uri(), wait_until="load")
    page.wait_for_timeout(300)
    assert requests == [page_file.as_uri()], requests  # no beacon, no MathJax from a CDN
    assert page.locator("math").count() >= 1 and "[beacon: a picture from elsewhere, not loaded]" in html
    page.get_by_text("click me").click()
    page.wait_for_timeout(1000)
    assert not dialogs, dialogs
    assert not page_errors and not console_errors, (page_errors, console_errors)
    tags = re.findall(r"<[a-zA-Z][^>]*>", html)  # no tag of the page carries a script of the student's
    assert not [t for t in tags if re.search(r"\son\w+\s*=", t, re.I) or "javascript:" in t.lower()]
    assert not [t for t in tags if t.startswith("<script") and "widget" in t]


def test_no_feedback_page_holds_the_hidden_tests_a_function_read(graded):
    """The function read its test cell's hidden lines (the instructor's copy of the run shows it did) and later
    cells printed them plain, base64 and base32, in an exception too, and every case it was called in raised
    them: the student's feedback page holds none of it, and still shows their code and the judge's lines."""
    import base64

    run = nbformat.read(graded["course"] / "autograded" / "reads_hidden_tests" / nbs.ASSIGNMENT / f"{NB}.ipynb",
                        as_version=4)
    printed = "".join(o.get("text", "") for c in run.cells if c.cell_type == "code" for o in c.outputs)
    encoded = printed.split("B64 ", 1)[1].split()[0]
    stash = base64.b64decode(encoded).decode()
    assert "BEGIN HIDDEN TESTS" in stash and 'check("hidden-' in stash, printed[:500]  # the attack worked
    hidden_lines = [line for line in stash.splitlines() if "hidden-" in line]
    outcome = json.loads((graded["out"] / "outcomes" / "reads_hidden_tests.json").read_text())
    assert "LEAK " in json.dumps(outcome["judged"])  # and its cases raised them, in the instructor's records
    errors = [o for c in run.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    error_text = "".join(o.evalue for o in errors)

    html = (graded["out"] / "feedback" / "reads_hidden_tests" / f"{NB}.html").read_text()
    for needle in [*hidden_lines, "BEGIN HIDDEN TESTS", 'check("hidden-', encoded[:40], encoded[-40:],
                   error_text[4:44]]:
        assert needle not in html and needle.replace('"', "&quot;") not in html, needle
    for line in hidden_lines:  # nor any run of the lines' base64 that would decode to them
        assert base64.b64encode(line.strip().encode()).decode()[:24] not in html
    text = re.sub(r"<[^>]+>", "", html)  # the code as shown, without its highlighting's markup
    assert "_stashed.append(_cell)" in text and "\u2717 hidden case 1: raises ValueError" in text
    assert "(hidden tests ran here)" in text
