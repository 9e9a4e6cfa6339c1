"""Grades and feedback back into the LMS the class came from: `python -m grading export OUT --to moodle|canvas`.

Written from one `ClassResults` (grading/results.py), built by `read_class_results`: the run's outcomes in OUT
and the gradebook's points at export time, so a score a person gave in formgrader since the run is exported.
Who each student is comes from intake alone (the outcome's `name` and `lms_id`, read from the export's file
names, and `lms`, whose names they were): a student without an LMS id, or with the other LMS's id (a Moodle
participant id is no Canvas user id, nor the reverse: it may be someone else's), is listed in `not_exported.csv`
with the reason, never dropped nor written under that id, and two students with one id refuse the export
(`ExportError`). A student whose grading failed (or who handed in no notebook) is exported with an empty grade,
never 0: Moodle's import skips an empty grade, Canvas's clears a score already in its gradebook (docs/lms.md).
Each file is read by the LMS's own importer; docs/lms.md describes the formats and the source each follows.

Moodle (OUT/moodle/):
- `grading_worksheet.csv`, the offline grading worksheet as mod/assign/feedback/offline/importgradeslib.php
  (`assignfeedback_offline_grade_importer`) reads it: columns looked up by their exact header, of which
  `Identifier`, `Grade` and `Last modified (grade)` are required (init() fails without any of them);
  `Identifier` is `Participant <id>`, the importer strips the length of the string 'hiddenuser' ("Participant ")
  and maps the rest with get_user_id_for_uniqueid (the participant id of the download's folder names);
  `Feedback comments` is the comments plugin's editor field (never the first column: next() skips index 0).
  `Last modified (grade)` goes through strtotime(): process_import_grades() (locallib.php) skips a grade that
  changed in Moodle more than 60 s after it, unless "Allow updating records modified more recently in Moodle"
  is ticked; an empty grade, or one above the assignment's maximum, is skipped. `Maximum grade` is the course's
  whole maximum (test cells and written answers) or 100 with --percent; a grade above it (extra credit given in
  formgrader) is left empty and the student listed in `not_exported.csv`, never written for Moodle to skip.
  UTF-8 without a BOM (parsecsv() loads it as 'utf-8', 'comma'; headers are compared exactly).
- `feedback_files.zip`, for "Upload multiple feedback files in a zip": one folder per student named
  `<Full Name>_<participant id>_assignsubmission_file_` as mod/assign/feedback/file/importziplib.php
  (`is_valid_filename_for_import`) reads it: the folder name is split at its first four `_` (explode('_', ..., 5)),
  [1] must be the numeric participant id and [2]_[3] a plugin, so the name holds no `_` (Moodle's own download
  replaces them with spaces too).

Canvas (OUT/canvas/):
- `gradebook_import.csv`, as Canvas's GradebookImporter (app/models/gradebook_importer.rb) reads it: a header
  `Student, ID, SIS User ID, SIS Login ID, Section, <assignment>` (row[0] =~ /Student/, row[1] =~ /ID/, then the
  SIS columns and Section), a row whose first cell matches /Points Possible/, then one row per student matched by
  `ID` (the Canvas user id of the download's file names). The assignment's header is `Name (id)` as Canvas
  exports it (`--assignment`; Assignment.title_and_id), or a title it matches by name.
- `feedback_files.zip`, for the assignment's "Re-Upload Submissions" (Assignment#generate_comments_from_files,
  app/models/assignment.rb): Canvas unpacks every file by its base name alone (lib/zip_extractor.rb), splits
  the name at `_` and takes its first two all-digit parts as the user id and the attachment id, which must be
  a file of that user's submission (infer_comment_context_from_filename). So each feedback page is at the zip's
  root as `<lastfirst>_<user id>_<attachment id>_<page>`, the attachment id of the notebook's file as the
  student handed it in (intake keeps the download's name of it). A student with pages but no attachment id
  (a submission not from Canvas's download) keeps their grade in the CSV and is listed in `not_exported.csv`.
- `students.csv`: who was exported with their late flag (the import CSV has no column for it: any column after
  Section is read as an assignment).
"""
from __future__ import annotations

import html
import re
import shutil
import zipfile
from datetime import datetime, timezone
from pathlib import Path

from .intake import CANVAS, MOODLE, canvas_ids
from .notebooks import ASSIGNMENT
from .outcome import Status
from .results import ClassResults, StudentResult
from .spreadsheet import write_csv

LMS = ("moodle", "canvas")
NOT_EXPORTED = "not_exported.csv"
# Moodle's English strings (mod/assign/lang/en/assign.php: recordid, hiddenuser, lastmodifiedgrade; core grade;
# mod/assign/feedback/comments/lang/en/assignfeedback_comments.php: pluginname), which the importer compares exactly
PARTICIPANT = "Participant "  # get_string('hiddenuser', 'assign'), whose length is cut off `Identifier` on import
MOODLE_HEADER = ["Identifier", "Full name", "Status", "Grade", "Maximum grade", "Last modified (grade)",
                 "Feedback comments"]
CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
POINTS_POSSIBLE = "    Points Possible"  # Canvas's export writes it so; its importer matches /Points Possible/


class ExportError(ValueError):
    """The class cannot be exported as it is (two students with one LMS id)."""


def late(student: StudentResult) -> bool:
    """Late under the class's policy (`grading.late`): by the submission times, or by the LMS's own mark."""
    return student.lateness.late


# why an id read from one LMS's names is not written into the other's files: (read from, exported to) -> reason
FOREIGN_ID = {(MOODLE, CANVAS): "participant id from a Moodle export, not a Canvas user id",
              (CANVAS, MOODLE): "user id from a Canvas export, not a Moodle participant id"}


NO_OWN_FILE = ("no file of its own (each file read as this student's reads as another's too): its id may be a "
               "classmate's, not written (a person decides whose the files are)")


def foreign_id(s: StudentResult, to: str) -> str | None:
    """Why the student's LMS id is not one of `to`'s (read from the other LMS's names), else None. An outcome
    that does not say whose id it is (`lms` "": written before it was recorded) is taken as it is."""
    lms = s.outcome.lms
    if lms in ("", to):
        return None
    if (lms, to) in FOREIGN_ID:
        return (f"{FOREIGN_ID[(lms, to)]}: not written, it may be another student's (export --to {lms}, or give "
                "the grade by hand)")
    return (f"id {s.outcome.lms_id} read from both Moodle's and Canvas's file names, not known to be a "
            f"{to.capitalize()} id: not written (give the grade by hand)")


def exported(results: ClassResults, to: str) -> tuple[list[StudentResult], list[tuple[StudentResult, str]]]:
    """The students with an LMS id of `to`, and the others with the reason: no id, or the other LMS's id. Two
    students with one id refuse the export: an LMS would give both the grade of whichever row it read last. A row
    resting on no file of its own (`own_files`) takes no part: its id, read from a disputed name, may be another's."""
    with_id: dict[str, list[StudentResult]] = {}
    missing = []
    for s in results.students:
        why = foreign_id(s, to) or (None if s.outcome.own_files else NO_OWN_FILE)
        if why:
            missing.append((s, why))
        elif s.outcome.lms_id:
            with_id.setdefault(s.outcome.lms_id, []).append(s)
        else:
            missing.append((s, "no LMS id: the submission's name is not one an LMS export writes "
                               "(give the grade by hand)"))
    shared = {i: ss for i, ss in with_id.items() if len(ss) > 1}
    if shared:
        raise ExportError("two students share an LMS id, refusing to export: " + "; ".join(
            f"{i}: {', '.join(repr(s.outcome.name or s.student) for s in ss)}" for i, ss in sorted(shared.items())))
    return [ss[0] for ss in with_id.values()], missing


def maximum(results: ClassResults, percent: bool) -> float:
    """The grade's maximum: the course's points (test cells and written answers), or 100 for a percentage."""
    return 100.0 if percent else results.max_total()


def grade(results: ClassResults, s: StudentResult, percent: bool) -> float | str:
    """The student's grade: total points less the late penalty (or percent of the maximum); "" when not graded,
    never 0."""
    if not s.graded:
        return ""
    if percent:
        top = results.max_total()
        return round(100 * s.final() / top, 2) if top else 0.0
    return round(s.final(), 4)


def summary(results: ClassResults, s: StudentResult) -> str:
    """One line for the student: their points (or why there are none), the late penalty, written answers awaiting a
    grade, how late (and the rule), what they did not hand in."""
    if s.graded:
        # a person's score: a test cell's changed, or a written answer's given (a notebook not handed in has its
        # written answers at 0 without anyone grading them)
        by_hand = any(t.by_hand or t.column.written and t.points is not None and t.column.notebook in s.outcome.notebooks
                      for t in s.tasks)
        how = "autograded and graded by hand" if by_hand else "autograded"  # a written answer, or a score overridden
        parts = [f"{s.total():g} of {results.max_total():g} points ({how})"]
        if s.late_penalty:
            parts.append(f"late penalty {s.late_penalty:g} points: {s.final():g} of {results.max_total():g}")
        if s.pending:
            parts.append(f"{s.pending:g} points of written answers still to be graded")
    elif s.outcome.status == Status.NO_NOTEBOOKS:
        parts = ["not graded: no notebook of the assignment was found in the submission"]
    else:
        parts = ["not graded: automatic grading failed, your instructor will grade it"]
    if s.late_line:
        parts.append(s.late_line)
    if s.graded:
        parts += s.outcome.missing_work
    return "; ".join(parts) + "."


def _name(s: StudentResult) -> str:
    return s.outcome.name or s.student


def _pages(out: Path, s: StudentResult) -> list[Path]:
    folder = out / "feedback" / s.student
    return sorted(folder.glob("*.html")) if s.graded and folder.is_dir() else []


def _fresh(folder: Path) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def write_zip(path: Path, members: list[tuple[Path, str]]) -> Path:
    """A zip of (file, its name in the zip), written whole even when there is nothing to put in it."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for file, name in members:
            zf.write(file, name)
    return path


def write_not_exported(dest: Path, missing: list[tuple[StudentResult, str]]) -> Path:
    return write_csv(dest / NOT_EXPORTED, [["id", "name", "status", "grade", "reason"]] + [
        [s.student, _name(s), s.outcome.status, round(s.total(), 4) if s.graded else "", why] for s, why in missing])


def moodle_folder(name: str, lms_id: str) -> str:
    """The zip folder Moodle's feedback-zip import (importziplib.php, is_valid_filename_for_import) gives to the
    participant `lms_id`: `<name>_<id>_assignsubmission_file_`. The name is split off at the first `_`, so it may
    hold none (replaced by a space, as Moodle's download does), nor a path separator or a character a zip tool
    refuses (clean_filename drops them)."""
    clean = re.sub(r'[\x00-\x1f\x7f/\\:*?"<>|]', "", name.replace("_", " ")).strip(" .") or "student"
    return f"{clean}_{lms_id}_assignsubmission_file_"


def export_moodle(out: Path, results: ClassResults, percent: bool = False, now: datetime | None = None) -> list[Path]:
    students, missing = exported(results, MOODLE)  # before anything is written: a refused class leaves no files
    dest = _fresh(out / "moodle")
    if not students:  # nothing the LMS could import: only the reasons, no file to upload by mistake
        return [write_not_exported(dest, missing)]
    students.sort(key=lambda s: int(s.outcome.lms_id) if s.outcome.lms_id.isdigit() else 0)
    # strtotime() reads ISO 8601; the import keeps a grade changed in Moodle after this time (locallib.php)
    stamp = (now or datetime.now(timezone.utc)).replace(microsecond=0).isoformat()
    top = maximum(results, percent)

    def cell(s: StudentResult) -> float | str:
        g = grade(results, s, percent)
        if isinstance(g, float) and g > top:  # Moodle's import would skip it unsaid: the student is listed instead
            missing.append((s, f"grade {g:g} is above the maximum {top:g}, which Moodle's import skips: "
                               "not written (give the grade by hand)"))
            return ""
        return g

    rows = [MOODLE_HEADER] + [
        [PARTICIPANT + s.outcome.lms_id, _name(s), ("Graded" if s.graded else "Not graded") + (", late" if late(s) else ""),
         cell(s), top, stamp, html.escape(summary(results, s), quote=False)] for s in students]
    paths = [write_csv(dest / "grading_worksheet.csv", rows)]
    pages = [(page, f"{moodle_folder(_name(s), s.outcome.lms_id)}/{page.name}") for s in students
             for page in _pages(out, s)]
    paths.append(write_zip(dest / "feedback_files.zip", pages))
    paths.append(write_not_exported(dest, missing))
    return paths


def canvas_file(name: str, user_id: str, attachment_id: str, page: str) -> str:
    """A feedback page's name as Canvas's re-upload reads it: `<lastfirst>_<user id>_<attachment id>_<page>`.
    Canvas takes the first two all-digit parts between `_` as the ids, so the name part keeps letters, digits
    and `-` only, and is never all digits."""
    lastfirst = re.sub(r"[^0-9A-Za-z-]+", "", name)
    return f"{lastfirst if lastfirst and not lastfirst.isdigit() else 'student'}_{user_id}_{attachment_id}_{page}"


def canvas_attachments(s: StudentResult) -> dict[str, str]:
    """{notebook: the Canvas attachment id of the file it was graded from}, read from the name intake kept of a
    file of Canvas's download; a file of another user's id (a name that only looks like Canvas's) is none."""
    found = {}
    for stem, graded_as in s.outcome.notebooks.items():
        ids = canvas_ids(Path(graded_as).name)
        if ids and ids[0] == s.outcome.lms_id:
            found[stem] = ids[1]
    return found


def export_canvas(out: Path, results: ClassResults, percent: bool = False, assignment: str = ASSIGNMENT) -> list[Path]:
    students, missing = exported(results, CANVAS)
    dest = _fresh(out / "canvas")
    if not students:  # as Moodle's
        return [write_not_exported(dest, missing)]
    students.sort(key=lambda s: (_name(s).casefold(), s.outcome.lms_id))

    def cell(s: StudentResult) -> float | str:
        g = grade(results, s, percent)
        return f"{g:g}%" if percent and g != "" else g  # Canvas reads "85%" of a points assignment as a percent

    rows: list[list] = [CANVAS_HEADER + [assignment], [POINTS_POSSIBLE, "", "", "", "", results.max_total()]]
    rows += [[_name(s), s.outcome.lms_id, "", "", "", cell(s)] for s in students]
    paths = [write_csv(dest / "gradebook_import.csv", rows)]
    pages: list[tuple[Path, str]] = []
    for s in students:
        attachments, unmatched = canvas_attachments(s), []
        for page in _pages(out, s):
            if page.stem in attachments:
                pages.append((page, canvas_file(_name(s), s.outcome.lms_id, attachments[page.stem], page.name)))
            else:
                unmatched.append(page.stem)
        if unmatched:
            missing.append((s, f"feedback of {', '.join(unmatched)} not in feedback_files.zip: no Canvas attachment "
                               "id (the file was not named as Canvas's download names it); the grade is in "
                               "gradebook_import.csv, attach the pages in SpeedGrader"))
    paths.append(write_zip(dest / "feedback_files.zip", pages))
    paths.append(write_csv(dest / "students.csv", [["ID", "Student", "id", "status", "grade", "late", "summary"]] + [
        [s.outcome.lms_id, _name(s), s.student, s.outcome.status, cell(s), "yes" if late(s) else "", summary(results, s)]
        for s in students]))
    paths.append(write_not_exported(dest, missing))
    return paths


def export(out: Path, results: ClassResults, to: str, percent: bool = False,
           assignment: str = ASSIGNMENT) -> list[Path]:
    """Write the import files of `to` (moodle | canvas) into OUT/<to>/; returns what was written."""
    if to == "moodle":
        return export_moodle(out, results, percent)
    if to == "canvas":
        return export_canvas(out, results, percent, assignment)
    raise ValueError(f"unknown LMS {to!r} (one of {', '.join(LMS)})")
