"""Every stored known-bug variant, in every notebook, is distinguishable from the reference and
comes with a one-line message (a variant equal to the reference would blame correct code)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import SOLUTION_STEMS, case_names, load_any_case

NAMES = [n for stem in SOLUTION_STEMS for n in case_names(stem)]


@pytest.mark.parametrize("name", NAMES)
def test_variants_differ_from_reference(name):
    case = load_any_case(name)
    for vname, (message, vouts) in case.variants.items():
        assert message and len(message.splitlines()) == 1, f"{name}: {vname}"
        differs = any(vouts[n].shape != case.expected[n].shape
                      or not np.allclose(vouts[n], case.expected[n], rtol=case.rtol, atol=case.atol, equal_nan=True)
                      for n in case.outputs)
        assert differs, f"{name}: variant {vname} equals the reference"
