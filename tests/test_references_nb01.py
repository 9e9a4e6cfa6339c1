"""Notebook 01's stored references agree with independent implementations.

Outputs against `torch.nn.functional.scaled_dot_product_attention`, weights against the NumPy
formula, causal masks against `numpy.tril`, gradients against autograd through PyTorch's attention.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import case_names, load_any_case

STEM = "01_scaled_dot_product_attention"


def _names():
    return case_names(STEM)


def _softmax_np(x):
    x = x - np.max(np.where(np.isfinite(x), x, -np.inf), axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def _attention(q, k, v, mask):
    """PyTorch's attention for the output; the NumPy formula for the weights."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = q.detach().numpy() @ np.swapaxes(k.detach().numpy(), -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask.numpy(), scores, -np.inf)
    return out, _softmax_np(scores)


def _independent(case, inputs, params):
    t = case.target
    if t in ("attention_loop", "scaled_dot_product_attention"):
        a = [inputs[n] for n in case.args]
        return _attention(*a, inputs.get("mask"))
    if t == "causal_mask":
        (n,) = case.const_args
        return (torch.from_numpy(np.tril(np.ones((n, n), dtype=bool))),)
    if t == "SelfAttention":
        x = inputs["x"]
        q, k, v = x @ params["query.weight"].T, x @ params["key.weight"].T, x @ params["value.weight"].T
        return _attention(q, k, v, inputs.get("mask"))
    raise AssertionError(f"no independent implementation for {t}")


@pytest.mark.parametrize("name", _names())
def test_reference_matches_independent_implementation(name):
    case = _load(name)
    inputs = {k: torch.from_numpy(v.copy()).double() if v.dtype.kind == "f" else torch.from_numpy(v.copy())
              for k, v in case.inputs.items()}
    params = {k: torch.from_numpy(v.copy()).double() for k, v in case.params.items()}
    for key in case.grad_wrt:
        (inputs if key in inputs else params)[key].requires_grad_(True)
    outs = _independent(case, inputs, params)
    for out_name, value in zip(case.outputs, outs):
        value = value.detach().numpy() if isinstance(value, torch.Tensor) else value
        assert value.shape == case.expected[out_name].shape
        np.testing.assert_allclose(value.astype(np.float64), case.expected[out_name].astype(np.float64),
                                   rtol=1e-5, atol=1e-6, err_msg=f"{name}: {out_name}")
    floats = [v.dtype for v in case.inputs.values() if v.dtype.kind == "f"]
    if floats:  # the stored dtype follows the inputs' dtype
        assert case.expected["output"].dtype == floats[0]
    if case.grad_wrt:
        loss = (outs[0] * torch.from_numpy(case.grad_weights["output"]).double()).sum()
        # the NumPy weights carry no graph: the weights' gradient term goes through torch's softmax
        if case.target == "SelfAttention":
            x = inputs["x"]
            q, k = x @ params["query.weight"].T, x @ params["key.weight"].T
        else:
            q, k = inputs[case.args[0]], inputs[case.args[1]]
        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if "mask" in inputs:
            s = s.masked_fill(~inputs["mask"], float("-inf"))
        loss = loss + (s.softmax(-1) * torch.from_numpy(case.grad_weights["weights"]).double()).sum()
        loss.backward()
        for key in case.grad_wrt:
            grad = (inputs if key in inputs else params)[key].grad
            np.testing.assert_allclose(grad.numpy(), case.grads[key], rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name}: grad {key}")


def _load(name):
    return load_any_case(name)


def test_cases_cover_the_curriculum():
    targets = {_load(n).target for n in _names()}
    assert targets == {"attention_loop", "scaled_dot_product_attention", "causal_mask", "SelfAttention"}
    graded = [n for n in _names() if _load(n).grad_wrt]
    assert graded, "at least one gradient check"


def test_question_3s_model_answer_is_what_the_polarity_cell_prints():
    """Q3: the polarity cell, run on the solution's answers, prints what the model answer says: PyTorch's attention
    agrees with the student's under a bool mask, an additive mask and is_causal; flipped, query 0 sees only its
    future and the last query nothing (NaN weights from the student's softmax; zeros or NaN from PyTorch's, by
    version); a mask of ones and zeros added to the scores lets the future in, an additive -inf mask does not."""
    import contextlib
    import io

    from grading import notebooks as nbs

    stem = "01_scaled_dot_product_attention"
    ns = dict(nbs.solution(stem))
    (cell,) = [c for c in nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb").cells
               if nbs.nbgrader_meta(c).get("grade_id") == "code_torch_sdpa"]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(cell.source, ns)
    printed = out.getvalue()
    for name in ("a bool mask", "an additive float mask", "is_causal=True"):
        assert f"yours == PyTorch's with {name}: True" in printed, printed
    assert "query 0 may attend to keys [1, 2, 3, 4], the last query to []" in printed, printed
    yours, theirs = re.search(r"from yours: \[(.*?)\], its output from PyTorch's \(version [^)]*\): \[(.*?)\]", printed).groups()
    assert set(yours.split(", ")) == {"nan"}, yours
    assert set(theirs.split(", ")) in ({"0.0"}, {"nan"}), theirs
    assert "with the additive mask, query 0's output moves when its future changes: False" in printed
    assert "with the bool mask cast to float (1.0 / 0.0), query 0's output moves when its future changes: True" in printed
    answer = [c.source for c in nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb").cells
              if nbs.nbgrader_meta(c).get("grade_id") == "q_polarity"][0]
    assert "keys 1 to 4, its future" in answer and "NaN weights" in answer and "an output of zeros" in answer
