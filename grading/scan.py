"""Spot student code that reaches for the checks, the interpreter or the system, for an instructor's look.

It reads spelling, not behaviour: an import of a risky module, a risky module reached as an attribute of
another (`np.ctypeslib.ctypes`, `torch.sys`, `pathlib.os`), the interpreter's own names (`__builtins__`), a
`getattr` by a name made at run time or of a dunder, an assignment into a module or class, torch's switches that
turn off the checks' watch of its operations (`torch._C._DisableTorchDispatch`, `_disable_current_modes`). Code that reaches
the same objects by a route it does not spell is not listed. It decides nothing: scores come from the judge, which compares recorded outputs with expected ones
that never enter the sandbox, so such code cannot gain points. The findings go to the `review`
column. Honest notebook code (functions, classes, `self.x = ...`, tensor maths) raises none.

Each cell is read on its own, as the kernel reads it: IPython's syntax (`out = !cmd`, `%magic`, `%%cell
magic`) transformed first by IPython's own transformer, the code a magic runs (`%time ...`, `%%capture`)
scanned too. A cell that is still not Python is itself a finding, and the other cells are scanned all the
same (one such line once hid a whole notebook from the scan).
"""
from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

from IPython.core.inputtransformer2 import TransformerManager

from .notebooks import nbgrader_meta

PROTECTED_NAMES = {"check", "load_case", "CheckFailed", "summary"}
RISKY_CALLS = {"setattr", "delattr", "globals", "vars", "__import__", "exec", "eval", "compile", "get_ipython",
               "locals"}
RISKY_MODULES = {"builtins", "ctypes", "gc", "importlib", "inspect", "sys", "starter", "unittest", "IPython",
                 "ipykernel", "signal", "subprocess", "grading", "nbgrader", "os", "operator"}
# names that are the interpreter's own, not the student's: read as a name, not only as an attribute
RISKY_NAMES = {"__builtins__", "__loader__", "__spec__", "__import__"}
# what switches off the checks' watch of torch's operations (the rules of starter.compare: no matrix products, no
# ready-made softmax, no tensor larger than a case allows): torch's own switches of its dispatch and function modes
CHECK_ESCAPES = {"_python_dispatch", "_disable_current_modes", "_DisableTorchDispatch", "DisableTorchFunction",
                 "DisableTorchFunctionSubclass", "_pop_mode", "_pop_mode_temporarily", "_pop_torch_dispatch_stack",
                 "_pop_torch_function_stack", "_set_torch_function_mode", "_len_torch_dispatch_stack"}
NAME_LOOKUPS = {"getattr", "hasattr"}  # a lookup by a name that is not written out, or of a dunder, is a finding
# IPython's calls that run a magic, and which of their arguments is the code the magic may run as Python
MAGIC_CODE_ARGUMENT = {"run_line_magic": 1, "run_cell_magic": 2}
MAX_MAGIC_DEPTH = 3  # a magic's code that holds a magic, ...: deeper is not read


class NotPython(ValueError):
    """A cell that neither Python nor IPython can read (the kernel would refuse it as well)."""


@dataclass
class Findings:
    """What the scan found in a notebook: what its code reaches for, and which cells are not Python."""
    reasons: list[str] = field(default_factory=list)
    not_python: list[str] = field(default_factory=list)


def is_student_code(cell) -> bool:
    """A code cell of the student's own in a notebook rebuilt on the release (grading/submission.py): an answer
    cell, or an extra cell (the release gives every one of its code cells nbgrader metadata)."""
    meta = nbgrader_meta(cell)
    return isinstance(cell, dict) and cell.get("cell_type") == "code" and (bool(meta.get("solution")) or not meta)


def _root_name(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _shown(node: ast.AST) -> str:
    """The start of an expression's code, for a reason (an expression nested too deep to write back: its root)."""
    try:
        return ast.unparse(node)[:60]
    except RecursionError:
        return f"{_root_name(node)}[...] (nested too deep to show)"


def parse_cell(source: str) -> ast.Module:
    """One cell's code as the kernel runs it: IPython's syntax transformed, then parsed; NotPython if it is not."""
    try:
        python = TransformerManager().transform_cell(source)
    except Exception as exc:  # e.g. a transformation that never settles: the kernel fails on it too
        raise NotPython(f"IPython cannot transform it ({type(exc).__name__}: {str(exc)[:100]})") from exc
    try:
        return ast.parse(python)
    except SyntaxError as exc:
        raise NotPython(f"{exc.msg} (line {exc.lineno})") from exc
    except (ValueError, RecursionError, MemoryError) as exc:  # nested past what the parser takes
        raise NotPython(f"{type(exc).__name__} {str(exc)[:100]}".strip()) from exc


def _magic_code(node: ast.Call) -> str | None:
    """The code a magic is given (`%time CODE`, `%%capture` + CODE), where `node` runs one with a literal."""
    position = MAGIC_CODE_ARGUMENT.get(node.func.attr) if isinstance(node.func, ast.Attribute) else None
    if position is None or len(node.args) <= position:
        return None
    arg = node.args[position]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def _magic_reasons(code: str, depth: int) -> list[str]:
    """Reasons in a magic's code, read as Python where it is (a `%%bash` body is not, and is left alone)."""
    if depth >= MAX_MAGIC_DEPTH:
        return []
    try:
        return _reasons(parse_cell(code), depth + 1)
    except NotPython:
        return []


def suspicious(source: str) -> list[str]:
    """Reasons to look at one cell's code (empty for ordinary code); NotPython if the cell is not Python."""
    return sorted(set(_reasons(parse_cell(source), 0)))


def scan_cells(cells: Iterable[tuple[int, str]], given: dict[int, set[str]] | None = None) -> Findings:
    """The findings of a notebook's cells, given as (cell number, source), each read on its own; `given`: cell
    number -> reasons the release's own lines of that cell give, which are not the student's."""
    found = Findings()
    for number, source in cells:
        try:
            found.reasons += [r for r in suspicious(source) if r not in (given or {}).get(number, set())]
        except NotPython as exc:
            found.not_python.append(f"cell {number} is not Python: {exc}")
    found.reasons = sorted(set(found.reasons))
    return found


@functools.cache
def given_reasons() -> dict[str, frozenset[str]]:
    """Answer cell's grade_id -> the reasons its release version gives: a script's cell (`%%writefile`, the imports
    and `sys.exit` of its given lines) reaches for what a script needs, and that is the kit's code, not the
    student's. Grade ids of answer cells are unique across the notebooks."""
    from .notebooks import RELEASE, is_solution, read

    out: dict[str, frozenset[str]] = {}
    for path in sorted(RELEASE.glob("*.ipynb")):
        for cell in read(path).cells:
            if cell.cell_type == "code" and is_solution(cell):
                try:
                    out[nbgrader_meta(cell)["grade_id"]] = frozenset(suspicious(cell.source))
                except NotPython:
                    continue
    return out


def scan_notebook(cells: list) -> Findings:
    """The findings of the student's own cells of a rebuilt notebook (numbered from 1, as in the notebook), less
    what the release's own lines of an answer cell give."""
    given = given_reasons()
    return scan_cells(((number, cell.get("source", "")) for number, cell in enumerate(cells, 1)
                       if is_student_code(cell) and isinstance(cell.get("source", ""), str)),
                      {number: set(given.get(nbgrader_meta(cell).get("grade_id", ""), ()))
                       for number, cell in enumerate(cells, 1) if isinstance(cell, dict)})


def _reasons(tree: ast.AST, depth: int) -> list[str]:
    reasons = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in PROTECTED_NAMES:
            reasons.append(f"redefines {node.name}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names = [a.asname or a.name for a in node.names]
            for mod in mods:
                if mod.split(".")[0] in RISKY_MODULES:
                    reasons.append(f"imports {mod}")
                if set(mod.split(".")) & CHECK_ESCAPES:
                    reasons.append(f"imports {mod}, which can switch off the checks' watch of torch")
            for name in (a.name for a in node.names):
                if name in CHECK_ESCAPES:
                    reasons.append(f"imports {name}, which can switch off the checks' watch of torch")
            for name in names:
                if name in PROTECTED_NAMES:
                    reasons.append(f"binds {name} by import")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in RISKY_CALLS:
            reasons.append(f"calls {node.func.id}()")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in NAME_LOOKUPS \
                and len(node.args) >= 2:
            looked_up = node.args[1]
            if not (isinstance(looked_up, ast.Constant) and isinstance(looked_up.value, str)):
                reasons.append(f"calls {node.func.id}() with a name made at run time")
            elif looked_up.value.startswith("__"):
                reasons.append(f"calls {node.func.id}() for {looked_up.value}")
        elif isinstance(node, ast.Name) and node.id in RISKY_NAMES:
            reasons.append(f"uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in CHECK_ESCAPES:
            reasons.append(f"uses {node.attr}, which can switch off the checks' watch of torch")
        elif isinstance(node, ast.Attribute) and node.attr in RISKY_MODULES:
            reasons.append(f"reaches the module {node.attr} through {_shown(node.value)}")
        elif isinstance(node, ast.Call) and (code := _magic_code(node)) is not None:
            reasons += _magic_reasons(code, depth)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr not in (
                "__init__", "__name__", "__class__", "__len__", "__call__"):
            reasons.append(f"uses {node.attr}")
        for target in targets:
            for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                root = _root_name(t)
                if isinstance(t, ast.Name) and t.id in PROTECTED_NAMES:
                    reasons.append(f"rebinds {t.id}")
                elif isinstance(t, (ast.Attribute, ast.Subscript)) and root not in (None, "self"):
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and root == t.value.id:
                        continue  # x[i] = ... on a local tensor or list
                    reasons.append(f"assigns to {_shown(t)}")
    return reasons
