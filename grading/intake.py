"""Intake: a folder or zip of submissions becomes one staged folder of notebooks per student.

Symbolic links are never followed; a zip member that would land outside its folder, is a link, is
too big or cannot be unpacked (a bad CRC, a file where the zip also has a folder of that name) refuses
that one student (with the reason), and the rest of the class goes on; so does any error met while
reading or rebuilding one student's files (`stage_student`). Each notebook is rebuilt on the release
(`grading/submission.py`), malformed details (metadata of the wrong JSON type) read as absent.
Submissions are only read.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import notebooks
from .notebooks import ASSIGNMENT
from .submission import read_any, rebuild

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
JUNK = {"__MACOSX", ".ipynb_checkpoints", ".DS_Store"}
MAX_ZIP_BYTES = 2 * 1024**3


@dataclass
class StudentResult:
    student: str
    notebooks: dict[str, str] = field(default_factory=dict)  # notebook stem -> file graded
    notes: list[str] = field(default_factory=list)  # what was wrong with the submission, per file
    flags: list[str] = field(default_factory=list)  # for manual review (suspected tampering)
    status: str = "pending"  # graded | failed | no notebooks
    seconds: float = 0.0


# --------------------------------------------------------------------------------------------------
# Reading submissions

MAX_MEMBER_BYTES = 256 * 2**20  # one file of a zip


def one_line(text: str, limit: int = 300) -> str:
    """`text` as one line of a note: control characters (a file name may hold a newline) shown escaped."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", str(text))[:limit]


def problem(exc: BaseException) -> str:
    """An exception as the one line a note gives it: its type and the first line of its message."""
    first = (str(exc).splitlines() or [""])[0]
    return one_line(f"{type(exc).__name__}: {first}" if first else type(exc).__name__, 200)


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
    """Descend through wrapper folders (e.g. a zip of `submissions/`) to the folder of students."""
    while True:
        entries = [p for p in folder.iterdir() if p.name not in JUNK]
        if len(entries) == 1 and entries[0].is_dir() and not any(entries[0].glob("*.ipynb")):
            folder = entries[0]
        else:
            return folder


def notebook_for(filename: str, known: dict[str, str]) -> str | None:
    """Which assignment notebook a submitted file is, from its name (exact stem, or its NN_ number)."""
    stem = Path(filename).stem
    if stem in known.values():
        return stem
    m = re.search(r"(?<!\d)(\d\d)_", stem)
    return known.get(m.group(1)) if m else None


def read_submission(path: Path, repairs: list[str] | None = None):
    """(notebook, None), or (None, why it cannot be read); malformed details repaired are added to `repairs`."""
    try:
        return read_any(path, repairs), None
    except Exception as exc:
        return None, f"corrupt notebook ({problem(exc)[:160]})"


def _files(folder: Path, result: StudentResult) -> list[Path]:
    """The regular files under `folder`; symbolic links are noted and never followed (a link could
    point at the instructor's solution or at another student's work)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                result.notes.append(f"{path.relative_to(folder)}: ignored (a symbolic link)")
            elif name in filenames and path.is_file():
                found.append(path)
    return sorted(found)


def collect(student_dir: Path, known: dict[str, str], result: StudentResult, dest: Path) -> None:
    """Copy the student's gradable notebooks to `dest/<notebook>.ipynb`; note every other file."""
    candidates: dict[str, list[Path]] = {}
    checkpoints: list[Path] = []
    for path in _files(student_dir, result):
        rel = path.relative_to(student_dir)
        if any(part in JUNK for part in rel.parts):
            continue
        if path.name == Path(notebooks.CHECKPOINT_04).name:
            checkpoints.append(path)
            continue
        if path.suffix != ".ipynb":
            result.notes.append(f"{rel}: ignored (not a notebook)")
            continue
        stem = notebook_for(path.name, known)
        if stem is None:
            result.notes.append(f"{rel}: ignored (not one of the assignment's notebooks)")
            continue
        candidates.setdefault(stem, []).append(path)
    dest.mkdir(parents=True, exist_ok=True)
    for stem, paths in candidates.items():
        # prefer the exact name, then the most recently modified copy
        paths.sort(key=lambda p: (p.stem == stem, p.stat().st_mtime), reverse=True)
        for extra in paths[1:]:
            result.notes.append(f"{extra.relative_to(student_dir)}: ignored (another copy of {stem} was graded)")
        chosen = paths[0]
        rel = chosen.relative_to(student_dir)
        repairs: list[str] = []
        nb, unreadable = read_submission(chosen, repairs)
        if unreadable:
            result.notes.append(f"{rel}: not graded: {unreadable}")
            continue
        try:
            rebuilt = rebuild(nb, notebooks.read(notebooks.RELEASE / f"{stem}.ipynb"))
            nbformat.write(rebuilt.notebook, str(dest / f"{stem}.ipynb"))
        except Exception as exc:
            raise Refused(f"{rel}: could not be rebuilt on the release ({problem(exc)})") from exc
        result.notes += [f"{rel}: {note}" for note in repairs + rebuilt.notes]
        result.notebooks[stem] = str(rel)
    _keep_checkpoint(checkpoints, student_dir, result, dest)


class Refused(Exception):
    """One student's files cannot be taken in: the message names the file and the problem, on one line."""


def _keep_checkpoint(found: list[Path], student_dir: Path, result: StudentResult, dest: Path) -> None:
    """Notebook 04's trained model goes to `dest`/runs/ (its test_trained_model loads it there): the copy in
    a runs/ folder if there is one, else the newest; one over MAX_HANDED_IN bytes is noted and left out."""
    if not found:
        return
    found.sort(key=lambda p: (p.parent.name == "runs", p.stat().st_mtime), reverse=True)
    chosen, rel = found[0], found[0].relative_to(student_dir)
    for extra in found[1:]:
        result.notes.append(f"{extra.relative_to(student_dir)}: ignored (another copy of the trained model was kept)")
    size = chosen.stat().st_size
    if size > notebooks.MAX_HANDED_IN:
        result.notes.append(f"{rel}: not kept ({size / 2**20:.0f} MB, over {notebooks.MAX_HANDED_IN / 2**20:.0f} MB)")
        return
    target = dest / notebooks.CHECKPOINT_04
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(chosen, target)


def stage_student(root: Path, student_dir: Path, known: dict[str, str]) -> StudentResult:
    """Copy one student's gradable notebooks into the course's submitted/ folder."""
    result = StudentResult(student=student_dir.name)
    submitted = root / "submitted" / result.student / ASSIGNMENT
    try:
        if submitted.exists():
            shutil.rmtree(submitted)
        collect(student_dir, known, result, submitted)
    except Exception as exc:  # this student's files, whatever is wrong with them, never stop the class
        why = str(exc) if isinstance(exc, Refused) else _where(exc, student_dir)
        shutil.rmtree(submitted, ignore_errors=True)  # nothing half-staged is graded
        with contextlib.suppress(OSError):
            submitted.parent.rmdir()  # the student's folder, if nothing else is in it
        return StudentResult(student=result.student, status="failed", notes=result.notes + [f"refused: {why}"])
    if not result.notebooks:
        result.status = "no notebooks"
        result.notes.append("no notebook of this assignment in the folder: nothing to grade (0)")
    return result


def _where(exc: BaseException, student_dir: Path) -> str:
    """`file: problem` for an error met while reading a student's folder (the folder if no file is named)."""
    name = getattr(exc, "filename", None)
    try:
        rel = Path(name).relative_to(student_dir) if name else None
    except (TypeError, ValueError):
        rel = None
    return f"{rel if rel is not None else 'folder'}: {problem(exc)}"


def _student_of(member: str, wrapper: tuple[str, ...]) -> str | None:
    """The student folder a zip member belongs to, given the wrapper folders above the students' folders."""
    parts = Path(member).parts
    depth = len(wrapper)
    if len(parts) <= depth + 1 or parts[:depth] != wrapper or parts[depth] in ("..", "/"):
        return None
    return parts[depth]


def intake(submissions: Path, root: Path, students: list[str] | None = None) -> tuple[list[StudentResult], list[str]]:
    """Stage every student of `submissions` (a folder or a zip) into `root`/submitted; one result per
    student (refused ones marked failed, with the reason), and the files that belong to no student."""
    known = {p.name[:2]: p.stem for p in notebooks.solution_notebooks()}
    results: list[StudentResult] = []
    with tempfile.TemporaryDirectory(prefix="submissions-") as tmp:
        unpacked, refused = unpack(Path(submissions), Path(tmp))
        folder = submission_root(unpacked)
        wrapper = folder.relative_to(unpacked).parts
        refused_of: dict[str, list[str]] = {}
        loose = [p.name for p in folder.iterdir() if p.is_file() and p.name not in JUNK]
        for name, why in refused:
            student = _student_of(name, wrapper)
            if student is None:
                loose.append(f"{name} (refused: {why})")
            else:
                refused_of.setdefault(student, []).append(f"{name}: {why}")
        for student_dir in sorted(p for p in folder.iterdir() if p.name not in JUNK and not p.is_file()):
            if students and student_dir.name not in students:
                continue
            if student_dir.is_symlink() or not STUDENT_ID.match(student_dir.name):
                why = "a symbolic link, not a folder" if student_dir.is_symlink() else "not a usable student id"
                results.append(StudentResult(student=student_dir.name, status="failed", notes=[f"folder: {why}"]))
                continue
            bad = refused_of.get(student_dir.name)
            if bad:
                results.append(StudentResult(student=student_dir.name, status="failed",
                                             notes=["refused: the zip holds " + "; ".join(bad[:3])]))
                continue
            results.append(stage_student(root, student_dir, known))
        # a student whose only files were refused has no folder: a row all the same
        for student, bad in refused_of.items():
            if not any(r.student == student for r in results) and (not students or student in students):
                results.append(StudentResult(student=student, status="failed",
                                             notes=["refused: the zip holds " + "; ".join(bad[:3])]))
    for r in results:  # a note is one line, whatever the file names hold
        r.notes = [one_line(note, 1000) for note in r.notes]
    return results, loose
