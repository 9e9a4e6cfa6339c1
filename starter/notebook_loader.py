"""Use what you wrote in an earlier notebook, without copying it.

    from starter.notebook_loader import load_definitions
    mine = load_definitions("03_multi_head_attention.ipynb", ["MultiHeadAttention"])
    MultiHeadAttention = mine["MultiHeadAttention"]

The notebook file is read as JSON; its set-up cells (tagged `setup`) and your answer cells (the ones
with `# YOUR CODE HERE` in the student version) run in a fresh namespace; nothing else runs (no
plots, no training, no test cells). The file is looked for where you say (`folder=`), else in the
course folder and, on Colab, in `MyDrive/Colab Notebooks` too (see `starter.runtime`); never in the
kit's own `notebooks/`, whose copies are blank.
"""
from __future__ import annotations

import json
from pathlib import Path

from .runtime import (
    GENERATION_NOTEBOOK,
    KIT_ROOT,
    MODEL_NOTEBOOK,
    TRAINED_MODEL,
    TRAINING_NOTEBOOK,
    OneLineError,
    notebook_folders,
)


class NotebookLoadError(OneLineError, RuntimeError):
    """Your notebook can't be found or run."""


class Definitions(dict):
    """The objects asked for, by name; `.path` is the notebook they came from."""

    path: Path


def read_cells(path: str | Path) -> list[dict]:
    """A notebook's cells as plain JSON dicts with `source` joined into one string (no nbformat)."""
    with open(path, encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    for cell in cells:
        if isinstance(cell.get("source"), list):
            cell["source"] = "".join(cell["source"])
    return cells


def python_source(cell: dict) -> str:
    """A code cell's source without IPython magics and shell lines (`%...`, `!...`)."""
    return "\n".join(ln for ln in cell["source"].splitlines() if not ln.lstrip().startswith(("%", "!")))


def is_answer(cell: dict) -> bool:
    return bool((cell.get("metadata", {}).get("nbgrader") or {}).get("solution"))


def is_untouched_release(path: Path, name: str) -> bool:
    """True if every answer cell of `path` is still as the release `name` has it (its `raise
    NotImplementedError()` / YOUR ANSWER HERE); without the release at hand, if every one holds that marker."""
    try:
        answers = [c["source"].strip() for c in read_cells(path) if is_answer(c)]
    except (OSError, ValueError, KeyError):
        return False  # not a blank: let load_definitions say what is wrong with it
    release = KIT_ROOT / "notebooks" / name
    if release.is_file():
        blanks = {c["source"].strip() for c in read_cells(release) if is_answer(c)}
        return all(a in blanks for a in answers)
    return all("raise NotImplementedError" in a or "YOUR ANSWER HERE" in a for a in answers)


def _copies(name: str, where: Path) -> list[Path]:
    """`name` and its renamed copies in `where` ("Copy of name", "name (1)", ...)."""
    return [p for p in where.glob(f"*{Path(name).stem}*.ipynb") if p.is_file()]


def _in_one_folder(name: str, where: Path) -> Path | None:
    """`name` itself, else its newest copy."""
    if (where / name).is_file():
        return where / name
    return max(_copies(name, where), key=lambda p: p.stat().st_mtime, default=None)


def find_notebook(name: str, folder: str | Path | None = None) -> Path:
    """Your notebook `name`: in `folder` if given, else in the course folder and, on Colab, in MyDrive/Colab
    Notebooks too; there the newest copy that is not a blank release wins (blanks only: as in one folder)."""
    folders = [Path(folder).resolve()] if folder is not None else notebook_folders()
    if len(folders) > 1:
        worked_on = [p for f in folders for p in _copies(name, f) if not is_untouched_release(p, name)]
        if worked_on:
            return max(worked_on, key=lambda p: p.stat().st_mtime)
    for where in folders:
        found = _in_one_folder(name, where)
        if found:
            return found
    raise NotebookLoadError(
        f"can't find your {name} in {' nor in '.join(map(str, folders))}: keep your notebooks together in one "
        "folder (on Colab: the course folder in Google Drive that the first cell sets up), or pass folder=... .")


def load_definitions(name: str, names: list[str], folder: str | Path | None = None) -> Definitions:
    """Run the set-up and answer cells of notebook `name`; return the objects called `names`."""
    path = find_notebook(name, folder)
    try:
        cells = read_cells(path)
    except (OSError, ValueError, KeyError) as exc:
        raise NotebookLoadError(f"{path} is not a readable notebook ({exc})") from None
    namespace: dict = {"__name__": f"notebook_{path.stem}"}
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        if not ("setup" in cell.get("metadata", {}).get("tags", []) or is_answer(cell)):
            continue
        try:
            exec(compile(python_source(cell), f"{path.name} cell {index}", "exec"), namespace)
        except NotImplementedError:
            pass  # an unfinished answer: reported below if it is one of `names`
        except Exception as exc:
            raise NotebookLoadError(f"{path} cell {index} raised {type(exc).__name__}: {exc}") from None
    missing = [n for n in names if n not in namespace]
    if missing:
        raise NotebookLoadError(f"{path} does not define {missing}: finish that notebook first.")
    found = Definitions({n: namespace[n] for n in names})
    found.path = path
    return found


def load_or_none(name: str, names: list[str], folder: str | Path | None = None) -> dict:
    """`load_definitions`, for a notebook that goes on without the pieces: the objects called `names`, or None
    for each of them when notebook `name` can't be found or run. Prints one line either way."""
    try:
        found = load_definitions(name, names, folder)
    except NotebookLoadError as exc:
        print(f"{exc} The notebook goes on without {', '.join(names)}.")
        return dict.fromkeys(names)
    print(f"{', '.join(names)} from {found.path}")
    return dict(found)


class TrainedCaptioner:
    """What `load_trained_captioner` returns: the model (eval mode), the dataset it was trained on, the
    vocabulary it was trained with, your `greedy_decode`, and every piece loaded (`defs`, by name)."""

    def __init__(self, model, info: dict, dataset, defs: dict, path: Path):
        self.model, self.info, self.dataset, self.defs, self.path = model, info, dataset, defs, path
        self.vocab = info["vocab"]  # the vocabulary notebook 06 trained with, saved with the weights
        self.greedy_decode = defs["greedy_decode"]


def load_trained_captioner(checkpoint: str | Path = TRAINED_MODEL, dataset: str | None = None, device="cpu",
                           also: dict[str, tuple[str, ...]] | None = None) -> TrainedCaptioner:
    """Your trained model, as notebooks 08 and 09 use it: `CaptioningTransformer` from your notebook 05, the
    weights notebook 06 saved at `checkpoint` (relative to the course folder), `greedy_decode` from your notebook
    07, the names `also` lists by notebook file ({"06_training.ipynb": ("train_step", ...)}) from those notebooks,
    and the dataset recorded in the checkpoint (or `dataset`). Prints what came from where; a missing piece is a
    NotebookLoadError that says which and what to do."""
    from .data import load_dataset
    from .runtime import missing_checkpoint
    from .training import load_checkpoint

    wanted = {MODEL_NOTEBOOK: ["CaptioningTransformer"], GENERATION_NOTEBOOK: ["greedy_decode"]}
    for notebook, names in (also or {}).items():
        wanted.setdefault(notebook, []).extend(n for n in names if n not in wanted[notebook])
    loaded = [load_definitions(notebook, names) for notebook, names in wanted.items()]
    if not Path(checkpoint).is_file():
        raise NotebookLoadError(missing_checkpoint(checkpoint, TRAINING_NOTEBOOK))
    print("; ".join(f"{', '.join(found)} from {found.path}" for found in loaded))
    defs = {name: obj for found in loaded for name, obj in found.items()}
    model, info = load_checkpoint(checkpoint, defs["CaptioningTransformer"], device=device)  # eval mode
    dataset = dataset or (info["extra"] or {}).get("dataset") or "shapes"
    ds = load_dataset(dataset)
    if info["config"].get("num_regions", ds.num_regions) != ds.num_regions:
        raise NotebookLoadError(f"{checkpoint} was not trained on {dataset!r} (the number of regions differs): "
                                "pass the dataset notebook 06 used")
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, from {checkpoint} | dataset "
          f"{dataset!r}: {ds.grid_shape[0]} x {ds.grid_shape[1]} regions, {ds.split('val').num_images} validation images")
    return TrainedCaptioner(model, info, ds, defs, Path(checkpoint))
