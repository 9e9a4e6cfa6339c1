"""Reference cases of notebook 01 (scaled dot-product attention).

Public cases (public=True) are what students see in the test cells; hidden ones vary shapes, batch
dims, masks and dtypes, and check gradients. Variants are known bugs the check names when a
student's output matches them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grading.references import CaseSpec, Row, causal, deviation, randn, with_forward
from starter.compare import MATRIX_PRODUCTS, READY_MADE_SOFTMAX

FORBID = ["torch.nn.functional.scaled_dot_product_attention"]  # the task is to write it
# Task 1 is written with loops and its softmax written out, as its text says: no ready-made softmax, and no
# matrix product of whole matrices (a dot product of two vectors is allowed). Rules, not names: the check
# watches every torch operation while the case runs, so an alias (`_mm = torch.matmul`) does not escape them.
FORBID_LOOP = FORBID + [READY_MADE_SOFTMAX, MATRIX_PRODUCTS]

# ---- known bugs, written independently of the solution -------------------------------------------

def _attend(q, k, v, mask=None, scale=None, softmax_dim=-1, mask_after=False, fill=float("-inf"),
            invert_mask=False):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None and invert_mask:
        mask = ~mask
    if mask is not None and not mask_after:
        scores = scores.masked_fill(~mask, fill)
    w = torch.softmax(scores, dim=softmax_dim)
    if mask is not None and mask_after:
        w = w.masked_fill(~mask, 0.0)
    return w @ v, w


def _sdpa_variants(masked: bool) -> dict:
    v = {
        "no_scale": ("looks unscaled: divide the scores by sqrt(d_k) (d_k = q.shape[-1]).",
                     deviation(_attend, scale=1.0)),
        "scale_dk": ("scores divided by d_k instead of sqrt(d_k).",
                     lambda ns: lambda q, k, val, mask=None: _attend(q, k, val, mask, scale=1 / q.shape[-1])),
        "softmax_queries": ("softmax taken over the queries (dim=-2); it must be over the keys (dim=-1).",
                            deviation(_attend, softmax_dim=-2)),
    }
    if masked:
        v.update({
            "mask_after": ("mask applied after the softmax: fill masked scores with -inf *before* the softmax, "
                           "so each row still sums to 1.",
                           deviation(_attend, mask_after=True)),
            "fill_zero": ("masked scores set to 0 instead of -inf: exp(0) = 1 still gives them weight.",
                          deviation(_attend, fill=0.0)),
            "inverted": ("mask convention inverted: True means the key MAY be attended to; block where mask is False.",
                         deviation(_attend, invert_mask=True)),
        })
    return v


def _loop_variants() -> dict:
    return {
        "no_scale": ("looks unscaled: each score q·k is divided by the square root of the key dimension.",
                     deviation(_attend, scale=1.0)),
        "softmax_queries": ("weights normalised over the queries; each query's weights over the keys must sum to 1.",
                            deviation(_attend, softmax_dim=-2)),
    }


def _causal_variants() -> dict:
    return {
        "no_diagonal": ("off by one: position t must be allowed to attend to itself (keep the diagonal True).",
                        lambda ns: lambda T: torch.ones(T, T, dtype=torch.bool).tril(-1)),
        "upper": ("inverted: True must mark allowed positions (the past and present, lower triangle), "
                  "not the future.",
                  lambda ns: lambda T: torch.ones(T, T, dtype=torch.bool).triu(1)),
        "upper_diag": ("transposed: row t is the query, column s the key; allow s <= t (lower triangle).",
                       lambda ns: lambda T: torch.ones(T, T, dtype=torch.bool).triu(0)),
    }


def _self_attention_variants() -> dict:
    def subclass(ns, forward):
        return with_forward(ns, "SelfAttention", forward)

    def no_scale(self, x, mask=None):
        return _attend(self.query(x), self.key(x), self.value(x), mask, scale=1.0)

    def no_value(self, x, mask=None):
        q, k = self.query(x), self.key(x)
        return _attend(q, k, x[..., : q.shape[-1]], mask)

    def swapped(self, x, mask=None):
        return _attend(self.key(x), self.query(x), self.value(x), mask)

    return {
        "no_scale": ("scores not divided by sqrt(head_dim).", lambda ns: subclass(ns, no_scale)),
        "swapped": ("query and key projections swapped: the queries come from self.query, the keys from self.key.",
                    lambda ns: subclass(ns, swapped)),
    }


# ---- cases ----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LoopCase(Row):
    """attention_loop(query (M, D), keys (N, D), values (N, Dv))."""
    queries: int  # M
    keys: int  # N
    dim: int  # D
    value_dim: int  # Dv
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True, kw_only=True)
class SdpaCase(Row):
    """scaled_dot_product_attention(q, k, v, mask=None) on inputs of these shapes."""
    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    mask: torch.Tensor | None = None  # True = may attend; every query keeps >= 1 key
    dtype: torch.dtype = torch.float32
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class CausalCase(Row):
    """causal_mask(T)."""
    length: int  # T


@dataclass(frozen=True, kw_only=True)
class SelfAttentionCase(Row):
    """SelfAttention(embed_dim, head_dim).forward(x, mask=None)."""
    shape: tuple[int, ...]  # of x
    embed_dim: int
    head_dim: int
    mask: torch.Tensor | None = None
    grad: bool = False


def _padding(b, tq, tk, g):
    """(b, tq, tk) masks of keys with random lengths (True = a real key), at least one real padding."""
    lengths = torch.randint(1, tk + 1, (b,), generator=g)
    lengths[0] = tk - 1 if tk > 1 else 1
    return (torch.arange(tk)[None, :] < lengths[:, None])[:, None, :].expand(b, tq, tk).clone()


ATTN_PROPS = [["rows_sum_to_one", "weights"]]


def _loop_spec(c: LoopCase, g: torch.Generator) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="attention_loop", args=["query", "keys", "values"], outputs=["output", "weights"],
        inputs={"query": randn(c.queries, c.dim, g=g, dtype=c.dtype), "keys": randn(c.keys, c.dim, g=g, dtype=c.dtype),
                "values": randn(c.keys, c.value_dim, g=g, dtype=c.dtype)},
        variants=_loop_variants(), properties=list(ATTN_PROPS), public=c.public, forbid=FORBID_LOOP)


def _sdpa_spec(c: SdpaCase, g: torch.Generator) -> CaseSpec:
    inputs = {"q": randn(*c.q, g=g, dtype=c.dtype), "k": randn(*c.k, g=g, dtype=c.dtype),
              "v": randn(*c.v, g=g, dtype=c.dtype)}
    kwargs, props = {}, list(ATTN_PROPS)
    if c.mask is not None:
        inputs["mask"], kwargs["mask"] = c.mask, "mask"
        props.append(["zero_where_masked", "weights", "mask"])
    return CaseSpec(
        name=c.name, target="scaled_dot_product_attention", args=["q", "k", "v"], kwargs=kwargs,
        outputs=["output", "weights"], inputs=inputs, grad_wrt=["q", "k", "v"] if c.grad else [],
        variants=_sdpa_variants(c.mask is not None), properties=props, public=c.public, forbid=FORBID)


def _causal_spec(c: CausalCase) -> CaseSpec:
    return CaseSpec(name=c.name, target="causal_mask", args=[], const_args=[c.length], inputs={}, outputs=["mask"],
                    variants=_causal_variants() if c.length > 1 else {}, public=c.public,
                    hint="mask[t, s] must be True exactly when s <= t.")


def _self_attention_spec(c: SelfAttentionCase, g: torch.Generator) -> CaseSpec:
    inputs = {"x": randn(*c.shape, g=g)}
    kwargs, props = {}, list(ATTN_PROPS)
    if c.mask is not None:
        inputs["mask"], kwargs["mask"] = c.mask, "mask"
        props.append(["zero_where_masked", "weights", "mask"])
    return CaseSpec(
        name=c.name, target="SelfAttention", kind="module", init={"embed_dim": c.embed_dim, "head_dim": c.head_dim},
        args=["x"], kwargs=kwargs, outputs=["output", "weights"], inputs=inputs,
        grad_wrt=["x", "query.weight", "key.weight", "value.weight"] if c.grad else [],
        variants=_self_attention_variants(), properties=props, public=c.public, forbid=FORBID)


def cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(2024)
    out = []
    # attention_loop: one set of queries (M, D) against keys (N, D) and values (N, Dv)
    out += [_loop_spec(c, g) for c in [
        LoopCase(name="loop/basic", queries=3, keys=4, dim=5, value_dim=5, public=True),
        LoopCase(name="loop/rectangular", queries=2, keys=6, dim=3, value_dim=7),
        LoopCase(name="loop/float64", queries=4, keys=3, dim=8, value_dim=2, dtype=torch.float64),
    ]]
    # scaled_dot_product_attention, unmasked
    out += [_sdpa_spec(c, g) for c in [
        SdpaCase(name="sdpa/basic", q=(2, 4, 8), k=(2, 4, 8), v=(2, 4, 8), public=True),
        SdpaCase(name="sdpa/4d", q=(2, 3, 5, 4), k=(2, 3, 6, 4), v=(2, 3, 6, 7)),
        SdpaCase(name="sdpa/unbatched", q=(5, 16), k=(7, 16), v=(7, 3)),
        SdpaCase(name="sdpa/float64", q=(3, 4, 6), k=(3, 5, 6), v=(3, 5, 6), dtype=torch.float64),
        SdpaCase(name="sdpa/grad", q=(2, 4, 8), k=(2, 6, 8), v=(2, 6, 5), grad=True),
    ]]
    # scaled_dot_product_attention with masks (True = may attend); every query keeps >= 1 key
    out += [_sdpa_spec(c, g) for c in [
        SdpaCase(name="sdpa/masked", q=(2, 5, 4), k=(2, 5, 4), v=(2, 5, 4), mask=causal(5), public=True),
        SdpaCase(name="sdpa/masked_padding", q=(3, 4, 8), k=(3, 6, 8), v=(3, 6, 2), mask=_padding(3, 4, 6, g)),
        SdpaCase(name="sdpa/masked_4d", q=(2, 2, 6, 4), k=(2, 2, 6, 4), v=(2, 2, 6, 4), mask=causal(6)),
        SdpaCase(name="sdpa/masked_grad", q=(2, 5, 4), k=(2, 5, 4), v=(2, 5, 3), mask=causal(5), grad=True),
    ]]
    # causal_mask(T)
    out += [_causal_spec(c) for c in [
        CausalCase(name="causal/5", length=5, public=True),
        CausalCase(name="causal/1", length=1),
        CausalCase(name="causal/17", length=17),
    ]]
    # SelfAttention(embed_dim, head_dim).forward(x, mask=None)
    out += [_self_attention_spec(c, g) for c in [
        SelfAttentionCase(name="selfattn/basic", shape=(2, 5, 8), embed_dim=8, head_dim=4, public=True),
        SelfAttentionCase(name="selfattn/causal", shape=(3, 6, 8), embed_dim=8, head_dim=8, mask=causal(6)),
        SelfAttentionCase(name="selfattn/unbatched", shape=(4, 6), embed_dim=6, head_dim=3),
        SelfAttentionCase(name="selfattn/grad", shape=(2, 4, 6), embed_dim=6, head_dim=5, mask=causal(4), grad=True),
    ]]
    # The documented mask shapes no case above has; drawn after them so that their inputs stay as they were.
    keys_kept = torch.arange(6)[None, None, :] < torch.tensor([6, 4, 2])[:, None, None]  # (B, 1, T_k): per key
    out.append(_sdpa_spec(SdpaCase(name="sdpa/mask_per_key", q=(3, 4, 8), k=(3, 6, 8), v=(3, 6, 5),
                                   mask=keys_kept), g))
    per_sequence = causal(5) & (torch.rand(2, 5, 5, generator=g) < 0.7) | torch.eye(5, dtype=torch.bool)  # (B, T, T)
    out.append(_self_attention_spec(SelfAttentionCase(name="selfattn/mask_per_sequence", shape=(2, 5, 8), embed_dim=8,
                                                      head_dim=4, mask=per_sequence), g))
    return out
