"""Every notebook's reference cases, by notebook number: the one list of case makers, each a function of the
solution notebook's namespace that returns its `CaseSpec`s. `python -m grading references` builds them all."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from grading import notebooks
from grading.cases import nb01, nb02, nb03, nb09, nb10
from grading.cases.captioning import cases_of
from grading.references import CaseSpec, build

CASES: dict[str, Callable[[dict], list[CaseSpec]]] = {
    "01": nb01.cases,
    "02": nb02.cases,
    "03": nb03.cases,
    "04": partial(cases_of, "04"),  # notebooks 04-08 share one case table (grading/cases/captioning)
    "05": partial(cases_of, "05"),
    "06": partial(cases_of, "06"),
    "07": partial(cases_of, "07"),
    "08": partial(cases_of, "08"),
    "09": nb09.cases,
    "10": nb10.cases,
}


def build_notebook(notebook: Path, public_dir: Path = notebooks.PUBLIC_REFERENCES,
                   hidden_dir: Path = notebooks.HIDDEN_REFERENCES) -> tuple[Path, Path]:
    """Build the reference files of one solution notebook (`solutions/NN_name.ipynb`)."""
    return build(notebook, CASES[notebook.name[:2]], public_dir, hidden_dir)


def build_all(public_dir: Path = notebooks.PUBLIC_REFERENCES,
              hidden_dir: Path = notebooks.HIDDEN_REFERENCES) -> list[tuple[Path, Path]]:
    """Build the reference files of every solution notebook; one without a case maker is an error."""
    found = notebooks.solution_notebooks()
    unlisted = [nb.name for nb in found if nb.name[:2] not in CASES]
    if unlisted:
        raise ValueError(f"no case maker for {unlisted}: add one to grading/cases/registry.py")
    return [build_notebook(nb, public_dir, hidden_dir) for nb in found]
