"""Reference cases of notebook 01 (scaled dot-product attention).

Public cases (public=True) are what students see in the test cells; hidden ones vary shapes, batch
dims, masks and dtypes, and check gradients. Variants are known bugs the check names when a
student's output matches them.
"""
from __future__ import annotations

import math

import torch

from grading.references import CaseSpec, randn

FORBID = ["torch.nn.functional.scaled_dot_product_attention"]  # the task is to write it

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
                     lambda ns: lambda q, k, val, mask=None: _attend(q, k, val, mask, scale=1.0)),
        "scale_dk": ("scores divided by d_k instead of sqrt(d_k).",
                     lambda ns: lambda q, k, val, mask=None: _attend(q, k, val, mask, scale=1 / q.shape[-1])),
        "softmax_queries": ("softmax taken over the queries (dim=-2); it must be over the keys (dim=-1).",
                            lambda ns: lambda q, k, val, mask=None: _attend(q, k, val, mask, softmax_dim=-2)),
    }
    if masked:
        v.update({
            "mask_after": ("mask applied after the softmax: fill masked scores with -inf *before* the softmax, "
                           "so each row still sums to 1.",
                           lambda ns: lambda q, k, val, mask=None: _attend(q, k, val, mask, mask_after=True)),
            "fill_zero": ("masked scores set to 0 instead of -inf: exp(0) = 1 still gives them weight.",
                          lambda ns: lambda q, k, val, mask=None: _attend(q, k, val, mask, fill=0.0)),
            "inverted": ("mask convention inverted: True means the key MAY be attended to; block where mask is False.",
                         lambda ns: lambda q, k, val, mask=None: _attend(q, k, val, mask, invert_mask=True)),
        })
    return v


def _loop_variants() -> dict:
    return {
        "no_scale": ("looks unscaled: divide each score q·k by sqrt(D).",
                     lambda ns: lambda q, k, v: _attend(q, k, v, scale=1.0)),
        "softmax_queries": ("weights normalised over the queries; each query's weights over the keys must sum to 1.",
                            lambda ns: lambda q, k, v: _attend(q, k, v, softmax_dim=-2)),
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
        return type("Buggy", (ns["SelfAttention"],), {"forward": forward})

    def no_scale(self, x, mask=None):
        return _attend(self.query(x), self.key(x), self.value(x), mask, scale=1.0)

    def no_value(self, x, mask=None):
        q, k = self.query(x), self.key(x)
        return _attend(q, k, x[..., : q.shape[-1]], mask)

    def swapped(self, x, mask=None):
        return _attend(self.key(x), self.query(x), self.value(x), mask)

    return {
        "no_scale": ("scores not divided by sqrt(head_dim).", lambda ns: subclass(ns, no_scale)),
        "swapped": ("query and key projections swapped: q = self.query(x), k = self.key(x).",
                    lambda ns: subclass(ns, swapped)),
    }


# ---- cases ----------------------------------------------------------------------------------------


def cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(2024)
    attn_props = [["rows_sum_to_one", "weights"]]
    out = []

    # attention_loop: one set of queries (M, D) against keys (N, D) and values (N, Dv)
    for name, (m, n, d, dv, dtype, public) in {
        "loop/basic": (3, 4, 5, 5, torch.float32, True),
        "loop/rectangular": (2, 6, 3, 7, torch.float32, False),
        "loop/float64": (4, 3, 8, 2, torch.float64, False),
    }.items():
        out.append(CaseSpec(
            name=name, target="attention_loop", args=["query", "keys", "values"], outputs=["output", "weights"],
            inputs={"query": randn(m, d, g=g, dtype=dtype), "keys": randn(n, d, g=g, dtype=dtype),
                    "values": randn(n, dv, g=g, dtype=dtype)},
            variants=_loop_variants(), properties=attn_props, public=public, forbid=FORBID))

    # scaled_dot_product_attention, unmasked
    for name, (qs, ks, vs, dtype, grad, public) in {
        "sdpa/basic": ((2, 4, 8), (2, 4, 8), (2, 4, 8), torch.float32, False, True),
        "sdpa/4d": ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7), torch.float32, False, False),
        "sdpa/unbatched": ((5, 16), (7, 16), (7, 3), torch.float32, False, False),
        "sdpa/float64": ((3, 4, 6), (3, 5, 6), (3, 5, 6), torch.float64, False, False),
        "sdpa/grad": ((2, 4, 8), (2, 6, 8), (2, 6, 5), torch.float32, True, False),
    }.items():
        out.append(CaseSpec(
            name=name, target="scaled_dot_product_attention", args=["q", "k", "v"], outputs=["output", "weights"],
            inputs={"q": randn(*qs, g=g, dtype=dtype), "k": randn(*ks, g=g, dtype=dtype),
                    "v": randn(*vs, g=g, dtype=dtype)},
            grad_wrt=["q", "k", "v"] if grad else [], variants=_sdpa_variants(False), properties=attn_props,
            public=public, forbid=FORBID))

    # scaled_dot_product_attention with masks (True = may attend); every query keeps >= 1 key
    def causal(t):
        return torch.ones(t, t, dtype=torch.bool).tril()

    def padding(b, tq, tk, g):
        lengths = torch.randint(1, tk + 1, (b,), generator=g)
        lengths[0] = tk - 1 if tk > 1 else 1  # at least one real padding
        return (torch.arange(tk)[None, :] < lengths[:, None])[:, None, :].expand(b, tq, tk).clone()

    masked = {
        "sdpa/masked": ((2, 5, 4), (2, 5, 4), (2, 5, 4), causal(5), False, True),
        "sdpa/masked_padding": ((3, 4, 8), (3, 6, 8), (3, 6, 2), padding(3, 4, 6, g), False, False),
        "sdpa/masked_4d": ((2, 2, 6, 4), (2, 2, 6, 4), (2, 2, 6, 4), causal(6), False, False),
        "sdpa/masked_grad": ((2, 5, 4), (2, 5, 4), (2, 5, 3), causal(5), True, False),
    }
    for name, (qs, ks, vs, mask, grad, public) in masked.items():
        out.append(CaseSpec(
            name=name, target="scaled_dot_product_attention", args=["q", "k", "v"], kwargs={"mask": "mask"},
            outputs=["output", "weights"],
            inputs={"q": randn(*qs, g=g), "k": randn(*ks, g=g), "v": randn(*vs, g=g), "mask": mask},
            grad_wrt=["q", "k", "v"] if grad else [], variants=_sdpa_variants(True),
            properties=attn_props + [["zero_where_masked", "weights", "mask"]], public=public, forbid=FORBID))

    # causal_mask(T)
    for name, (t, public) in {"causal/5": (5, True), "causal/1": (1, False), "causal/17": (17, False)}.items():
        variants = _causal_variants() if t > 1 else {}
        out.append(CaseSpec(name=name, target="causal_mask", args=[], const_args=[t], inputs={}, outputs=["mask"],
                            variants=variants, public=public,
                            hint="mask[t, s] must be True exactly when s <= t."))

    # SelfAttention(embed_dim, head_dim).forward(x, mask=None)
    for name, (shape, e, h, mask, grad, public) in {
        "selfattn/basic": ((2, 5, 8), 8, 4, None, False, True),
        "selfattn/causal": ((3, 6, 8), 8, 8, causal(6), False, False),
        "selfattn/unbatched": ((4, 6), 6, 3, None, False, False),
        "selfattn/grad": ((2, 4, 6), 6, 5, causal(4), True, False),
    }.items():
        inputs = {"x": randn(*shape, g=g)}
        kwargs = {}
        props = list(attn_props)
        if mask is not None:
            inputs["mask"] = mask
            kwargs["mask"] = "mask"
            props.append(["zero_where_masked", "weights", "mask"])
        grad_wrt = ["x", "query.weight", "key.weight", "value.weight"] if grad else []
        out.append(CaseSpec(
            name=name, target="SelfAttention", kind="module", init={"embed_dim": e, "head_dim": h},
            args=["x"], kwargs=kwargs, outputs=["output", "weights"], inputs=inputs, grad_wrt=grad_wrt,
            variants=_self_attention_variants(), properties=props, public=public, forbid=FORBID))
    return out
