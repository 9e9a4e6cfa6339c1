"""Where a notebook runs, and how its errors read. The first cell of every notebook calls
``start_notebook()``.

**The course folder** holds your notebooks and what they save (``runs/`` with notebook 06's
checkpoint). Notebooks 05 to 09 load your earlier notebooks from it (on Colab also from
``MyDrive/Colab Notebooks``, see below), never from the kit's blank copies. It is the working folder
of the notebook's kernel (Jupyter starts the kernel in the notebook's folder), unless ``$COURSE_NOTEBOOKS_DIR`` names another one.

**On Google Colab** a new runtime starts with an empty ``/content``: files written there are gone the
next day, and notebook 07 runs in another runtime than notebook 06. With ``use_drive=True`` the first
cell mounts Google Drive, makes ``MyDrive/<course_dir>`` the course folder (and the working folder),
keeps the datasets in its ``data/`` folder, and puts copies of the course's notebooks there if they are
missing. Open them from Drive and your work,
your earlier notebooks and 06's checkpoint are all in one place that outlives the runtime. A notebook
opened from its Colab badge and saved with "Save a copy in Drive" lands in ``MyDrive/Colab Notebooks``
instead: notebooks 05 to 09 look there too (the newest copy you worked on wins over a blank one), and
the first cell says so while such copies are there.

**Errors.** An unfinished task (``raise NotImplementedError()``) used by a demo cell prints one line
naming the function instead of a traceback, and a later cell that fails only because that cell never
set a variable says so in one line. Every other error keeps its normal traceback.
"""
from __future__ import annotations

import ast
import importlib
import os
import shutil
import sys
from pathlib import Path

from data.common import DATA_ENV

KIT_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_ENV = "COURSE_NOTEBOOKS_DIR"  # the environment variable naming the course folder
SAVES_ENV = "COURSE_COLAB_SAVES"  # MyDrive/Colab Notebooks, for a process a Colab notebook starts
GRADING_ENV = "NBGRADER_EXECUTION"  # set (by nbgrader, and by the kit's sandbox) while a notebook is graded
DATA_NOTEBOOK = "04_captioning_data.ipynb"  # the data pipeline: vocabulary, encoding, Dataset, collate
MODEL_NOTEBOOK = "05_captioning_model.ipynb"  # CaptioningTransformer, its loss, the optimiser
TRAINING_NOTEBOOK = "06_training.ipynb"  # the schedule, the step, the validation loss, train_captioner.py
GENERATION_NOTEBOOK = "07_generation_and_evaluation.ipynb"  # greedy_decode, evaluate_captions, evaluate_captioner.py
DECODING_NOTEBOOK = "08_decoding.ipynb"  # beam_search, sample_decode
TRAINED_MODEL = "runs/captioning_transformer.pt"  # where notebook 06 saves its model, in the course folder
RUN_TAG = "attention-course-run:"  # what a training run writes into each checkpoint: this, then 32 hex digits
DRIVE_MOUNT = "/content/drive"  # where Colab mounts Google Drive; "MyDrive" is the user's own files
COLAB_SAVES = "Colab Notebooks"  # the MyDrive folder where Colab's "Save a copy in Drive" puts a notebook


def checkpoint_file(dataset: str) -> str:
    """Where notebook 06 saves a model trained on `dataset`: TRAINED_MODEL (graded) for "shapes", a file of
    its own for any other, so that a COCO run never overwrites the graded checkpoint."""
    return TRAINED_MODEL if dataset == "shapes" else TRAINED_MODEL.replace(".pt", f"_{dataset}.pt")


class OneLineError(Exception):
    """An error whose message says what to do: Jupyter shows it as one line, without a traceback."""

    def _render_traceback_(self):  # IPython calls this instead of printing the traceback
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self}"]


def in_colab() -> bool:
    return "google.colab" in sys.modules


def course_folder() -> Path:
    """The folder of your notebooks and runs: $COURSE_NOTEBOOKS_DIR if set, else the working folder."""
    return Path(os.environ.get(NOTEBOOKS_ENV) or os.getcwd()).resolve()


def colab_saves_folder() -> Path | None:
    """MyDrive/Colab Notebooks on Colab with Drive mounted (where a notebook opened from its Colab badge is
    saved), else None. A process the notebook starts (notebook 06's and 07's scripts) knows it from $COURSE_COLAB_SAVES,
    which the first cell sets: such a process has not imported google.colab."""
    if os.environ.get(SAVES_ENV):
        return Path(os.environ[SAVES_ENV]).resolve()
    folder = Path(DRIVE_MOUNT, "MyDrive", COLAB_SAVES)
    return folder.resolve() if in_colab() and folder.is_dir() else None


def notebook_folders() -> list[Path]:
    """Where notebooks 05-09 look for your earlier notebooks: the course folder, then on Colab
    MyDrive/Colab Notebooks."""
    saves = colab_saves_folder()
    return [course_folder()] + ([saves] if saves and saves != course_folder() else [])


def start_notebook(use_drive: bool = True, course_dir: str = "attention-course") -> Path:
    """Set up this notebook's session; returns the course folder. Safe to run again."""
    if in_colab() and use_drive:
        folder = _drive_course_folder(course_dir)
        os.chdir(folder)
        os.environ[NOTEBOOKS_ENV] = str(folder)
        # the datasets too, so that a new runtime (notebook 07 after 06) does not build them again
        os.environ.setdefault(DATA_ENV, str(folder / "data"))
        print(f"course folder (Google Drive): {folder}")
        saves = colab_saves_folder()
        if saves is not None:  # for the scripts the notebooks run
            os.environ[SAVES_ENV] = str(saves)
        saved_apart = _course_copies(saves) if saves != folder.resolve() else []
        if saved_apart:  # said every time: a student working there should know where 05-09 look
            shown = ", ".join(saved_apart[:2]) + (", ..." if len(saved_apart) > 2 else "")
            print(f"your notebooks in My Drive/{COLAB_SAVES} ({shown}) are outside the course folder My Drive/"
                  f"{course_dir}: notebooks 05-09 look for your work in both, the newest copy you worked on "
                  "first; keep your copies in one of the two")
    elif in_colab():
        print(f"course folder: {course_folder()} (not in Google Drive: files here are gone with this runtime; "
              "set USE_DRIVE = True to keep them)")
    _install_error_display()
    return course_folder()


def _course_copies(folder: Path | None) -> list[str]:
    """Names of the files in `folder` that are copies of the course notebooks ("Copy of 01_....ipynb")."""
    stems = [p.stem for p in (KIT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")]
    return sorted(p.name for p in folder.glob("*.ipynb") if any(s in p.name for s in stems)) if folder else []


def _drive_course_folder(course_dir: str) -> Path:
    drive = importlib.import_module("google.colab.drive")  # Colab's own module, only there
    if not os.path.isdir(os.path.join(DRIVE_MOUNT, "MyDrive")):
        drive.mount(DRIVE_MOUNT)
    folder = Path(DRIVE_MOUNT, "MyDrive", course_dir)
    folder.mkdir(parents=True, exist_ok=True)
    copied = []
    for release in sorted((KIT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if not (folder / release.name).exists():
            shutil.copyfile(release, folder / release.name)
            copied.append(release.name)
    if copied:
        print(f"copied {len(copied)} blank notebooks into {folder}: open them from Google Drive "
              "(File > Open notebook > Google Drive) so that your work is saved there")
    return folder


# ------------------------------------------------------------------------------- one-line errors
_stopped: dict[str, str] = {}  # a variable that a stopped cell would have set -> why that cell stopped


def _unfinished_function(tb) -> str:
    """`Class.method` or `function` where the NotImplementedError was raised (the innermost frame)."""
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    owner = frame.f_locals.get("self")
    name = frame.f_code.co_name
    return f"{type(owner).__name__}.{name}" if owner is not None and name != "<module>" else name


def _assigned_names(source: str) -> set[str]:
    """Names a cell binds at its top level or in its blocks (assignments, defs, imports, for targets)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _one_line(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for every exception of a cell: one line for an unfinished task, for the kit's
    one-line errors (they define `_render_traceback_`) and for a name that such a stopped cell never
    set; the normal traceback for everything else."""
    if issubclass(etype, NotImplementedError):
        where = _unfinished_function(tb)
        why = f"`{where}` is not implemented yet"
        stb = [f"\x1b[31mNotImplementedError\x1b[0m: {why}: fill in its cell (and run its test), "
               "then run this cell again."]
    elif hasattr(value, "_render_traceback_"):
        why = f"of the {etype.__name__} above"
        stb = value._render_traceback_()
    elif issubclass(etype, NameError) and getattr(value, "name", None) in _stopped:
        why = None
        stb = [f"\x1b[31mNameError\x1b[0m: `{value.name}` was never set: the cell that sets it stopped because "
               f"{_stopped[value.name]}. Fix that, then run the notebook again from that cell."]
    else:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None
    if why:
        history = shell.user_ns.get("In") or [""]  # IPython's input history; the last entry is this cell
        _stopped.update(dict.fromkeys(_assigned_names(history[-1]), why))
    shell._showtraceback(etype, value, stb)
    return stb


def _install_error_display() -> None:
    ipython = sys.modules.get("IPython")  # imported already in any Jupyter kernel
    shell = ipython.get_ipython() if ipython else None
    if shell is None:  # plain Python, not a notebook
        return
    shell.set_custom_exc((Exception,), _one_line)


def missing_checkpoint(path: str | os.PathLike, notebook: str = TRAINING_NOTEBOOK) -> str:
    """One line: why there is no trained model at `path`, and how to get one."""
    path = Path(path).resolve()
    advice = (f"no trained model at {path}: run {notebook} to its end in the course folder "
              f"({course_folder()}) first, its training cell saves the checkpoint there.")
    if in_colab():
        advice += (" On Colab a new runtime starts with an empty /content, so the checkpoint survives only in "
                   f"Google Drive: run {notebook} with USE_DRIVE = True in its first cell (about a minute on a GPU), or "
                   f"upload your {path.name} to {path.parent}.")
    return advice
