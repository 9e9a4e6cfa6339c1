"""Intake: a folder or zip of submissions becomes one staged folder of notebooks per student.

Symbolic links are never followed; a zip member that would land outside its folder, is a link, is
too big or cannot be unpacked (a bad CRC, a file where the zip also has a folder of that name) refuses
that one student (with the reason), and the rest of the class goes on; so does any error met while
reading or rebuilding one student's files (`stage_student`). Each notebook is rebuilt on the release
(`grading/submission.py`), malformed details (metadata of the wrong JSON type) read as absent.
Submissions are only read.

Students are found as an LMS export lays them out (`handins`): a folder per student (any name: Moodle's
`First Last_<id>_assignsubmission_file[_]` gives the name and the participant id), or the flat files of
Canvas (`lastfirst_<user id>_<attachment id>_<file>`) or of Moodle without folders; a flat file whose name reads as
more than one student's is nobody's (each of them gets a row that says so, for a person to decide). Each is
graded under an id that is safe as a folder and gradebook name (`student_id`); the reports show the name as
given. One student's ignored files are noted one by one up to MAX_FILES_NOTED of a kind, then counted.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
import unicodedata
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import nbformat

from starter.runtime import RUN_TAG

from . import notebooks
from .host_bounds import Bound, PastBound, each_bounded
from .notebooks import ASSIGNMENT
from .outcome import Status, StudentOutcome
from .scan import is_student_code
from .submission import read_any, rebuild

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
HASHED = re.compile(r"-[0-9a-f]{10}$")  # how an id made by `student_id` ends
JUNK = {"__MACOSX", ".ipynb_checkpoints", ".DS_Store"}
MAX_ZIP_BYTES = 2 * 1024**3


# --------------------------------------------------------------------------------------------------
# Who a student is: the name an export gives, and the id graded under

def unusable_name(name: str) -> str | None:
    """Why `name` cannot be a student's folder (None if it can)."""
    if name in ("", ".", ".."):
        return f"{name!r} cannot be a folder's name"
    if "/" in name or "\0" in name:
        return "a name holding a slash or a NUL cannot be a folder's name"
    if re.search(r"[\x00-\x1f\x7f]", name):
        return "a name holding a control character (a newline, a tab, ...)"
    return None


def student_id(name: str) -> str:
    """The id a student named `name` is graded under (the gradebook's id, the feedback folder's name): the
    name itself if it is one already, else a lowercase ASCII slug of it and a hash of the exact name, so that
    two names never share an id (an id made here ends in the hash; a name so ending is hashed too)."""
    if STUDENT_ID.match(name) and not HASHED.search(name):
        return name
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_name).strip("-")[:40].strip("-") or "student"
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    return f"{slug}-{digest}"


def shown(name: str) -> str:
    """`name` as text a report can hold (a folder name that is not UTF-8 has its bad bytes replaced)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


# How Moodle names what it exports (mod/assign/classes/downloader.php, Moodle 4.1 on; mod/assign/locallib.php
# before): a student's prefix is `clean_filename(str_replace('_', ' ', fullname) . '_' . participant id)`, then
# `_assignsubmission_<plugin>` (`file`, `onlinetext`) and either a folder (`<prefix>_assignsubmission_file/`, with
# a `_` at its end before 4.1) or, without folders, the file name itself (`<prefix>_assignsubmission_file_<file>`).
# Moodle's own import of feedback zips splits these names at their first four `_`: a name it wrote holds no `_`.
# Names written otherwise (another tool, a renamed export) may: a folder's name is read from its right, where
# the fixed fields are; a flat file's name has the file's own name at its right, so every split at the fixed
# fields is a reading, and a name with several readings (participant 2002, `Alice Smith_1001_assignsubmission_file_x`,
# handing in `01.ipynb` reads as Alice's `x_2002_assignsubmission_file_01.ipynb` too) is nobody's: refused for review.
MOODLE_FOLDER = re.compile(r"(?P<name>.+)_(?P<lms_id>\d+)_assignsubmission_[a-z]+_?", re.S)
MOODLE_FIELDS = re.compile(r"(?=(_(?P<lms_id>\d+)_assignsubmission_[a-z]+_))")  # at every place they could be
# Which LMS's names an id was read from (StudentOutcome.lms): the ids of one mean nothing to the other. MIXED: a
# student whose name and id are in both (an id neither export can trust)
MOODLE, CANVAS, MIXED = "moodle", "canvas", "moodle and canvas"
# Canvas: `<lastfirst>_<user id>_<attachment id>_<file>` (`<lastfirst>_LATE_...` when late); the name is the part
# before the first `_` (Canvas keeps none in it), so a name cannot hold the fields that follow it: one reading.
# The attachment id is the id of the file the student handed in: Canvas's re-upload of feedback files matches a
# file to a submission by it (grading.lms_export), so a notebook taken from such a file keeps that name.
CANVAS_FILE = re.compile(r"(?P<name>[^_]+)_(?:(?P<late>late)_)?(?P<lms_id>\d+)_(?P<attachment_id>\d+)_(?P<file>.+)",
                         re.S | re.I)


class Reading(NamedTuple):
    """Whose an entry of the class folder is, read from its name."""
    name: str
    lms_id: str
    file: str  # the name the file was handed in as ("" for a folder)
    late: bool


def lms_readings(entry: str, folder: bool) -> list[Reading]:
    """Every way an entry of the class folder's name reads as a student's: one for a folder (a Moodle folder
    `First Last_<id>_assignsubmission_file[_]` is First Last's, any other folder the student of that name); for a
    file, one per split of its name as a flat export writes it (Moodle's `First Last_<id>_assignsubmission_file_<file>`,
    Canvas's `lastfirst_<user id>_<attachment id>_<file>`), none for a loose file, several for a name nobody
    can own."""
    if folder:
        m = MOODLE_FOLDER.fullmatch(entry)
        return [Reading(m["name"], m["lms_id"], "", False) if m else Reading(entry, "", "", False)]
    found = [Reading(entry[:m.start()], m["lms_id"], entry[m.end(1):], False) for m in MOODLE_FIELDS.finditer(entry)
             if m.start() > 0 and m.end(1) < len(entry)]
    canvas = _canvas_reading(entry)
    return found + [canvas] if canvas else found


def _canvas_reading(entry: str) -> Reading | None:
    m = CANVAS_FILE.fullmatch(entry)
    return Reading(m["name"], m["lms_id"], m["file"], bool(m["late"])) if m else None


def reading_lms(entry: str, reading: Reading) -> str:
    """Whose names `reading` of the class folder's `entry` was read from: CANVAS, MOODLE (a folder, or a flat
    file's split at Moodle's fields), "" for a reading without an id."""
    if not reading.lms_id:
        return ""
    return CANVAS if _canvas_reading(entry) == reading else MOODLE


def canvas_ids(name: str) -> tuple[str, str] | None:
    """(user id, attachment id) of a file named as Canvas's download names it, else None."""
    m = CANVAS_FILE.fullmatch(name)
    return (m["lms_id"], m["attachment_id"]) if m else None


@dataclass
class Handin:
    """One student's part of a class folder: their folders and loose files, under their name as given."""
    name: str
    lms_id: str = ""
    lms: str = ""  # whose names lms_id was read from (MOODLE, CANVAS); both: MIXED, an id the export gives neither
    folders: list[Path] = field(default_factory=list)
    files: list[tuple[Path, str]] = field(default_factory=list)  # a loose file, and the name it was handed in as
    entries: list[str] = field(default_factory=list)  # the class folder's names of those (zip members refused too)
    late: bool = False
    disputed: list[str] = field(default_factory=list)  # files whose names read as this student's and another's
    from_canvas: set[Path] = field(default_factory=set)  # loose files named as Canvas's download names them

    @property
    def key(self) -> str:
        """The exact text the student's id is made from: one per student of the export."""
        return f"{self.name}_{self.lms_id}" if self.lms_id else self.name


def handins(folder: Path, refused: dict[str, bool]) -> tuple[list[Handin], list[str]]:
    """The students of a class folder as its export lays them out, and the loose files (nobody's).
    `refused`: top-level entries the zip held but did not unpack (name -> whether it was a folder)."""
    found: dict[str, Handin] = {}
    loose = []
    entries = {p.name: p for p in folder.iterdir() if p.name not in JUNK}
    for entry in sorted(set(entries) | set(refused)):
        path = entries.get(entry)
        is_folder = refused[entry] if path is None else (path.is_dir() or path.is_symlink() and not path.is_file())
        readings = lms_readings(entry, is_folder)
        if not readings:
            if path is not None:
                loose.append(entry)
            continue
        owners = []
        for reading in readings:
            lms = reading_lms(entry, reading)
            new = Handin(reading.name, reading.lms_id, lms)
            handin = found.setdefault(new.key, new)
            if handin.lms != lms:  # one name and id in Moodle's names and Canvas's: whose id is it?
                handin.lms = MIXED
            owners.append(handin)
            owners[-1].entries.append(entry)
        if len(owners) > 1:  # every student it could be gets a row; none gets the file
            whose = " or ".join(f"{shown(r.name)} ({r.lms_id})" for r in readings)
            for handin in owners:
                handin.disputed.append(f"{entry} (the file of {whose})")
            continue
        handin, reading = owners[0], readings[0]
        handin.late |= reading.late
        if path is not None:
            if is_folder:
                handin.folders.append(path)
            else:
                handin.files.append((path, reading.file))
                if _canvas_reading(entry) == reading:
                    handin.from_canvas.add(path)
    return list(found.values()), loose


# --------------------------------------------------------------------------------------------------
# Reading submissions

MAX_MEMBER_BYTES = 256 * 2**20  # one file of a zip
# What the grader's host reads of one notebook, in characters of its sources summed: the student's code cells
# (their answers and extra cells: what the review scan parses), and every cell the feedback page highlights or
# renders (the release's included). Honest notebooks are far under: the solutions hold at most 7,757 characters
# of answer code (notebook 04) and 53,251 shown (notebook 05); one extra cell of 4 MB of code cost the host
# 2 minutes of CPU and 1 GB of memory (the highlighting most), so at these limits it costs seconds.
MAX_STUDENT_CODE = 256 * 2**10
MAX_SHOWN_SOURCE = 512 * 2**10


def one_line(text: str, limit: int = 300) -> str:
    """`text` as one line of a note: control characters (a file name may hold a newline) shown escaped."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", str(text))[:limit]


def problem(exc: BaseException) -> str:
    """An exception as the one line a note gives it: its type and the first line of its message."""
    first = (str(exc).splitlines() or [""])[0]
    return one_line(f"{type(exc).__name__}: {first}" if first else type(exc).__name__, 200)


MAX_FILES_NOTED = 10  # of one reason, per student: more are one note (20 000 files made a note of 820 000 characters)
DISPUTED = "not taken in: its name reads as more than one student's file (a person decides whose it is)"
DISPUTED_FLAG = "a file whose name reads as this student's and another's was not taken in (see notes)"


class Ignored:
    """The files of one student's hand-in that are not taken in, by reason: a note per file, or for more than
    MAX_FILES_NOTED files of one reason one note that counts them and names the first."""

    def __init__(self) -> None:
        self.files: dict[str, list[str]] = {}

    def add(self, file: Path | str, why: str) -> None:
        self.files.setdefault(why, []).append(str(file))

    def notes(self) -> list[str]:
        notes = []
        for why, files in self.files.items():
            if len(files) <= MAX_FILES_NOTED:
                notes += [f"{file}: {why}" for file in files]
            else:
                first = ", ".join(one_line(file, 60) for file in files[:MAX_FILES_NOTED])
                notes.append(f"{len(files)} files: {why}; the first {MAX_FILES_NOTED}: {first}")
        return notes


def unpack(path: Path, into: Path) -> tuple[Path, list[tuple[str, str]]]:
    """A folder of submissions from a folder or a zip, and the zip members refused: (name, why).

    Members that would land outside `into` (absolute paths, `..`), symbolic links, oversized files and
    members that cannot be unpacked (a bad CRC, an encrypted or unknown compression, a file where the zip
    also has a folder of the same name) are not extracted; the student whose folder held one is refused
    with the reason (the rest of the class is graded)."""
    if path.is_dir():
        return path, []
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is neither a folder nor a zip file")
    refused = []
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ValueError(f"{path}: the zip file cannot be read ({problem(exc)})") from exc
    with zf:
        total = sum(i.file_size for i in zf.infolist())
        if total > MAX_ZIP_BYTES:
            raise ValueError(f"{path} unpacks to {total / 1e9:.1f} GB; refusing")
        root = into.resolve()
        for info in zf.infolist():
            target = (into / info.filename).resolve()
            mode = info.external_attr >> 16
            if info.filename.startswith("/") or not target.is_relative_to(root) or ".." in Path(info.filename).parts:
                refused.append((info.filename, "a path outside the submission (absolute or with ..)"))
            elif stat.S_ISLNK(mode):
                refused.append((info.filename, "a symbolic link"))
            elif info.file_size > MAX_MEMBER_BYTES:
                refused.append((info.filename, f"a file of {info.file_size / 2**20:.0f} MB"))
            else:
                try:
                    _extract(zf, info, target)
                except Exception as exc:  # one member's problem is its student's, never the class's
                    refused.append((info.filename, f"a member that cannot be unpacked ({problem(exc)})"))
    return into, refused


def _extract(zf: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    if info.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zf.open(info) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except BaseException:
        if target.is_file() and not target.is_symlink():
            target.unlink()  # half a file (a bad CRC is found at its end) is not graded
        raise


def submission_root(folder: Path) -> Path:
    """Descend through wrapper folders (e.g. a zip of `submissions/`) to the folder of students: one that
    holds no notebook, or only the files of a flat export (Canvas's, a class in one folder)."""
    while True:
        entries = [p for p in folder.iterdir() if p.name not in JUNK]
        if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() and (
                not any(entries[0].glob("*.ipynb")) or _flat_export(entries[0])):
            folder = entries[0]
        else:
            return folder


def _flat_export(folder: Path) -> bool:
    """Whether every file in `folder` is named as a flat export names a student's file."""
    files = [p.name for p in folder.iterdir() if p.is_file() and p.name not in JUNK]
    return bool(files) and all(lms_readings(name, folder=False) for name in files)


def notebook_for(filename: str, known: dict[str, str]) -> str | None:
    """Which assignment notebook a submitted file is, from its name (exact stem, or its NN_ number)."""
    stem = Path(filename).stem
    if stem in known.values():
        return stem
    m = re.search(r"(?<!\d)(\d\d)_", stem)
    return known.get(m.group(1)) if m else None


# Reading a submitted notebook (JSON, then nbformat's validation) costs what its file holds, whatever of it is
# kept: 21 MB of empty objects in its metadata (20 KB zipped) took 400 s and 4 GB. So it is read in a child
# process within this (grading.host_bounds); an honest notebook, outputs and all, takes well under a second.
READ_BOUND = Bound(seconds=60, memory_mb=2048)


def read_submissions(paths: list[Path]) -> list[tuple[object, str | None, list[str]]]:
    """(notebook, None, the malformed details repaired) for each of a student's notebook files, or (None, why it
    cannot be read, []). Read in one child process, each file within READ_BOUND (a file past it costs that child;
    a new one reads the next: grading.host_bounds)."""
    def read(path: Path) -> dict:
        found: list[str] = []
        try:
            return {"notebook": nbformat.writes(read_any(path, found)), "repairs": found}
        except MemoryError:  # past the bound: said as such
            raise
        except Exception as exc:
            return {"error": f"corrupt notebook ({problem(exc)[:160]})"}

    read_back: list[tuple[object, str | None, list[str]]] = []
    for answer in each_bounded(read, paths, READ_BOUND):
        if isinstance(answer, PastBound):
            read_back.append((None, f"not read: reading it went past the grader's limit ({READ_BOUND}: {answer})", []))
        elif not isinstance(answer, dict) or "notebook" not in answer:
            why = answer.get("error", "corrupt notebook") if isinstance(answer, dict) else "corrupt notebook"
            read_back.append((None, why, []))
        else:
            read_back.append((nbformat.reads(answer["notebook"], as_version=4), None, answer["repairs"]))
    return read_back


def read_submission(path: Path, repairs: list[str] | None = None):
    """(notebook, None), or (None, why it cannot be read), of one file (`read_submissions`); malformed details
    repaired are added to `repairs`."""
    nb, unreadable, found = read_submissions([path])[0]
    if repairs is not None:
        repairs += found
    return nb, unreadable


def _files(folder: Path, ignored: Ignored, prefix: Path = Path()) -> list[tuple[Path, Path]]:
    """The regular files under `folder`, each with its name in the student's hand-in (`prefix`/its path in
    `folder`); symbolic links are noted and never followed (a link could point at the instructor's
    solution or at another student's work)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        files = set(filenames)  # a set: a folder of 20 000 files made the list's lookups take seconds
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                ignored.add(prefix / path.relative_to(folder), "ignored (a symbolic link)")
            elif name in files and path.is_file():
                found.append((path, prefix / path.relative_to(folder)))
    return sorted(found)


def handed_in(handin: Handin, ignored: Ignored) -> list[tuple[Path, Path]]:
    """Every regular file of a student's hand-in, with the name it is reported under: its path in the
    student's folder (behind the folder's name when the student has several, as Moodle's file and online
    text), or the name a flat export's file was handed in as."""
    found = []
    for folder in handin.folders:
        found += _files(folder, ignored, Path(folder.name) if len(handin.folders) > 1 else Path())
    taken = {str(rel) for _, rel in found}
    for path, name in sorted(handin.files):
        rel = Path(name if name not in taken else path.name)  # the export's own name if two were handed in alike
        taken.add(str(rel))
        if path.is_symlink():
            ignored.add(rel, "ignored (a symbolic link)")
        elif path.is_file():
            found.append((path, rel))
    return found


def collect(handin: Handin, known: dict[str, str], result: StudentOutcome, dest: Path) -> None:
    """Copy the student's gradable notebooks to `dest/<notebook>.ipynb`; note every other file."""
    ignored = Ignored()
    try:
        _collect(handin, known, result, dest, ignored)
    finally:  # what was ignored is noted, also when the student is refused
        result.notes += ignored.notes()


def _collect(handin: Handin, known: dict[str, str], result: StudentOutcome, dest: Path, ignored: Ignored) -> None:
    candidates: dict[str, list[tuple[Path, Path]]] = {}
    checkpoints: list[tuple[Path, Path]] = []
    for entry in handin.disputed:
        ignored.add(entry, DISPUTED)
    for path, rel in handed_in(handin, ignored):
        if any(part in JUNK for part in rel.parts):
            continue
        if rel.name == Path(notebooks.TRAINED_CHECKPOINT).name:
            checkpoints.append((path, rel))
            continue
        if path.suffix != ".ipynb":
            ignored.add(rel, "ignored (not a notebook)")
            continue
        stem = notebook_for(rel.name, known)
        if stem is None:
            ignored.add(rel, "ignored (not one of the assignment's notebooks)")
            continue
        candidates.setdefault(stem, []).append((path, rel))
    dest.mkdir(parents=True, exist_ok=True)
    chosen_copies = {}
    for stem, copies in candidates.items():
        # prefer the exact name, then the most recently modified copy
        copies.sort(key=lambda c: (c[1].stem == stem, c[0].stat().st_mtime), reverse=True)
        for _, extra in copies[1:]:
            ignored.add(extra, f"ignored (another copy of {stem} was graded)")
        chosen_copies[stem] = copies[0]
    read_back = read_submissions([chosen for chosen, _ in chosen_copies.values()])
    for (stem, (chosen, rel)), (nb, unreadable, repairs) in zip(chosen_copies.items(), read_back):
        if unreadable:
            result.notes.append(f"{rel}: not graded: {unreadable}")
            continue
        try:
            rebuilt = rebuild(nb, notebooks.read(notebooks.RELEASE / f"{stem}.ipynb"))
            too_large = oversized(rebuilt.notebook)
            if too_large is None:
                nbformat.write(rebuilt.notebook, str(dest / f"{stem}.ipynb"))
        except Exception as exc:
            raise Refused(f"{rel}: could not be rebuilt on the release ({problem(exc)})") from exc
        if too_large is not None:
            result.notes.append(f"{rel}: not graded: {too_large}")
            continue
        result.notes += [f"{rel}: {note}" for note in repairs + rebuilt.notes]
        # a file of Canvas's download is recorded by its name there, which holds its attachment id
        result.notebooks[stem] = chosen.name if chosen in handin.from_canvas else str(rel)
    result.missing = [stem for stem in known.values() if stem not in candidates]
    _keep_checkpoint(checkpoints, result, dest, ignored)
    result.model_kept = (dest / notebooks.TRAINED_CHECKPOINT).is_file()


def oversized(nb) -> str | None:
    """Why a rebuilt notebook is too large to grade (MAX_STUDENT_CODE, MAX_SHOWN_SOURCE), else None."""
    code = sum(len(c.source) for c in nb.cells if is_student_code(c))
    if code > MAX_STUDENT_CODE:
        return (f"{code:,} characters of code in the student's cells, over the limit of {MAX_STUDENT_CODE:,} "
                "(what the grader's host reads of a notebook)")
    shown = sum(len(c.source) for c in nb.cells)
    if shown > MAX_SHOWN_SOURCE:
        return (f"{shown:,} characters of cells for the feedback page, over the limit of {MAX_SHOWN_SOURCE:,} "
                "(what the grader's host highlights and renders)")
    return None


class Refused(Exception):
    """One student's files cannot be taken in: the message names the file and the problem, on one line."""


def _keep_checkpoint(found: list[tuple[Path, Path]], result: StudentOutcome, dest: Path, ignored: Ignored) -> None:
    """Notebook 06's trained model goes to `dest`/runs/ (its test_trained_model loads it there): the copy in
    a runs/ folder if there is one, else the newest; one over MAX_HANDED_IN bytes is noted and left out."""
    if not found:
        return
    found.sort(key=lambda c: (c[1].parent.name == "runs", c[0].stat().st_mtime), reverse=True)
    chosen, rel = found[0]
    for _, extra in found[1:]:
        ignored.add(extra, "ignored (another copy of the trained model was kept)")
    size = chosen.stat().st_size
    if size > notebooks.MAX_HANDED_IN:
        result.notes.append(f"{rel}: not kept ({size / 2**20:.0f} MB, over {notebooks.MAX_HANDED_IN / 2**20:.0f} MB)")
        return
    target = dest / notebooks.TRAINED_CHECKPOINT
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(chosen, target)


def stage_student(root: Path, handin: Handin, known: dict[str, str], student: str) -> StudentOutcome:
    """Copy one student's gradable notebooks into the course's submitted/`student` folder."""
    result = StudentOutcome(student=student, name=shown(handin.name), lms_id=handin.lms_id, lms=handin.lms,
                            lms_late=handin.late)
    submitted = root / "submitted" / result.student / ASSIGNMENT
    try:
        if submitted.exists():
            shutil.rmtree(submitted)
        collect(handin, known, result, submitted)
    except Exception as exc:  # this student's files, whatever is wrong with them, never stop the class
        why = str(exc) if isinstance(exc, Refused) else _where(exc, handin)
        shutil.rmtree(submitted, ignore_errors=True)  # nothing half-staged is graded
        with contextlib.suppress(OSError):
            submitted.parent.rmdir()  # the student's folder, if nothing else is in it
        return StudentOutcome(student=result.student, status=Status.FAILED, notes=result.notes + [f"refused: {why}"],
                             name=result.name, lms_id=result.lms_id, lms=result.lms, lms_late=result.lms_late)
    if not result.notebooks:
        result.status = Status.NO_NOTEBOOKS
        result.notes.append("no notebook of this assignment in the folder: nothing to grade (no grade given, not 0)")
    return result


def _where(exc: BaseException, handin: Handin) -> str:
    """`file: problem` for an error met while reading a student's files (the folder if no file is named)."""
    name = getattr(exc, "filename", None)
    rel: str | Path | None = None
    failed = Path(name) if isinstance(name, (str, os.PathLike)) else None
    for folder in handin.folders:
        if failed is not None and failed.is_relative_to(folder):
            inside = failed.relative_to(folder)
            rel = Path(folder.name) / inside if len(handin.folders) > 1 else inside
    rel = next((handed for path, handed in handin.files if str(path) == str(name)), rel)
    return f"{rel if rel is not None else 'folder'}: {problem(exc)}"


def _entry_of(member: str, wrapper: tuple[str, ...]) -> tuple[str, bool] | None:
    """The class folder's entry a zip member is or lies in (given the wrapper folders above the students'),
    and whether that entry is a folder; None for a member outside it."""
    parts = Path(member).parts
    depth = len(wrapper)
    if len(parts) <= depth or parts[:depth] != wrapper or parts[depth] in ("..", "/"):
        return None
    return parts[depth], len(parts) > depth + 1 or member.endswith("/")


def intake(submissions: Path, root: Path, students: list[str] | None = None) -> tuple[list[StudentOutcome], list[str]]:
    """Stage every student of `submissions` (a folder or a zip) into `root`/submitted; one result per
    student (refused ones marked failed, with the reason), and the files that belong to no student.
    `students`: only those (by name as given, by id, by LMS id, or by the name of their folder or file)."""
    known = {p.name[:2]: p.stem for p in notebooks.solution_notebooks()}
    results: list[StudentOutcome] = []
    with tempfile.TemporaryDirectory(prefix="submissions-") as tmp:
        unpacked, refused = unpack(Path(submissions), Path(tmp))
        folder = submission_root(unpacked)
        wrapper = folder.relative_to(unpacked).parts
        refused_of: dict[str, list[tuple[str, str]]] = {}  # entry of the class folder -> (member refused, why)
        refused_entries: dict[str, bool] = {}
        loose: list[str] = []
        for name, reason in refused:
            entry = _entry_of(name, wrapper)
            if entry is None:
                loose.append(f"{name} (refused: {reason})")
            else:
                refused_of.setdefault(entry[0], []).append((name, reason))
                refused_entries[entry[0]] = refused_entries.get(entry[0], False) or entry[1]
        found, loose_files = handins(folder, refused_entries)
        loose += loose_files
        owned = {e for h in found for e in h.entries}
        loose += [f"{name} (refused: {reason})" for e, members in refused_of.items() if e not in owned
                  for name, reason in members]
        ids: dict[str, str] = {}  # id -> the key of the student graded under it
        for handin in sorted(found, key=lambda h: h.key):
            why = unusable_name(handin.name)
            student = handin.key if why else student_id(handin.key)
            if students and not {handin.key, handin.name, student, handin.lms_id, *handin.entries} - {""} & set(students):
                continue
            if why is None and any(f.is_symlink() for f in handin.folders):
                why = "a symbolic link, not a folder"
            if why is None and ids.setdefault(student, handin.key) != handin.key:
                why = f"its id {student} is another student's"  # (a hash collision: never seen)
            bad = [problem for entry in handin.entries for problem in refused_of.get(entry, [])]
            own_files = bool(handin.folders or handin.files or bad)
            if why is None and not own_files and handin.disputed:
                why = "no file is this student's alone: each one's name reads as another student's file too"
            if why or bad:
                note = f"refused: {why}" if why else "refused: the zip holds " + "; ".join(f"{n}: {w}" for n, w in bad[:3])
                disputed = Ignored()
                for file in handin.disputed:
                    disputed.add(file, DISPUTED)
                results.append(StudentOutcome(student=student, status=Status.FAILED, notes=disputed.notes() + [note],
                                             flags=[DISPUTED_FLAG] if handin.disputed else [],
                                             name=shown(handin.name), lms_id=handin.lms_id, lms=handin.lms,
                                             own_files=own_files))
                continue
            outcome = stage_student(root, handin, known, student)
            if handin.disputed:
                outcome.flags.append(DISPUTED_FLAG)
            results.append(outcome)
    flag_shared_runs(root, results)
    for r in results:  # a note is one line, whatever the file names hold
        r.notes = [one_line(note, 1000) for note in r.notes]
    return results, loose


RUN_IDENTITY = re.compile(re.escape(RUN_TAG.encode()) + rb"[0-9a-f]{32}")


def run_identities(checkpoint: Path) -> set[bytes]:
    """The training runs a checkpoint names (`starter.scripts.run_identity`), read from its bytes as they are (a
    checkpoint stores its records uncompressed): nothing of a student's file is unpickled here. Empty for a file
    that is not there or names none (saved otherwise)."""
    try:
        with checkpoint.open("rb") as f:
            return set(RUN_IDENTITY.findall(f.read(notebooks.MAX_HANDED_IN)))
    except OSError:
        return set()


def flag_shared_runs(root: Path, results: list[StudentOutcome]) -> None:
    """Flag each student of `results` whose trained model comes from the same training run as the one another student
    of the course folder handed in (staged now or before): the same file handed in twice, or a run resumed from
    another's checkpoint. Independent runs never share a run's identity, even with the same code, seed and steps
    (and so the same weights); a person decides what it means. The mark measures the weights and stands."""
    staged = root / "submitted"
    runs_of = {folder.name: run_identities(folder / ASSIGNMENT / notebooks.TRAINED_CHECKPOINT)
               for folder in (sorted(staged.iterdir()) if staged.is_dir() else [])}
    students_of: dict[bytes, list[str]] = {}
    for student, runs in runs_of.items():
        for run in runs:
            students_of.setdefault(run, []).append(student)
    for outcome in results:
        if outcome.status == Status.FAILED:
            continue
        others = sorted({s for run in runs_of.get(outcome.student, ()) for s in students_of[run]
                         if s != outcome.student})
        if others:
            outcome.flags.append(f"{notebooks.TRAINED_CHECKPOINT} comes from the same training run as the one "
                                 f"{', '.join(others[:5])}{' and others' if len(others) > 5 else ''} handed in (the "
                                 "run's identity that train_captioner.py writes into each checkpoint): one file "
                                 "handed in twice, or a run resumed from another's; the trained-model mark measures "
                                 "the weights and stands, worth a look")
