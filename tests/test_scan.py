"""The tamper scan flags code that could patch the checks, and leaves honest answers alone."""
from __future__ import annotations

import pytest

from grading import notebooks as nbs
from grading.scan import suspicious


@pytest.mark.parametrize("path", nbs.solution_notebooks(), ids=lambda p: p.stem)
def test_reference_answers_raise_no_alarm(path):
    for cell in nbs.read(path).cells:
        if nbs.is_solution(cell):
            assert suspicious(nbs.strip_solution_markers(cell.source)) == [], nbs.nbgrader_meta(cell)["grade_id"]


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
])
def test_tampering_raises_an_alarm(code):
    assert suspicious(code)
