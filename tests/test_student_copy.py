"""The student copy gives away no graded answer.

What students get (`python -m grading publish`: the release notebooks, `starter/`, `data/*.py`) must hold
no implementation of a graded task, under its own name or any other. Two checks, each able to fail:

1. **Every function and class of the copy, run as the answer of every graded task it could answer**
   (the callable check). Each module of the copy's `starter/` and `data/` is imported from the copy (in a
   subprocess with the copy first on sys.path: tests/fixtures/student_copy/run_candidates.py), and every
   function, class and method it defines is handed to each graded test cell's check on that cell's hidden
   cases, through the adapter the cell wraps its answer in, wherever its signature accepts the check's call.
   What it did is recorded as the grading sandbox records it and scored by the judge
   (`grading.judge.judge_cell`). No callable may pass a hidden case that the release's own stub (the answer
   cell as students get it) or a stub that only raises the error a bad-input case expects does not pass:
   such a stub earns those cases with no code, so passing them gives nothing away. Notebook 05's
   trained-model cases are left out: they grade the checkpoint a student hands in, not a function.

2. **No function of the copy resembles an answer** (the similarity scan): every function and method of the
   copy against every answer (the code between `### BEGIN SOLUTION` and `### END SOLUTION` of the solution
   notebooks, under the def line of the function it is in), compared on normalised syntax trees.
   Normalised: docstrings, decorators and annotations dropped; every identifier, attribute and keyword
   name and every constant's value replaced by a placeholder (a constant keeps its type), so that renaming
   changes nothing. Similarity: the Jaccard index of the sets of 3-grams of the node types in pre-order
   (sets of short runs: insensitive to statements moved around, fast enough for every pair).

   Threshold, measured (tests/fixtures/student_copy/ holds the kit's old giveaways, verbatim from commit
   302f14f): the old copies score 0.596 to 0.785 against their answers (default_fit 0.596, _lr_factor
   0.627, mean_loss 0.667, build_vocab 0.684, default_step 0.717, _kit_extract 0.747, encode_captions
   0.785); the highest pair of unrelated functions of the copy and answers scores 0.340 (Split._batch
   against TransformerDecoderLayer.forward), the tenth highest 0.284. SIMILAR = 0.45 sat between them, nearer
   the unrelated side: a false alarm costs a look, a miss a grade. It missed the learned positional encoding of
   starter/layers.py at 3a265bf, whose forward was notebook 02's PositionalEncoding.forward with a learned
   table (0.443; old_layers.py): SIMILAR = 0.44 catches it, and the highest unrelated pair now scores 0.429
   (Split._batch against notebook 05's two-line evaluate_checkpoint). Units of fewer than MIN_NODES
   nodes (about one line of code) are not compared: among them unrelated pairs reach 0.44 (a 9-node
   forward against split_heads), too close to the threshold to mean anything; the four answers that
   small (split_heads, merge_heads, causal_mask, PositionalEncoding.__init__) are left to the callable
   check. The old giveaways that were rewrites rather than copies (pad_collate with pad_sequence,
   FeatureCaptions, evaluate_captioner, the one-line warmup_cosine) score below the threshold (0.10 to
   0.34): the callable check is the one that catches a working rewrite, and the planted-giveaway test
   below shows that it does. Neither check sees a piece that needs glue to answer a task: the old
   evaluate_captioner (it reads words with `vocab.decode`, which the check's stand-in vocabulary lacks;
   0.34 as code) or the old Vocab.encode (one caption; 0.15).
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grading import notebooks as nbs
from grading.judge import judge_cell, public_case_names
from grading.publish import publish
from starter.checks import load_case
from starter.compare import read_observations

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "student_copy"
RUNNER = FIXTURES / "run_candidates.py"
OLD_MODULES = sorted(FIXTURES.glob("old_*.py"))  # the kit's old giveaways (see the fixture folder's README)
STUB, ERROR_STUB = "_release_stub", "_raises_the_expected_error"  # the runner's baselines
CALL_TIMEOUT = 5.0  # seconds one call of a candidate may take (every correct answer takes milliseconds)

SIMILAR = 0.44
MIN_NODES = 20
K = 3


# ---------------------------------------------------------------------------------- the graded tasks
@dataclasses.dataclass(frozen=True)
class HiddenCase:
    task: str  # "<notebook number>.<test cell's grade_id>"
    case: str
    adapter: str | None  # what the test cell wraps the answer in (starter.checks._adapters), None: nothing
    answer: str
    is_class: bool


@dataclasses.dataclass(frozen=True)
class Task:
    key: str
    grade_id: str
    points: float
    source: str  # the test cell, hidden tests included (what the judge reads)
    cases: tuple[HiddenCase, ...]


def _answer_kinds(nb) -> dict[str, bool]:
    """{name: is a class} of what the solution cells define at their top level."""
    kinds = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and nbs.is_solution(cell):
            for node in ast.parse(nbs.without_magics(cell.source)).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    kinds[node.name] = isinstance(node, ast.ClassDef)
    return kinds


def graded_tasks() -> list[Task]:
    """Every graded test cell of the solution notebooks with its hidden cases: the `check("case", answer)`
    and `check("case", adapter(answer))` calls of its source whose case is not public."""
    public = public_case_names()
    tasks = []
    for path in nbs.solution_notebooks():
        nb = nbs.read(path)
        kinds = _answer_kinds(nb)
        for cell in nbs.test_cells(nb):
            meta = nbs.nbgrader_meta(cell)
            key = f"{path.name[:2]}.{meta['grade_id']}"
            cases = []
            for call in ast.walk(ast.parse(nbs.without_magics(cell.source))):
                if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "check"):
                    continue
                name, target = call.args[0].value, call.args[1]
                if name in public:
                    continue
                adapter, answers = ((None, [target.id]) if isinstance(target, ast.Name)
                                    else (target.func.id, [a.id for a in target.args]))
                if len(answers) != 1:  # the trained-model cases: they grade a checkpoint, not a function
                    continue
                # a script's cases take the module the test cell loaded (train_script), not an answer cell's name
                cases.append(HiddenCase(key, name, adapter, answers[0], kinds.get(answers[0], False)))
            if cases:  # (a cell of trained-model cases only has none left)
                tasks.append(Task(key, meta["grade_id"], float(meta.get("points", 0)), cell.source, tuple(cases)))
    return tasks


# -------------------------------------------------------------------------------- the callable check
def run_candidates(copy_dir: Path, cases: list[HiddenCase], out: Path, only: list[str] | None = None) -> dict:
    """Run the copy's callables (those of modules starting with `only`, default all) on `cases` in a
    subprocess that imports the copy, not the repository; returns the runner's index."""
    scratch = out / "scratch"
    scratch.mkdir(parents=True)
    job = {"copy": str(copy_dir), "hidden_dir": str(nbs.HIDDEN_REFERENCES), "results": str(out / "results"),
           "cases": [dataclasses.asdict(c) for c in cases], "only": only, "timeout": CALL_TIMEOUT}
    (out / "job.json").write_text(json.dumps(job))
    # a home, data folder and working folder of its own: what a candidate writes stays there
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(copy_dir), "HOME": str(scratch),
           "COURSE_DATA_DIR": str(scratch / "data"), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([sys.executable, str(RUNNER), str(out / "job.json")], cwd=scratch, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the candidate runner failed:\n{run.stdout[-2000:]}{run.stderr[-4000:]}"
    return json.loads((out / "results" / "index.json").read_text())


@dataclasses.dataclass
class Outcome:
    task: Task
    passed: dict[str, set[str]]  # candidate -> the hidden cases it passed (as the judge scores them)
    points: dict[str, float]  # candidate -> the judge's points for the cell

    @property
    def allowed(self) -> set[str]:
        """What an answer with no code passes: the release's stub, or a stub raising the expected error."""
        return self.passed.get(STUB, set()) | self.passed.get(ERROR_STUB, set())

    def giveaways(self) -> dict[str, set[str]]:
        return {name: got - self.allowed for name, got in self.passed.items()
                if name not in (STUB, ERROR_STUB) and got - self.allowed}


def judge_results(tasks: list[Task], results: Path) -> dict[str, Outcome]:
    """Each candidate's recorded observations scored by the judge, cell by cell."""
    dirs = [nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES]
    outcomes = {}
    for task in tasks:
        outcome = Outcome(task, {}, {})
        folder = results / task.key
        ran = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        for candidate in ran:
            observations, problems = read_observations(candidate)
            assert not problems, f"{candidate.name} on {task.key}: {problems[:3]}"
            cell = judge_cell(task.grade_id, task.source, task.points, observations, dirs, public_case_names(),
                              "did not run")
            outcome.passed[candidate.name] = {c.case for c in cell.cases if c.passed and not c.public}
            outcome.points[candidate.name] = cell.points
        outcomes[task.key] = outcome
    return outcomes


def describe(outcome: Outcome, name: str) -> str:
    task, got = outcome.task, outcome.passed[name]
    hidden = len({c.case for c in task.cases})
    return (f"{name} passes {len(got)} of {hidden} hidden cases of {task.key} (answer "
            f"{task.cases[0].answer}; {outcome.points[name]:g} of {task.points:g} points; an answer with no code "
            f"passes {len(outcome.allowed)})")


@pytest.fixture(scope="module")
def student_copy(tmp_path_factory) -> Path:
    return publish(tmp_path_factory.mktemp("student") / "kit")


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return graded_tasks()


@pytest.fixture(scope="module")
def every_callable(student_copy, tasks, tmp_path_factory):
    """(runner index, outcomes by task) of every callable of the copy on every graded task."""
    out = tmp_path_factory.mktemp("candidates")
    index = run_candidates(student_copy, [c for t in tasks for c in t.cases], out)
    return index, judge_results(tasks, out / "results")


def test_every_function_of_the_copy_was_tried(every_callable, student_copy, tasks):
    index, outcomes = every_callable
    assert not index["import_errors"], f"modules of the student copy that do not import: {index['import_errors']}"
    defined = set()  # what the copy's files define at their top level, read from their source
    for package in ("starter", "data"):
        for path in (student_copy / package).rglob("*.py"):
            module = ".".join(path.relative_to(student_copy).with_suffix("").parts).removesuffix(".__init__")
            assert module in index["modules"], f"{module} was not imported"
            defined |= {f"{module}.{node.name}" for node in ast.parse(path.read_text()).body
                        if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert defined and not defined - set(index["candidates"]), sorted(defined - set(index["candidates"]))
    for task in tasks:  # the baselines and some candidates ran on each task; the baselines pass exactly the
        ran = set(outcomes[task.key].points)  # bad-input cases
        assert {STUB, ERROR_STUB} < ran, f"{task.key}: no candidate ran"
        bad_input = {c.case for c in task.cases if load_case(c.case, [nbs.HIDDEN_REFERENCES]).expects_error}
        assert outcomes[task.key].allowed == bad_input, task.key


def test_no_callable_of_the_copy_passes_a_hidden_case(every_callable):
    _, outcomes = every_callable
    found = [describe(o, name) for o in outcomes.values() for name in o.giveaways()]
    assert not found, "the student copy answers graded tasks:\n" + "\n".join(found)


def _planted_answer(notebook: str, answer: str, new_name: str) -> str:
    """The solution of `answer` as a module of the copy could hold it: every name the function binds (itself,
    its arguments, its locals) renamed, the imports it needs above it."""
    source = nbs.solution_sources(notebook)[answer]
    tree = ast.parse(source)
    fn = tree.body[0]
    own = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    own |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    renamed = {old: f"v{i}" for i, old in enumerate(sorted(own))}

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node):
            node.id = renamed.get(node.id, node.id)
            return node

        def visit_arg(self, node):
            node.arg = renamed.get(node.arg, node.arg)
            return node

    fn = Rename().visit(fn)
    fn.name = new_name
    return "import math\n\nimport torch\n\n\n" + ast.unparse(fn) + "\n"


@pytest.fixture(scope="module")
def planted_copy(student_copy, tmp_path_factory) -> Path:
    """The copy with known giveaways added to starter/: notebook 05's train_step under other names
    (starter/planted.py), and the kit's old versions of graded tasks (tests/fixtures/student_copy)."""
    planted = tmp_path_factory.mktemp("planted") / "kit"
    shutil.copytree(student_copy, planted)
    (planted / "starter" / "planted.py").write_text(
        _planted_answer("06_training", "train_step", "kit_step"))
    for module in OLD_MODULES:
        shutil.copy(module, planted / "starter" / module.name)
    return planted


# what the old kit handed out in place of each unfinished task of notebooks 04-05 (its `_kit` table), but for
# evaluate_captions: the old version turned indices into words with `vocab.decode`, which the check's stand-in
# vocabulary does not have (turning indices into words is part of that task), so it passes no case of it
OLD_KIT_VERSIONS = {
    "starter.old_pipeline._kit_extract": "04.test_extract_grid_features",
    "starter.old_common.build_vocab": "04.test_build_vocab",
    "starter.old_pipeline._kit_encode": "04.test_encode_captions",
    "starter.old_data.FeatureCaptions": "04.test_caption_features",
    "starter.old_data.pad_collate": "04.test_collate_captions",
    "starter.old_training.warmup_cosine": "06.test_lr_at_step",
    "starter.old_training.default_step": "06.test_train_step",
    "starter.old_training.mean_loss": "06.test_validation_loss",
    "starter.old_training.default_fit": "06.test_fit",
}


def test_planted_giveaways_are_caught_by_the_callable_check(planted_copy, tasks, tmp_path):
    """The check is able to fail: an answer copied into the copy under other names, and the old kit's
    versions, each pass the hidden cases of the task they answer."""
    targets = {"06.test_train_step", *OLD_KIT_VERSIONS.values()}
    chosen = [t for t in tasks if t.key in targets]
    run_candidates(planted_copy, [c for t in chosen for c in t.cases], tmp_path,
                   only=["starter.planted", "starter.old_"])
    outcomes = judge_results(chosen, tmp_path / "results")
    step = outcomes["06.test_train_step"]
    assert step.giveaways().get("starter.planted.kit_step") == {c.case for c in step.task.cases}, \
        "a renamed copy of train_step is not caught"
    missed = [f"{name} ({task})" for name, task in OLD_KIT_VERSIONS.items() if name not in outcomes[task].giveaways()]
    assert not missed, f"old giveaways the callable check does not catch: {missed}"


# --------------------------------------------------------------------------------- the similarity scan
_DROPPED_FIELDS = {"annotation", "returns", "type_comment", "decorator_list", "type_params"}


def _without_docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def node_types(fn: ast.AST) -> list[str]:
    """The normalised tree in pre-order: node types only (no names, no values; a constant keeps its
    type), without load/store contexts, annotations and decorators."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.expr_context):
            return
        if isinstance(node, ast.Constant):
            out.append(f"Constant:{type(node.value).__name__}")
            return
        out.append(type(node).__name__)
        for field, value in ast.iter_fields(node):
            if field in _DROPPED_FIELDS:
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    visit(child)

    visit(fn)
    return out


def similarity(a: list[str], b: list[str]) -> float:
    """Jaccard index of the sets of K-grams of two node-type sequences."""
    grams_a = {tuple(a[i:i + K]) for i in range(max(1, len(a) - K + 1))}
    grams_b = {tuple(b[i:i + K]) for i in range(max(1, len(b) - K + 1))}
    return len(grams_a & grams_b) / len(grams_a | grams_b)


def functions_of(source: str, prefix: str) -> dict[str, list[str]]:
    """{qualified name: node types} of every function of a module: module-level, methods, nested."""
    found = {}

    def walk(node: ast.AST, qual: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[qual + child.name] = node_types(child)
                walk(child, f"{qual}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{qual}{child.name}.")
            else:
                walk(child, qual)

    walk(_without_docstrings(ast.parse(source)), prefix)
    return found


def functions_of_copy(copy_dir: Path) -> dict[str, list[str]]:
    found = {}
    for package in ("starter", "data"):
        for path in sorted((copy_dir / package).rglob("*.py")):
            module = ".".join(path.relative_to(copy_dir).with_suffix("").parts)
            found.update(functions_of(path.read_text(encoding="utf-8"), f"{module}."))
    return found


_BEGIN, _END = re.compile(r"^\s*### BEGIN SOLUTION"), re.compile(r"^\s*### END SOLUTION")


def answers() -> dict[str, list[str]]:
    """{"<grade_id>[.<method>]": node types} of every solution block, as a function: the def line of the
    function the block is in, with the block as its whole body."""
    return {name: node_types(fn) for name, fn in answer_functions().items()}


def answer_functions() -> dict[str, ast.FunctionDef]:
    """{"<nb>.<grade_id>[.<method>]": the solution block as a function (see answers), docstrings dropped}."""
    found = {}
    for path in nbs.solution_notebooks():
        for cell in nbs.read(path).cells:
            if cell.cell_type != "code" or not nbs.is_solution(cell):
                continue
            source = nbs.without_magics(cell.source)  # a %%writefile cell's first line
            lines = source.splitlines()
            defs = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            begins = [i for i, line in enumerate(lines) if _BEGIN.match(line)]
            for begin in begins:
                end = next(j for j in range(begin + 1, len(lines)) if _END.match(lines[j]))
                grade_id = nbs.nbgrader_meta(cell)["grade_id"]
                owners = [d for d in defs if d.lineno <= begin < d.end_lineno]
                if not owners:  # a block at the top of a module (a script's): it is one unit, named by its cell
                    owners = ast.parse(f"def {grade_id}():\n    pass").body
                owner = min(owners, key=lambda d: d.end_lineno - d.lineno)
                fn = copy.deepcopy(owner)
                fn.body = ast.parse(textwrap.dedent("\n".join(lines[begin + 1:end]))).body
                name = grade_id if owner.name == grade_id else f"{grade_id}.{owner.name}"
                found[f"{path.name[:2]}.{name}"] = _without_docstrings(ast.Module([fn], [])).body[0]
    return found


def similar_pairs(functions: dict[str, list[str]], answer_types: dict[str, list[str]]) -> list[tuple[float, str, str]]:
    """(similarity, function, answer) of every pair of units of at least MIN_NODES nodes, highest first."""
    pairs = [(similarity(f, a), fname, aname) for fname, f in functions.items() if len(f) >= MIN_NODES
             for aname, a in answer_types.items() if len(a) >= MIN_NODES]
    return sorted(pairs, reverse=True)


# the old giveaways that were copies of their answer, give or take names (the others were rewrites: see the
# module's docstring), by the answer they copy
OLD_COPIES = {
    "old_training.default_step": "06.train_step",
    "old_training._lr_factor": "06.lr_at_step",
    "old_training.mean_loss": "06.validation_loss",
    "old_training.default_fit": "06.fit",
    "old_common.build_vocab": "04.build_vocab",
    "old_common.encode_captions": "04.encode_captions",
    "old_pipeline._kit_extract": "04.extract_grid_features",
    "old_layers.LearnedPositionalEncoding.forward": "02.PositionalEncoding.forward",
}


@pytest.fixture(scope="module")
def answer_types() -> dict[str, list[str]]:
    return answers()


def test_the_scan_catches_the_old_copies(answer_types):
    old = {}
    for module in OLD_MODULES:
        old.update(functions_of(module.read_text(), f"{module.stem}."))
    scores = {name: similarity(old[name], answer_types[answer]) for name, answer in OLD_COPIES.items()}
    missed = {name: round(score, 3) for name, score in scores.items() if score < SIMILAR}
    assert not missed, f"old copies of answers the scan misses (threshold {SIMILAR}): {missed}"
    assert all(len(old[name]) >= MIN_NODES for name in OLD_COPIES)


def test_the_scan_catches_a_renamed_answer(planted_copy, answer_types):
    """train_step with every name it binds changed reads as the answer itself, and the scan reports it."""
    planted = {"starter.planted.kit_step": functions_of_copy(planted_copy)["starter.planted.kit_step"]}
    flagged = [(score, answer) for score, _, answer in similar_pairs(planted, answer_types) if score >= SIMILAR]
    assert flagged == [(1.0, "06.train_step")]


def test_no_function_of_the_copy_resembles_an_answer(student_copy, answer_types):
    pairs = similar_pairs(functions_of_copy(student_copy), answer_types)
    assert len(pairs) > 1000, "the scan compared almost nothing"
    close = [f"{fname} resembles the answer {aname} ({score:.2f} >= {SIMILAR})" for score, fname, aname in pairs
             if score >= SIMILAR]
    assert not close, "the student copy holds functions that resemble answers:\n" + "\n".join(close)
