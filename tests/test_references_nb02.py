"""Notebook 02's stored references agree with independent implementations.

The encoding against the formula evaluated in NumPy, one column at a time; the shift matrices and the
shifted codes against the angle-addition formulas; rotary embeddings against complex multiplication (a pair
(a, b) as a + ib, times e^(i theta)); the layer against x + the NumPy table; gradients
against autograd through independent PyTorch formulas. Bug variants must differ from the reference,
and the cases that expect a ValueError must really get one from the solution.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_matches_reference, case_names, load_any_case

from grading import notebooks as nbs

STEM = "02_positional_encoding"


_load = load_any_case


def _names():
    return case_names(STEM)




def pe_numpy(max_len: int, d: int) -> np.ndarray:
    """PE(pos, j) straight from the formula, column by column (works for odd d)."""
    pe = np.zeros((max_len, d))
    for j in range(d):
        i = j // 2
        angle = np.arange(max_len) / 10000 ** (2 * i / d)
        pe[:, j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    return pe


def _rotation(omega: torch.Tensor, phi: float) -> torch.Tensor:
    """[[cos, sin], [-sin, cos]](omega * phi), built entry by entry."""
    a = omega * phi
    m = torch.zeros(*omega.shape, 2, 2, dtype=omega.dtype)
    m = m + torch.cos(a)[..., None, None] * torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=omega.dtype)
    return m + torch.sin(a)[..., None, None] * torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=omega.dtype)


def _independent(case, inputs):
    t = case.target
    if t == "sinusoidal_encoding":
        return [torch.from_numpy(pe_numpy(*case.const_args))]
    if t == "relative_shift_matrix":
        return [_rotation(inputs["omega"], case.const_args[0])]
    if t == "shift_encoding":
        pe, omega, (phi,) = inputs["pe"], inputs["omega"], case.const_args
        cols = []
        for i in range(pe.shape[-1] // 2):  # angle addition, one pair at a time
            s, c = pe[..., 2 * i], pe[..., 2 * i + 1]
            a = omega[i] * phi
            cols += [s * torch.cos(a) + c * torch.sin(a), -s * torch.sin(a) + c * torch.cos(a)]
        return [torch.stack(cols, -1)]
    if t == "apply_rope":  # pair (a, b) as the complex number a + ib, rotated by multiplying with e^(i theta)
        x, (offset,) = inputs["x"], case.const_args
        d, T = x.shape[-1], x.shape[-2]
        theta = (offset + torch.arange(T, dtype=torch.float64))[:, None] / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(torch.ones_like(theta), theta)
        return [torch.stack([z.real, z.imag], -1).flatten(-2)]
    if t == "PositionalEncoding":
        x = inputs["x"]
        summed = x + torch.from_numpy(pe_numpy(x.shape[1], x.shape[2]))
        if case.train_seed is None:
            return [summed]
        p = case.init["dropout"]  # training mode: the checks' dropout (a function of each value), on the sum
        return [summed * (1 - p * (1 + torch.cos(6 * summed + 1)) / 2) / (1 - p)]
    if t == "follows_module(PositionalEncoding)":  # the solution's layer moves to another device, its table too
        ns = nbs.execute_definitions(nbs.SOLUTIONS / f"{STEM}.ipynb")
        layer = ns["PositionalEncoding"](inputs["x"].shape[-1], case.const_args[0], 0.0).to("meta")
        out = layer(inputs["x"].to("meta"))
        return [torch.tensor([float(out.device.type == "meta"), float(layer.pe.device.type == "meta")])]
    raise AssertionError(f"no independent implementation for {t}")


NAMES = _names()


@pytest.mark.parametrize("name", NAMES)
def test_reference_matches_independent_implementation(name):
    case = _load(name)
    if case.expects_error:
        placeholder = next(iter(case.expected.values()))
        assert placeholder.size == 0  # the check only expects the ValueError
        if case.target == "apply_rope":
            assert case.inputs["x"].shape[-1] % 2 == 1
        else:
            assert case.inputs["x"].shape[1] > case.init["max_len"]
        return
    inputs = {k: torch.from_numpy(np.array(v)).double() for k, v in case.inputs.items()}
    for key in case.grad_wrt:
        inputs[key].requires_grad_(True)
    outs = _independent(case, inputs)
    assert_matches_reference(name, case, outs, inputs)


def test_solution_refuses_too_long_sequences():
    ns = nbs.execute_definitions(nbs.SOLUTIONS / f"{STEM}.ipynb")
    layer = ns["PositionalEncoding"](d_model=4, max_len=5)
    assert layer(torch.zeros(1, 5, 4)).shape == (1, 5, 4)
    with pytest.raises(ValueError, match="max_len"):
        layer(torch.zeros(1, 6, 4))
    assert "pe" in dict(layer.named_buffers()) and not list(layer.parameters())
    # the encoding against the formula at a length the cases don't store, and with an odd d_model
    np.testing.assert_allclose(ns["sinusoidal_encoding"](300, 33).numpy(), pe_numpy(300, 33), atol=1e-5)


def test_cases_cover_the_notebook():
    cases = [_load(n) for n in NAMES]
    assert {c.target for c in cases} == {"sinusoidal_encoding", "relative_shift_matrix", "shift_encoding",
                                         "PositionalEncoding", "follows_module(PositionalEncoding)", "apply_rope"}
    assert any(c.train_seed is not None for c in cases), "no case about dropout (training mode)"
    for target in {c.target for c in cases} - {"follows_module(PositionalEncoding)"}:
        mine = [c for c in cases if c.target == target]
        assert any(c.grad_wrt for c in mine) or target == "sinusoidal_encoding", f"{target}: no gradient check"
    assert any(c.target == "sinusoidal_encoding" and c.const_args[1] % 2 == 1 for c in cases), "odd d_model"
    assert sum(c.expects_error for c in cases) >= 3
    rope = [c for c in cases if c.target == "apply_rope"]
    assert any(c.const_args[0] >= 100_000 for c in rope), "no far position (float32 angles)"
    assert any(c.const_args[0] and c.inputs["x"].shape[-2] == 1 for c in rope), "no cached decoding step"


def test_solution_refuses_an_odd_rope_size_and_rotates_a_cached_step_as_the_whole_sequence():
    ns = nbs.execute_definitions(nbs.SOLUTIONS / f"{STEM}.ipynb")
    with pytest.raises(ValueError, match="d = 5"):
        ns["apply_rope"](torch.zeros(2, 3, 5))
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    assert torch.allclose(ns["apply_rope"](x)[:, 4:], ns["apply_rope"](x[:, 4:], offset=4))


def test_question_5s_model_answer_is_what_the_rope_cell_prints():
    """Q5: the score of a rotated query and key is the same wherever the pair sits, for the key 3 after and for the
    key 3 before, and those two differ; the last row rotated alone with its offset is the whole sequence's."""
    import contextlib
    import io
    import re

    ns = dict(nbs.solution(STEM))
    (cell,) = [c for c in nbs.read(nbs.SOLUTIONS / f"{STEM}.ipynb").cells
               if nbs.nbgrader_meta(c).get("grade_id") == "code_rope"]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(cell.source, ns)
    rows = [tuple(map(float, m)) for m in re.findall(r"key 3 after it +(-?[\d.]+) \| key 3 before it +(-?[\d.]+)",
                                                     out.getvalue())]
    assert len(rows) == 4, out.getvalue()
    after, before = zip(*rows)
    assert max(after) - min(after) < 2e-3 and max(before) - min(before) < 2e-3, rows
    assert abs(after[0] - before[0]) > 0.05, rows
    assert "equals the last row of the whole sequence rotated: True" in out.getvalue()


def test_question_4s_model_answer_holds_for_the_solutions_encoding():
    """Q4: PE(p)·PE(p+k) = sum_i cos(omega_i k) for every start p, the same for +k and -k; a rotation M(phi) of each
    frequency pair between the two codes makes the score peak at the signed offset k = -phi."""
    ns = nbs.execute_definitions(nbs.SOLUTIONS / f"{STEM}.ipynb")
    d, phi = 16, 3
    pe = ns["sinusoidal_encoding"](60, d).double()
    omega = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    for k in range(0, 20):
        dots = [float(pe[p] @ pe[p + k]) for p in (0, 7, 20)]
        assert max(dots) - min(dots) < 1e-5 and abs(dots[0] - float(torch.cos(omega * k).sum())) < 1e-5
        assert abs(float(pe[30] @ pe[30 - k]) - dots[0]) < 1e-5  # +k and -k alike
    rotation = torch.block_diag(*[torch.tensor([[torch.cos(w * phi), torch.sin(w * phi)],
                                                [-torch.sin(w * phi), torch.cos(w * phi)]], dtype=torch.float64)
                                  for w in omega])
    assert torch.allclose(rotation @ pe[10], pe[10 + phi], atol=1e-5), "M(phi) moves a code phi positions on"
    scores = {k: float(pe[30] @ (rotation @ pe[30 + k])) for k in range(-8, 9)}
    assert max(scores, key=scores.get) == -phi and scores[phi] != scores[-phi], scores
