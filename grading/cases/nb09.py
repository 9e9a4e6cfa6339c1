"""Reference cases of notebook 09 (visualising attention).

The graded tools of notebook 09 are checked on stored inputs only, never on a trained model, so a bug
in a student's notebooks 04-08 costs no points here. Public cases (public=True) are what students see;
hidden ones use batch dimensions, non-square grids, float64, a single region (fc7 features), an
all-zero map, large radii and gradients. Variants are known bugs, written here independently of the
solution, that the check names.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grading.references import CaseSpec, Row, deviation

# ---- known bugs -----------------------------------------------------------------------------------

def _grid_variants(grid_shape) -> dict:
    H, W = grid_shape

    def column_major(weights, gs):  # fill the grid column by column
        return weights.unflatten(-1, (gs[1], gs[0])).transpose(-1, -2)

    variants = {
        "column_major": ("the grid is filled column by column: regions are flattened row by row, so the first W "
                         "regions are the top row and region r is cell (r // W, r % W).",
                         lambda ns: column_major),
    }
    if H == W:
        variants["transposed"] = ("the grid is transposed (rows and columns swapped): region r is cell "
                                  "(row r // W, column r % W).",
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
    variants = {
        "align_corners": ("looks like the corner convention (align_corners=True), which stretches the map by about "
                          "a cell: each cell's value sits at the centre of its block of pixels.",
                          deviation(_up, align_corners=True)),
        "nearest": ("nearest-neighbour (blocky) upsampling: a pixel between two cell centres is a linear blend of "
                    "their values.",
                    deviation(_up, mode="nearest")),
        "bicubic": ("bicubic upsampling: the spec asks for bilinear, a pixel between two cell centres a linear blend "
                    "of those two.", deviation(_up, mode="bicubic")),
        "unnormalised": ("the upsampling looks right but the maps are not normalised: divide each map by its "
                         "own maximum so that its peak is 1.", deviation(_up, norm="none")),
        "sum": ("each map normalised to sum 1: divide by its maximum instead, so that its peak is 1.",
                deviation(_up, norm="sum")),
        "minmax": ("min-max normalised: only divide by the maximum (don't subtract the minimum), so zero "
                   "attention stays 0.", deviation(_up, norm="minmax")),
        "grid_max": ("divided by the maximum of the grid before upsampling: divide by the maximum of each "
                     "upsampled map, so that its peak is exactly 1.", deviation(_up, norm="grid_max")),
    }
    if zero:
        variants["no_clamp"] = ("an all-zero map became NaN (0 / 0): an all-zero map stays zero.", deviation(_up, norm="no_clamp"))
    if batched:
        variants["global"] = ("one maximum for the whole batch: every (height, width) map is scaled by its own "
                              "maximum.", deviation(_up, norm="global"))
    return variants


def _rollout(self_layers, cross_layers, residual=0.5, bug=None):
    """Attention rollout to the regions, written out position by position; `bug` a known mistake."""
    self_layers, cross_layers = list(self_layers), list(cross_layers)
    if bug == "reversed":
        self_layers, cross_layers = self_layers[::-1], cross_layers[::-1]
    if bug == "last_only":
        self_layers, cross_layers = self_layers[-1:], cross_layers[-1:]
    B, _, T, R = cross_layers[0].shape
    shares = cross_layers[0].new_zeros(B, T, R)
    for s, c in zip(self_layers, cross_layers):
        s_bar = s[:, 0] if bug == "first_head" else s.sum(1) if bug == "head_sum" else s.mean(1)
        c_bar = c[:, 0] if bug == "first_head" else c.sum(1) if bug == "head_sum" else c.mean(1)
        eye = torch.eye(T, dtype=s.dtype)
        mix = {"no_carry": eye, "no_self_residual": s_bar, "transposed": residual * eye + (1 - residual) * s_bar.transpose(-1, -2)
               }.get(bug, residual * eye + (1 - residual) * s_bar)
        if bug == "cross_first":
            shares = mix @ (residual * shares + (1 - residual) * c_bar)
        elif bug == "no_cross_residual":
            shares = mix @ shares + (1 - residual) * c_bar
        else:
            shares = residual * (mix @ shares) + (1 - residual) * c_bar
    if bug == "normalised":
        shares = shares / shares.sum(-1, keepdim=True)
    return shares


def _rollout_variants(layers: int, heads: int, positions: int, residual: float) -> dict:
    out = {
        "normalised": ("the rows sum to 1: return the shares themselves, not normalised; a row sums to the image's "
                       "share of that position, less than 1, since every sublayer keeps a share `residual` of what the "
                       "position held.", deviation(_rollout, bug="normalised")),
    }
    if heads > 1:
        out["first_head"] = ("took head 0 of each layer: every sublayer mixes in the proportions of its weights "
                             "averaged over the heads.", deviation(_rollout, bug="first_head"))
        out["head_sum"] = ("summed the heads: average them, so that each row of weights still sums to 1.",
                           deviation(_rollout, bug="head_sum"))
    if residual > 0 and layers > 1:  # (with one layer it is the normalised rows above, whose message covers it)
        out["no_cross_residual"] = ("the cross-attention sublayer kept the whole earlier mixture: it keeps a share "
                                    "`residual` of it and takes 1 - residual from the regions.",
                                    deviation(_rollout, bug="no_cross_residual"))
    if residual > 0 and positions > 1:  # (one position: self-attention mixes nothing, its bugs change nothing)
        out["no_self_residual"] = ("the self-attention sublayer mixed by the weights alone: a position keeps a share "
                                   "`residual` of what it held (the residual path).",
                                   deviation(_rollout, bug="no_self_residual"))
    if layers > 1 and positions > 1:
        out.update({
            "no_carry": ("what the earlier positions read from the image is not passed on by self-attention: "
                         "self-attention brings in the whole mixture each position it reads holds.",
                         deviation(_rollout, bug="no_carry")),
            "transposed": ("self-attention passed the mixtures in the wrong direction: row t of the weights says "
                           "what position t reads, from positions s <= t.", deviation(_rollout, bug="transposed")),
            "cross_first": ("cross-attention before self-attention: in each decoder layer self-attention comes first.",
                            deviation(_rollout, bug="cross_first")),
        })
    if layers > 1:
        out.update({
            "reversed": ("the layers were taken last first: layer 0 is the first the words pass through.",
                         deviation(_rollout, bug="reversed")),
            "last_only": ("only the last layer counts: every layer reads the image, and the rollout follows all of them.",
                          deviation(_rollout, bug="last_only")),
        })
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
    out = {
        "miss": ("returned the fraction of misses: return hits / words.", deviation(_locacc, bug="miss")),
        "count": ("returned the number of hits: divide by the number of words (take the mean).",
                  deviation(_locacc, bug="count")),
    }
    if radius > 0:
        out["flat"] = ("compared flat indices (|peak - target| <= radius): the radius applies to rows and to "
                       "columns of the grid, each on its own.", deviation(_locacc, bug="flat"))
        out["manhattan"] = ("used |dr| + |dc| <= radius: a hit needs |dr| <= radius AND |dc| <= radius "
                            "(a (2 radius + 1)^2 block).", deviation(_locacc, bug="manhattan"))
    if not square:
        out["height"] = ("converted flat indices with the grid height: row = idx // W and col = idx % W, "
                         "with W = grid_shape[1] the width.", deviation(_locacc, bug="height"))
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
    out = {
        "count": ("returned the number of cells near the target: divide by the number of cells H * W.",
                  deviation(_chance, bug="count")),
    }
    if radius > 0:
        out["uniform"] = ("returned 1/R: with radius > 0 a random peak hits any of the cells within the radius.",
                          deviation(_chance, bug="uniform"))
        out["unclipped"] = ("used (2 radius + 1)^2 / R for every target: near the border part of that block "
                            "falls off the grid; count only the cells inside it.", deviation(_chance, bug="unclipped"))
    if not square:
        out["height"] = ("converted flat indices with the grid height: row = idx // W, col = idx % W.",
                         deviation(_chance, bug="height"))
    return out


# ---- cases ----------------------------------------------------------------------------------------

def _attention(*shape, g, dtype=torch.float32, sharp=2.0):
    """Random attention weights (rows sum to 1) with distinct values, so argmax has no ties."""
    scores = torch.randn(*shape, generator=g, dtype=torch.float64) * sharp
    return torch.softmax(scores, dim=-1).to(dtype)


def _near(cross, gs, frac_hit, frac_near, g):
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


@dataclass(frozen=True, kw_only=True)
class GridCase(Row):
    """attention_to_grid(weights of `shape`, grid_shape); weights whose regions don't fill the grid are a case of
    bad input (a ValueError)."""
    shape: tuple[int, ...]  # of weights (..., R)
    grid_shape: tuple[int, int]  # (H, W)
    dtype: torch.dtype = torch.float32
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class UpsampleCase(Row):
    """upsample_attention(grid of `shape`, image_size)."""
    shape: tuple[int, ...]  # of grid (..., H, W)
    size: tuple[int, int]  # image_size
    dtype: torch.dtype = torch.float32
    zero_first: bool = False  # the first of two 3 x 3 maps is all zeros
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class RolloutCase(Row):
    """rollout_to_regions(self_layers, cross_layers, residual): L layers, batch B, heads, T positions, R regions."""
    layers: int
    batch: int
    heads: int
    positions: int
    regions: int
    residual: float = 0.5
    dtype: torch.dtype = torch.float32
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class LocaccCase(Row):
    """localisation_accuracy(cross of `shape`, target_cells, grid_shape, radius)."""
    shape: tuple[int, ...]
    grid_shape: tuple[int, int]
    radius: int = 0
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True, kw_only=True)
class ChanceCase(Row):
    """chance_accuracy(target_cells, grid_shape, radius)."""
    cells: list[int]
    grid_shape: tuple[int, int]
    radius: int = 0


def _grid_spec(c: GridCase, g: torch.Generator) -> CaseSpec:
    H, W = c.grid_shape
    mismatch = c.shape[-1] != H * W  # a case of bad input: the function must raise, nothing is compared
    raises = ["raises", "ValueError", f"when {c.shape[-1]} regions don't fill a {H} x {W} grid"]
    return CaseSpec(
        name=c.name, target="attention_to_grid", args=["weights"], const_args=[list(c.grid_shape)],
        inputs={"weights": _attention(*c.shape, g=g, dtype=c.dtype)}, outputs=["grid"],
        grad_wrt=["weights"] if c.grad else [], public=c.public,
        variants={} if mismatch else _grid_variants(c.grid_shape), properties=[raises] if mismatch else [],
        hint="" if mismatch else "the regions in the order the grid was flattened, row after row (the first W regions are the top row), leading dims unchanged.")


def _upsample_spec(c: UpsampleCase, g: torch.Generator) -> CaseSpec:
    if c.zero_first:  # the first map is all zeros, the second a normal one
        grid = torch.stack([torch.zeros(3, 3), _attention(9, g=g).reshape(3, 3)])
    else:
        h, w = c.shape[-2:]
        grid = _attention(*c.shape[:-2], h * w, g=g, dtype=c.dtype).reshape(c.shape)
    return CaseSpec(
        name=c.name, target="upsample_attention", args=["grid"], const_args=[list(c.size)], inputs={"grid": grid},
        outputs=["heat"], grad_wrt=["grid"] if c.grad else [], public=c.public,
        variants=_upsample_variants(len(c.shape) > 2, c.zero_first),
        hint="each map resized to `size` by bilinear interpolation (corners not aligned), then scaled so that its own largest value is 1.")


def _causal_attention(*shape, g, dtype):
    """Random causal self-attention weights (..., T, T): row t spreads over positions 0..t."""
    T = shape[-1]
    scores = torch.randn(*shape, generator=g, dtype=torch.float64) * 2.0
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1).to(dtype)


def _rollout_spec(c: RolloutCase, g: torch.Generator) -> CaseSpec:
    L, B, Hh, T, R = c.layers, c.batch, c.heads, c.positions, c.regions
    return CaseSpec(
        name=c.name, target="rollout_to_regions", args=["self_layers", "cross_layers"],
        const_kwargs={"residual": c.residual},
        inputs={"self_layers": _causal_attention(L, B, Hh, T, T, g=g, dtype=c.dtype),
                "cross_layers": _attention(L, B, Hh, T, R, g=g, dtype=c.dtype)},
        outputs=["shares"], grad_wrt=["self_layers", "cross_layers"] if c.grad else [], public=c.public,
        variants=_rollout_variants(L, Hh, T, c.residual),
        hint="for each position, the share of its state after the last layer that came from each region, following "
             "the mixtures through every layer's self-attention (residual share kept) and cross-attention.")


def _locacc_spec(c: LocaccCase, g: torch.Generator) -> CaseSpec:
    cross = _attention(*c.shape, g=g, dtype=c.dtype)
    target = _near(cross, c.grid_shape, 0.4, 0.3, g)
    return CaseSpec(
        name=c.name, target="localisation_accuracy", args=["cross", "target_cells"],
        const_args=[list(c.grid_shape)], const_kwargs={"radius": c.radius},
        inputs={"cross": cross, "target_cells": target}, outputs=["accuracy"], public=c.public,
        variants=_locacc_variants(c.radius, c.grid_shape[0] == c.grid_shape[1]),
        hint="a word is a hit when the region its attention peaks on is within `radius` rows and columns of its target region; the accuracy is the share of words that hit.")


def _chance_spec(c: ChanceCase) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="chance_accuracy", args=["target_cells"], const_args=[list(c.grid_shape)],
        const_kwargs={"radius": c.radius}, inputs={"target_cells": torch.tensor(c.cells)}, outputs=["chance"],
        public=c.public, variants=_chance_variants(c.radius, c.grid_shape[0] == c.grid_shape[1]),
        hint="the chance that a peak drawn uniformly over the grid hits: the share of the grid's cells within `radius` of each target (none outside the grid), averaged over the targets.")


def cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(5005)
    out = []
    # attention_to_grid(weights, grid_shape)
    out += [_grid_spec(c, g) for c in [
        GridCase(name="grid/basic", shape=(4, 49), grid_shape=(7, 7), public=True),
        GridCase(name="grid/batched", shape=(2, 3, 5, 16), grid_shape=(4, 4)),
        GridCase(name="grid/nonsquare_float64", shape=(3, 15), grid_shape=(3, 5), dtype=torch.float64),
        GridCase(name="grid/one_region", shape=(2, 6, 1), grid_shape=(1, 1)),
        GridCase(name="grid/grad", shape=(2, 12), grid_shape=(3, 4), grad=True),
    ]]
    # upsample_attention(grid, image_size)
    out += [_upsample_spec(c, g) for c in [
        UpsampleCase(name="upsample/basic", shape=(7, 7), size=(28, 28), public=True),
        UpsampleCase(name="upsample/batched", shape=(2, 3, 4, 4), size=(12, 16)),
        UpsampleCase(name="upsample/nonsquare_float64", shape=(3, 5), size=(9, 20), dtype=torch.float64),
        UpsampleCase(name="upsample/one_region", shape=(4, 1, 1), size=(6, 6)),
        UpsampleCase(name="upsample/all_zero", shape=(2, 3, 3), size=(6, 6), zero_first=True),
        UpsampleCase(name="upsample/grad", shape=(2, 3, 3), size=(8, 8), grad=True),
    ]]
    # localisation_accuracy(cross, target_cells, grid_shape, radius=0)
    out += [_locacc_spec(c, g) for c in [
        LocaccCase(name="locacc/basic", shape=(20, 49), grid_shape=(7, 7), public=True),
        LocaccCase(name="locacc/radius1", shape=(32, 49), grid_shape=(7, 7), radius=1, public=True),
        LocaccCase(name="locacc/nonsquare", shape=(40, 15), grid_shape=(3, 5), radius=1),
        LocaccCase(name="locacc/batched_float64", shape=(3, 8, 16), grid_shape=(4, 4), dtype=torch.float64),
        LocaccCase(name="locacc/large_radius", shape=(10, 12), grid_shape=(3, 4), radius=5),
    ]]
    # chance_accuracy(target_cells, grid_shape, radius=0)
    out += [_chance_spec(c) for c in [
        ChanceCase(name="chance/radius1", cells=[8, 10, 24, 40, 0, 6, 3, 48], grid_shape=(7, 7), radius=1, public=True),
        ChanceCase(name="chance/radius0", cells=[1, 5, 7], grid_shape=(7, 7)),
        ChanceCase(name="chance/corners_nonsquare", cells=[0, 4, 10, 14, 7, 2], grid_shape=(3, 5), radius=1),
        ChanceCase(name="chance/large_radius", cells=[0, 5, 11], grid_shape=(3, 4), radius=6),
    ]]
    # errors: attention_to_grid refuses a grid of the wrong size
    out += [_grid_spec(c, g) for c in [
        GridCase(name="grid/mismatch", shape=(3, 49), grid_shape=(6, 8), public=True),
        GridCase(name="grid/mismatch_small", shape=(2, 12), grid_shape=(5, 3)),
    ]]
    # rollout_to_regions(self_layers, cross_layers, residual=0.5): layers stacked as (L, B, heads, T, S)
    out += [_rollout_spec(c, g) for c in [
        RolloutCase(name="rollout/basic", layers=2, batch=2, heads=4, positions=5, regions=9, public=True),
        RolloutCase(name="rollout/one_layer", layers=1, batch=1, heads=2, positions=4, regions=6, public=True),
        RolloutCase(name="rollout/three_layers_float64", layers=3, batch=2, heads=3, positions=6, regions=12,
                    residual=0.3, dtype=torch.float64),
        RolloutCase(name="rollout/one_head", layers=2, batch=3, heads=1, positions=4, regions=4, residual=0.7),
        RolloutCase(name="rollout/one_position", layers=3, batch=2, heads=2, positions=1, regions=5),
        RolloutCase(name="rollout/no_residual", layers=2, batch=1, heads=2, positions=5, regions=6, residual=0.0),
        RolloutCase(name="rollout/batched_grid", layers=4, batch=3, heads=4, positions=8, regions=49),
        RolloutCase(name="rollout/grad", layers=2, batch=2, heads=2, positions=4, regions=6, grad=True),
    ]]
    return out
