"""The tamper scan flags code that could patch the checks, and leaves honest answers alone; it reads each cell on
its own, as the kernel does (IPython's syntax first), so no cell hides the others."""
from __future__ import annotations

import nbformat
import pytest
from conftest import write_nb

from grading import notebooks as nbs
from grading.scan import NotPython, given_reasons, scan_notebook, suspicious
from grading.submission import rebuild
from grading.worker import review_flags

NB = "01_scaled_dot_product_attention"
# code that reaches for the checks eight ways: each line is one reason
REACHING = """import builtins
import starter.checks
builtins.isinstance = lambda *a: True
starter.checks.check = print
setattr(torch, 'allclose', None)
check = None
g = globals()
d = torch.__dict__
"""
EIGHT_REASONS = {"imports builtins", "imports starter.checks", "assigns to builtins.isinstance",
                 "assigns to starter.checks.check", "calls setattr()", "rebinds check", "calls globals()",
                 "uses __dict__"}


@pytest.mark.parametrize("path", nbs.solution_notebooks(), ids=lambda p: p.stem)
def test_reference_answers_raise_no_alarm(path):
    for cell in nbs.read(path).cells:
        if nbs.is_solution(cell) and cell.cell_type == "code":  # a written answer is Markdown, never scanned
            grade_id = nbs.nbgrader_meta(cell)["grade_id"]
            given = given_reasons().get(grade_id, frozenset())  # a script's cell: its given imports and magic
            found = [r for r in suspicious(nbs.strip_solution_markers(cell.source)) if r not in given]
            assert found == [], grade_id


@pytest.mark.parametrize("stem", [p.stem for p in nbs.solution_notebooks()])
def test_a_submitted_solution_raises_nothing_in_review(tmp_path, stem):
    """The whole notebook as the worker scans it (rebuilt by intake, every cell on its own): no flag."""
    rebuilt = rebuild(nbs.filled_submission(stem), nbs.read(nbs.RELEASE / f"{stem}.ipynb")).notebook
    write_nb(rebuilt, tmp_path / "submitted" / "s" / nbs.ASSIGNMENT / f"{stem}.ipynb")
    assert review_flags(tmp_path, "s", []) == []


@pytest.mark.parametrize("code", [
    "check = lambda *a, **k: None",
    "import starter.checks\nstarter.checks.check = print",
    "from starter.checks import check as c",
    "import torch\ntorch.allclose = lambda *a, **k: True",
    "import numpy as np\nnp.allclose = lambda *a, **k: True",
    "import torch.testing\ntorch.testing.assert_close = lambda *a, **k: None",
    "vars(__import__('starter.checks'))['check'] = None",
    "setattr(torch, 'allclose', None)",
    "def check(*a):\n    pass",
    "import builtins\nbuiltins.isinstance = lambda *a: True",
    "torch.Tensor.numpy = lambda self: self",
    "import sys\nsys.modules['starter.checks'] = None",
    "out = !true\nimport builtins\nbuiltins.isinstance = lambda *a: True",  # IPython's syntax, read as the kernel reads it
    "%time check = print",  # the code a magic runs
    "%%capture\nimport builtins\nbuiltins.isinstance = lambda *a: True",
])
def test_tampering_raises_an_alarm(code):
    assert suspicious(code)


# routes to the same objects that the plain forms' reasons did not spell out: each now gives its own reason
ROUTES = {
    "getattr(__builtins__, bytes([101, 120, 101, 99]).decode())('check = print')":
        {"uses __builtins__", "calls getattr() with a name made at run time"},
    "import numpy as np\nnp.ctypeslib.ctypes.CDLL(None)": {"reaches the module ctypes through np.ctypeslib"},
    "torch.sys.modules['starter.checks'].check = print": {"reaches the module sys through torch"},
    "getattr(type(m), '__setattr__')(m, 'x', 1)": {"calls getattr() for __setattr__"},
    "import pathlib\npathlib.os.system('ls')": {"reaches the module os through pathlib"},
    "from operator import attrgetter\nattrgetter('check')(ns)": {"imports operator"},
    "with torch._C._DisableTorchDispatch():\n    s = q @ k.mT": {"uses _DisableTorchDispatch, which can switch off "
                                                              "the checks' watch of torch"},
    "from torch.utils._python_dispatch import _disable_current_modes":
        {"imports torch.utils._python_dispatch, which can switch off the checks' watch of torch",
         "imports _disable_current_modes, which can switch off the checks' watch of torch"},
}


@pytest.mark.parametrize("code", sorted(ROUTES))
def test_a_route_around_the_plain_spelling_has_its_reason(code):
    assert ROUTES[code] <= set(suspicious(code)), suspicious(code)


def test_honest_lookups_raise_nothing():
    """What answers do write: a getattr of a written-out attribute, modules' functions used, not reached through."""
    honest = ("w = getattr(self, 'weight')\nout = torch.nn.functional.relu(x)\nos_name = 'linux'\n"
              "import math\nscale = math.sqrt(d)\nself.cache = {}\n")
    assert suspicious(honest) == []


def _with_extra_cells(*sources: str):
    nb = nbs.filled_submission(NB)
    nb.cells += [nbformat.v4.new_code_cell(source) for source in sources]
    return rebuild(nb, nbs.read(nbs.RELEASE / f"{NB}.ipynb")).notebook


def test_one_line_of_ipython_syntax_hides_no_cell_from_review(tmp_path):
    """`out = !true` in a cell of its own once left the review column empty: the scan parsed all the student's code
    as one text and gave up on the syntax error. Each cell is read on its own now, IPython's syntax transformed."""
    nb = _with_extra_cells("out = !true", REACHING)
    assert EIGHT_REASONS <= set(scan_notebook(nb.cells).reasons)
    write_nb(nb, tmp_path / "submitted" / "s" / nbs.ASSIGNMENT / f"{NB}.ipynb")
    flags = review_flags(tmp_path, "s", [])
    assert any(f.startswith(f"{NB}: code that reaches for the checks (") for f in flags), flags


def test_a_cell_that_is_not_python_is_a_finding_and_the_others_are_read(tmp_path):
    nb = _with_extra_cells("def broken(:\n    pass", REACHING)
    number = next(i for i, c in enumerate(nb.cells, 1) if c.source.startswith("def broken"))
    found = scan_notebook(nb.cells)
    assert found.not_python == [f"cell {number} is not Python: invalid syntax (line 1)"]
    assert EIGHT_REASONS <= set(found.reasons)
    with pytest.raises(NotPython):
        suspicious("def broken(:\n    pass")
    write_nb(nb, tmp_path / "submitted" / "s" / nbs.ASSIGNMENT / f"{NB}.ipynb")
    assert any(f"cell {number} is not Python" in f for f in review_flags(tmp_path, "s", []))


def test_an_expression_too_deep_to_write_back_is_still_a_reason():
    assert suspicious("torch.x[" + "1+" * 900 + "1] = 0") == ["assigns to torch[...] (nested too deep to show)"]


def test_a_script_cell_is_flagged_for_what_the_student_adds_not_for_its_given_lines():
    """Notebook 07's script cell is given `%%writefile` and the kit's imports; a student's own
    reach for the interpreter inside them is still flagged."""
    assert "calls get_ipython()" in given_reasons()["eval_script"]
    release = nbs.read(nbs.RELEASE / "07_generation_and_evaluation.ipynb")
    cells = [dict(c) for c in release.cells]
    index = next(i for i, c in enumerate(cells) if nbs.nbgrader_meta(c).get("grade_id") == "eval_script")
    assert scan_notebook(cells).reasons == []
    cells[index]["source"] += "\nimport ctypes\n"
    assert scan_notebook(cells).reasons == ["imports ctypes"]
