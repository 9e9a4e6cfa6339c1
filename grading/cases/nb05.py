"""Reference cases of notebook 05 (visualising attention).

The graded tools of notebook 05 are checked on stored inputs only, never on a trained model, so a bug
in a student's notebook 04 costs no points here. Public cases (public=True) are what students see;
hidden ones use batch dimensions, non-square grids, float64, a single region (fc7 features), an
all-zero map, large radii and gradients. Variants are known bugs, written here independently of the
solution, that the check names.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from grading.references import CaseSpec

# ---- known bugs -----------------------------------------------------------------------------------

def _grid_variants(grid_shape) -> dict:
    H, W = grid_shape

    def column_major(weights, gs):  # fill the grid column by column
        return weights.unflatten(-1, (gs[1], gs[0])).transpose(-1, -2)

    variants = {
        "column_major": ("the grid is filled column by column (reshape to (W, H) and transpose): regions are "
                         "flattened row by row, region r is cell (r // W, r % W), so reshape straight to (..., H, W).",
                         lambda ns: column_major),
    }
    if H == W:
        variants["transposed"] = ("the grid is transposed (rows and columns swapped): region r is cell "
                                  "(row r // W, column r % W); reshape to (..., H, W) without a transpose.",
                                  lambda ns: lambda weights, gs: weights.unflatten(-1, tuple(gs)).transpose(-1, -2))
    return variants


def _up(grid, size, mode="bilinear", align_corners=False, norm="max"):
    lead, (h, w) = grid.shape[:-2], grid.shape[-2:]
    x = grid.reshape(-1, 1, h, w)
    if mode == "nearest":
        up = F.interpolate(x, size=tuple(size), mode="nearest")
    else:
        up = F.interpolate(x, size=tuple(size), mode=mode, align_corners=align_corners)
    up = up.reshape(*lead, *up.shape[-2:])
    if norm == "max":
        return up / up.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    if norm == "none":
        return up
    if norm == "no_clamp":
        return up / up.amax(dim=(-2, -1), keepdim=True)
    if norm == "sum":
        return up / up.sum(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    if norm == "minmax":
        lo = up.amin(dim=(-2, -1), keepdim=True)
        return (up - lo) / (up.amax(dim=(-2, -1), keepdim=True) - lo).clamp_min(1e-12)
    if norm == "global":
        return up / up.max().clamp_min(1e-12)
    if norm == "grid_max":
        return up / grid.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    raise ValueError(norm)


def _upsample_variants(batched: bool, zero: bool = False) -> dict:
    def v(**kw):
        return lambda ns: lambda grid, size: _up(grid, size, **kw)

    variants = {
        "align_corners": ("looks like align_corners=True: use the pixel-centre convention, "
                          "F.interpolate(..., mode='bilinear', align_corners=False).", v(align_corners=True)),
        "nearest": ("nearest-neighbour (blocky) upsampling: use mode='bilinear' (align_corners=False).",
                    v(mode="nearest")),
        "bicubic": ("bicubic upsampling: use mode='bilinear' (align_corners=False).", v(mode="bicubic")),
        "unnormalised": ("the upsampling looks right but the maps are not normalised: divide each map by its "
                         "own maximum so that its peak is 1.", v(norm="none")),
        "sum": ("each map normalised to sum 1: divide by its maximum instead, so that its peak is 1.", v(norm="sum")),
        "minmax": ("min-max normalised: only divide by the maximum (don't subtract the minimum), so zero "
                   "attention stays 0.", v(norm="minmax")),
        "grid_max": ("divided by the maximum of the grid before upsampling: divide by the maximum of each "
                     "upsampled map, so that its peak is exactly 1.", v(norm="grid_max")),
    }
    if zero:
        variants["no_clamp"] = ("an all-zero map became NaN (0 / 0): clamp each maximum at 1e-12 before dividing "
                                "(`.clamp_min(1e-12)`).", v(norm="no_clamp"))
    if batched:
        variants["global"] = ("one maximum for the whole batch: normalise every (height, width) map by its own "
                              "maximum (amax over the last two dims, keepdim=True).", v(norm="global"))
    return variants


def _collect(layers, layer=-1, head=None, bug=None):
    w = layers[0] if bug == "first_layer" else layers[layer]
    if bug == "layers_mean":
        w = torch.stack(list(layers)).mean(0)
    if head is not None:
        return w[head] if bug == "head_on_batch" else w[:, head]
    if bug == "batch_mean":
        return w.mean(dim=0)
    if bug == "sum":
        return w.sum(dim=1)
    if bug == "max":
        return w.amax(dim=1)
    return w.mean(dim=1)


def _collect_variants(head, layer) -> dict:
    def v(bug):
        return lambda ns: lambda layers, layer=-1, head=None: _collect(layers, layer, head, bug)

    out = {
        "first_layer": (f"took the first layer: `layer={layer}` counts like a Python index (-1 is the last "
                        "layer), so use layers[layer].", v("first_layer")),
        "layers_mean": ("averaged over the layers: pick the one layer `layers[layer]`.", v("layers_mean")),
    }
    if layer == 0:
        del out["first_layer"]
    if head is None:
        out.update({
            "batch_mean": ("averaged over the batch axis: the heads are axis 1 of (B, heads, T, S), so mean(dim=1).",
                           v("batch_mean")),
            "sum": ("summed over the heads: take the mean, so that each row stays a probability distribution.",
                    v("sum")),
            "max": ("took the maximum over the heads: take the mean (dim=1).", v("max")),
        })
    else:
        out["head_on_batch"] = ("indexed the head on the batch axis: weights are (B, heads, T, S), so one head is "
                                "weights[:, head].", v("head_on_batch"))
    return out


def _locacc(cross, target, grid_shape, radius=0, bug=None):
    H, W = grid_shape
    peak = cross.argmax(dim=-1)
    if bug == "flat":
        hit = (peak - target).abs() <= radius
    else:
        div = H if bug == "height" else W
        pr, pc, tr, tc = peak // div, peak % div, target // div, target % div
        if bug == "manhattan":
            hit = (pr - tr).abs() + (pc - tc).abs() <= radius
        else:
            hit = ((pr - tr).abs() <= radius) & ((pc - tc).abs() <= radius)
    acc = hit.to(cross.dtype).mean()
    if bug == "miss":
        return 1 - acc
    if bug == "count":
        return hit.to(cross.dtype).sum()
    if bug == "min":
        return (cross.argmin(dim=-1) == target).to(cross.dtype).mean()
    return acc


def _locacc_variants(radius, square) -> dict:
    def v(bug):
        return lambda ns: lambda cross, target, gs, radius=0: _locacc(cross, target, gs, radius, bug)

    out = {
        "miss": ("returned the fraction of misses: return hits / words.", v("miss")),
        "count": ("returned the number of hits: divide by the number of words (take the mean).", v("count")),
    }
    if radius > 0:
        out["flat"] = ("compared flat indices (|peak - target| <= radius): convert both to (row, col) with "
                       "row = idx // W, col = idx % W and compare each.", v("flat"))
        out["manhattan"] = ("used |dr| + |dc| <= radius: a hit needs |dr| <= radius AND |dc| <= radius "
                            "(a (2 radius + 1)^2 block).", v("manhattan"))
    if not square:
        out["height"] = ("converted flat indices with the grid height: row = idx // W and col = idx % W, "
                         "with W = grid_shape[1] the width.", v("height"))
    return out


def _chance(target, grid_shape, radius=0, bug=None):
    H, W = grid_shape
    if bug == "uniform":
        return torch.tensor(1.0 / (H * W))
    if bug == "unclipped":
        return torch.tensor(min((2 * radius + 1) ** 2, H * W) / (H * W), dtype=torch.float32)
    div = H if bug == "height" else W
    r, c = target // div, target % div
    rows = (r + radius).clamp(max=H - 1) - (r - radius).clamp(min=0) + 1
    cols = (c + radius).clamp(max=W - 1) - (c - radius).clamp(min=0) + 1
    p = (rows * cols).float() / (H * W)
    if bug == "count":
        return (rows * cols).float().mean()
    return p.mean()


def _chance_variants(radius, square) -> dict:
    def v(bug):
        return lambda ns: lambda target, gs, radius=0: _chance(target, gs, radius, bug)

    out = {
        "count": ("returned the number of cells near the target: divide by the number of cells H * W.", v("count")),
    }
    if radius > 0:
        out["uniform"] = ("returned 1/R: with radius > 0 a random peak hits any of the cells within the radius.",
                          v("uniform"))
        out["unclipped"] = ("used (2 radius + 1)^2 / R for every target: near the border part of that block "
                            "falls off the grid; count only the cells inside it.", v("unclipped"))
    if not square:
        out["height"] = ("converted flat indices with the grid height: row = idx // W, col = idx % W.", v("height"))
    return out


# ---- cases ----------------------------------------------------------------------------------------

def _attention(*shape, g, dtype=torch.float32, sharp=2.0):
    """Random attention weights (rows sum to 1) with distinct values, so argmax has no ties."""
    scores = torch.randn(*shape, generator=g, dtype=torch.float64) * sharp
    return torch.softmax(scores, dim=-1).to(dtype)


def cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(5005)
    out = []

    # attention_to_grid(weights, grid_shape)
    for name, (shape, gs, dtype, grad, public) in {
        "grid/basic": ((4, 49), (7, 7), torch.float32, False, True),
        "grid/batched": ((2, 3, 5, 16), (4, 4), torch.float32, False, False),
        "grid/nonsquare_float64": ((3, 15), (3, 5), torch.float64, False, False),
        "grid/one_region": ((2, 6, 1), (1, 1), torch.float32, False, False),
        "grid/grad": ((2, 12), (3, 4), torch.float32, True, False),
    }.items():
        w = _attention(*shape, g=g, dtype=dtype)
        out.append(CaseSpec(
            name=name, target="attention_to_grid", args=["weights"], const_args=[list(gs)], inputs={"weights": w},
            outputs=["grid"], grad_wrt=["weights"] if grad else [], public=public,
            variants=_grid_variants(gs),
            hint="grid[..., i, j] = weights[..., i * W + j] (row-major), leading dims unchanged."))

    # upsample_attention(grid, image_size)
    for name, (shape, size, dtype, kind, grad, public) in {
        "upsample/basic": ((7, 7), (28, 28), torch.float32, "random", False, True),
        "upsample/batched": ((2, 3, 4, 4), (12, 16), torch.float32, "random", False, False),
        "upsample/nonsquare_float64": ((3, 5), (9, 20), torch.float64, "random", False, False),
        "upsample/one_region": ((4, 1, 1), (6, 6), torch.float32, "random", False, False),
        "upsample/all_zero": ((2, 3, 3), (6, 6), torch.float32, "zero_first", False, False),
        "upsample/grad": ((2, 3, 3), (8, 8), torch.float32, "random", True, False),
    }.items():
        if kind == "zero_first":  # the first map is all zeros, the second a normal one
            grid = torch.stack([torch.zeros(3, 3), _attention(9, g=g).reshape(3, 3)])
        else:
            h, w = shape[-2:]
            grid = _attention(*shape[:-2], h * w, g=g, dtype=dtype).reshape(shape)
        out.append(CaseSpec(
            name=name, target="upsample_attention", args=["grid"], const_args=[list(size)], inputs={"grid": grid},
            outputs=["heat"], grad_wrt=["grid"] if grad else [], public=public,
            variants=_upsample_variants(len(shape) > 2, kind == "zero_first"),
            hint="F.interpolate(mode='bilinear', align_corners=False) on (N, 1, H, W), then each map / its own max."))

    # collect_attention(layers, layer=-1, head=None): layers stacked as (L, B, heads, T, S)
    for name, (shape, layer, head, dtype, grad, public) in {
        "collect/mean_heads": ((3, 2, 2, 4, 5), -1, None, torch.float32, False, True),
        "collect/one_head": ((2, 3, 3, 4, 4), -1, 1, torch.float32, False, True),
        "collect/first_layer": ((3, 2, 2, 3, 3), 0, None, torch.float32, False, False),
        "collect/float64_cross": ((2, 4, 4, 3, 9), -2, 2, torch.float64, False, False),
        "collect/grad": ((2, 2, 4, 3, 6), 1, None, torch.float32, True, False),
    }.items():
        layers = _attention(*shape, g=g, dtype=dtype)
        out.append(CaseSpec(
            name=name, target="collect_attention", args=["layers"], const_kwargs={"layer": layer, "head": head},
            inputs={"layers": layers}, outputs=["weights"], grad_wrt=["layers"] if grad else [], public=public,
            variants=_collect_variants(head, layer),
            properties=[["rows_sum_to_one", "weights"]],
            hint="layers[layer] is (B, heads, T, S): mean over dim 1 (head=None) or [:, head]."))

    # localisation_accuracy(cross, target_cells, grid_shape, radius=0)
    def near(cross, gs, frac_hit, frac_near, g):
        """Targets: some at the argmax, some one cell away (if possible), the rest random."""
        H, W = gs
        peak = cross.argmax(-1).flatten()
        tgt = torch.randint(0, H * W, peak.shape, generator=g)
        u = torch.rand(peak.shape, generator=g)
        r, c = peak // W, peak % W
        dr = torch.randint(-1, 2, peak.shape, generator=g)
        dc = torch.where(dr == 0, torch.ones_like(dr), torch.randint(-1, 2, peak.shape, generator=g))
        nr, nc = (r + dr).clamp(0, H - 1), (c + dc).clamp(0, W - 1)
        tgt = torch.where(u < frac_hit, peak, torch.where(u < frac_hit + frac_near, nr * W + nc, tgt))
        return tgt.reshape(cross.shape[:-1])

    for name, (shape, gs, radius, dtype, public) in {
        "locacc/basic": ((20, 49), (7, 7), 0, torch.float32, True),
        "locacc/radius1": ((32, 49), (7, 7), 1, torch.float32, True),
        "locacc/nonsquare": ((40, 15), (3, 5), 1, torch.float32, False),
        "locacc/batched_float64": ((3, 8, 16), (4, 4), 0, torch.float64, False),
        "locacc/large_radius": ((10, 12), (3, 4), 5, torch.float32, False),
    }.items():
        cross = _attention(*shape, g=g, dtype=dtype)
        target = near(cross, gs, 0.4, 0.3, g)
        out.append(CaseSpec(
            name=name, target="localisation_accuracy", args=["cross", "target_cells"],
            const_args=[list(gs)], const_kwargs={"radius": radius},
            inputs={"cross": cross, "target_cells": target}, outputs=["accuracy"], public=public,
            variants=_locacc_variants(radius, gs[0] == gs[1]),
            hint="hit: |peak // W - target // W| <= radius and |peak % W - target % W| <= radius; return hits / words."))

    # chance_accuracy(target_cells, grid_shape, radius=0)
    for name, (cells, gs, radius, public) in {
        "chance/radius1": ([8, 10, 24, 40, 0, 6, 3, 48], (7, 7), 1, True),
        "chance/radius0": ([1, 5, 7], (7, 7), 0, False),
        "chance/corners_nonsquare": ([0, 4, 10, 14, 7, 2], (3, 5), 1, False),
        "chance/large_radius": ([0, 5, 11], (3, 4), 6, False),
    }.items():
        target = torch.tensor(cells)
        out.append(CaseSpec(
            name=name, target="chance_accuracy", args=["target_cells"], const_args=[list(gs)],
            const_kwargs={"radius": radius}, inputs={"target_cells": target}, outputs=["chance"], public=public,
            variants=_chance_variants(radius, gs[0] == gs[1]),
            hint="mean over targets of (cells of the grid within radius of the target, clipped at the border) / (H*W)."))

    # errors: attention_to_grid refuses a grid of the wrong size
    for name, (shape, gs, public) in {
        "grid/mismatch": ((3, 49), (6, 8), True),
        "grid/mismatch_small": ((2, 12), (5, 3), False),
    }.items():
        out.append(CaseSpec(
            name=name, target="attention_to_grid", args=["weights"], const_args=[list(gs)],
            inputs={"weights": _attention(*shape, g=g)}, outputs=["grid"], public=public,
            properties=[["raises", "ValueError", f"when {shape[-1]} regions don't fill a {gs[0]} x {gs[1]} grid"]]))
    return out
