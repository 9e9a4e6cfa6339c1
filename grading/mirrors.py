"""Python mirrors of the solution notebooks, for code review.

`solutions/NN_name.ipynb` is the source of truth; `solutions/py/NN_name.py` is its jupytext "percent" mirror,
written by `python -m grading release` and committed, so that a review reads a Python diff instead of notebook
JSON. A mirror holds every cell's source (markdown as `# ` comments) and, in each `# %%` header, the cell's
`nbgrader` metadata and `tags`; nothing else (no outputs, execution counts, cell ids, notebook metadata, nor
the jupytext version), so it changes only when a cell does.

    python -m grading.mirrors --check              exit 1, one line per notebook, if a mirror is out of date
    python -m grading.mirrors --to-notebook PY...  copy an edited mirror's cells back into its notebook

`--to-notebook` keeps what the mirror does not hold from the notebook (cell ids, outputs, other metadata);
cells are matched as `jupytext --update` matches them. Run `python -m grading release` after it.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import logging
import sys
from pathlib import Path

import nbformat

from . import notebooks

MIRRORS = notebooks.SOLUTIONS / "py"
FORMAT = "py:percent"
CELL_METADATA = ("nbgrader", "tags")  # the cell metadata a mirror shows, and the only one it can change
FILTERS = {"notebook_metadata_filter": "-all", "cell_metadata_filter": ",".join(CELL_METADATA) + ",-all"}

log = logging.getLogger(__name__)


def _jupytext():
    # imported by name: jupytext (a maintainer's tool, in the dev extra) ships no type information
    return importlib.import_module("jupytext")


def mirror_path(notebook: Path, folder: Path = MIRRORS) -> Path:
    return folder / f"{notebook.stem}.py"


def mirror_text(nb) -> str:
    """The percent-format text of a notebook (a NotebookNode), with only the cell metadata in CELL_METADATA."""
    nb = copy.deepcopy(nb)
    nb.metadata = {"jupytext": dict(FILTERS)}
    return _jupytext().writes(nb, fmt=FORMAT)


def write_mirrors(folder: Path = MIRRORS, sources: list[Path] | None = None) -> list[Path]:
    """Write the mirror of every solution notebook into `folder` (a file is rewritten only if it changes) and
    remove the mirrors of notebooks that no longer exist. Returns the mirrors' paths."""
    sources = notebooks.solution_notebooks() if sources is None else sources
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sources:
        target = mirror_path(source, folder)
        text = mirror_text(notebooks.read(source))
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8", newline="\n")
            log.info(f"wrote {target}")
        written.append(target)
    for stale in set(folder.glob("[0-9][0-9]_*.py")) - set(written):
        stale.unlink()
        log.info(f"removed {stale} (its notebook is gone)")
    return written


def stale_mirrors(folder: Path = MIRRORS, sources: list[Path] | None = None) -> list[str]:
    """One line per mirror that does not match its notebook (or is missing, or has no notebook)."""
    sources = notebooks.solution_notebooks() if sources is None else sources
    problems = []
    for source in sources:
        target = mirror_path(source, folder)
        if not target.exists():
            problems.append(f"{source.name}: no mirror {target.name} in {folder}: run `python -m grading release`")
        elif target.read_text(encoding="utf-8") != mirror_text(notebooks.read(source)):
            problems.append(f"{source.name} was changed without updating its mirror {target.name}: "
                            "run `python -m grading release`")
    expected = {mirror_path(s, folder).name for s in sources}
    problems += [f"{p.name}: a mirror without a notebook in {sources[0].parent if sources else 'solutions/'}"
                 for p in sorted(folder.glob("[0-9][0-9]_*.py")) if p.name not in expected]
    return problems


def _trimmed(source: str) -> str:
    lines = source.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def notebook_from_mirror(text: str, nb):
    """The notebook `nb` with its cells taken from a mirror's text: sources, cell types and the CELL_METADATA
    keys from the mirror; ids, outputs, execution counts, other cell metadata and the notebook's metadata from
    `nb`. A cell new in the mirror gets a new id; a cell deleted from it is deleted. A cell whose source differs
    only in blank lines at its start or end keeps the notebook's source (the percent format cannot always tell
    them apart), so an unedited mirror gives back the notebook unchanged."""
    edited = _jupytext().reads(text, fmt=FORMAT)
    # which notebook cell each of the mirror's cells is (None: a new cell), as `jupytext --update` pairs them
    matches = importlib.import_module("jupytext.combine").map_outputs_to_inputs(edited.cells, nb.cells)
    cells = []
    for new, j in zip(edited.cells, matches):
        if j is None:
            make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell,
                    "raw": nbformat.v4.new_raw_cell}[new.cell_type]
            cell = make(new.source)
            other: dict = {}
        else:
            cell = copy.deepcopy(nb.cells[j])
            if _trimmed(new.source) != _trimmed(cell.source):  # blank lines around a cell: jupytext drops some
                cell.source = new.source
            other = {k: v for k, v in cell.metadata.items() if k not in CELL_METADATA}
        cell.metadata = nbformat.from_dict({**other, **{k: new.metadata[k] for k in CELL_METADATA
                                                        if k in new.metadata}})
        cells.append(cell)
    result = copy.deepcopy(nb)
    result.cells = cells
    return result


def update_notebook(mirror: Path, notebook: Path | None = None) -> Path:
    """Copy an edited mirror's cells back into its notebook (solutions/NN_name.ipynb by default)."""
    notebook = notebook or notebooks.SOLUTIONS / f"{mirror.stem}.ipynb"
    nb = notebook_from_mirror(mirror.read_text(encoding="utf-8"), notebooks.read(notebook))
    nbformat.validate(nb)
    nbformat.write(nb, str(notebook))
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grading.mirrors", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="are the mirrors up to date with the notebooks?")
    group.add_argument("--to-notebook", nargs="+", type=Path, metavar="PY", help="edited mirrors to copy back")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale_mirrors()
        print("\n".join(problems) or "the mirrors are up to date")
        return 1 if problems else 0
    for mirror in args.to_notebook:
        print(f"updated {update_notebook(mirror)} from {mirror}: now run `python -m grading release`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
