"""Notebook 07's stored references agree with independent implementations, and typical bugs are named.

The grid against explicit (i, j) indexing; the upsampling against a NumPy bilinear interpolation with
pixel centres written out by hand (and against torch's interpolate for the convention); the rollout to
the regions against a NumPy walk of every path, position by position; the localisation accuracy against NumPy argmax and divmod; the chance level
against counting cells one by one. Gradients against autograd through the independent versions.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_matches_reference, case_names, load_any_case

from grading import notebooks as nbs
from starter.checks import CheckFailed, check

STEM = "09_visualizing_attention"


_load = load_any_case


def _names():
    return case_names(STEM)




# ---- independent implementations ------------------------------------------------------------------

def grid_loops(w: torch.Tensor, gs) -> torch.Tensor:
    """grid[..., i, j] = w[..., i * W + j], cell by cell."""
    H, W = gs
    rows = [torch.stack([w[..., i * W + j] for j in range(W)], -1) for i in range(H)]
    return torch.stack(rows, -2)


def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of 1-D linear interpolation, pixel-centre convention, edges clamped."""
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        x = (o + 0.5) * n_in / n_out - 0.5          # position of output pixel centre in input coordinates
        x = min(max(x, 0.0), n_in - 1.0)
        lo = int(np.floor(x))
        hi = min(lo + 1, n_in - 1)
        f = x - lo
        m[o, lo] += 1 - f
        m[o, hi] += f
    return m


def upsample_numpy_weights(h, w, size):
    return torch.from_numpy(bilinear_matrix(h, size[0])), torch.from_numpy(bilinear_matrix(w, size[1]))


def upsample_independent(grid: torch.Tensor, size) -> torch.Tensor:
    """Separable bilinear interpolation as two matrix products, then each map / its maximum."""
    mh, mw = upsample_numpy_weights(grid.shape[-2], grid.shape[-1], size)
    up = mh.to(grid.dtype) @ grid @ mw.to(grid.dtype).T
    peak = up.flatten(-2).max(-1).values[..., None, None]
    return up / torch.clamp(peak, min=1e-12)


def locacc_numpy(cross: np.ndarray, target: np.ndarray, gs, radius: int) -> float:
    H, W = gs
    c = cross.reshape(-1, cross.shape[-1])
    t = target.reshape(-1)
    hits = 0
    for row, tgt in zip(c, t):
        pr, pc = divmod(int(np.argmax(row)), W)
        tr, tc = divmod(int(tgt), W)
        hits += abs(pr - tr) <= radius and abs(pc - tc) <= radius
    return hits / len(t)


def chance_counting(target: np.ndarray, gs, radius: int) -> float:
    H, W = gs
    probs = []
    for tgt in target.reshape(-1):
        tr, tc = divmod(int(tgt), W)
        near = sum(1 for r in range(H) for c in range(W) if abs(r - tr) <= radius and abs(c - tc) <= radius)
        probs.append(near / (H * W))
    return float(np.mean(probs))


def rollout_numpy(self_layers: np.ndarray, cross_layers: np.ndarray, residual: float) -> np.ndarray:
    """The regions' shares as a bookkeeping of sources: every position holds a vector of shares over the T word
    embeddings and the R regions, updated sublayer by sublayer with explicit loops."""
    L, B, heads, T, R = cross_layers.shape
    out = np.zeros((B, T, R))
    for b in range(B):
        state = np.concatenate([np.eye(T), np.zeros((T, R))], axis=1)   # position t: 100% word embedding t
        for layer in range(L):
            s_bar = sum(self_layers[layer, b, h] for h in range(heads)) / heads
            c_bar = sum(cross_layers[layer, b, h] for h in range(heads)) / heads
            after_self = np.zeros_like(state)
            for t in range(T):
                read = sum(s_bar[t, s] * state[s] for s in range(T))
                after_self[t] = residual * state[t] + (1 - residual) * read
            state = np.zeros_like(after_self)
            for t in range(T):
                state[t] = residual * after_self[t]
                state[t, T:] += (1 - residual) * c_bar[t]
        assert np.allclose(state.sum(1), 1.0), "shares of sources must sum to 1"
        out[b] = state[:, T:]
    return out


def _rollout_independent(self_layers, cross_layers, residual):
    """rollout_numpy, made differentiable where the case checks gradients: torch ops in the same loops."""
    if not (self_layers.requires_grad or cross_layers.requires_grad):
        return torch.from_numpy(rollout_numpy(self_layers.numpy(), cross_layers.numpy(), residual))
    L, B, heads, T, R = cross_layers.shape
    outs = []
    for b in range(B):
        state = torch.cat([torch.eye(T, dtype=torch.float64), torch.zeros(T, R, dtype=torch.float64)], 1)
        for layer in range(L):
            s_bar = self_layers[layer, b].mean(0)
            c_bar = cross_layers[layer, b].mean(0)
            mixed = torch.stack([residual * state[t] + (1 - residual) * sum(s_bar[t, s] * state[s] for s in range(T))
                                 for t in range(T)])
            state = residual * mixed + torch.cat([torch.zeros(T, T, dtype=torch.float64), (1 - residual) * c_bar], 1)
        outs.append(state[:, T:])
    return torch.stack(outs)


def _independent(case, inputs):
    t = case.target
    if t == "attention_to_grid":
        return [grid_loops(inputs["weights"], case.const_args[0])]
    if t == "upsample_attention":
        return [upsample_independent(inputs["grid"], case.const_args[0])]
    if t == "rollout_to_regions":
        return [_rollout_independent(inputs["self_layers"], inputs["cross_layers"], case.const_kwargs["residual"])]
    if t == "localisation_accuracy":
        acc = locacc_numpy(inputs["cross"].numpy(), inputs["target_cells"].numpy(), case.const_args[0],
                           case.const_kwargs["radius"])
        return [torch.tensor(acc, dtype=torch.float64)]
    if t == "chance_accuracy":
        return [torch.tensor(chance_counting(inputs["target_cells"].numpy(), case.const_args[0],
                                             case.const_kwargs["radius"]), dtype=torch.float64)]
    raise AssertionError(f"no independent implementation for {t}")


NAMES = _names()


def test_bilinear_matrix_is_the_pixel_centre_convention():
    g = torch.rand(2, 5, 3, dtype=torch.float64)
    ref = torch.nn.functional.interpolate(g[:, None], size=(11, 8), mode="bilinear", align_corners=False)[:, 0]
    mh, mw = upsample_numpy_weights(5, 3, (11, 8))
    np.testing.assert_allclose((mh @ g @ mw.T).numpy(), ref.numpy(), atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_reference_matches_independent_implementation(name):
    case = _load(name)
    if case.expects_error:
        assert case.expected["grid"].size == 0  # placeholder: the check only expects the ValueError
        h, w = case.const_args[0]
        assert case.inputs["weights"].shape[-1] != h * w
        return
    inputs = {k: torch.from_numpy(np.array(v)) for k, v in case.inputs.items()}
    inputs = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    for key in case.grad_wrt:
        inputs[key].requires_grad_(True)
    outs = _independent(case, inputs)
    assert_matches_reference(name, case, outs, inputs)


def test_cases_cover_the_notebook():
    cases = [_load(n) for n in NAMES]
    targets = {c.target for c in cases}
    assert targets == {"attention_to_grid", "upsample_attention", "rollout_to_regions", "localisation_accuracy",
                       "chance_accuracy"}
    for target in ("attention_to_grid", "upsample_attention", "rollout_to_regions"):
        assert any(c.grad_wrt for c in cases if c.target == target), f"{target}: no gradient check"
    assert any(c.inputs[k].dtype == np.float64 for c in cases for k in c.inputs), "float64"
    assert sum(c.expects_error for c in cases) >= 2
    assert any(c.target == "upsample_attention" and c.inputs["grid"].shape[-2:] == (1, 1) for c in cases), "fc7"
    # the localisation cases are neither all hits nor all misses (except the deliberately huge radius)
    for c in cases:
        if c.target == "localisation_accuracy" and c.const_kwargs["radius"] < 3:
            assert 0.1 < float(c.expected["accuracy"]) < 0.9, c.name


# ---- typical bugs get a one-line message naming them ----------------------------------------------

F = torch.nn.functional


def _up(grid, size, **kw):
    lead = grid.shape[:-2]
    up = F.interpolate(grid.reshape(-1, 1, *grid.shape[-2:]), size=tuple(size), **kw)
    return up.reshape(*lead, *up.shape[-2:])


def _rollout_loop(s, c, residual, transpose=False, head=None, carry=True):
    """A student's rollout, with switches for three of the bugs below."""
    shares = torch.zeros_like(c[0][:, 0])
    for sw, cw in zip(s, c):
        s_bar, c_bar = (sw.mean(1), cw.mean(1)) if head is None else (sw[:, head], cw[:, head])
        if transpose:
            s_bar = s_bar.transpose(-1, -2)
        mix = residual * torch.eye(s_bar.shape[-1]) + (1 - residual) * s_bar if carry else torch.eye(s_bar.shape[-1])
        shares = residual * (mix @ shares) + (1 - residual) * c_bar
    return shares


BUGS = [
    ("grid/basic", lambda w, gs: w.reshape(*w.shape[:-1], gs[1], gs[0]).transpose(-1, -2), "column by column"),
    ("grid/mismatch", lambda w, gs: w[..., : gs[0] * gs[1]].reshape(*w.shape[:-1], *gs), "ValueError"),
    ("upsample/basic", lambda g, s: (lambda u: u / u.amax((-2, -1), keepdim=True))(_up(g, s, mode="bilinear",
                                                                                      align_corners=True)),
     "align_corners=True"),
    ("upsample/basic", lambda g, s: _up(g, s, mode="bilinear", align_corners=False), "not normalised"),
    ("upsample/basic", lambda g, s: (lambda u: u / u.amax((-2, -1), keepdim=True))(_up(g, s, mode="nearest")),
     "nearest"),
    ("rollout/basic", lambda s, c, residual=0.5: _rollout_loop(s, c, residual, carry=False), "passed on"),
    ("rollout/basic", lambda s, c, residual=0.5: (1 - residual) * c[-1].mean(1), "only the last layer"),
    ("rollout/basic", lambda s, c, residual=0.5: _rollout_loop(s, c, residual, transpose=True), "wrong direction"),
    ("rollout/basic", lambda s, c, residual=0.5: _rollout_loop(s, c, residual, head=0), "head 0"),
    ("rollout/basic", lambda s, c, residual=0.5: (lambda p: p / p.sum(-1, keepdim=True))(_rollout_loop(s, c, residual)),
     "normalised"),
    ("rollout/one_layer", lambda s, c, residual=0.5: c[0].mean(1), "keeps a share"),
    ("locacc/radius1", lambda c, t, gs, radius=0: ((c.argmax(-1) - t).abs() <= radius).to(c.dtype).mean(),
     "flat indices"),
    ("chance/radius1", lambda t, gs, radius=0: torch.tensor((2 * radius + 1) ** 2 / (gs[0] * gs[1])), "border"),
]


@pytest.mark.parametrize("name,bug,words", BUGS, ids=[f"{b[0]}-{b[2]}" for b in BUGS])
def test_typical_bugs_are_named(name, bug, words):
    _load(name)  # sets the hidden folder
    with pytest.raises(CheckFailed) as info:
        check(name, bug)
    message = str(info.value)
    assert words in message and "\n" not in message, message


def test_solution_passes_every_case_and_unfinished_code_is_reported(hidden_references):
    ns = nbs.execute_definitions(nbs.SOLUTIONS / f"{STEM}.ipynb")
    for name in NAMES:
        target = _load(name).target
        check(name, ns[target])

    def unfinished(*args, **kwargs):
        raise NotImplementedError()

    for name in NAMES:
        with pytest.raises(CheckFailed, match="not implemented yet"):
            check(name, unfinished)
