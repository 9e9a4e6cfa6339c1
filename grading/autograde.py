"""Autograde a folder or zip of student submissions with nbgrader, one student at a time.

Layout of SUBMISSIONS (a folder, or a zip of one): one folder per student, holding that student's
notebooks (any depth; names such as `01_scaled_dot_product_attention (1).ipynb` are recognised by
their number). Each student is graded by its own nbgrader process, so a broken or malicious notebook
cannot stop the others. Original files are only read, never moved or changed.

Outputs in OUT: `grades.csv` (one row per student, one column per test cell, totals, and notes),
`feedback/<student>/<notebook>.html` (no hidden tests), `report.json`, and `logs/<student>.log`.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from . import course, notebooks
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

def unpack(path: Path, into: Path) -> Path:
    """A folder of submissions from a folder or a zip (extracted safely into `into`)."""
    if path.is_dir():
        return path
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is neither a folder nor a zip file")
    with zipfile.ZipFile(path) as zf:
        total = sum(i.file_size for i in zf.infolist())
        if total > MAX_ZIP_BYTES:
            raise ValueError(f"{path} unpacks to {total / 1e9:.1f} GB; refusing")
        for info in zf.infolist():
            target = (into / info.filename).resolve()
            if not str(target).startswith(str(into.resolve())):
                raise ValueError(f"{path}: unsafe path in zip: {info.filename}")
        zf.extractall(into)
    return into


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


def collect(student_dir: Path, known: dict[str, str], result: StudentResult, dest: Path) -> None:
    """Copy the student's gradable notebooks to `dest/<notebook>.ipynb`; note every other file."""
    candidates: dict[str, list[Path]] = {}
    for path in sorted(student_dir.rglob("*")):
        if any(part in JUNK for part in path.relative_to(student_dir).parts) or path.is_dir():
            continue
        rel = path.relative_to(student_dir)
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
# Grading

def _die_with_parent() -> None:
    """In the worker (Linux): be killed when the grading run that started it dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _spawn(root: Path, students: list[str]) -> subprocess.Popen:
    # its own process group, so a stuck worker is killed together with its kernels
    return subprocess.Popen([sys.executable, "-m", "grading.worker", str(root), *students], cwd=root,
                            env=course.nbgrader_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and the kernels it started
    except ProcessLookupError:
        pass
    proc.wait()


def run_workers(root: Path, students: list[str], workers: int = 1, student_timeout: float = 900) -> dict[str, dict]:
    """Grade `students` with up to `workers` worker processes; return each student's status record.

    A worker that makes no progress for `student_timeout` seconds is killed and the student it was on
    is recorded as failed. A worker that dies otherwise (killed from outside, out of memory) gets
    its student retried once by a new worker; a second death records the student as failed. A new
    worker takes the remaining students either way. Students that already have a status record
    (from an interrupted earlier run) are not graded again.
    """
    status = root / "status"
    status.mkdir(exist_ok=True)

    def done(s: str) -> bool:
        return (status / f"{s}.json").exists()

    queue = [s for s in students if not done(s)]
    chunks = [queue[i::workers] for i in range(workers)] if queue else []
    retried: set[str] = set()
    running: list[tuple[subprocess.Popen, list[str], float, int]] = []
    for chunk in filter(None, chunks):
        running.append((_spawn(root, chunk), chunk, time.monotonic(), 0))
    while running:
        time.sleep(0.2)
        still = []
        for proc, chunk, last_progress, finished in running:
            now_finished = sum(done(s) for s in chunk)
            if now_finished != finished:
                last_progress, finished = time.monotonic(), now_finished
            exited = proc.poll() is not None
            stuck = time.monotonic() - last_progress > student_timeout
            if not exited and not stuck:
                still.append((proc, chunk, last_progress, finished))
                continue
            if stuck:
                _kill(proc)
            stderr = proc.stderr.read() if proc.stderr else ""
            remaining = [s for s in chunk if not done(s)]
            if remaining:
                current = next((s for s in remaining if (status / f"{s}.started").exists()), remaining[0])
                (status / f"{current}.started").unlink(missing_ok=True)
                rest = [s for s in remaining if s != current]
                if not stuck and current not in retried:
                    retried.add(current)
                    rest.insert(0, current)
                else:
                    reason = (f"grading took longer than {student_timeout:.0f} s (infinite loop?)" if stuck else
                              "the grader process died twice: "
                              + (stderr.strip().splitlines() or ["no message"])[-1][:300])
                    (status / f"{current}.json").write_text(
                        json.dumps({"student": current, "ok": False, "error": reason}))
                if rest:
                    still.append((_spawn(root, rest), rest, time.monotonic(), 0))
        running = still
    return {s: json.loads((status / f"{s}.json").read_text()) for s in students}


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
              student_timeout: float = 900, cell_timeout: int = course.CELL_TIMEOUT,
              sandbox: bool = True) -> list[StudentResult]:
    """Grade every student in `submissions` (folder or zip). Returns one result per student folder.

    resume=True keeps the results of students graded by an earlier, interrupted run. sandbox=False
    runs student code without isolation (only where bubblewrap cannot be had): every row is flagged.
    """
    if sandbox:
        from .sandbox import require_bwrap

        require_bwrap()  # before any work: without it, say how to get it
    out.mkdir(parents=True, exist_ok=True)
    root = course_dir or (notebooks.ROOT / "grading" / "work" / "course")
    if db_url is None and workers > 1:
        raise ValueError("the SQLite gradebook allows one writer: use --workers 1, or --db with a PostgreSQL URL")
    status = root / "status"
    if not resume and status.exists():
        shutil.rmtree(status)
    course.prepare_grading_course(root, db_url, cell_timeout, isolate=sandbox)
    db_url = db_url or f"sqlite:///{root / 'gradebook.db'}"
    known = {p.name[:2]: p.stem for p in notebooks.solution_notebooks()}
    results: list[StudentResult] = []
    with tempfile.TemporaryDirectory(prefix="submissions-") as tmp:
        folder = submission_root(unpack(Path(submissions), Path(tmp)))
        loose = [p.name for p in folder.iterdir() if p.is_file() and p.name not in JUNK]
        for student_dir in sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in JUNK):
            if students and student_dir.name not in students:
                continue
            if not STUDENT_ID.match(student_dir.name):
                results.append(StudentResult(student=student_dir.name, status="failed",
                                             notes=["folder name is not a usable student id"]))
                continue
            results.append(stage_student(root, student_dir, known))
    gradable = [r.student for r in results if r.status != "failed"]
    records = run_workers(root, gradable, workers, student_timeout)
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
