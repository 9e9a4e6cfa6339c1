"""Notebook 03's stored references agree with PyTorch's own layers.

`split_heads`/`merge_heads` against NumPy index arithmetic; `MultiHeadAttention` against
`torch.nn.MultiheadAttention(batch_first=True)` with the stored weights copied in (in_proj_weight =
cat(W_q, W_k, W_v)); `TransformerDecoderLayer` against `torch.nn.TransformerDecoderLayer(batch_first=True,
norm_first=True, activation="relu")`. PyTorch's boolean attn_mask means True = blocked, ours True = may
attend, so it is inverted; key padding masks share the convention (True = padding). Gradients of our
separate projections are slices of the gradient of PyTorch's packed in_proj_weight. Bug variants must
differ from the reference.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import case_names, load_any_case
from torch import nn

from starter.compare import value_dropout

STEM = "03_multi_head_attention"


_load = load_any_case


def _names():
    return case_names(STEM)


# ---- our parameter names -> PyTorch's (name, rows) ------------------------------------------------

def _mha_target(name: str, e: int, prefix_ours: str = "", prefix_torch: str = ""):
    rows = {"q": slice(0, e), "k": slice(e, 2 * e), "v": slice(2 * e, 3 * e)}
    local = name[len(prefix_ours):]
    proj, kind = local.split(".")
    if proj == "out_proj":
        return prefix_torch + local, slice(None)
    return prefix_torch + f"in_proj_{kind}", rows[proj[0]]


def _torch_name(name: str, e: int):
    if name.startswith("self_attn."):
        return _mha_target(name, e, "self_attn.", "self_attn.")
    if name.startswith("cross_attn."):
        return _mha_target(name, e, "cross_attn.", "multihead_attn.")
    if name.split(".")[0] in {"linear1", "linear2", "norm1", "norm2", "norm3"}:
        return name, slice(None)
    return _mha_target(name, e)


def _copy_params(module: nn.Module, params: dict, e: int) -> None:
    own = dict(module.named_parameters())
    with torch.no_grad():
        for name, value in params.items():
            tname, rows = _torch_name(name, e)
            own[tname][rows] = torch.from_numpy(value).double()


def _torch_attn_mask(mask: torch.Tensor | None, b: int, h: int):
    """Ours (True = may attend, (T_q, T_k) or (B, H, T_q, T_k)) -> PyTorch's (True = blocked)."""
    if mask is None:
        return None
    if mask.dim() == 4:
        mask = mask.expand(b, h, *mask.shape[-2:]).reshape(b * h, *mask.shape[-2:])
    return ~mask


# ---- independent implementations ------------------------------------------------------------------

def _split_np(x: np.ndarray, h: int) -> np.ndarray:
    b, t, e = x.shape
    d = e // h
    out = np.zeros((b, h, t, d), dtype=x.dtype)
    for i in range(h):
        out[:, i] = x[:, :, i * d:(i + 1) * d]
    return out


def _merge_np(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x[:, i] for i in range(x.shape[1])], axis=-1)


def _run_mha(case, inputs):
    e, h = case.init["embed_dim"], case.init["num_heads"]
    ref = nn.MultiheadAttention(e, h, dropout=case.init["dropout"], batch_first=True).double()
    _copy_params(ref, case.params, e)
    b = inputs["query"].shape[0]

    def run():
        return ref(inputs["query"], inputs["key"], inputs["value"],
                   attn_mask=_torch_attn_mask(inputs.get("attn_mask"), b, h),
                   key_padding_mask=inputs.get("key_padding_mask"), need_weights=True, average_attn_weights=False)

    out, w = _as_the_case_runs(ref, case, run)
    if case.train_seed is not None:  # PyTorch returns the weights after dropout; ours are those before it
        w = ref.eval()(inputs["query"], inputs["key"], inputs["value"], attn_mask=_torch_attn_mask(
            inputs.get("attn_mask"), b, h), key_padding_mask=inputs.get("key_padding_mask"), need_weights=True,
            average_attn_weights=False)[1]
    return ref, [out, w]


def _as_the_case_runs(ref, case, run):
    """Run `ref` in eval mode, or, for a case about dropout, in train mode with the check's dropout (a
    function of each value, starter.compare.value_dropout), which PyTorch's own layers then use too."""
    ref.train(case.train_seed is not None)
    with value_dropout(case.train_seed):
        return run()


def _run_decoder(case, inputs):
    d, h = case.init["d_model"], case.init["num_heads"]
    ref = nn.TransformerDecoderLayer(d, h, case.init["dim_feedforward"], dropout=case.init["dropout"],
                                     activation="relu", batch_first=True, norm_first=True).double()
    _copy_params(ref, case.params, d)
    calls = {}

    def record(key):
        def hook(module, args, kwargs):
            calls[key] = (args, dict(kwargs))
            # the path that computes the weights drops them with F.dropout (the check's); the fused one would not
            return args, {**kwargs, "need_weights": True}
        return hook

    handles = [ref.self_attn.register_forward_pre_hook(record("self"), with_kwargs=True),
               ref.multihead_attn.register_forward_pre_hook(record("cross"), with_kwargs=True)]
    b = inputs["tgt"].shape[0]
    out = _as_the_case_runs(ref, case, lambda: ref(inputs["tgt"], inputs["memory"],
                                         tgt_mask=_torch_attn_mask(inputs.get("tgt_mask"), b, h),
                                         tgt_key_padding_mask=inputs.get("tgt_key_padding_mask"),
                                         memory_key_padding_mask=inputs.get("memory_key_padding_mask")))

    for handle in handles:
        handle.remove()
    ref.eval()  # the weights before dropout
    weights = []
    for key, attn in (("self", ref.self_attn), ("cross", ref.multihead_attn)):  # same inputs, weights this time
        args, kwargs = calls[key]
        kwargs.update(need_weights=True, average_attn_weights=False, is_causal=False)
        weights.append(attn(*args, **kwargs)[1])
    return ref, [out] + weights


def _independent(case, inputs):
    t = case.target
    if t == "split_heads":
        x = inputs["x"]
        out = torch.from_numpy(_split_np(x.detach().numpy(), case.const_args[0]))
        return None, [out], lambda: x.reshape(*x.shape[:2], case.const_args[0], -1).permute(0, 2, 1, 3)
    if t == "merge_heads":
        x = inputs["x"]
        return None, [torch.from_numpy(_merge_np(x.detach().numpy()))], lambda: torch.cat(x.unbind(1), -1)
    if t == "MultiHeadAttention":
        ref, outs = _run_mha(case, inputs)
        return ref, outs, None
    if t == "TransformerDecoderLayer":
        ref, outs = _run_decoder(case, inputs)
        return ref, outs, None
    raise AssertionError(f"no independent implementation for {t}")


NAMES = _names()


@pytest.mark.parametrize("name", NAMES)
def test_reference_matches_torch(name):
    case = _load(name)
    inputs = {k: torch.from_numpy(v.copy()).double() if v.dtype.kind == "f" else torch.from_numpy(v.copy())
              for k, v in case.inputs.items()}
    for key in case.grad_wrt:
        if key in inputs:
            inputs[key].requires_grad_(True)
    ref, outs, differentiable = _independent(case, inputs)
    for out_name, value in zip(case.outputs, outs):
        want = case.expected[out_name]
        assert tuple(value.shape) == want.shape, f"{name}: {out_name}"
        np.testing.assert_allclose(value.detach().numpy(), want.astype(np.float64), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}: {out_name}")
    floats = [v.dtype for v in case.inputs.values() if v.dtype.kind == "f"]
    assert case.expected[case.outputs[0]].dtype == floats[0]
    if not case.grad_wrt:
        return
    if differentiable is not None:
        outs = [differentiable()]
    loss = sum((o * torch.from_numpy(case.grad_weights[n]).double()).sum() for n, o in zip(case.outputs, outs))
    loss.backward()
    e = case.init.get("embed_dim", case.init.get("d_model"))
    own = dict(ref.named_parameters()) if ref is not None else {}
    for key in case.grad_wrt:
        if key in inputs:
            grad = inputs[key].grad
        else:
            tname, rows = _torch_name(key, e)
            grad = own[tname].grad[rows]
        np.testing.assert_allclose(grad.numpy(), case.grads[key], rtol=1e-4, atol=1e-5, err_msg=f"{name}: grad {key}")


def test_masked_and_padded_keys_get_exactly_zero_weight():
    for name in NAMES:
        case = _load(name)
        for out_name, mask_name, padding in (("weights", "attn_mask", False), ("weights", "key_padding_mask", True),
                                             ("self_attn_weights", "tgt_mask", False),
                                             ("self_attn_weights", "tgt_key_padding_mask", True),
                                             ("cross_attn_weights", "memory_key_padding_mask", True)):
            if mask_name not in case.inputs or out_name not in case.expected:
                continue
            w, m = case.expected[out_name], case.inputs[mask_name]
            blocked = np.broadcast_to(m[:, None, None, :] if padding else ~m, w.shape)
            assert blocked.any() and np.all(w[blocked] == 0), f"{name}: {mask_name}"


def test_cases_cover_the_notebook():
    cases = [_load(n) for n in NAMES]
    targets = {c.target for c in cases}
    assert targets == {"split_heads", "merge_heads", "MultiHeadAttention", "TransformerDecoderLayer"}
    for target in targets:
        assert any(c.grad_wrt for c in cases if c.target == target), f"{target}: no gradient check"
    mha = [c for c in cases if c.target == "MultiHeadAttention"]
    assert any(c.inputs["query"].shape[1] != c.inputs["key"].shape[1] for c in mha), "cross-attention"
    assert len({c.init["num_heads"] for c in mha}) >= 3, "several head counts"
    assert any(c.inputs["query"].dtype == np.float64 for c in mha)
    for c in mha + [c for c in cases if c.target == "TransformerDecoderLayer"]:
        assert "torch.nn.functional.scaled_dot_product_attention" in c.forbid
        assert "torch.nn.MultiheadAttention.forward" in c.forbid
