"""The release notebooks' given code gives away no graded answer (of any notebook).

Students get all ten release notebooks at once, so a given (locked, non-solution, non-test) code cell of one
notebook must not write out the answer of a task of another (or the same). Every code cell of the published
copy's notebooks whose nbgrader metadata is neither solution nor grade is cut into units: each function,
method and class it defines, and its top-level statements other than definitions as one unit (inline code
such as a cross-check is compared, not only defs). Each unit of at least MIN_NODES nodes is compared with
every answer of every notebook (tests/test_student_copy.py: `answer_functions`, its normalisation
`node_types` and its 3-gram Jaccard `similarity`), by three scores; a pair reaching any threshold is flagged:

1. **Jaccard** (the copy's similarity scan, same SIMILAR = 0.45 and MIN_NODES): a unit that is a renamed
   answer.
2. **Statement containment**: the share (in nodes) of the answer's simple statements (assignments,
   expressions, returns) of at least STMT_NODES nodes that have a statement in the unit of 3-gram
   Jaccard >= STMT_MATCH. A given cell that spells out part of an answer among other code (plots, prints)
   dilutes Jaccard but not this. Threshold STATEMENTS = 0.5.
3. **3-gram containment**: |A ∩ U| / |A|, A the answer body's 3-gram set, U the unit's: an answer inlined
   into one long expression (07's rotation figure) matches no statement of it. Threshold CONTAINED = 0.75.

Measured on commit 728a7b1 (the four known giveaways, kept verbatim in tests/fixtures/student_copy/given_*.py;
"unrelated": every other pair of a given unit and an answer, best unit per cell):

  known giveaway (answer; best unit of the cell)            Jaccard  statements  3-grams contained
  04 code_11 cross-check, <top> (CaptioningTransformer.forward)  0.276    0.620       0.515
  05 code_leaky LeakyCaptioner.forward (same)                   0.506    0.634       0.652
  06 code_sampling sample_decode (05 greedy_decode)             0.714    0.802       0.959
  07 code_07 rotation figure, <top> (02 shift_encoding)         0.117    0           0.767
  highest unrelated pair                                        0.314    0.366       0.731
    (Jaccard: 01 logit_stats ~ caption_loss; statements: 03 code_15/code_08 <top> ~
     CaptioningTransformer.forward; 3-grams: 07 code_27 <top> ~ TransformerDecoderLayer.forward)

Plain 3-gram containment alone does not separate: small answers sit in large cells by chance (unrelated
pairs up to 0.731 against 0.515 for 04's cross-check); windows of the cell's statements (Jaccard of the best
window, or of windows against fragments of the answer) did no better (04's cross-check 0.33-0.38 against
unrelated 0.44-0.66), nor did keeping attribute names or weighting 3-grams by rarity. Statement containment
separates 04-06 with a wide margin (0.62 against 0.366); only 3-gram containment sees 07, with a thin one
(0.767 against 0.731): CONTAINED is the least robust threshold here, and the first to revisit.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_student_copy import MIN_NODES, SIMILAR, K, _without_docstrings, answer_functions, node_types

from grading import notebooks as nbs
from grading.publish import publish

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "student_copy"
STMT_NODES, STMT_MATCH, STATEMENTS = 8, 0.7, 0.5
CONTAINED = 0.75
_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)

# the known giveaways of commit 728a7b1 (fixtures, verbatim) and the answer each writes out
GIVEN_GIVEAWAYS = {
    "given_04_code_11.py": "05.CaptioningTransformer.forward",
    "given_05_code_leaky.py": "05.CaptioningTransformer.forward",
    "given_06_code_sampling.py": "07.greedy_decode",
    "given_07_code_07.py": "02.shift_encoding",
}


def _grams(types: list[str]) -> set[tuple[str, ...]]:
    return {tuple(types[i:i + K]) for i in range(max(1, len(types) - K + 1))}


class Unit:
    """A unit of given code or an answer body, with what the three scores need."""

    def __init__(self, tree: ast.AST):
        self.types = node_types(tree)
        self.grams = _grams(self.types)
        self.statements = [(len(t), _grams(t)) for t in (node_types(n) for n in ast.walk(tree)
                                                          if isinstance(n, _SIMPLE)) if len(t) >= STMT_NODES]


def units_of_cell(source: str, prefix: str) -> dict[str, Unit]:
    """{name: unit} of one code cell: every function, method and class, and the top-level statements that
    are not definitions as one unit ("<top>")."""
    tree = _without_docstrings(ast.parse(source))
    found = {}

    def walk(node: ast.AST, qual: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[qual + child.name] = Unit(child)
                walk(child, f"{qual}{child.name}.")
            else:
                walk(child, qual)

    walk(tree, prefix)
    top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    if top:
        found[prefix + "<top>"] = Unit(ast.Module(top, []))
    return found


def given_units(notebook_dir: Path) -> dict[str, Unit]:
    """Every unit of every given code cell (nbgrader: not a solution, not graded) of the release notebooks."""
    found = {}
    for path in sorted(notebook_dir.glob("*.ipynb")):
        for i, cell in enumerate(nbs.read(path).cells):
            meta = nbs.nbgrader_meta(cell)
            if cell.cell_type != "code" or meta.get("solution") or meta.get("grade"):
                continue
            found.update(units_of_cell(nbs.without_magics(cell.source),
                                       f"{path.name[:2]}.{meta.get('grade_id', f'cell{i}')}."))
    return found


def scores(unit: Unit, answer: Unit) -> tuple[float, float, float]:
    """(Jaccard, statement containment, 3-gram containment) of a unit against an answer."""
    jaccard = len(unit.grams & answer.grams) / len(unit.grams | answer.grams)
    total = sum(n for n, _ in answer.statements)
    matched = sum(n for n, g in answer.statements
                  if any(len(g & h) / len(g | h) >= STMT_MATCH for _, h in unit.statements))
    return jaccard, matched / total if total else 0.0, len(unit.grams & answer.grams) / len(answer.grams)


def flagged(unit: Unit, answer: Unit) -> tuple[float, float, float] | None:
    if len(unit.types) < MIN_NODES or len(answer.types) < MIN_NODES:
        return None
    s = scores(unit, answer)
    return s if s[0] >= SIMILAR or s[1] >= STATEMENTS or s[2] >= CONTAINED else None


def close_pairs(units: dict[str, Unit], answer_units: dict[str, Unit]) -> list[str]:
    found = []
    for uname, unit in units.items():
        for aname, answer in answer_units.items():
            s = flagged(unit, answer)
            if s:
                found.append(f"{uname} writes out the answer {aname} (Jaccard {s[0]:.3f}, statements {s[1]:.3f}, "
                             f"3-grams contained {s[2]:.3f})")
    return found


@pytest.fixture(scope="module")
def answer_units() -> dict[str, Unit]:
    """Each answer's body (the solution block, without the def line: given code rarely repeats it)."""
    return {name: Unit(ast.Module(fn.body, [])) for name, fn in answer_functions().items()}


@pytest.fixture(scope="module")
def release_notebooks(tmp_path_factory) -> Path:
    return publish(tmp_path_factory.mktemp("student") / "kit") / "notebooks"


def test_the_notebook_scan_catches_the_known_giveaways(answer_units):
    """The scan is able to fail: each known giveaway (verbatim from commit 728a7b1) is flagged against the
    answer it writes out."""
    assert set(answer_units) >= set(GIVEN_GIVEAWAYS.values())
    missed = []
    for name, answer in GIVEN_GIVEAWAYS.items():
        units = units_of_cell((FIXTURES / name).read_text(encoding="utf-8"), f"{name}.")
        best = max((scores(u, answer_units[answer]) for u in units.values() if len(u.types) >= MIN_NODES),
                   key=lambda s: max(s[0] / SIMILAR, s[1] / STATEMENTS, s[2] / CONTAINED))
        if not any(flagged(u, answer_units[answer]) for u in units.values()):
            missed.append(f"{name} ({answer}): {tuple(round(x, 3) for x in best)}")
    assert not missed, f"known giveaways the notebook scan misses: {missed}"


def test_no_given_cell_of_the_release_notebooks_writes_out_an_answer(release_notebooks, answer_units):
    units = given_units(release_notebooks)
    assert len(units) > 50, "the scan found almost no given code"
    close = close_pairs(units, answer_units)
    assert not close, "given code of the release notebooks writes out graded answers:\n" + "\n".join(close)
