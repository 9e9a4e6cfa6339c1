"""`python -m grading export OUT --to moodle|canvas`: the files are read back by the LMS's own rules.

The readers below re-implement the importers' parsing (docs/lms.md names the sources):
- Moodle's offline grading worksheet (mod/assign/feedback/offline/importgradeslib.php, init() and next(); the
  skips of locallib.php process_import_grades()): columns found by exact header, `Identifier`, `Grade` and
  `Last modified (grade)` required, the length of "Participant " cut off the identifier, an empty grade skipped;
- Moodle's feedback zip (mod/assign/feedback/file/importziplib.php, is_valid_filename_for_import()): each path
  part split at its first four `_`, [1] a numeric participant id, [2]/[3] a plugin;
- Canvas's gradebook import (app/models/gradebook_importer.rb): Student/ID/SIS User ID/SIS Login ID/Section,
  a /Points Possible/ row, students matched by ID;
- Canvas's re-upload of feedback files (app/models/assignment.rb, generate_comments_from_files() and
  infer_comment_context_from_filename(); lib/zip_extractor.rb): each file by its base name, split at `_`, its
  first two all-digit parts the user id and the attachment id.

The nbgrader exporter plugin (grading/lms_export_plugin.py) writes the same files.

Fast checks build the run by hand (outcomes and a small SQLite gradebook, as tests/test_class_results.py does);
the round trips grade a small Moodle and a small Canvas export once each (notebook 01, as
tests/test_lms_exports.py does) and export them.
"""
from __future__ import annotations

import csv
import re
import shutil
import zipfile
from datetime import datetime
from pathlib import Path

import pytest

from grading import notebooks as nbs
from grading.judge import CaseResult, CellResult, NotebookRecord
from grading.outcome import StudentOutcome

NB = "01_scaled_dot_product_attention"
TASK = "test_attention_loop"
ACCENTED = 'Zoë "Zo" O\'Brien, Jr._x'  # accents, a quote, a comma and an underscore


# -- the importers' rules, re-implemented -----------------------------------------------------------------

def moodle_import(path: Path) -> dict[str, dict]:
    """{participant id: {grade, modified, feedback}} as assignfeedback_offline_grade_importer reads the worksheet;
    a row process_import_grades() would skip for an empty grade has grade None."""
    raw = path.read_bytes()
    assert not raw.startswith(b"\xef\xbb\xbf"), "a BOM would make the first header 'Identifier' fail to match"
    rows = list(csv.reader(raw.decode("utf-8").splitlines()))
    columns = rows[0]
    index = {name: columns.index(name) for name in ("Identifier", "Grade", "Last modified (grade)")
             if name in columns}
    assert len(index) == 3, f"init() fails: columns {columns}"
    feedback = columns.index("Feedback comments")
    assert feedback != 0, "next() reads a feedback column only at a non-zero index (!empty)"
    found = {}
    for record in rows[1:]:
        participant = record[index["Identifier"]][len("Participant "):]
        assert participant.isdigit(), record
        value = record[index["Grade"]]
        found[participant] = {"grade": None if value == "" else float(value),
                              "modified": datetime.fromisoformat(record[index["Last modified (grade)"]]),
                              "feedback": record[feedback], "row": dict(zip(columns, record))}
    return found


def moodle_zip_import(path: Path, participants: set[str]) -> dict[str, list[str]]:
    """{participant id: [file names]} as is_valid_filename_for_import() matches the zip's files."""
    matched: dict[str, list[str]] = {}
    with zipfile.ZipFile(path) as zf:
        for member in zf.namelist():
            base = member.rsplit("/", 1)[-1]
            if member.endswith("/") or base.startswith((".", "~")):
                continue
            parts = member.split("/")
            while parts:
                info = parts.pop(0).split("_", 4)  # PHP explode('_', $pathpart, 5)
                if len(info) < 4 or not info[1].isdigit() or info[1] not in participants:
                    continue
                assert (info[2], info[3]) == ("assignsubmission", "file"), info
                matched.setdefault(info[1], []).append("/".join([info[4] if len(info) == 5 else ""] + parts))
                break
    return matched


def canvas_reupload(path: Path) -> dict[str, set[str]]:
    r"""{user id: {attachment ids}} of the files Canvas's "Re-Upload Submissions" attaches as comments, by its rules:
    ZipExtractor#unzip_files extracts every file under its base name alone into one folder (File.split(name).last:
    two files of one base name would overwrite each other); infer_comment_context_from_filename() splits the base
    name at `_`, takes the first two parts matching /^\d+$/ as user_id and attachment_id, and drops the attachment
    when the last part matches /^link/ or the name /^\._/ (Ruby: ^ and $ at line ends, \d ASCII). A file without
    both is ignored; the rest (the attachment being one of that user's submission) is checked by the caller."""
    found: dict[str, set[str]] = {}
    with zipfile.ZipFile(path) as zf:
        names = [m.rsplit("/", 1)[-1] for m in zf.namelist() if not m.endswith("/")]
    assert len(names) == len(set(names)), f"two files of one base name: one would overwrite the other {names}"
    for filename in names:
        ids = canvas_comment_ids(filename)
        if ids:
            found.setdefault(ids[0], set()).add(ids[1])
    return found


def canvas_comment_ids(filename: str) -> tuple[str, str] | None:
    """(user id, attachment id) as infer_comment_context_from_filename() reads a base name; None: ignored."""
    parts = filename.split("_")
    ids = [part for part in parts if re.search(r"^\d+$", part, re.M | re.A)][:2]
    if re.search("^link", parts[-1], re.M) or re.search(r"^\._", filename, re.M) or len(ids) < 2:
        return None
    return ids[0], ids[1]


def canvas_import(path: Path) -> tuple[list[str], list[str], dict[str, dict]]:
    """(assignment headers, points possible, {user id: {name, grades}}) as GradebookImporter parses the CSV."""
    rows = list(csv.reader(path.read_text(encoding="utf-8").splitlines()))
    header = rows[0]
    assert len(header) > 3 and re.search("Student", header[0]) and re.search("ID", header[1]), header
    student_columns = 3
    if re.search(r"SIS\s+User\s+ID", header[2]) and re.search(r"SIS\s+Login\s+ID", header[3]):
        student_columns += 2
    assert re.search("Section", header[student_columns - 1]), header
    assignments, possible, students = header[student_columns:], [], {}
    for row in rows[1:]:
        if re.search("Points Possible", row[0]):
            possible = row[student_columns:]
            continue
        assert row[1] not in students, f"two rows for {row[1]}"
        students[row[1]] = {"name": row[0], "grades": row[student_columns:]}
    return assignments, possible, students


# -- a run made by hand ------------------------------------------------------------------------------------

def _outcome(student: str, name: str, lms_id: str, status: str = "graded", failing: str | None = None,
             notes: list[str] | None = None, graded_as: str = f"{NB}.ipynb", lms: str = "",
             lms_late: bool = False) -> StudentOutcome:
    cells = []
    for stem, task, points in nbs.graded_columns():
        if stem == NB:
            ok = task != failing
            case = CaseResult(f"{task}-hidden", "hidden case 1", False, ok, "" if ok else "raises", "" if ok else "x")
            cells.append(CellResult(task, points if ok else 0.0, points, [case]))
    judged = [NotebookRecord(student, NB, "finished", "", True, 1.0, [], cells)] if status == "graded" else []
    return StudentOutcome(student, notebooks={NB: graded_as}, status=status, name=name, lms_id=lms_id, lms=lms,
                          notes=list(notes or []), error="boom" if status == "failed" else "", judged=judged,
                          lms_late=lms_late)


def _outcomes() -> list[StudentOutcome]:  # conftest's blank_gradebook scores these (and NB)
    # alice and bob handed in the files of a Canvas download (intake keeps that name: it holds the attachment id)
    return [_outcome("alice", ACCENTED, "101", lms_late=True, graded_as=f"obrienzoe_LATE_101_5001_{NB}.ipynb"),
            _outcome("bob", "Bob Jones", "102", failing=TASK, graded_as=f"jonesbob_102_5002_{NB}-1.ipynb"),
            _outcome("carol", "Carol King", "103", status="failed"),
            _outcome("dave", "dave", "")]  # a folder of his own name: no LMS id


COURSE_POINTS = sum(p for *_, p in nbs.graded_columns() + nbs.written_columns())


def _nb01_points() -> float:
    return sum(p for stem, _, p in nbs.graded_columns() if stem == NB)


@pytest.fixture
def run(blank_gradebook, tmp_path) -> dict:
    """OUT as autograde's report step writes it (outcomes, feedback pages) and the run's gradebook."""
    from grading.report import report

    shutil.copy(blank_gradebook, tmp_path / "gradebook.db")
    course = tmp_path / "course"
    for student in ("alice", "bob"):
        pages = course / "feedback" / student / nbs.ASSIGNMENT
        pages.mkdir(parents=True)
        (pages / f"{NB}.html").write_text(f"<html><title>{NB}</title><body>{student}</body></html>")
    db_url, out = f"sqlite:///{tmp_path / 'gradebook.db'}", tmp_path / "out"
    report(out, course, _outcomes(), {}, [], db_url)
    return {"out": out, "db_url": db_url}


def _export(run: dict, to: str, *extra: str, code: int = 0) -> None:
    from grading.__main__ import main

    assert main(["export", str(run["out"]), "--to", to, "--db", run["db_url"], *extra]) == code


def _give_by_hand(db_url: str, student: str, task: str, score: float) -> None:
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        gb.find_grade(task, NB, nbs.ASSIGNMENT, student).manual_score = score
        gb.db.commit()


def _bob_points() -> float:
    return _nb01_points() - dict(((s, t), p) for s, t, p in nbs.graded_columns())[(NB, TASK)]


def test_moodle_worksheet_and_feedback_zip_read_back(run, capsys):
    _export(run, "moodle")
    printed = capsys.readouterr().out
    dest = run["out"] / "moodle"
    for name in ("grading_worksheet.csv", "feedback_files.zip", "not_exported.csv"):
        assert str(dest / name) in printed
    grades = moodle_import(dest / "grading_worksheet.csv")
    assert set(grades) == {"101", "102", "103"}
    assert grades["101"]["grade"] == _nb01_points()
    assert grades["102"]["grade"] == _bob_points()
    assert grades["103"]["grade"] is None, "a student whose grading failed is not graded, never 0"
    assert "not graded" in grades["103"]["feedback"]
    assert grades["101"]["row"]["Full name"] == ACCENTED, "the name survives accents, quotes and commas"
    assert "late" in grades["101"]["feedback"] and "late" in grades["101"]["row"]["Status"]
    assert "late" not in grades["102"]["feedback"]
    assert float(grades["101"]["row"]["Maximum grade"]) == COURSE_POINTS == 138, "test cells and written answers"
    lms_doc = (nbs.ROOT / "docs" / "lms.md").read_text(encoding="utf-8")  # what the instructors' page says of it
    assert f"maximum to {COURSE_POINTS:g} (or" in lms_doc and f"the course's maximum, {COURSE_POINTS:g} (" in lms_doc
    assert all("\n" not in g["feedback"] for g in grades.values())
    assert abs((datetime.now(grades["101"]["modified"].tzinfo) - grades["101"]["modified"]).total_seconds()) < 120

    files = moodle_zip_import(dest / "feedback_files.zip", set(grades))
    # the importer puts back an empty rest of the folder's name: "/<file>", a file at the root of the feedback area
    assert files == {"101": [f"/{NB}.html"], "102": [f"/{NB}.html"]}, files
    with zipfile.ZipFile(dest / "feedback_files.zip") as zf:
        folder = next(n for n in zf.namelist() if "_101_" in n).split("/")[0]
        assert folder == "Zoë Zo O'Brien, Jr. x_101_assignsubmission_file_", folder
        assert b"alice" in zf.read(f"{folder}/{NB}.html")

    with open(dest / "not_exported.csv", newline="", encoding="utf-8") as f:
        missing = list(csv.DictReader(f))
    assert [(r["id"], r["name"]) for r in missing] == [("dave", "dave")]
    assert "no LMS id" in missing[0]["reason"]


def test_an_override_in_the_gradebook_is_exported(run):
    _give_by_hand(run["db_url"], "bob", TASK, 2.0)
    _export(run, "moodle")
    grades = moodle_import(run["out"] / "moodle" / "grading_worksheet.csv")
    assert grades["102"]["grade"] == _bob_points() + 2.0
    assert "(autograded and graded by hand)" in grades["102"]["feedback"], "a person's score is not the grader's"
    assert "(autograded)" in grades["101"]["feedback"]
    _export(run, "canvas")
    _, _, students = canvas_import(run["out"] / "canvas" / "gradebook_import.csv")
    assert float(students["102"]["grades"][0]) == _bob_points() + 2.0


def test_canvas_gradebook_csv_reads_back(run, capsys):
    _export(run, "canvas", "--assignment", "Attention (4242)")
    assert str(run["out"] / "canvas" / "gradebook_import.csv") in capsys.readouterr().out
    assignments, possible, students = canvas_import(run["out"] / "canvas" / "gradebook_import.csv")
    total = sum(p for *_, p in nbs.graded_columns() + nbs.written_columns())
    assert assignments == ["Attention (4242)"] and [float(p) for p in possible] == [total]
    assert set(students) == {"101", "102", "103"}
    assert float(students["101"]["grades"][0]) == _nb01_points()
    assert float(students["102"]["grades"][0]) == _bob_points()
    assert students["103"]["grades"] == [""], "a student whose grading failed is not graded, never 0"
    assert students["101"]["name"] == ACCENTED
    with open(run["out"] / "canvas" / "students.csv", newline="", encoding="utf-8") as f:
        late = {r["ID"]: r["late"] for r in csv.DictReader(f)}
    assert late == {"101": "yes", "102": "", "103": ""}
    assert "dave" in (run["out"] / "canvas" / "not_exported.csv").read_text(encoding="utf-8")
    reupload = run["out"] / "canvas" / "feedback_files.zip"
    assert canvas_reupload(reupload) == {"101": {"5001"}, "102": {"5002"}}, "the ids intake kept of their files"
    with zipfile.ZipFile(reupload) as zf:
        assert b"alice" in zf.read(f"ZoZoOBrienJrx_101_5001_{NB}.html") and len(zf.namelist()) == 2

    _export(run, "canvas", "--percent")
    _, _, students = canvas_import(run["out"] / "canvas" / "gradebook_import.csv")
    assert students["101"]["grades"] == [f"{round(100 * _nb01_points() / total, 2):g}%"]
    assert students["103"]["grades"] == [""]


def test_a_canvas_student_without_an_attachment_id_keeps_the_grade_and_is_listed(run):
    """Bob's notebook was not a file of Canvas's download (no attachment id in its name): his grade is imported,
    his page cannot be re-uploaded, and not_exported.csv says so."""
    from grading.outcome import write_outcome

    write_outcome(run["out"] / "outcomes", _outcome("bob", "Bob Jones", "102", failing=TASK))
    _export(run, "canvas")
    dest = run["out"] / "canvas"
    _, _, students = canvas_import(dest / "gradebook_import.csv")
    assert float(students["102"]["grades"][0]) == _bob_points()
    assert canvas_reupload(dest / "feedback_files.zip") == {"101": {"5001"}}
    with open(dest / "not_exported.csv", newline="", encoding="utf-8") as f:
        missing = {r["id"]: r for r in csv.DictReader(f)}
    assert set(missing) == {"bob", "dave"}, missing
    assert "no Canvas attachment id" in missing["bob"]["reason"] and NB in missing["bob"]["reason"]
    assert float(missing["bob"]["grade"]) == _bob_points()


def _give_extra_credit(db_url: str, student: str, task: str, points: float) -> None:
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        gb.find_grade(task, NB, nbs.ASSIGNMENT, student).extra_credit = points
        gb.db.commit()


def test_a_grade_above_moodles_maximum_is_not_written(run):
    """Moodle's import skips a grade above the assignment's maximum: with extra credit from formgrader alice is
    over it, so her grade is left empty (Moodle leaves it alone) and not_exported.csv names her and why."""
    _give_extra_credit(run["db_url"], "alice", TASK, COURSE_POINTS)
    for extra, top in (((), COURSE_POINTS), (("--percent",), 100.0)):
        _export(run, "moodle", *extra)
        dest = run["out"] / "moodle"
        grades = moodle_import(dest / "grading_worksheet.csv")
        assert {float(g["row"]["Maximum grade"]) for g in grades.values()} == {top}
        assert grades["101"]["grade"] is None, "a grade above the maximum is written"
        assert all(g["grade"] is None or g["grade"] <= top for g in grades.values())
        assert grades["102"]["grade"] is not None
        with open(dest / "not_exported.csv", newline="", encoding="utf-8") as f:
            missing = {r["id"]: r["reason"] for r in csv.DictReader(f)}
        assert set(missing) == {"alice", "dave"} and f"above the maximum {top:g}" in missing["alice"], missing


def test_two_students_with_one_id_are_refused(run, capsys):
    from grading.lms_export import ExportError, export
    from grading.outcome import write_outcome
    from grading.results import read_class_results

    write_outcome(run["out"] / "outcomes", _outcome("erin", "Erin Twin", "102", status="no notebooks"))
    with pytest.raises(ExportError, match="102"):
        export(run["out"], read_class_results(run["out"], run["db_url"]), "moodle")
    _export(run, "canvas", code=2)
    assert "share an LMS id" in capsys.readouterr().err
    assert not (run["out"] / "canvas").exists() and not (run["out"] / "moodle").exists()


def test_an_id_from_the_other_lms_is_never_written_as_an_id(run):
    """A Moodle participant id is no Canvas user id, nor the reverse: the number may be someone else's. alice and
    bob came from Canvas's download, carol from Moodle's with participant id 101, the number of alice's Canvas
    user id: each LMS's files hold only the ids read from its own names, and not_exported.csv lists the others."""
    from grading.outcome import write_outcome

    outcomes = run["out"] / "outcomes"
    write_outcome(outcomes, _outcome("alice", ACCENTED, "101", lms_late=True, lms="canvas",
                                     graded_as=f"obrienzoe_LATE_101_5001_{NB}.ipynb"))
    write_outcome(outcomes, _outcome("bob", "Bob Jones", "102", failing=TASK, lms="canvas",
                                     graded_as=f"jonesbob_102_5002_{NB}-1.ipynb"))
    write_outcome(outcomes, _outcome("carol", "Carol King", "101", status="failed", lms="moodle"))

    def not_exported(to: str) -> dict[str, str]:
        with open(run["out"] / to / "not_exported.csv", newline="", encoding="utf-8") as f:
            return {r["id"]: r["reason"] for r in csv.DictReader(f)}

    _export(run, "canvas")
    _, _, students = canvas_import(run["out"] / "canvas" / "gradebook_import.csv")
    assert {i: s["name"] for i, s in students.items()} == {"101": ACCENTED, "102": "Bob Jones"}
    assert float(students["101"]["grades"][0]) == _nb01_points(), "alice's grade, not carol's"
    with open(run["out"] / "canvas" / "students.csv", newline="", encoding="utf-8") as f:
        assert sorted(r["id"] for r in csv.DictReader(f)) == ["alice", "bob"]
    assert canvas_reupload(run["out"] / "canvas" / "feedback_files.zip") == {"101": {"5001"}, "102": {"5002"}}
    missing = not_exported("canvas")
    assert set(missing) == {"carol", "dave"}, missing
    assert "participant id from a Moodle export, not a Canvas user id" in missing["carol"]

    _export(run, "moodle")
    grades = moodle_import(run["out"] / "moodle" / "grading_worksheet.csv")
    assert set(grades) == {"101"} and grades["101"]["row"]["Full name"] == "Carol King"
    assert grades["101"]["grade"] is None, "carol's grading failed: not alice's grade"
    assert moodle_zip_import(run["out"] / "moodle" / "feedback_files.zip", {"101", "102"}) == {}, "no page of alice"
    missing = not_exported("moodle")
    assert set(missing) == {"alice", "bob", "dave"}, missing
    assert all("user id from a Canvas export, not a Moodle participant id" in missing[s] for s in ("alice", "bob"))


def test_an_id_read_from_both_lmss_names_is_written_for_neither(run):
    from grading.outcome import write_outcome

    write_outcome(run["out"] / "outcomes", _outcome("bob", "Bob Jones", "102", failing=TASK, lms="moodle and canvas"))
    for to in ("moodle", "canvas"):
        _export(run, to)
        with open(run["out"] / to / "not_exported.csv", newline="", encoding="utf-8") as f:
            missing = {r["id"]: r["reason"] for r in csv.DictReader(f)}
        assert "read from both Moodle's and Canvas's file names" in missing["bob"], missing


def test_intake_records_which_lms_each_id_was_read_from(tmp_path):
    """Moodle's folders and flat files give participant ids, Canvas's files user ids; a folder of a name alone
    gives none. The outcome keeps which, the run's join keeps it, and an outcome written before reads as ""."""
    import json
    from dataclasses import asdict

    from conftest import filled_submission, write_nb

    from grading.intake import intake
    from grading.outcome import joined

    subs = tmp_path / "class"
    write_nb(filled_submission(NB), subs / "Ann Lee_2001_assignsubmission_file" / f"{NB}.ipynb")
    write_nb(filled_submission(NB), subs / f"Bo Yu_2002_assignsubmission_file_{NB}.ipynb")
    write_nb(filled_submission(NB), subs / f"smithjohn_LATE_12345_67890_{NB}.ipynb")
    write_nb(filled_submission(NB), subs / "dave" / f"{NB}.ipynb")
    results = {r.name: r for r in intake(subs, tmp_path / "course")[0]}
    assert {n: (r.lms_id, r.lms) for n, r in results.items()} == {
        "Ann Lee": ("2001", "moodle"), "Bo Yu": ("2002", "moodle"), "smithjohn": ("12345", "canvas"),
        "dave": ("", "")}, {n: r.notes for n, r in results.items()}
    ann = results["Ann Lee"]
    assert joined(ann, StudentOutcome(ann.student, status="graded")).lms == "moodle"
    old = {k: v for k, v in asdict(ann).items() if k != "lms"}  # an outcome file of a run before the field
    assert StudentOutcome.from_dict(json.loads(json.dumps(old))).lms == ""


def test_grades_csv_leaves_a_student_not_graded_empty_and_writes_points_as_floats(tmp_path):
    """A student with no notebook (or whose grading failed) has no points: empty cells, not 0.0, as the export
    leaves their grade empty. A graded student with no written answer pending has 0.0 pending, as every other
    points cell is written (never 0)."""
    from grading.report import write_grades
    from grading.results import class_results

    written = {(stem, task): points for stem, task, points in nbs.written_columns()}
    outcomes = [_outcome("alice", "Alice", "1"), _outcome("bob", "Bob", "2"),
                _outcome("erin", "Erin", "3", status="no notebooks"), _outcome("carol", "Carol", "4", status="failed")]
    tests = {(stem, task): points for stem, task, points in nbs.graded_columns() if stem == NB}
    results = class_results(outcomes, {"alice": {**tests, **written}, "bob": dict(tests)})
    path = write_grades(tmp_path, results)
    with open(path, newline="", encoding="utf-8") as f:
        rows = {r[2]: r for r in csv.reader(f)}
    header = rows.pop("id")
    cell = {student: dict(zip(header, row)) for student, row in rows.items()}
    for student in ("erin", "carol"):
        points = [c for c in header if ":" in c or c in ("total", "written_pending")]
        assert {cell[student][c] for c in points} == {""}, cell[student]
        assert cell[student]["max_total"] == str(results.max_total())
    assert cell["alice"]["written_pending"] == "0.0"
    assert float(cell["alice"]["total"]) == sum(tests.values()) + sum(written.values())
    assert float(cell["bob"]["written_pending"]) == sum(written.values()) and "." in cell["bob"]["written_pending"]
    assert cell["bob"][f"{NB}:total"] == str(float(sum(tests.values())))


# -- round trips: an LMS's export, graded, exported back ---------------------------------------------------

def _export_graded(graded: dict, to: str, grading_db, status: int = 0) -> Path:
    from grading.__main__ import main

    db_url = grading_db[0]
    where = ["--db", db_url] if db_url else ["--course", str(graded["out"].parent / "course")]
    assert main(["export", str(graded["out"]), "--to", to, *where]) == status
    return graded["out"] / to


def test_moodle_round_trip(moodle_graded, grading_db, capsys):
    dest = _export_graded(moodle_graded, "moodle", grading_db)
    grades = moodle_import(dest / "grading_worksheet.csv")
    given = {lms_id: name for name, lms_id in moodle_graded["students"]}
    assert set(grades) == set(given)
    for lms_id, row in grades.items():
        assert row["grade"] == _nb01_points(), row
        assert row["row"]["Full name"].lstrip("'") == given[lms_id]  # a formula-like name is quoted, as grades.csv
    assert set(moodle_zip_import(dest / "feedback_files.zip", set(grades))) == set(given)

    # the instructor's slip, --to canvas: Moodle's participant ids are no Canvas user ids, none is written, and
    # the command fails (1), saying so, rather than leave a file of headers to import
    dest = _export_graded(moodle_graded, "canvas", grading_db, status=1)
    assert "no student of" in capsys.readouterr().err
    assert sorted(p.name for p in dest.iterdir()) == ["not_exported.csv"], "a file to upload by mistake was written"
    with open(dest / "not_exported.csv", newline="", encoding="utf-8") as f:
        reasons = [r["reason"] for r in csv.DictReader(f)]
    assert len(reasons) == len(given) and all("participant id from a Moodle export" in r for r in reasons), reasons


def test_canvas_round_trip(canvas_graded, grading_db, capsys):
    dest = _export_graded(canvas_graded, "canvas", grading_db)
    _, _, students = canvas_import(dest / "gradebook_import.csv")
    given = {lms_id: name for name, lms_id in canvas_graded["students"]}
    assert {i: s["name"] for i, s in students.items()} == given
    assert all(float(s["grades"][0]) == _nb01_points() for s in students.values())
    with open(dest / "students.csv", newline="", encoding="utf-8") as f:
        assert {r["ID"]: r["late"] for r in csv.DictReader(f)} == {"12345": "", "678": "yes"}

    # the feedback pages come back to the files the students handed in: the ids of the export's own names
    from test_lms_exports import CANVAS

    from grading.intake import canvas_ids
    from grading.outcome import read_outcomes

    handed_in: dict[str, set[str]] = {}
    for members in CANVAS.values():
        for name in members:
            ids = canvas_comment_ids(name)
            if name.endswith(".ipynb") and ids:
                handed_in.setdefault(ids[0], set()).add(ids[1])
    kept: dict[str, set[str]] = {}
    for outcome in read_outcomes(canvas_graded["out"] / "outcomes").values():
        for graded_as in outcome.notebooks.values():
            user, attachment = canvas_ids(graded_as) or ("", "")
            kept.setdefault(user, set()).add(attachment)
    assert handed_in == {"12345": {"67890"}, "678": {"999"}}
    assert canvas_reupload(dest / "feedback_files.zip") == kept == handed_in

    # the instructor's slip, --to moodle: Canvas's user ids are no Moodle participant ids, none is written
    dest = _export_graded(canvas_graded, "moodle", grading_db, status=1)
    assert "could be exported to Moodle" in capsys.readouterr().err
    assert sorted(p.name for p in dest.iterdir()) == ["not_exported.csv"], "a file to upload by mistake was written"
    with open(dest / "not_exported.csv", newline="", encoding="utf-8") as f:
        reasons = [r["reason"] for r in csv.DictReader(f)]
    assert len(reasons) == len(given) and all("user id from a Canvas export" in r for r in reasons), reasons


def test_the_nbgrader_exporter_writes_the_same_files(run):
    """`nbgrader export --exporter=grading.lms_export_plugin.LmsExport`: the plugin, given nbgrader's open
    gradebook, writes what `python -m grading export` writes."""
    from nbgrader.api import Gradebook
    from traitlets.config import Config

    from grading.lms_export_plugin import LmsExport

    config = Config()
    config.LmsExport.out = str(run["out"])
    config.LmsExport.lms = "canvas"
    with Gradebook(run["db_url"]) as gb:
        LmsExport(config=config).export(gb)
    _, _, students = canvas_import(run["out"] / "canvas" / "gradebook_import.csv")
    assert float(students["102"]["grades"][0]) == _bob_points() and students["103"]["grades"] == [""]
    plugin_file = (run["out"] / "canvas" / "gradebook_import.csv").read_bytes()
    _export(run, "canvas")
    assert (run["out"] / "canvas" / "gradebook_import.csv").read_bytes() == plugin_file


def test_late_work_by_the_stated_rule_in_grades_and_both_exports(run, tmp_path, capsys):
    """Due 2026-12-01 23:59, 10 % a day up to 50 %. Moodle's grading worksheet says alice handed in 34 hours late
    (two days, a part of a day counting as one) and bob 9 hours late, but bob has an extension: alice loses 20 % of
    her total in grades.csv and both exports, which say why; bob nothing. A penalty waived by hand in the extensions
    file counts at the next report, with no option given again; a rule that is no rule changes nothing."""
    from grading.__main__ import main
    from grading.late import POLICY_FILE
    from grading.spreadsheet import read_csv

    worksheet, extensions = tmp_path / "worksheet.csv", tmp_path / "extensions.csv"
    moodle_time = "%A, %d %B %Y, %I:%M %p"  # Moodle's userdate(), English
    with open(worksheet, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["Identifier", "Full name", "Status", "Last modified (submission)"],
                                 ["Participant 101", ACCENTED, "Submitted for grading",
                                  datetime(2026, 12, 3, 10, 0).strftime(moodle_time)],
                                 ["Participant 102", "Bob Jones", "Submitted for grading",
                                  datetime(2026, 12, 2, 9, 0).strftime(moodle_time)],
                                 ["Participant 103", "Carol King", "No submission", "-"]])
    extensions.write_text("student,due,penalty\nBob Jones,2026-12-02 23:59,\n", encoding="utf-8")
    assert main(["report", str(run["out"]), "--db", run["db_url"], "--due", "2026-12-01 23:59",
                 "--late-penalty", "10%/day, max 50%", "--extensions", str(extensions), "--submitted",
                 str(worksheet)]) == 0
    rows = {r["id"]: r for r in read_csv(run["out"] / "grades.csv")}
    alice, bob = rows["alice"], rows["bob"]
    assert float(alice["late_penalty"]) == pytest.approx(0.2 * float(alice["total"])), alice
    assert float(alice["final"]) == pytest.approx(0.8 * float(alice["total"])), alice
    assert alice["late"].startswith("handed in 2026-12-03 10:00, 2 days late (due 2026-12-01 23:59)"), alice["late"]
    assert bob["late"] == "handed in 2026-12-02 09:00, on time (due 2026-12-02 23:59, your extension)", bob["late"]
    assert (float(bob["late_penalty"]), bob["final"]) == (0.0, bob["total"]), bob
    for to in ("moodle", "canvas"):
        _export(run, to)
    grades = moodle_import(run["out"] / "moodle" / "grading_worksheet.csv")
    assert grades["101"]["grade"] == pytest.approx(0.8 * _nb01_points()) and grades["102"]["grade"] == _bob_points()
    assert "2 days late" in grades["101"]["feedback"] and "late penalty" in grades["101"]["feedback"]
    assert "late" not in grades["102"]["feedback"] and "late" not in grades["102"]["row"]["Status"]
    _, _, students = canvas_import(run["out"] / "canvas" / "gradebook_import.csv")
    assert float(students["101"]["grades"][0]) == pytest.approx(0.8 * _nb01_points())
    assert float(students["102"]["grades"][0]) == _bob_points()

    extensions.write_text("student,due,penalty\nBob Jones,2026-12-02 23:59,\n101,,0\nBob Jnes,2026-12-09 23:59,\n",
                          encoding="utf-8")
    recorded = (run["out"].parent / "course" / POLICY_FILE).read_text()
    for rule, why in (("ten a day", "is not a rule"), ("150%/day", "at most 100")):
        assert main(["report", str(run["out"]), "--db", run["db_url"], "--late-penalty", rule]) == 2
        assert why in capsys.readouterr().err
    assert (run["out"].parent / "course" / POLICY_FILE).read_text() == recorded, "a refused rule was recorded"
    assert main(["report", str(run["out"]), "--db", run["db_url"]]) == 0
    said = capsys.readouterr().err  # a typo in the extensions file is said, not silently dropped
    assert "'Bob Jnes' is no student of the class" in said, said
    assert "no submission time for 1 graded student(s) (dave)" in said, said  # dave has no LMS id: not in Moodle's
    alice = {r["id"]: r for r in read_csv(run["out"] / "grades.csv")}["alice"]
    assert (float(alice["late_penalty"]), alice["final"]) == (0.0, alice["total"]), alice
    assert alice["late"].endswith("late penalty set by your instructor: 0 points"), alice["late"]
    assert main(["report", str(run["out"]), "--db", run["db_url"], "--extensions", "", "--late-penalty", "zero"]) == 0
    alice = {r["id"]: r for r in read_csv(run["out"] / "grades.csv")}["alice"]
    assert float(alice["final"]) == 0.0 and alice["late"].endswith("late work gets 0"), alice
