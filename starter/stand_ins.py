"""The kit's own versions of a student's submodules, which a check runs in place of them (a case's `stand_ins`).

The decoder layer's check runs the student's layer with PyTorch's attention in place of their
`MultiHeadAttention`, so that a mistake in the attention costs points once, in its own test.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

# bound when the kit is imported: a check forbids the student's code to call it, not the kit's stand-in
_multi_head_attention_forward = nn.functional.multi_head_attention_forward


def torch_attention(mha, query, key, value, attn_mask=None, key_padding_mask=None):
    """``mha.forward`` done by PyTorch's ``F.multi_head_attention_forward`` with ``mha``'s own projections
    (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, ``dropout``, ``num_heads``, as notebook 03 gives
    them): the interface of your ``MultiHeadAttention``. The decoder layer's check runs your layer with this
    in place of your attention, so that a mistake in your attention costs points once, in its own test.

    query (B, T_q, E); key, value (B, T_k, E); attn_mask bool broadcastable to (T_q, T_k) or (B, h, T_q, T_k),
    True = may attend; key_padding_mask bool (B, T_k), True = padding. Returns (output (B, T_q, E),
    weights (B, h, T_q, T_k) before dropout)."""
    B, T_q, E = query.shape
    T_k, h = key.shape[1], mha.num_heads
    blocked = None  # torch: True = blocked, as (B*h, T_q, T_k)
    if attn_mask is not None:
        blocked = (~attn_mask.bool()).expand(B, h, T_q, T_k).reshape(B * h, T_q, T_k)
    projections = (mha.q_proj, mha.k_proj, mha.v_proj)

    def attend(training: bool):
        return _multi_head_attention_forward(
            query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), E, h,
            in_proj_weight=None, in_proj_bias=torch.cat([p.bias for p in projections]), bias_k=None, bias_v=None,
            add_zero_attn=False, dropout_p=mha.dropout.p, out_proj_weight=mha.out_proj.weight,
            out_proj_bias=mha.out_proj.bias, training=training, key_padding_mask=key_padding_mask,
            need_weights=True, attn_mask=blocked, use_separate_proj_weight=True,
            q_proj_weight=mha.q_proj.weight, k_proj_weight=mha.k_proj.weight, v_proj_weight=mha.v_proj.weight,
            average_attn_weights=False)

    out, weights = attend(mha.training)  # dropout (F.dropout) on the (B*h, T_q, T_k) weights, row-major
    if mha.training and mha.dropout.p > 0:  # PyTorch returns the weights after dropout; ours are before it
        weights = attend(False)[1]
    return out.transpose(0, 1), weights


STAND_INS = {"MultiHeadAttention": torch_attention}  # what a case's `stand_ins` may name


def stand_in(module: nn.Module, class_names: list[str]) -> None:
    """Make every submodule of `module` whose class is named in `class_names` run the kit's version
    (its `forward` replaced on the instance; its parameters, and so the module's, stay as they are)."""
    for sub in module.modules():
        name = type(sub).__name__
        if sub is not module and name in class_names:
            sub.forward = functools.partial(STAND_INS[name], sub)
