"""Reference cases of notebook 03 (multi-head attention and the decoder block).

Public cases (public=True) are what students see in the test cells; hidden ones vary batch sizes,
head counts, masks (causal, padding, per-head), use cross-attention with T_q != T_k, float64, and
check gradients. Variants are known bugs, written here independently of the solution, that the
check names when a student's output matches them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grading.references import CaseSpec, Row, causal, forward_deviation, randn

FORBID = [
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.multi_head_attention_forward",
    "torch.nn.MultiheadAttention.forward",
]
FORBID_DECODER = FORBID + ["torch.nn.TransformerDecoderLayer.forward"]

# ---- known bugs -----------------------------------------------------------------------------------

def _split_variants() -> dict:
    return {
        "no_transpose": ("heads split by a reshape straight to (B, h, T, d_k): that mixes positions between heads. Head i "
                         "must hold, at every position t, features i*d_k .. (i+1)*d_k - 1 of that same position.",
                         lambda ns: lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h)),
        "feature_major": ("features dealt out to the heads in the wrong order: head i owns the contiguous block "
                          "of features i*d_k .. (i+1)*d_k - 1, not every h-th feature.",
                          lambda ns: lambda x, h: x.reshape(x.shape[0], x.shape[1], x.shape[2] // h, h)
                          .permute(0, 3, 1, 2)),
    }


def _merge_variants() -> dict:
    return {
        "no_transpose": ("heads merged by a reshape straight from (B, h, T, d_k): that mixes positions. Position t "
                         "of the result holds what every head computed at position t, side by side, head 0 first.",
                         lambda ns: lambda x: x.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])),
        "feature_major": ("heads interleaved feature by feature: head i's features must stay together, as the block "
                          "i*d_k .. (i+1)*d_k - 1 of each position.",
                          lambda ns: lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1)),
    }


def _mha(self, query, key, value, attn_mask=None, key_padding_mask=None, *, split="ok", merge="ok",
         softmax_dim=-1, mask_after=False, out_proj=True, scale="d_k", invert_padding=False,
         invert_attn=False, drop_padding=False, padding_on_queries=False, dropout="weights", dropped_weights=False):
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
    used = self.dropout(w) if dropout == "weights" else w
    o = used @ v
    if split == "no_transpose" or merge == "no_transpose":
        o = o.reshape(B, Tq, E)
    else:
        o = o.transpose(1, 2).reshape(B, Tq, E)
    o = self.out_proj(o) if out_proj else o
    return (self.dropout(o) if dropout == "output" else o), (used if dropped_weights else w)


def _mha_variants(attn_mask: bool = False, padding: bool = False, heads: int = 2, square: bool = True) -> dict:
    def v(message, **kw):
        return message, forward_deviation("MultiHeadAttention", _mha, **kw)

    out = {
        "no_out_proj": v("missing W^O: apply self.out_proj to the merged heads.", out_proj=False),
        "scale_d_model": v("scores divided by sqrt(embed_dim); divide by sqrt(d_k), the head size "
                           "embed_dim // num_heads.", scale="d_model"),
        "no_scale": v("scores not scaled: divide q k^T by sqrt(d_k) (d_k = embed_dim // num_heads).", scale="none"),
        "softmax_queries": v("softmax over the wrong axis (the queries, dim=-2): it must be over the keys, dim=-1.",
                             softmax_dim=-2),
        # told apart only in training mode (the case about dropout)
        "dropout_on_output": v("dropout applied to the output instead of the attention weights: dropout acts on the "
                               "weights after the softmax, before they weigh the values.", dropout="output"),
        "no_dropout": v("no dropout in training mode: apply self.dropout to the attention weights before "
                        "multiplying by v.", dropout="none"),
        "weights_after_dropout": v("returned the weights after dropout: return them as the softmax gave them "
                                   "(before dropout), and use the dropped ones only for the output.",
                                   dropped_weights=True),
    }
    if heads == 1:  # d_k == d_model, and a single head needs no transpose
        del out["scale_d_model"]
    else:
        out["split_no_transpose"] = v("heads split by a reshape straight to (B, h, T, d_k), which mixes positions "
                                      "between heads: head i holds features i*d_k .. (i+1)*d_k - 1 of every position.",
                                      split="no_transpose")
        out["merge_no_transpose"] = v("heads merged by a reshape straight from (B, h, T, d_k), which mixes positions: "
                                      "position t of the merge holds every head's output at position t.",
                                      merge="no_transpose")
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
             norm="pre", residual=True, norm_memory=False, relu=True, self_mask=True, cross_padding=True,
             sublayer_dropout=True, ffn_dropout=True, dropout_after_add=False):
    """A decoder layer with one deliberate bug (uses the module's own sublayers)."""
    def sa(h):
        return self.self_attn(h, h, h, attn_mask=tgt_mask if self_mask else None,
                              key_padding_mask=tgt_key_padding_mask)

    def ca(h):
        m = self.norm2(memory) if norm_memory else memory
        return self.cross_attn(h, m, m, key_padding_mask=memory_key_padding_mask if cross_padding else None)

    def ff(h):
        a = self.linear1(h)
        a = torch.relu(a) if relu else a
        return self.linear2(self.dropout(a) if ffn_dropout else a)

    def add(x, y):  # the residual connection around a sublayer's output y
        if dropout_after_add:
            return self.dropout(x + y)
        y = self.dropout(y) if sublayer_dropout else y
        return x + y if residual else y

    x = tgt
    if norm == "post":
        a, ws = sa(x)
        x = self.norm1(x + a)
        c, wc = ca(x)
        x = self.norm2(x + c)
        return self.norm3(x + ff(x)), ws, wc
    a, ws = sa(self.norm1(x))
    x = add(x, a)
    c, wc = ca(self.norm2(x))
    x = add(x, c)
    return add(x, ff(self.norm3(x))), ws, wc


def _decoder_variants(tgt_mask: bool = False, memory_padding: bool = False) -> dict:
    def v(message, **kw):
        return message, forward_deviation("TransformerDecoderLayer", _decoder, **kw)

    out = {
        "post_norm": v("that is post-norm, norm(x + sublayer(x)); this layer is pre-norm: x + sublayer(norm(x)).",
                       norm="post"),
        "no_residual": v("residual connections missing: add each sublayer's output to its input, "
                         "x = x + sublayer(norm(x)).", residual=False),
        "norm_memory": v("the memory was normalised: only the decoder's own stream goes through norm2; pass "
                         "memory to the cross-attention as it is.", norm_memory=True),
        "no_relu": v("feed-forward network without its ReLU: linear2(dropout(relu(linear1(x)))).", relu=False),
        # told apart only in training mode (the case about dropout)
        "no_sublayer_dropout": v("no dropout on the sublayers' outputs: x = x + dropout(sublayer(norm(x))) for "
                                 "each of the three.", sublayer_dropout=False),
        "no_ffn_dropout": v("no dropout inside the feed-forward network: linear2(dropout(relu(linear1(x)))).",
                            ffn_dropout=False),
        "dropout_after_add": v("dropout applied after the residual addition, dropout(x + sublayer(...)): drop the "
                               "sublayer's output only, x + dropout(sublayer(norm(x))).", dropout_after_add=True),
    }
    if tgt_mask:
        out["no_tgt_mask"] = v("tgt_mask not passed to the self-attention (attn_mask=tgt_mask).", self_mask=False)
    if memory_padding:
        out["no_memory_padding"] = v("memory_key_padding_mask not passed to the cross-attention.",
                                     cross_padding=False)
    return out


# ---- cases ----------------------------------------------------------------------------------------


def padding(lengths, t):
    """(B, T) bool, True at padding (positions >= length)."""
    return torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]


@dataclass(frozen=True, kw_only=True)
class HeadsCase(Row):
    """split_heads(x, heads) when `heads` is given, merge_heads(x) when it is None."""
    shape: tuple[int, ...]  # of x: (B, T, E) to split, (B, h, T, d_k) to merge
    heads: int | None = None
    dtype: torch.dtype = torch.float32
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class MhaCase(Row):
    """MultiHeadAttention(embed_dim, heads, dropout).forward(query, key, value, attn_mask, key_padding_mask)."""
    batch: int
    q_len: int  # T_q
    k_len: int  # T_k
    embed_dim: int
    heads: int
    attn_mask: torch.Tensor | None = None
    key_padding_mask: torch.Tensor | None = None
    self_attention: bool = False  # key and value are the query (then k_len == q_len)
    dtype: torch.dtype = torch.float32
    grad: bool = False
    train_seed: int | None = None  # train mode with dropout 0.5, this seed: where the dropout goes


@dataclass(frozen=True, kw_only=True)
class DecoderCase(Row):
    """TransformerDecoderLayer(d_model, heads, dim_feedforward, dropout).forward(tgt, memory, masks...)."""
    batch: int
    tgt_len: int  # T
    memory_len: int  # S
    d_model: int
    heads: int
    dim_feedforward: int
    tgt_mask: torch.Tensor | None = None
    tgt_key_padding_mask: torch.Tensor | None = None
    memory_key_padding_mask: torch.Tensor | None = None
    dtype: torch.dtype = torch.float32
    grad: bool = False
    train_seed: int | None = None  # train mode with dropout 0.5, this seed: where the dropout goes


MHA_PARAMS = ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
              "out_proj.weight", "out_proj.bias"]
DECODER_GRAD_WRT = ["tgt", "memory", "self_attn.q_proj.weight", "cross_attn.k_proj.weight", "linear1.weight",
                    "linear2.bias", "norm1.weight", "norm3.bias"]


def _heads_spec(c: HeadsCase, g: torch.Generator) -> CaseSpec:
    splits = c.heads is not None
    return CaseSpec(
        name=c.name, target="split_heads" if splits else "merge_heads", args=["x"],
        const_args=[c.heads] if splits else [], inputs={"x": randn(*c.shape, g=g, dtype=c.dtype)},
        outputs=["heads" if splits else "merged"], grad_wrt=["x"] if c.grad else [],
        variants=_split_variants() if splits else _merge_variants(), public=c.public,
        hint="heads[b, i, t] = x[b, t, i*d_k:(i+1)*d_k]." if splits else "merged[b, t, i*d_k:(i+1)*d_k] = x[b, i, t].")


def _mha_spec(c: MhaCase, g: torch.Generator) -> CaseSpec:
    amask, kpm = c.attn_mask, c.key_padding_mask
    if amask is not None and amask.dim() == 4:
        amask[..., 0] = True  # every query keeps at least one key
    q = randn(c.batch, c.q_len, c.embed_dim, g=g, dtype=c.dtype)
    if c.self_attention:
        inputs = {"query": q, "key": q.clone(), "value": q.clone()}
    else:
        inputs = {"query": q, "key": randn(c.batch, c.k_len, c.embed_dim, g=g, dtype=c.dtype),
                  "value": randn(c.batch, c.k_len, c.embed_dim, g=g, dtype=c.dtype)}
    kwargs, props = {}, [["rows_sum_to_one", "weights"]]
    if amask is not None:
        inputs["attn_mask"], kwargs["attn_mask"] = amask, "attn_mask"
        props.append(["zero_where_masked", "weights", "attn_mask"])
    if kpm is not None:
        inputs["key_padding_mask"], kwargs["key_padding_mask"] = kpm, "key_padding_mask"
        props.append(["zero_where_padded", "weights", "key_padding_mask"])
    return CaseSpec(
        name=c.name, target="MultiHeadAttention", kind="module",
        init={"embed_dim": c.embed_dim, "num_heads": c.heads, "dropout": 0.1 if c.train_seed is None else 0.5},
        train_seed=c.train_seed, args=["query", "key", "value"],
        kwargs=kwargs, outputs=["output", "weights"], inputs=inputs,
        grad_wrt=(["query", "key", "value"] + MHA_PARAMS) if c.grad else [],
        variants=_mha_variants(amask is not None, kpm is not None, c.heads, c.q_len == c.k_len),
        properties=props, public=c.public, forbid=FORBID,
        hint="per head: softmax(q k^T / sqrt(d_k)) with blocked scores at -inf, times v; merge, then out_proj.")


def _decoder_spec(c: DecoderCase, g: torch.Generator) -> CaseSpec:
    inputs = {"tgt": randn(c.batch, c.tgt_len, c.d_model, g=g, dtype=c.dtype),
              "memory": randn(c.batch, c.memory_len, c.d_model, g=g, dtype=c.dtype)}
    kwargs = {}
    props = [["rows_sum_to_one", "self_attn_weights"], ["rows_sum_to_one", "cross_attn_weights"]]
    for key, mask in (("tgt_mask", c.tgt_mask), ("tgt_key_padding_mask", c.tgt_key_padding_mask),
                      ("memory_key_padding_mask", c.memory_key_padding_mask)):
        if mask is not None:
            inputs[key], kwargs[key] = mask, key
    if c.tgt_mask is not None:
        props.append(["zero_where_masked", "self_attn_weights", "tgt_mask"])
    if c.tgt_key_padding_mask is not None:
        props.append(["zero_where_padded", "self_attn_weights", "tgt_key_padding_mask"])
    if c.memory_key_padding_mask is not None:
        props.append(["zero_where_padded", "cross_attn_weights", "memory_key_padding_mask"])
    return CaseSpec(
        name=c.name, target="TransformerDecoderLayer", kind="module",
        init={"d_model": c.d_model, "num_heads": c.heads, "dim_feedforward": c.dim_feedforward,
              "dropout": 0.1 if c.train_seed is None else 0.5}, train_seed=c.train_seed,
        args=["tgt", "memory"], kwargs=kwargs, outputs=["output", "self_attn_weights", "cross_attn_weights"],
        inputs=inputs, grad_wrt=list(DECODER_GRAD_WRT) if c.grad else [],
        variants=_decoder_variants(c.tgt_mask is not None, c.memory_key_padding_mask is not None),
        properties=props, public=c.public, forbid=FORBID_DECODER, atol=5e-5, stand_ins=["MultiHeadAttention"],
        hint="pre-norm: x = x + dropout(sublayer(norm_i(x))) for self-attention, cross-attention (memory not "
             "normalised), then the FFN.")


def cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(2026)
    out = []
    # split_heads(x, num_heads) and merge_heads(x)
    out += [_heads_spec(c, g) for c in [
        HeadsCase(name="split/basic", shape=(2, 5, 8), heads=2, public=True),
        HeadsCase(name="split/four_heads", shape=(3, 4, 12), heads=4),
        HeadsCase(name="split/float64", shape=(1, 6, 6), heads=3, dtype=torch.float64),
        HeadsCase(name="split/grad", shape=(2, 3, 8), heads=4, grad=True),
        HeadsCase(name="merge/basic", shape=(2, 2, 5, 4), public=True),
        HeadsCase(name="merge/four_heads", shape=(3, 4, 3, 2)),
        HeadsCase(name="merge/float64", shape=(1, 3, 6, 2), dtype=torch.float64),
        HeadsCase(name="merge/grad", shape=(2, 4, 3, 2), grad=True),
    ]]
    # MultiHeadAttention(embed_dim, num_heads, dropout).forward(query, key, value, attn_mask, key_padding_mask)
    out += [_mha_spec(c, g) for c in [
        MhaCase(name="mha/self", batch=2, q_len=5, k_len=5, embed_dim=8, heads=2, self_attention=True, public=True),
        MhaCase(name="mha/cross", batch=3, q_len=4, k_len=7, embed_dim=12, heads=3),
        MhaCase(name="mha/one_head", batch=2, q_len=3, k_len=6, embed_dim=6, heads=1),
        MhaCase(name="mha/eight_heads_float64", batch=2, q_len=6, k_len=6, embed_dim=16, heads=8, self_attention=True,
                dtype=torch.float64),
        MhaCase(name="mha/grad", batch=2, q_len=4, k_len=5, embed_dim=8, heads=4, grad=True),
        MhaCase(name="mha/causal_padding", batch=2, q_len=6, k_len=6, embed_dim=8, heads=2, attn_mask=causal(6),
                key_padding_mask=padding([6, 4], 6), self_attention=True, public=True),
        MhaCase(name="mha/cross_padding", batch=3, q_len=4, k_len=9, embed_dim=12, heads=4,
                key_padding_mask=padding([9, 5, 1], 9)),
        MhaCase(name="mha/mask_per_head", batch=2, q_len=5, k_len=7, embed_dim=8, heads=2,
                attn_mask=torch.rand(2, 2, 5, 7, generator=g) < 0.6),
        MhaCase(name="mha/padding_only", batch=4, q_len=5, k_len=5, embed_dim=8, heads=4,
                key_padding_mask=padding([5, 3, 2, 1], 5), self_attention=True),
        MhaCase(name="mha/masks_grad", batch=2, q_len=5, k_len=5, embed_dim=12, heads=3, attn_mask=causal(5),
                key_padding_mask=padding([5, 3], 5), self_attention=True, grad=True),
        MhaCase(name="mha/train_dropout", batch=2, q_len=4, k_len=6, embed_dim=8, heads=2, train_seed=5, public=True),
        MhaCase(name="mha/train_dropout_masks", batch=3, q_len=5, k_len=5, embed_dim=12, heads=3, attn_mask=causal(5),
                key_padding_mask=padding([5, 4, 2], 5), self_attention=True, train_seed=6),
    ]]
    # TransformerDecoderLayer(d_model, num_heads, dim_feedforward, dropout).forward(tgt, memory, ...)
    out += [_decoder_spec(c, g) for c in [
        DecoderCase(name="decoder/causal", batch=2, tgt_len=5, memory_len=7, d_model=8, heads=2, dim_feedforward=16,
                    tgt_mask=causal(5), public=True),
        DecoderCase(name="decoder/no_masks", batch=3, tgt_len=4, memory_len=6, d_model=12, heads=3, dim_feedforward=24),
        DecoderCase(name="decoder/padding", batch=3, tgt_len=6, memory_len=9, d_model=8, heads=4, dim_feedforward=32,
                    tgt_mask=causal(6), tgt_key_padding_mask=padding([6, 4, 2], 6),
                    memory_key_padding_mask=padding([9, 9, 5], 9)),
        DecoderCase(name="decoder/float64", batch=2, tgt_len=4, memory_len=3, d_model=16, heads=4, dim_feedforward=20,
                    tgt_mask=causal(4), dtype=torch.float64),
        DecoderCase(name="decoder/grad", batch=2, tgt_len=4, memory_len=5, d_model=8, heads=2, dim_feedforward=12,
                    tgt_mask=causal(4), tgt_key_padding_mask=padding([4, 3], 4),
                    memory_key_padding_mask=padding([5, 2], 5), grad=True),
        DecoderCase(name="decoder/train_dropout", batch=2, tgt_len=5, memory_len=6, d_model=8, heads=2,
                    dim_feedforward=16, tgt_mask=causal(5), train_seed=9, public=True),
        DecoderCase(name="decoder/train_dropout_padding", batch=3, tgt_len=6, memory_len=7, d_model=12, heads=3,
                    dim_feedforward=24, tgt_mask=causal(6), tgt_key_padding_mask=padding([6, 5, 3], 6),
                    memory_key_padding_mask=padding([7, 4, 7], 7), train_seed=10),
    ]]
    # The documented mask shapes no case above has; drawn after them so that their inputs stay as they were.
    per_sequence = torch.rand(3, 1, 4, 6, generator=g) < 0.6  # (B, 1, T_q, T_k): shared by the heads
    per_sequence[..., 0] = True  # every query keeps a key
    out.append(_mha_spec(MhaCase(name="mha/mask_per_sequence", batch=3, q_len=4, k_len=6, embed_dim=8, heads=2,
                                 attn_mask=per_sequence), g))
    per_head = causal(5) & (torch.rand(2, 2, 5, 5, generator=g) < 0.7) | torch.eye(5, dtype=torch.bool)  # (B, h, T, T)
    out.append(_decoder_spec(DecoderCase(name="decoder/mask_per_head", batch=2, tgt_len=5, memory_len=6, d_model=8,
                                         heads=2, dim_feedforward=16, tgt_mask=per_head), g))
    return out
