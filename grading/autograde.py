"""Autograde a folder or zip of student submissions: the whole flow, read top to bottom in `autograde`.

1. intake (this module): unpack and stage each student's notebooks, rebuilt on the release;
2. grade one student (`worker.grade_student`, one Dask task per student, `engine.run`): nbgrader's
   autograde with the sandbox (`sandbox.py`) as its Execute step and the judge (`judge.py`) scoring
   the test cells, then the feedback pages;
3. record: nbgrader's SaveAutoGrades writes the judge's scores to the gradebook;
4. report (this module): `grades.csv`, `failures.csv`/`.png`, the feedback pages, `report.json`.

Layout of SUBMISSIONS (a folder, or a zip of one): one folder per student, holding that student's
notebooks (any depth; names such as `01_scaled_dot_product_attention (1).ipynb` are recognised by
their number). Original files are only read, never moved or changed.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import stat
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from . import course, engine, notebooks
from .submission import read_any, rebuild
from .notebooks import ASSIGNMENT

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


def unpack(path: Path, into: Path) -> tuple[Path, list[tuple[str, str]]]:
    """A folder of submissions from a folder or a zip, and the zip members refused: (name, why).

    Members that would land outside `into` (absolute paths, `..`), symbolic links and oversized
    files are not extracted; the student whose folder held one is refused with the reason (the rest
    of the class is graded)."""
    if path.is_dir():
        return path, []
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is neither a folder nor a zip file")
    refused = []
    with zipfile.ZipFile(path) as zf:
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
            elif info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    return into, refused


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


def read_submission(path: Path):
    """(notebook, None), or (None, why it cannot be read)."""
    try:
        return read_any(path), None
    except Exception as exc:  # noqa: BLE001 - any parse failure is the student's file
        return None, f"corrupt notebook ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]})"


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
    for path in _files(student_dir, result):
        rel = path.relative_to(student_dir)
        if any(part in JUNK for part in rel.parts):
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
        nb, problem = read_submission(chosen)
        if problem:
            result.notes.append(f"{rel}: not graded: {problem}")
            continue
        rebuilt = rebuild(nb, notebooks.read(notebooks.RELEASE / f"{stem}.ipynb"))
        result.notes += [f"{rel}: {note}" for note in rebuilt.notes]
        nbformat.write(rebuilt.notebook, str(dest / f"{stem}.ipynb"))
        result.notebooks[stem] = str(rel)


# --------------------------------------------------------------------------------------------------
# Grading and reporting

def stage_student(root: Path, student_dir: Path, known: dict[str, str]) -> StudentResult:
    """Copy one student's gradable notebooks into the course's submitted/ folder."""
    result = StudentResult(student=student_dir.name)
    submitted = root / "submitted" / result.student / ASSIGNMENT
    if submitted.exists():
        shutil.rmtree(submitted)
    collect(student_dir, known, result, submitted)
    if not result.notebooks:
        result.status = "no notebooks"
    return result


def copy_feedback(root: Path, out: Path, student: str) -> None:
    """Only the HTML pages: the feedback folder also receives copies of the (hidden) source files."""
    src = root / "feedback" / student / ASSIGNMENT
    dst = out / "feedback" / student
    if dst.exists():
        shutil.rmtree(dst)
    for page in sorted(src.glob("*.html")) if src.is_dir() else []:
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page, dst / page.name)


def graded_columns() -> list[tuple[str, str, float]]:
    """(notebook stem, grade_id, points) of every test cell, in notebook order."""
    cols = []
    for path in notebooks.solution_notebooks():
        for cell in notebooks.test_cells(notebooks.read(path)):
            meta = notebooks.nbgrader_meta(cell)
            cols.append((path.stem, meta["grade_id"], float(meta.get("points", 0))))
    return cols


def scores_from_gradebook(gb, student: str) -> dict[tuple[str, str], float]:
    """{(notebook, grade_id): score} of one student, from an open nbgrader Gradebook."""
    from nbgrader.api import MissingEntry

    try:
        submission = gb.find_submission(ASSIGNMENT, student)
    except MissingEntry:
        return {}
    return {(nb.name, grade.name): float(grade.score or 0.0) for nb in submission.notebooks for grade in nb.grades}


def write_grades(out: Path, results: list[StudentResult], db_url: str) -> Path:
    cols = graded_columns()
    stems = list(dict.fromkeys(c[0] for c in cols))
    header = ["student", "status"] + [f"{s}:{g}" for s, g, _ in cols] + [f"{s}:total" for s in stems]
    header += ["total", "max_total", "review", "notes"]
    rows = [["(max points)", ""] + [p for _, _, p in cols]
            + [sum(p for s2, _, p in cols if s2 == s) for s in stems]
            + [sum(p for *_, p in cols), sum(p for *_, p in cols), "", ""]]
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        graded = {r.student: scores_from_gradebook(gb, r.student) for r in results if r.status == "graded"}
    for r in sorted(results, key=lambda r: r.student):
        scores = graded.get(r.student, {})
        per = [scores.get((s, g), 0.0) for s, g, _ in cols]
        totals = [sum(v for (s2, _, _), v in zip(cols, per) if s2 == s) for s in stems]
        rows.append([r.student, r.status] + per + totals
                    + [sum(per), sum(p for *_, p in cols), " | ".join(r.flags), " | ".join(r.notes)])
    path = out / "grades.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header] + rows)
    return path


def write_failure_summary(out: Path, grades_csv: Path) -> tuple[Path, Path]:
    """Which tests failed most often across the class: a table and a bar chart, most failed first.

    Only students whose notebook was graded count for that notebook's tests (a missing notebook is
    not evidence about a concept).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(grades_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    maxima, students = rows[0], rows[1:]
    columns = [c for c in maxima if ":" in c and not c.endswith(":total")]
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {"students": []}
    submitted = {s["student"]: set(s["notebooks"]) for s in report["students"]}
    table = []
    for col in columns:
        stem = col.split(":")[0]
        took = [r for r in students if r["status"] == "graded" and stem in submitted.get(r["student"], {stem})]
        failed = [r for r in took if float(r[col] or 0) < float(maxima[col])]
        table.append((col, float(maxima[col]), len(took), len(failed), len(failed) / len(took) if took else 0.0))
    table.sort(key=lambda t: (-t[4], t[0]))
    csv_path = out / "failures.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["test", "points", "students_graded", "students_failed", "fail_rate"])
        w.writerows([(c, p, n, k, f"{r:.3f}") for c, p, n, k, r in table])
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(4, len(table)) + 1.2))
    labels = [c for c, *_ in table][::-1]
    ax.barh(labels, [100 * r for *_, r in table][::-1], color="tab:red")
    ax.set_xlabel("students who lost points on this test (%)")
    ax.set_xlim(0, 100)
    ax.set_title(f"Most-failed tests across the class ({len(students)} students)")
    for i, (_, _, n, k, r) in enumerate(table[::-1]):
        ax.text(min(100 * r + 1, 92), i, f"{k}/{n}", va="center", fontsize=8)
    fig.tight_layout()
    png_path = out / "failures.png"
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return csv_path, png_path


def autograde(submissions: Path, out: Path, course_dir: Path | None = None, db_url: str | None = None,
              students: list[str] | None = None, workers: int = 1, resume: bool = False,
              cell_timeout: int = course.CELL_TIMEOUT, notebook_timeout: int = course.NOTEBOOK_TIMEOUT,
              sandbox: bool = True, scheduler: str | None = None, progress: bool = False) -> list[StudentResult]:
    """Grade every student in `submissions` (folder or zip). Returns one result per student folder.

    resume=True keeps the results of students graded by an earlier, interrupted run. sandbox=False
    runs student code without isolation (only where bubblewrap cannot be had): every row is flagged.
    `workers` worker processes on this machine, or the Dask cluster at `scheduler` (grading/engine.py).
    """
    if sandbox:
        from .sandbox import require_bwrap

        require_bwrap()  # before any work: without it, say how to get it
    out.mkdir(parents=True, exist_ok=True)
    root = course_dir or (notebooks.ROOT / "grading" / "work" / "course")
    if db_url is None and (workers > 1 or scheduler):
        raise ValueError("the SQLite gradebook allows one writer: use --workers 1, or --db with a PostgreSQL URL")
    status = root / "status"
    if not resume and status.exists():
        shutil.rmtree(status)
    course.prepare_grading_course(root, db_url, cell_timeout, isolate=sandbox, notebook_timeout=notebook_timeout)
    db_url = db_url or f"sqlite:///{root / 'gradebook.db'}"
    known = {p.name[:2]: p.stem for p in notebooks.solution_notebooks()}
    results: list[StudentResult] = []
    with tempfile.TemporaryDirectory(prefix="submissions-") as tmp:
        unpacked, refused = unpack(Path(submissions), Path(tmp))
        folder = submission_root(unpacked)
        loose = [p.name for p in folder.iterdir() if p.is_file() and p.name not in JUNK]
        for student_dir in sorted(p for p in folder.iterdir() if p.name not in JUNK and not p.is_file()):
            if students and student_dir.name not in students:
                continue
            if student_dir.is_symlink() or not STUDENT_ID.match(student_dir.name):
                why = "a symbolic link, not a folder" if student_dir.is_symlink() else "not a usable student id"
                results.append(StudentResult(student=student_dir.name, status="failed", notes=[f"folder: {why}"]))
                continue
            bad = [f"{name}: {why}" for name, why in refused if student_dir.name in Path(name).parts]
            if bad:
                results.append(StudentResult(student=student_dir.name, status="failed",
                                             notes=["refused: the zip holds " + "; ".join(bad[:3])]))
                continue
            results.append(stage_student(root, student_dir, known))
        # a student whose only files were refused has no folder: a row all the same
        depth = len(folder.relative_to(unpacked).parts)
        for name, why in refused:
            parts = Path(name).parts
            student = parts[depth] if len(parts) > depth + 1 and parts[depth] != ".." else None
            if student is None:
                loose.append(f"{name} (refused: {why})")
            elif not any(r.student == student for r in results) and (not students or student in students):
                results.append(StudentResult(student=student, status="failed",
                                             notes=[f"refused: the zip holds {name}: {why}"]))
    gradable = [r.student for r in results if r.status != "failed"]
    records = engine.run(root, gradable, workers=workers, scheduler=scheduler, progress=progress)
    for r in results:
        record = records.get(r.student)
        if record is None:
            continue
        r.seconds = record.get("seconds", 0.0)
        r.notes += record.get("notes", [])
        r.flags += record.get("flags", [])
        if record.get("ok"):
            r.status = "graded" if r.status != "no notebooks" else r.status
            copy_feedback(root, out, r.student)
        else:
            r.status = "failed"
            r.notes.append(record.get("error", "unknown error"))
        print(f"{r.student}: {r.status} ({r.seconds:.1f} s)", flush=True)
    if loose:
        print(f"ignored files outside student folders: {', '.join(loose)}")
    (out / "report.json").write_text(json.dumps(
        {"students": [asdict(r) for r in results], "ignored_loose_files": loose}, indent=2))
    write_failure_summary(out, write_grades(out, results, db_url))
    return results
