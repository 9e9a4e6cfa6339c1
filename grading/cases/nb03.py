"""Reference cases of notebook 03 (multi-head attention and the decoder block).

Public cases (public=True) are what students see in the test cells; hidden ones vary batch sizes,
head counts, masks (causal, padding, per-head), use cross-attention with T_q != T_k, float64, and
check gradients. Variants are known bugs, written here independently of the solution, that the
check names when a student's output matches them.
"""
from __future__ import annotations

import math

import torch

from grading.references import CaseSpec, randn

FORBID = [
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.multi_head_attention_forward",
    "torch.nn.MultiheadAttention.forward",
]
FORBID_DECODER = FORBID + ["torch.nn.TransformerDecoderLayer.forward"]

# ---- known bugs -----------------------------------------------------------------------------------

def _split_variants() -> dict:
    return {
        "no_transpose": ("heads split without the transpose: reshape to (B, T, h, d_k) first, then "
                         "transpose(1, 2); reshaping straight to (B, h, T, d_k) mixes positions between heads.",
                         lambda ns: lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h)),
        "feature_major": ("features dealt out to the heads in the wrong order: head i owns the contiguous block "
                          "of features i*d_k .. (i+1)*d_k - 1 (reshape to (B, T, h, d_k), not (B, T, d_k, h)).",
                          lambda ns: lambda x, h: x.reshape(x.shape[0], x.shape[1], x.shape[2] // h, h)
                          .permute(0, 3, 1, 2)),
    }


def _merge_variants() -> dict:
    return {
        "no_transpose": ("heads merged without the transpose: transpose(1, 2) to (B, T, h, d_k) first, then "
                         "reshape to (B, T, h*d_k).",
                         lambda ns: lambda x: x.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])),
        "feature_major": ("heads interleaved feature by feature: head i's features must stay together "
                          "(transpose(1, 2), not permute(0, 2, 3, 1)).",
                          lambda ns: lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1)),
    }


def _mha(self, query, key, value, attn_mask=None, key_padding_mask=None, *, split="ok", merge="ok",
         softmax_dim=-1, mask_after=False, out_proj=True, scale="d_k", invert_padding=False,
         invert_attn=False, drop_padding=False, padding_on_queries=False):
    """Multi-head attention with one deliberate bug (uses only the module's given layers)."""
    B, Tq, E = query.shape
    Tk = key.shape[1]
    H = self.num_heads
    d = E // H

    def sp(x):
        if split == "no_transpose":
            return x.reshape(B, H, x.shape[1], d)
        return x.reshape(B, x.shape[1], H, d).transpose(1, 2)

    q, k, v = sp(self.q_proj(query)), sp(self.k_proj(key)), sp(self.v_proj(value))
    scores = q @ k.transpose(-2, -1) / math.sqrt({"d_k": d, "d_model": E, "none": 1}[scale])
    allowed = torch.ones(B, 1, Tq, Tk, dtype=torch.bool)
    if attn_mask is not None:
        allowed = allowed & (~attn_mask if invert_attn else attn_mask)
    if key_padding_mask is not None and not drop_padding:
        pad = key_padding_mask[:, None, :, None] if padding_on_queries else key_padding_mask[:, None, None, :]
        allowed = allowed & (pad if invert_padding else ~pad)
    if not mask_after:
        scores = scores.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(scores, dim=softmax_dim)
    if mask_after:
        w = w.masked_fill(~allowed, 0.0)
    o = w @ v
    if split == "no_transpose" or merge == "no_transpose":
        o = o.reshape(B, Tq, E)
    else:
        o = o.transpose(1, 2).reshape(B, Tq, E)
    return (self.out_proj(o) if out_proj else o), w


def _mha_variants(attn_mask: bool = False, padding: bool = False, heads: int = 2, square: bool = True) -> dict:
    def v(message, **kw):
        def make(ns):
            def forward(self, query, key, value, attn_mask=None, key_padding_mask=None):
                return _mha(self, query, key, value, attn_mask, key_padding_mask, **kw)
            return type("Buggy", (ns["MultiHeadAttention"],), {"forward": forward})
        return message, make

    out = {
        "no_out_proj": v("missing W^O: apply self.out_proj to the merged heads.", out_proj=False),
        "scale_d_model": v("scores divided by sqrt(embed_dim); divide by sqrt(d_k), the head size "
                           "embed_dim // num_heads.", scale="d_model"),
        "no_scale": v("scores not scaled: divide q k^T by sqrt(d_k) (d_k = embed_dim // num_heads).", scale="none"),
        "softmax_queries": v("softmax over the wrong axis (the queries, dim=-2): it must be over the keys, dim=-1.",
                             softmax_dim=-2),
    }
    if heads == 1:  # d_k == d_model, and a single head needs no transpose
        del out["scale_d_model"]
    else:
        out["split_no_transpose"] = v("heads split without the transpose: reshape to (B, T, h, d_k), then "
                                      "transpose(1, 2) (and transpose back before merging).", split="no_transpose")
        out["merge_no_transpose"] = v("heads merged without the transpose: transpose(1, 2) back to (B, T, h, d_k) "
                                      "before reshaping to (B, T, embed_dim).", merge="no_transpose")
    if attn_mask or padding:
        out["mask_after"] = v("mask applied after the softmax: fill blocked scores with -inf *before* the softmax, "
                              "so each row still sums to 1.", mask_after=True)
    if attn_mask:
        out["attn_inverted"] = v("attn_mask inverted: True means MAY attend (as in notebook 01); block where it "
                                 "is False.", invert_attn=True)
    if padding:
        out["padding_inverted"] = v("key_padding_mask inverted: True marks PADDING, which must get zero weight "
                                    "(the opposite of attn_mask).", invert_padding=True)
        out["padding_ignored"] = v("key_padding_mask ignored: block the padded keys (True entries) too, combined "
                                   "with attn_mask.", drop_padding=True)
        if square:
            out["padding_on_queries"] = v("key_padding_mask applied to the queries (rows): reshape it to "
                                          "(B, 1, 1, T_k) so that it blocks keys (columns).", padding_on_queries=True)
    return out


def _decoder(self, tgt, memory, tgt_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None, *,
             norm="pre", residual=True, norm_memory=False, relu=True, self_mask=True, cross_padding=True):
    """A decoder layer with one deliberate bug (uses the module's own sublayers)."""
    def sa(h):
        return self.self_attn(h, h, h, attn_mask=tgt_mask if self_mask else None,
                              key_padding_mask=tgt_key_padding_mask)

    def ca(h):
        m = self.norm2(memory) if norm_memory else memory
        return self.cross_attn(h, m, m, key_padding_mask=memory_key_padding_mask if cross_padding else None)

    def ff(h):
        a = self.linear1(h)
        return self.linear2(torch.relu(a) if relu else a)

    x = tgt
    if norm == "post":
        a, ws = sa(x)
        x = self.norm1(x + a)
        c, wc = ca(x)
        x = self.norm2(x + c)
        return self.norm3(x + ff(x)), ws, wc
    a, ws = sa(self.norm1(x))
    x = x + a if residual else a
    c, wc = ca(self.norm2(x))
    x = x + c if residual else c
    f = ff(self.norm3(x))
    return (x + f if residual else f), ws, wc


def _decoder_variants(tgt_mask: bool = False, memory_padding: bool = False) -> dict:
    def v(message, **kw):
        def make(ns):
            def forward(self, tgt, memory, tgt_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None):
                return _decoder(self, tgt, memory, tgt_mask, tgt_key_padding_mask, memory_key_padding_mask, **kw)
            return type("Buggy", (ns["TransformerDecoderLayer"],), {"forward": forward})
        return message, make

    out = {
        "post_norm": v("that is post-norm, norm(x + sublayer(x)); this layer is pre-norm: x + sublayer(norm(x)).",
                       norm="post"),
        "no_residual": v("residual connections missing: add each sublayer's output to its input, "
                         "x = x + sublayer(norm(x)).", residual=False),
        "norm_memory": v("the memory was normalised: only the decoder's own stream goes through norm2; pass "
                         "memory to the cross-attention as it is.", norm_memory=True),
        "no_relu": v("feed-forward network without its ReLU: linear2(dropout(relu(linear1(x)))).", relu=False),
    }
    if tgt_mask:
        out["no_tgt_mask"] = v("tgt_mask not passed to the self-attention (attn_mask=tgt_mask).", self_mask=False)
    if memory_padding:
        out["no_memory_padding"] = v("memory_key_padding_mask not passed to the cross-attention.",
                                     cross_padding=False)
    return out


# ---- cases ----------------------------------------------------------------------------------------


def causal(t):
    return torch.ones(t, t, dtype=torch.bool).tril()


def padding(lengths, t):
    """(B, T) bool, True at padding (positions >= length)."""
    return torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]


def cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(2026)
    out = []

    # split_heads(x, num_heads) and merge_heads(x)
    for name, (shape, h, dtype, grad, public) in {
        "split/basic": ((2, 5, 8), 2, torch.float32, False, True),
        "split/four_heads": ((3, 4, 12), 4, torch.float32, False, False),
        "split/float64": ((1, 6, 6), 3, torch.float64, False, False),
        "split/grad": ((2, 3, 8), 4, torch.float32, True, False),
    }.items():
        out.append(CaseSpec(
            name=name, target="split_heads", args=["x"], const_args=[h], inputs={"x": randn(*shape, g=g, dtype=dtype)},
            outputs=["heads"], grad_wrt=["x"] if grad else [], variants=_split_variants(), public=public,
            hint="heads[b, i, t] = x[b, t, i*d_k:(i+1)*d_k]."))
    for name, (heads_shape, dtype, grad, public) in {
        "merge/basic": ((2, 2, 5, 4), torch.float32, False, True),
        "merge/four_heads": ((3, 4, 3, 2), torch.float32, False, False),
        "merge/float64": ((1, 3, 6, 2), torch.float64, False, False),
        "merge/grad": ((2, 4, 3, 2), torch.float32, True, False),
    }.items():
        out.append(CaseSpec(
            name=name, target="merge_heads", args=["x"], inputs={"x": randn(*heads_shape, g=g, dtype=dtype)},
            outputs=["merged"], grad_wrt=["x"] if grad else [], variants=_merge_variants(), public=public,
            hint="merged[b, t, i*d_k:(i+1)*d_k] = x[b, i, t]."))

    # MultiHeadAttention(embed_dim, num_heads, dropout).forward(query, key, value, attn_mask, key_padding_mask)
    mha_params = ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
                  "out_proj.weight", "out_proj.bias"]
    mha = {
        # name: (B, T_q, T_k, E, H, attn_mask, key_padding_mask, self-attention?, dtype, grad, public)
        "mha/self": (2, 5, 5, 8, 2, None, None, True, torch.float32, False, True),
        "mha/cross": (3, 4, 7, 12, 3, None, None, False, torch.float32, False, False),
        "mha/one_head": (2, 3, 6, 6, 1, None, None, False, torch.float32, False, False),
        "mha/eight_heads_float64": (2, 6, 6, 16, 8, None, None, True, torch.float64, False, False),
        "mha/grad": (2, 4, 5, 8, 4, None, None, False, torch.float32, True, False),
        "mha/causal_padding": (2, 6, 6, 8, 2, causal(6), padding([6, 4], 6), True, torch.float32, False, True),
        "mha/cross_padding": (3, 4, 9, 12, 4, None, padding([9, 5, 1], 9), False, torch.float32, False, False),
        "mha/mask_per_head": (2, 5, 7, 8, 2, torch.rand(2, 2, 5, 7, generator=g) < 0.6, None, False, torch.float32,
                              False, False),
        "mha/padding_only": (4, 5, 5, 8, 4, None, padding([5, 3, 2, 1], 5), True, torch.float32, False, False),
        "mha/masks_grad": (2, 5, 5, 12, 3, causal(5), padding([5, 3], 5), True, torch.float32, True, False),
    }
    for name, (b, tq, tk, e, h, amask, kpm, self_attn, dtype, grad, public) in mha.items():
        if amask is not None and amask.dim() == 4:
            amask[..., 0] = True  # every query keeps at least one key
        q = randn(b, tq, e, g=g, dtype=dtype)
        if self_attn:
            inputs = {"query": q, "key": q.clone(), "value": q.clone()}
        else:
            inputs = {"query": q, "key": randn(b, tk, e, g=g, dtype=dtype), "value": randn(b, tk, e, g=g, dtype=dtype)}
        kwargs, props = {}, [["rows_sum_to_one", "weights"]]
        if amask is not None:
            inputs["attn_mask"], kwargs["attn_mask"] = amask, "attn_mask"
            props.append(["zero_where_masked", "weights", "attn_mask"])
        if kpm is not None:
            inputs["key_padding_mask"], kwargs["key_padding_mask"] = kpm, "key_padding_mask"
            props.append(["zero_where_padded", "weights", "key_padding_mask"])
        grad_wrt = (["query", "key", "value"] + mha_params) if grad else []
        out.append(CaseSpec(
            name=name, target="MultiHeadAttention", kind="module",
            init={"embed_dim": e, "num_heads": h, "dropout": 0.1}, args=["query", "key", "value"], kwargs=kwargs,
            outputs=["output", "weights"], inputs=inputs, grad_wrt=grad_wrt,
            variants=_mha_variants(amask is not None, kpm is not None, h, tq == tk), properties=props, public=public,
            forbid=FORBID,
            hint="per head: softmax(q k^T / sqrt(d_k)) with blocked scores at -inf, times v; merge, then out_proj."))

    # TransformerDecoderLayer(d_model, num_heads, dim_feedforward, dropout).forward(tgt, memory, ...)
    dec = {
        # name: (B, T, S, d_model, H, d_ff, tgt_mask, tgt_kpm, memory_kpm, dtype, grad, public)
        "decoder/causal": (2, 5, 7, 8, 2, 16, causal(5), None, None, torch.float32, False, True),
        "decoder/no_masks": (3, 4, 6, 12, 3, 24, None, None, None, torch.float32, False, False),
        "decoder/padding": (3, 6, 9, 8, 4, 32, causal(6), padding([6, 4, 2], 6), padding([9, 9, 5], 9),
                            torch.float32, False, False),
        "decoder/float64": (2, 4, 3, 16, 4, 20, causal(4), None, None, torch.float64, False, False),
        "decoder/grad": (2, 4, 5, 8, 2, 12, causal(4), padding([4, 3], 4), padding([5, 2], 5), torch.float32,
                         True, False),
    }
    for name, (b, t, s, d, h, dff, tmask, tkpm, mkpm, dtype, grad, public) in dec.items():
        inputs = {"tgt": randn(b, t, d, g=g, dtype=dtype), "memory": randn(b, s, d, g=g, dtype=dtype)}
        kwargs = {}
        props = [["rows_sum_to_one", "self_attn_weights"], ["rows_sum_to_one", "cross_attn_weights"]]
        for key, value in (("tgt_mask", tmask), ("tgt_key_padding_mask", tkpm), ("memory_key_padding_mask", mkpm)):
            if value is not None:
                inputs[key], kwargs[key] = value, key
        if tmask is not None:
            props.append(["zero_where_masked", "self_attn_weights", "tgt_mask"])
        if tkpm is not None:
            props.append(["zero_where_padded", "self_attn_weights", "tgt_key_padding_mask"])
        if mkpm is not None:
            props.append(["zero_where_padded", "cross_attn_weights", "memory_key_padding_mask"])
        grad_wrt = ["tgt", "memory", "self_attn.q_proj.weight", "cross_attn.k_proj.weight", "linear1.weight",
                    "linear2.bias", "norm1.weight", "norm3.bias"] if grad else []
        out.append(CaseSpec(
            name=name, target="TransformerDecoderLayer", kind="module",
            init={"d_model": d, "num_heads": h, "dim_feedforward": dff, "dropout": 0.1},
            args=["tgt", "memory"], kwargs=kwargs, outputs=["output", "self_attn_weights", "cross_attn_weights"],
            inputs=inputs, grad_wrt=grad_wrt, variants=_decoder_variants(tmask is not None, mkpm is not None),
            properties=props, public=public, forbid=FORBID_DECODER, atol=5e-5,
            hint="pre-norm: x = x + dropout(sublayer(norm_i(x))) for self-attention, cross-attention (memory not "
                 "normalised), then the FFN; make MultiHeadAttention pass its checks first."))
    return out
