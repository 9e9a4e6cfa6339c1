"""Where the notebooks are, and how to read their cells."""
from __future__ import annotations

import functools
import re
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import nbformat

from starter.runtime import TRAINED_MODEL

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
RELEASE = ROOT / "notebooks"
HIDDEN_REFERENCES = ROOT / "grading" / "references"
PUBLIC_REFERENCES = ROOT / "starter" / "references"
ASSIGNMENT = "attention"  # the nbgrader assignment that holds every notebook
# a test cell's `check("case", ...)`: the case's name, with what surrounds it (to rewrite it in place)
CHECK_CALL = re.compile(r"""(?P<before>\bcheck\(\s*["'])(?P<case>[^"']+)(?P<after>["'])""")
# What a notebook's grading run gets beside it from the student's submission, by notebook: the earlier notebooks
# whose pieces it loads (the data of 04, the model of 05 and, for a model built with layers="mine", the notebooks
# that define those layers), and for notebook 07 the trained model notebook 06 saved (its test_trained_model
# loads it). Intake keeps the checkpoint (MAX_HANDED_IN bytes).
TRAINED_CHECKPOINT = TRAINED_MODEL
_LAYERS = ["02_positional_encoding.ipynb", "03_multi_head_attention.ipynb"]
FILES_BESIDE = {"05_captioning_model": ["04_captioning_data.ipynb", *_LAYERS],
                "06_training": ["04_captioning_data.ipynb", "05_captioning_model.ipynb", *_LAYERS],
                "07_generation_and_evaluation": [TRAINED_CHECKPOINT, "05_captioning_model.ipynb", *_LAYERS]}
MAX_HANDED_IN = 64 * 2**20
TRAINED_MODEL_CELL = ("07_generation_and_evaluation", "test_trained_model")  # the test cell that measures the checkpoint

@functools.cache
def public_case_names() -> frozenset[str]:
    """The names of the public cases (their references ship with the kit, in starter/references)."""
    from starter.compare import case_names

    return frozenset(case_names(PUBLIC_REFERENCES))


def solution_notebooks() -> list[Path]:
    """The authored notebooks, in curriculum order: solutions/NN_name.ipynb."""
    return sorted(SOLUTIONS.glob("[0-9][0-9]_*.ipynb"))


def nbgrader_meta(cell) -> dict:
    """A cell's nbgrader metadata, {} if it has none. Metadata that is not a dictionary (a hand-edited or
    hostile notebook) counts as absent, as if an editor had stripped it."""
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    found = meta.get("nbgrader") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def is_solution(cell) -> bool:
    return bool(nbgrader_meta(cell).get("solution"))


def is_written_answer(cell) -> bool:
    """A written question's answer: a Markdown cell that is both a solution and graded (by a person)."""
    meta = nbgrader_meta(cell)
    return bool(meta.get("grade")) and bool(meta.get("solution")) and cell.get("cell_type") == "markdown"


def is_test(cell) -> bool:
    meta = nbgrader_meta(cell)
    return bool(meta.get("grade")) and not meta.get("solution") and cell.get("cell_type") == "code"


def test_cells(nb) -> Iterator:
    return (c for c in nb.cells if is_test(c))


def read(path: Path):
    return nbformat.read(str(path), as_version=4)


def definitions_source(nb) -> str:
    """The code that defines a notebook's graded objects: set-up cells (tag `setup`) and solution cells."""
    parts = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        if "setup" in tags or is_solution(cell):
            parts.append(without_magics(cell.source))
    return "\n\n".join(parts)


def without_magics(source: str) -> str:
    """A code cell's Python: without IPython magics and shell lines (a `%%writefile` cell's code is Python too),
    as `starter.notebook_loader` runs a student's cells."""
    return "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))


WRITEFILE = re.compile(r"^%%writefile(\s+-a)?\s+(\S+)\s*$")


def written_files(nb) -> dict[str, str]:
    """The files a notebook's `%%writefile NAME` (and `%%writefile -a NAME`) cells write, in cell order: file name ->
    its content, as running the cells top to bottom leaves it."""
    files: dict[str, str] = {}
    for cell in nb.cells:
        first, _, rest = cell.source.partition("\n")
        match = WRITEFILE.match(first.strip()) if cell.cell_type == "code" else None
        if match:
            files[match.group(2)] = (files.get(match.group(2), "") if match.group(1) else "") + rest + "\n"
    return files


@functools.cache
def solution_scripts(stem: str) -> dict[str, types.SimpleNamespace]:
    """The scripts solution notebook `stem` writes, each run as a module (its main does not run): file name ->
    namespace, as `starter.scripts.load_script` gives a student's."""
    out = {}
    for name, source in written_files(read(SOLUTIONS / f"{stem}.ipynb")).items():
        namespace: dict = {"__name__": Path(name).stem}
        exec(compile(strip_solution_markers(source), name, "exec"), namespace)
        out[name] = types.SimpleNamespace(**namespace)
    return out


def execute_definitions(path: Path) -> dict:
    """Run a notebook's set-up and solution cells in a fresh namespace and return it."""
    nb = read(path)
    namespace: dict = {"__name__": f"notebook_{path.stem}"}
    exec(compile(definitions_source(nb), str(path), "exec"), namespace)
    return namespace


@functools.cache
def solution(stem: str) -> dict:
    """The namespace of solution notebook `stem` (set-up and solution cells run once per process): the
    kit's implementation of every graded task, for instructor-side code (references, trained checkpoints,
    benchmarks, tests). Students never get it: the student copy holds no implementation of a graded task."""
    return execute_definitions(SOLUTIONS / f"{stem}.ipynb")


CAPTIONING = ("04_captioning_data", "05_captioning_model", "06_training", "07_generation_and_evaluation", "08_decoding")


@functools.cache
def captioning_solution() -> dict:
    """The solution namespaces of notebooks 04-08 in one: every piece of the captioner, wherever it is taught."""
    ns: dict = {}
    for stem in CAPTIONING:
        ns.update({k: v for k, v in solution(stem).items() if k not in ns})
    return ns


def solution_training(ns: dict):
    """The training pieces of notebooks 05-06 (a solution namespace with both) as `starter.training.train` takes them."""
    from starter.training import TrainingPieces

    return TrainingPieces(fit=ns["fit"], train_step=ns["train_step"], lr_at_step=ns["lr_at_step"],
                          validation_loss=ns["validation_loss"], make_optimizer=ns["make_optimizer"])


def strip_solution_markers(source: str) -> str:
    """The solution code as a student would have typed it (markers removed, code kept)."""
    return "\n".join(line for line in source.splitlines()
                     if not re.match(r"^\s*### (BEGIN|END) SOLUTION", line))


def solution_sources(stem: str) -> dict[str, str]:
    """grade_id -> solution code as a student would type it (markers removed)."""
    sol = read(SOLUTIONS / f"{stem}.ipynb")
    return {nbgrader_meta(c)["grade_id"]: strip_solution_markers(c.source)
            for c in sol.cells if is_solution(c)}


def filled_submission(stem: str, overrides: dict[str, str] | None = None):
    """The release notebook with every solution cell filled in, except those replaced by `overrides`."""
    nb = read(RELEASE / f"{stem}.ipynb")
    sources = solution_sources(stem)
    sources.update(overrides or {})
    for cell in nb.cells:
        if is_solution(cell):
            cell.source = sources[nbgrader_meta(cell)["grade_id"]]
    return nb


def shapes_config() -> dict:
    """The "shapes" entry of notebook 06's CONFIGS dict, read from the solution's source (not re-typed)."""
    import ast

    for cell in read(SOLUTIONS / "06_training.ipynb").cells:
        if cell.cell_type == "code" and cell.source.startswith("CONFIGS = {"):
            tree = ast.parse(cell.source.split("\nconfig = ")[0])
            expr = ast.Expression(tree.body[0].value)
            from starter.training import TrainConfig

            return eval(compile(expr, "CONFIGS", "eval"), {"__builtins__": {}, "dict": dict,
                                                           "TrainConfig": TrainConfig})["shapes"]
    raise LookupError("CONFIGS cell not found in the solution notebook 06")


def trained_checkpoint(path: Path, steps: int | None = None, layers: str = "mine") -> Path:
    """What a student who finished notebook 06 hands in with notebook 07: the solution's model trained on `shapes`
    as the notebook trains it (its configuration, seed 0, the layers of the solution notebooks 02-03 or, with
    layers="torch", PyTorch's; `steps` to shorten it), saved to `path` with save_checkpoint. For the tests
    and walks of grading a correct submission."""
    import torch

    from starter.data import load_dataset
    from starter.layers import layers_from
    from starter.training import save_checkpoint, seed_everything, train

    ns = captioning_solution()
    cfg = shapes_config()
    train_config = replace(cfg["train"], time_limit=None, steps=steps or cfg["train"].steps)
    ds = load_dataset("shapes")
    seed_everything(0)
    config = dict(vocab_size=len(ds.vocab), feature_dim=ds.feature_dim, num_regions=ds.num_regions,
                  max_len=ds.max_length, layers=layers, **cfg["model"])
    with layers_from(SOLUTIONS):  # layers="mine": the solution's notebooks 02-03
        model = ns["CaptioningTransformer"](**config)
    history = train(model, ns["teacher_forcing_loss"], ds.split("train"), train_config, solution_training(ns),
                    val_data=ds.split("val"), progress=False)
    with torch.no_grad():
        return save_checkpoint(path, model, config, ds.vocab, history=history, dataset="shapes")


# ---- the graded cells, as the grades table's columns
def _graded_cells(is_kind) -> list[tuple[str, str, float]]:
    """(notebook stem, grade_id, points) of every solution-notebook cell for which `is_kind(cell)`, in order."""
    cols = []
    for path in solution_notebooks():
        for cell in read(path).cells:
            if is_kind(cell):
                meta = nbgrader_meta(cell)
                cols.append((path.stem, meta["grade_id"], float(meta.get("points", 0))))
    return cols


def graded_columns() -> list[tuple[str, str, float]]:
    """(notebook stem, grade_id, points) of every test cell, in notebook order."""
    return _graded_cells(is_test)


def written_columns() -> list[tuple[str, str, float]]:
    """(notebook stem, grade_id, points) of every written question (a Markdown answer cell that a person
    grades in nbgrader's formgrader), in notebook order."""
    return _graded_cells(is_written_answer)
