"""Use what you wrote in an earlier notebook, without copying it.

    from starter.notebook_loader import load_definitions
    mine = load_definitions("03_multi_head_attention.ipynb", ["MultiHeadAttention"])
    MultiHeadAttention = mine["MultiHeadAttention"]

The notebook file is read as JSON; its set-up cells (tagged `setup`) and your answer cells (the ones
with `# YOUR CODE HERE` in the student version) run in a fresh namespace; nothing else runs (no
plots, no training, no test cells). The file is looked for where you say, then in the current
folder, then in `notebooks/` of the course kit.
"""
from __future__ import annotations

import json
from pathlib import Path

from .runtime import OneLineError, course_folder


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


def find_notebook(name: str, folder: str | Path | None = None) -> Path:
    where = Path(folder).resolve() if folder is not None else course_folder()
    exact = where / name
    if exact.is_file():
        return exact
    copies = [p for p in where.glob(f"*{Path(name).stem}*.ipynb") if p.is_file()]
    if copies:
        return max(copies, key=lambda p: p.stat().st_mtime)
    raise NotebookLoadError(
        f"can't find your {name} in {where}: keep your notebooks together in one folder (on Colab: the "
        "course folder in Google Drive that the first cell sets up), or pass folder=... .")


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
        meta = cell.get("metadata", {})
        if not ("setup" in meta.get("tags", []) or (meta.get("nbgrader") or {}).get("solution")):
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
