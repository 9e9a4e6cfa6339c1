"""An nbgrader course directory built from `solutions/`, and nbgrader's API on it.

The repository keeps notebooks flat (`solutions/01_….ipynb`, `notebooks/01_….ipynb`); nbgrader wants
`source/<assignment>/…`. This module lays out that course directory (in a temporary or work folder),
writes its `nbgrader_config.py` (nbgrader's own keys, and the kit's steps as preprocessors in nbgrader's own
pipelines), and drives nbgrader through its Python API (`api(root)`), never through a subprocess and its log. What
a run's grading needs beyond that (its settings, the course's files) travels in its `GradingRun`, not in the
configuration.

One run at a time per course folder (`hold`): a run prepares the folder, grades into it and reports from
it, and a second run doing the same under its feet would change the hidden cases' ids and the gradebook
mid-run. `preparation_digest` says what a run was prepared with, so that grading can tell when it changed.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from . import notebooks
from .notebooks import ASSIGNMENT
from .settings import Settings

CONFIG = """\
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = "attention-transformers"
c.CourseDirectory.db_url = {db_url!r}
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".DS_Store"]
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
c.ClearSolutions.enforce_metadata = True
c.LimitOutput.max_lines = 200
c.LimitOutput.max_traceback = 20
c.Autograde.create_student = True
# Autograde: nbgrader's own steps, with Execute replaced by GradeNotebook (the notebook run in the student's
# sandbox, then its test cells scored by the judge from what the checks recorded there) and SaveAutoGrades by
# SaveJudgedScores (the judge's points into the gradebook). Their settings are not here: they get the student's
# grading (grading.worker.StudentGrading) from grading.worker.StudentAutograde, so they refuse to run under
# nbgrader's own autograde. nbgrader's AssignLatePenalties is left out: late work is grading/late.py's (its penalty
# follows the total, written answers graded later included; nbgrader's is fixed per notebook at autograde time).
c.Autograde.autograde_preprocessors = [
    "grading.worker.GradeNotebook",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "grading.worker.SaveJudgedScores",
    "grading.metadata_check.CheckCellMetadata",
]
# nbgrader's other pipelines that check the cells' metadata, with the same check, its schema compiled once
# (grading/metadata_check.py): nbgrader's own steps otherwise, in its order
c.Autograde.sanitize_preprocessors = {sanitize}
c.GenerateAssignment.preprocessors = {generate}
# Feedback: grades, the student's code and outputs, the judge's lines; never hidden sources or names.
c.GenerateFeedback.preprocessors = [
    "grading.feedback.GetGradesNotYet",
    "grading.feedback.RedactHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.GenerateFeedback.exporter_class = "grading.feedback.FeedbackHTMLExporter"
"""


class NbgraderError(RuntimeError):
    pass


DEFAULT_COURSE = notebooks.ROOT / "grading" / "work" / "course"  # the course folder when none is given


GRADEBOOK_FILE = "gradebook.db"  # the SQLite gradebook, in the course folder


def sqlite_url(root: Path) -> str:
    """The gradebook's URL when the course folder `root` keeps it, as SQLite (one writer: one worker)."""
    return f"sqlite:///{root / GRADEBOOK_FILE}"


def write_config(root: Path, db_url: str | None = None) -> None:
    """nbgrader_config.py of the course at `root`: nbgrader's own keys and pipelines, the kit's steps in them.
    A run's settings are not written here: they travel in its `GradingRun`."""
    (root / "nbgrader_config.py").write_text(CONFIG.format(
        root=str(root), db_url=db_url or sqlite_url(root),
        sanitize=_with_kit_check("Autograde", "sanitize_preprocessors"),
        generate=_with_kit_check("GenerateAssignment", "preprocessors")))


def _with_kit_check(app: str, pipeline: str) -> str:
    """nbgrader's default steps of `app`'s `pipeline`, by import name, its CheckCellMetadata the kit's."""
    from nbgrader import converters
    from nbgrader.preprocessors import CheckCellMetadata

    steps = getattr(getattr(converters, app), pipeline).default()
    names = ["grading.metadata_check.CheckCellMetadata" if step is CheckCellMetadata
             else f"{step.__module__}.{step.__name__}" for step in steps]
    if "grading.metadata_check.CheckCellMetadata" not in names:
        raise NbgraderError(f"this nbgrader's {app}.{pipeline} has no CheckCellMetadata: the kit pins nbgrader 0.9.6")
    return "[\n    " + ",\n    ".join(f"{name!r}" for name in names) + ",\n]"


@dataclass(frozen=True)
class CourseFiles:
    """What grading reads of the prepared course: the hidden cases' inputs under opaque ids (the sandbox's), the
    datasets folder (read-only in the sandbox) and the reference files the judge compares with."""

    case_inputs: Path | None
    data_dir: Path | None
    reference_dirs: tuple[Path, ...]


@dataclass(frozen=True)
class GradingRun:
    """What every student's grading in one run shares, made once by `grading.autograde.autograde` and sent whole
    (pickled) to each task, `grading.worker.grade_student(run, student)`: the course folder, the run's settings,
    the course's files, the digest of the preparation it started with (`preparation_digest`, compared with the
    folder's before and after each student) and the gradebook's URL."""

    root: Path
    settings: Settings
    files: CourseFiles
    prepared: str
    gradebook: str


def populate_source(root: Path) -> Path:
    """Copy the solution notebooks (nothing else: no data file ever goes through nbgrader) into source/."""
    source = root / "source" / ASSIGNMENT
    if source.exists():
        shutil.rmtree(source)
    source.mkdir(parents=True)
    for nb in notebooks.solution_notebooks():
        shutil.copy2(nb, source / nb.name)
    return source


_apis: dict[str, object] = {}


def api(root: Path):
    """nbgrader's API for the course at `root` with its nbgrader_config.py, made once per process."""
    if str(root) not in _apis:
        from nbgrader.apps import NbGraderAPI
        from nbgrader.coursedir import CourseDirectory
        from sqlalchemy.exc import SAWarning
        from traitlets.config.loader import PyFileConfigLoader

        # nbgrader's gradebook code links a new submission to objects outside its session, and SQLAlchemy 2
        # warns ("... not in session, add operation along ... will not proceed") for every student graded.
        # Nothing is lost by it (the tests read every grade back from the gradebook); shown once per student
        # to the instructor, it would bury the lines that matter.
        warnings.filterwarnings("ignore", message=r"Object of type <\w+> not in session", category=SAWarning)

        # nbgrader runs the `alembic` command when it creates a gradebook: this interpreter's scripts first
        bin_dir = str(Path(sys.executable).parent)
        if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
        config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
        coursedir = CourseDirectory(config=config)
        coursedir.root = str(root)
        _apis[str(root)] = NbGraderAPI(coursedir, config=config)
    return _apis[str(root)]


def last_error(result: dict) -> str:
    """The line that says what went wrong, from an API call's result (its traceback and its log)."""
    text = (result.get("error") or "") + "\n" + (result.get("log") or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "see the error log" not in ln.lower()]
    causes = [ln for ln in lines if ln.split(":")[0].endswith(("Error", "Exception", "Exit"))]
    errors = [ln for ln in lines if ln.startswith("[ERROR]")]
    return ((causes or errors or lines or ["unknown error"])[-1])[:400]


def generate_assignment(root: Path) -> None:
    result = api(root).generate_assignment(ASSIGNMENT, force=True, create=True)
    if not result.get("success"):
        raise NbgraderError(f"nbgrader generate_assignment failed: {last_error(result)}")


RECORDED_FILE = "recorded.json"  # in the course folder: from what, and as what, the assignment was last recorded


def record_assignment(root: Path, gradebook: str) -> bool:
    """Record the assignment in the gradebook (nbgrader's generate_assignment: its cells, points and checksums,
    and the release in `root/release/`), unless it is there as this folder last recorded it: the same source
    notebooks and configuration (`nbgrader_config.py`, which names the gradebook), a release of every notebook, and
    the gradebook still holding the same cells. Recording it again would change nothing and took 8 s, most of a
    preparation. Returns whether nbgrader ran."""
    stamp = root / RECORDED_FILE
    inputs = _assignment_inputs(root)
    try:
        last = json.loads(stamp.read_text())
    except (OSError, ValueError):  # none yet, or damaged: record
        last = None
    released = {p.name for p in (root / "release" / ASSIGNMENT).glob("*.ipynb")}
    if (isinstance(last, dict) and last.get("inputs") == inputs and released == set(last.get("notebooks", ()))
            and last.get("cells") is not None and last.get("cells") == recorded_cells(gradebook)):
        return False
    stamp.unlink(missing_ok=True)
    generate_assignment(root)
    stamp.write_text(json.dumps({"inputs": inputs, "cells": recorded_cells(gradebook),
                                 "notebooks": sorted(p.name for p in (root / "release" / ASSIGNMENT).glob("*.ipynb"))}))
    return True


def _assignment_inputs(root: Path) -> str:
    """A digest of what nbgrader records the assignment from: the configuration, the source notebooks, nbgrader."""
    import nbgrader

    digest = hashlib.sha256(nbgrader.__version__.encode() + b"\0" + (root / "nbgrader_config.py").read_bytes())
    for path in sorted((root / "source" / ASSIGNMENT).glob("*.ipynb")):
        digest.update(b"\0" + path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def recorded_cells(gradebook: str) -> str | None:
    """A digest of what the gradebook at `gradebook` holds of the assignment: each notebook's source cells (with
    their checksums), graded cells (with their points), solution and task cells. None if it holds no such assignment
    or cannot be read (then recording it says why)."""
    from nbgrader.api import Gradebook

    try:
        with Gradebook(gradebook) as gb:
            rows = []
            for nb in gb.find_assignment(ASSIGNMENT).notebooks:
                rows += [[nb.name, "source", c.name, c.cell_type, c.locked, c.checksum, c.source]
                         for c in nb.source_cells]
                rows += [[nb.name, "grade", c.name, c.cell_type, c.max_score] for c in nb.grade_cells]
                rows += [[nb.name, "solution", c.name] for c in nb.solution_cells]
                rows += [[nb.name, "task", c.name, c.max_score] for c in nb.task_cells]
    except Exception:  # no such assignment (MissingEntry), no gradebook or no server: record, which says why
        return None
    return hashlib.sha256(json.dumps(sorted(rows, key=str)).encode()).hexdigest()


def release(dest: Path = notebooks.RELEASE, mirrors: Path | None = None) -> list[Path]:
    """Generate the student notebooks from solutions/ into `dest` (only .ipynb files are copied out), and
    the solutions' Python mirrors for review into `mirrors` (grading.mirrors). Releasing into notebooks/
    writes the mirrors into solutions/py/; a release elsewhere (a test's) writes none unless asked.
    Returns the student notebooks written."""
    from . import mirrors as review_mirrors

    if mirrors is None and dest.resolve() == notebooks.RELEASE.resolve():
        mirrors = review_mirrors.MIRRORS
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        root = Path(tmp)
        write_config(root)
        with open(root / "nbgrader_config.py", "a") as f:
            f.write("c.GenerateAssignment.no_database = True\nc.SaveCells.enabled = False\n")  # no gradebook
        populate_source(root)
        generate_assignment(root)
        out_dir = root / "release" / ASSIGNMENT
        dest.mkdir(parents=True, exist_ok=True)
        written = []
        for nb in sorted(out_dir.glob("*.ipynb")):
            target = dest / nb.name
            shutil.copyfile(nb, target)
            written.append(target)
        stale = {p.name for p in dest.glob("*.ipynb")} - {p.name for p in written}
        for name in stale:  # a notebook removed from solutions/ leaves the release too
            (dest / name).unlink()
    if mirrors is not None:
        review_mirrors.write_mirrors(mirrors)  # logs each mirror it changes
    return written


def prepare_grading_course(root: Path, db_url: str | None = None, held: CourseHold | None = None,
                           mounted: Callable[[CourseFiles], object] | None = None) -> CourseFiles:
    """Lay out a course directory for autograding and record the assignment in the gradebook: the
    source notebooks, the hidden cases' inputs for the sandboxes, and the dataset notebooks 04-09 load.
    Holds the folder (`hold`) while it does, unless the caller gives its hold of it (`held`: a run holds
    the folder from before it is prepared until its report is written). `mounted(files)` is called once what the
    sandboxes mount is in place, before nbgrader records the assignment (a run starts its workers' sandboxes
    then); a folder prepared before from the same notebooks, whose gradebook still holds them as recorded, is not
    recorded again (`record_assignment`). Returns the files grading reads there."""
    from data.common import default_data_dir
    from starter.data import load_dataset

    from .sandbox import write_case_inputs

    if held is not None and held.root != Path(root).resolve():
        raise ValueError(f"the hold given is of {held.root}, not of the course folder {root}")
    with hold(root, "prepare the course folder") if held is None else contextlib.nullcontext():
        write_config(root, db_url)
        populate_source(root)
        if (root / "case_inputs").exists():
            shutil.rmtree(root / "case_inputs")
        write_case_inputs(notebooks.HIDDEN_REFERENCES, root / "case_inputs")  # + case_inputs.json: id -> name
        load_dataset("shapes")  # built once here: the sandboxes see the data folder read-only
        files = CourseFiles(root / "case_inputs", default_data_dir(),
                            (notebooks.PUBLIC_REFERENCES, notebooks.HIDDEN_REFERENCES))
        if mounted is not None:
            mounted(files)
        _apis.pop(str(root), None)  # the configuration was just written
        record_assignment(root, db_url or sqlite_url(root))
    return files


def preparation_digest(root: Path) -> str:
    """A digest of what grading reads from the course's preparation: its configuration, the source notebooks,
    the hidden cases' inputs with their id map (new random ids each time the course is prepared) and the
    hidden references the judge compares with. A different digest: the course was prepared again, or
    something in it changed, since the digest was taken."""
    files = [root / "nbgrader_config.py", root / "case_inputs.json",
             *sorted((root / "case_inputs").glob("*")), *sorted((root / "source" / ASSIGNMENT).glob("*.ipynb")),
             *sorted(notebooks.HIDDEN_REFERENCES.glob("*.h5"))]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path).encode() + b"\0")
        try:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        except OSError:  # missing or unreadable: that differs from the file
            digest.update(b"unreadable")
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------------
# One run per course folder

LOCK_FILE = "grading.lock"  # in the course folder; says who holds it (JSON), the lock itself is flock's


@dataclass(frozen=True)
class CourseHold:
    """A held course folder (what `hold` yields): passed to what would otherwise take the hold itself."""

    root: Path  # resolved
    run: str


class CourseLockError(RuntimeError):
    """The course folder is held by another run (or cannot be locked): nothing was changed."""


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote in the lock file (it writes right after it takes the lock)."""
    for _ in range(20):
        raw = os.pread(fd, 4096, 0)
        try:
            info = json.loads(raw)
            break
        except ValueError:
            time.sleep(0.05)
    else:
        return "its details unreadable in the lock file"
    if not isinstance(info, dict):
        return "its details unreadable in the lock file"
    text = (f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: {info.get('run')}; "
            f"command: {info.get('command')}")
    return " ".join(text.split())[:500]  # one line, whatever the file holds


def _command() -> str:
    """This process's command line, as typed for the grading command (`python -m grading ...`)."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).parts[-2:] == ("grading", "__main__.py"):
        argv[0:1] = ["python", "-m", "grading"]
    return shlex.join(argv)[:300]


@contextlib.contextmanager
def hold(root: Path, run: str) -> Iterator[CourseHold]:
    """Hold the course folder `root` for `run` (what it is, e.g. "autograde SUBMISSIONS --out OUT"), or raise
    CourseLockError at once, naming the run that holds it, before anything is changed.

    An exclusive `flock` on `root`/grading.lock: the kernel drops it when the holder's process ends, killed
    or not, so a lock is never left behind by a dead run (on NFS, once the server notices). Only the process
    that runs the whole flow takes it: Dask workers, here or on other machines, grade inside the parent's
    hold. It is not taken twice: the second try, even from this process, is another run's and raises; what
    the holder calls gets its `CourseHold` (autograde holds the folder, then prepares the course with it)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise CourseLockError(f"cannot open the course lock {path} ({exc.strerror}): grading needs a writable "
                              "course folder") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CourseLockError(f"the course folder {root} is in use by another grading run ({_holder(fd)}); "
                                  "nothing was changed: wait for that run to end, or use another --course") from None
        except OSError as exc:
            raise CourseLockError(f"cannot lock {path} ({exc.strerror}): its file system has no file locks, so "
                                  "two runs could change the course under each other; use a local course folder "
                                  "(--course)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                   "started": datetime.now().astimezone().isoformat(timespec="seconds"),
                                   "run": run, "command": _command()}) + "\n").encode(), 0)
        try:
            yield CourseHold(root.resolve(), run)
        finally:
            os.ftruncate(fd, 0)  # nobody to name any more
    finally:
        os.close(fd)  # releases the lock
