"""Copy what students need into a folder of its own, for a separate student repository.

    python -m grading publish DEST [--repo OWNER/NAME]

This repository holds the solutions (`solutions/`) and the hidden references (`grading/`); a Colab
link must point at a repository without them. DEST receives the release notebooks, the `starter`
package with the public references, the dataset scripts, the reference run's printed numbers and figures for
the written questions (`reference_run/`), the packaging files and a short README,
and nothing else; the copy is then checked for anything that must stay private, and for any mention
of a file of this repository that the copy lacks (`kit.py`, `benchmarks/…`), which would send a student
looking for it. With `--repo`, the GitHub address in the notebooks' first cell and Colab badges becomes
that of the student repository.
"""
from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py

from starter.compare import case_names
from starter.runtime import TRAINED_MODEL, checkpoint_file

from . import notebooks

ROOT = notebooks.ROOT
FILES = ["pyproject.toml", "requirements.txt", "environment.yml", ".gitignore"]
PACKAGING = FILES[:3]  # the files the copy gets a version of its own of (packaging_for_the_copy)
TREES = {"notebooks": "*.ipynb", "starter": "*", "data": "*.py",
         "reference_run": "*"}  # the reference run's printed numbers and figures (grading/reference_run.py)
DEFAULT_REPO = "attention-course-kit/attention-transformers"  # the address the notebooks are written with
TEXT_SUFFIXES = {".ipynb", ".py", ".md", ".toml", ".txt", ".yml"}
# Paths a mention may name although the copy does not hold them: what a student's own runs make there
# (notebook 06's checkpoints, the datasets built on first use). Everything else named must ship.
STUDENT_MADE = {"runs", TRAINED_MODEL, checkpoint_file("coco-grid"), checkpoint_file("coco-fc7"), "data/cache",
                f"notebooks/{TRAINED_MODEL}",  # a local copy's course folder is notebooks/
                # what notebooks 06's and 07's scripts write: the training log, its evaluation, and the resume trial's runs
                TRAINED_MODEL.replace(".pt", ".csv"), TRAINED_MODEL.replace(".pt", ".json"), "runs/resume_check",
                "runs/resume_check/one_go.pt", "runs/resume_check/resumed.pt"}
README = """# Attention and Transformers: student notebooks

Open the notebooks in order, on Google Colab (the badges; the first cell of each notebook installs
this repository there and keeps your work in a Google Drive folder) or locally
(`pip install -e ".[jupyter]"`, then `jupyter lab notebooks/`). Fill in the cells marked
`# YOUR CODE HERE`; the test cell under each prints a one-line hint when something is wrong.

{badges}

## Where your work is

The notebooks work in one **course folder**: notebook 06 saves its trained model there, as
`runs/captioning_transformer.pt`, and notebooks 05 to 09 read your earlier notebooks (07 to 09 also
that model) from it.

- **Locally** the course folder is the folder of the notebooks you opened: `notebooks/` after
  `jupyter lab notebooks/`, so the trained model is `notebooks/runs/captioning_transformer.pt`.
- **On Colab** (with `USE_DRIVE = True`, the first cell's default) it is `My Drive/attention-course`
  in your Google Drive: the first cell puts copies of the ten notebooks there (open them from there:
  *File → Open notebook → Google Drive*), and the trained model is
  `My Drive/attention-course/runs/captioning_transformer.pt`. A notebook opened from its badge and
  saved with *File → Save a copy in Drive* lands in `My Drive/Colab Notebooks` instead, as
  `Copy of 0N_….ipynb`. With `USE_DRIVE = False` everything is in `/content` and gone with the runtime.

## If your model does not train

Notebooks 07 to 09 ask written questions about what your trained model prints and draws. If your model
of notebooks 05 and 06 does not train, answer them from the course's reference run instead:
`reference_run/07_generation_and_evaluation.md`, `reference_run/08_decoding.md` and
`reference_run/09_visualizing_attention.md` hold what those notebooks printed and drew when run with the
course's own answers, their figures in folders of the same names (on Colab:
`/content/attention-transformers/reference_run/`, in the file browser on the left). Each question says which
part to use.

## Handing in

Hand in **the ten notebooks and notebook 06's trained model**:

- your `01_…` to `09_….ipynb`, from the course folder (on Colab also from `My Drive/Colab Notebooks`
  for a notebook you saved there; a `Copy of 0N_….ipynb` is fine as it is: the grader knows a notebook
  by its number);
- `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks.
  One test cell of notebook 07 (3 points) grades the model in that file on scenes nobody has seen; the
  grader does not train your model again, so without the file those points are lost. Your training
  script saves it there (`train_captioner.py`, which notebook 06 has you write).

The scripts themselves need not be handed in: they are in notebooks 06's and 07's cells, and the grader writes them
again from there. The end of each notebook says the same.
"""


def colab_badge(repo: str, notebook: str) -> str:
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{repo}/blob/main/notebooks/{notebook})")


class LeakError(RuntimeError):
    pass


class MissingPathError(RuntimeError):
    """The copy mentions a file or folder of this repository that it does not hold."""


def hidden_case_names() -> set[str]:
    return case_names(notebooks.HIDDEN_REFERENCES)


def check_no_leak(dest: Path) -> None:
    """Raise LeakError if `dest` holds solution code or hidden tests/references."""
    hidden = hidden_case_names()
    for path in dest.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(dest)
        if rel.parts[0] in {"solutions", "grading", "tests"}:
            raise LeakError(f"{rel}: private folder")
        if path.suffix in TEXT_SUFFIXES:
            text = path.read_text(encoding="utf-8", errors="replace")
            for marker in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS"):
                if marker in text:
                    raise LeakError(f"{rel}: contains {marker!r}")
        if path.suffix == ".h5":
            with h5py.File(path, "r") as f:
                names: list[str] = []
                f.visititems(lambda n, o, names=names: names.append(n) if isinstance(o, h5py.Group) else None)
            if hidden & set(names):
                raise LeakError(f"{rel}: holds hidden reference cases {sorted(hidden & set(names))[:3]}")


# ------------------------------------------------------------------ mentions of what the copy lacks
# A relative path in text: components joined by "/", not inside a URL or an absolute path (no "/", ":"
# or word character just before it), or a bare file name.
_PATH = re.compile(r"(?<![\w./:@~-])((?:[\w.-]+/)+[\w.*…-]*|[\w-]+\.(?:py|ipynb|md|toml|txt|yml|yaml|pt|h5))")


def kit_entries() -> set[str]:
    """The names at the top of this repository (kit.py, benchmarks, grading, ...) and runs: a mention that
    starts with one of them names a file of the kit, which the copy must then hold (or a student's work make)."""
    return {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} | {"runs"}


def _exists(dest: Path, mention: str) -> bool:
    path = mention.rstrip("/").split("…")[0]
    if path in STUDENT_MADE:
        return True
    if "…" in mention:  # `notebooks/0N_…`: a name that starts so
        return any(dest.glob(path + "*"))
    return any(dest.glob(path)) if "*" in path else (dest / path).exists()


def missing_mentions(text: str, dest: Path, entries: set[str] | None = None) -> list[str]:
    """The paths in `text` that name a file or folder of this repository which `dest` does not hold."""
    entries = kit_entries() if entries is None else entries
    found = []
    for match in _PATH.finditer(text):
        mention = match.group(1)
        if mention.split("/")[0] in entries and not _exists(dest, mention):
            found.append(mention)
    return found


def check_mentions(dest: Path) -> None:
    """Raise MissingPathError listing every text file of `dest` that names what `dest` lacks."""
    entries = kit_entries()
    problems = []
    for path in sorted(dest.rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            missing = missing_mentions(path.read_text(encoding="utf-8", errors="replace"), dest, entries)
            if missing:
                problems.append(f"{path.relative_to(dest)}: {', '.join(sorted(set(missing)))}")
    if problems:
        raise MissingPathError("the student copy mentions what it does not hold:\n" + "\n".join(problems))


# ------------------------------------------------------------------ the copy's packaging files
def _strip_comment(line: str, drop: Callable[[str], object]) -> str | None:
    """`line` without a comment that `drop(comment)` is true of; None when nothing is left of it."""
    code, sep, comment = line.partition("#") if line.lstrip().startswith("#") else line.partition("  #")
    if not sep or not drop(comment):
        return line
    return code.rstrip() or None


def packaging_for_the_copy(name: str, text: str, dest: Path) -> str:
    """The copy's version of a packaging file (requirements.txt, environment.yml, pyproject.toml): comments
    that name files the copy lacks left out, and in pyproject.toml the maintainers' tool settings (tests,
    lint, types) and the grading package too; what it installs stays the same (tests/test_publish.py)."""
    entries = kit_entries()
    lines = text.splitlines()
    if name == "pyproject.toml":
        kept, keep = [], True
        for line in lines:
            if line.startswith("["):
                keep = not line.startswith(("[tool.", "[[tool.")) or line.startswith("[tool.setuptools")
            if keep:
                kept.append(line)
        lines = [line.replace('"grading*", ', "").replace(', "grading.work*", "grading.references*"', "")
                 for line in kept]
    out = [line for line in (_strip_comment(line, lambda c: missing_mentions(c, dest, entries)) for line in lines)
           if line is not None]
    return "\n".join(out).rstrip("\n") + "\n"


def publish(dest: Path, repo: str = DEFAULT_REPO) -> Path:
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    for folder, pattern in TREES.items():
        for path in sorted((ROOT / folder).rglob(pattern)):
            rel = path.relative_to(ROOT)
            if path.is_dir() or "__pycache__" in rel.parts or "cache" in rel.parts[1:2]:
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)
    files = [name for name in FILES if (ROOT / name).exists()]
    for name in files:
        shutil.copy2(ROOT / name, dest / name)
    for name in set(files) & set(PACKAGING):  # once all is there: what their comments name is there or not
        text = (ROOT / name).read_text(encoding="utf-8")
        (dest / name).write_text(packaging_for_the_copy(name, text, dest), encoding="utf-8")
    released = sorted((dest / "notebooks").glob("*.ipynb"))
    if repo != DEFAULT_REPO:
        for nb in released:
            nb.write_text(nb.read_text(encoding="utf-8").replace(DEFAULT_REPO, repo), encoding="utf-8")
    badges = "\n".join(f"- {colab_badge(repo, nb.name)} `{nb.stem}`" for nb in released)
    (dest / "README.md").write_text(README.format(badges=badges), encoding="utf-8")
    check_no_leak(dest)
    check_mentions(dest)
    return dest
