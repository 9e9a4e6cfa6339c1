"""Mutation suite for the layers' fill-ins (notebooks 02, 03, 09): plausible bugs, each written as an edit
of the solution's code, must lose points (a hidden case of the task fails: only hidden cases are scored)
with a one-line message that names the bug; correct alternatives written differently must pass every case, public and hidden.

The bugs here are those a read of the notebooks' text suggests and that once earned full marks: dropout in
the wrong place (only visible in training mode), a positional table that is not a buffer (only visible when
the module moves to another device), `if head:` for head 0. Notebooks 01 and 04-08 have their own suites
(tests/test_checks.py, tests/test_references_captioning.py).
"""
from __future__ import annotations

import pytest
from conftest import case_names, case_names_in, case_results, load_any_case, mutated_namespace

from grading import notebooks as nbs
from starter.layers import follows_module

ADAPTERS = {"follows_module(PositionalEncoding)": lambda ns: follows_module(ns["PositionalEncoding"])}


def _results(stem: str, namespace: dict, targets: set[str]) -> dict[str, str | None]:
    """Every stored case of `targets`: None if it passes, else its one-line message."""
    names = [name for name in case_names(stem) if load_any_case(name).target in targets]
    return case_results(names, lambda case: ADAPTERS[case.target](namespace) if case.target in ADAPTERS
                        else namespace[case.target])


PE = "02_positional_encoding"
MHA = "03_multi_head_attention"
VIS = "09_visualizing_attention"
RETURN_PE = "return self.dropout(x + self.pe[:T].to(x.dtype))"
BUFFER = 'self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)'
DROP_WEIGHTS = "out = self.dropout(weights) @ v"
RETURN_MHA = "return self.out_proj(merge_heads(out)), weights"
SELF_ADD = "        attended, self_weights = self.self_attn(h, h, h, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask)\n        x = x + self.dropout(attended)"
FFN = "x = x + self.dropout(self.linear2(self.dropout(torch.relu(self.linear1(h)))))"
ROPE_PAIRS = "a, b = x[..., 0::2], x[..., 1::2]"
ROPE_RETURN = "return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)"

# (notebook, targets, {grade_id: [(old, new)]}, words the message of a failing case must contain)
BUGS = {
    "posenc: dropout before adding the table": (
        PE, {"PositionalEncoding"}, {"PositionalEncoding": [(RETURN_PE, "return self.dropout(x) + self.pe[:T].to(x.dtype)")]},
        "dropout(x + pe[:T])"),
    "posenc: no dropout": (
        PE, {"PositionalEncoding"}, {"PositionalEncoding": [(RETURN_PE, "return x + self.pe[:T].to(x.dtype)")]},
        "no dropout in training mode"),
    "posenc: the table as a plain attribute": (
        PE, {"follows_module(PositionalEncoding)"},
        {"PositionalEncoding": [(BUFFER, "self.pe = sinusoidal_encoding(max_len, d_model)")]}, "register_buffer"),
    "posenc: an attribute moved by hand in forward": (
        PE, {"follows_module(PositionalEncoding)"},
        {"PositionalEncoding": [(BUFFER, "self.table = sinusoidal_encoding(max_len, d_model)"),
                                (RETURN_PE, "return self.dropout(x + self.table[:T].to(x))")]}, "not a buffer"),
    "mha: dropout on the output": (
        MHA, {"MultiHeadAttention"}, {"MultiHeadAttention": [(DROP_WEIGHTS, "out = weights @ v"), (
            RETURN_MHA, "return self.dropout(self.out_proj(merge_heads(out))), weights")]},
        "instead of the attention weights"),
    "mha: the weights returned after dropout": (
        MHA, {"MultiHeadAttention"}, {"MultiHeadAttention": [(
            "weights = torch.softmax(scores, dim=-1)\n        out = self.dropout(weights) @ v",
            "weights = self.dropout(torch.softmax(scores, dim=-1))\n        out = weights @ v")]},
        "after dropout"),
    "mha: the weights returned transposed": (  # they sum to 1 along axis -2: not a softmax over the wrong axis
        MHA, {"MultiHeadAttention"}, {"MultiHeadAttention": [(RETURN_MHA, "return self.out_proj(merge_heads(out)), "
                                                                          "weights.transpose(-2, -1)")]},
        "last two axes swapped"),
    "mha: no dropout": (
        MHA, {"MultiHeadAttention"}, {"MultiHeadAttention": [(DROP_WEIGHTS, "out = weights @ v")]},
        "no dropout in training mode"),
    "decoder: no dropout on the sublayers' outputs": (
        MHA, {"TransformerDecoderLayer"}, {"TransformerDecoderLayer": [
            ("x = x + self.dropout(attended)", "x = x + attended"),
            (FFN, "x = x + self.linear2(self.dropout(torch.relu(self.linear1(h))))")]},
        "sublayers' outputs"),
    "decoder: no dropout inside the feed-forward network": (
        MHA, {"TransformerDecoderLayer"}, {"TransformerDecoderLayer": [
            (FFN, "x = x + self.dropout(self.linear2(torch.relu(self.linear1(h))))")]},
        "inside the feed-forward"),
    "decoder: dropout after the residual addition": (
        MHA, {"TransformerDecoderLayer"}, {"TransformerDecoderLayer": [
            ("x = x + self.dropout(attended)", "x = self.dropout(x + attended)"),
            (FFN, "x = self.dropout(x + self.linear2(self.dropout(torch.relu(self.linear1(h)))))")]},
        "after the residual addition"),
    "rollout: the mixtures passed the wrong way": (
        VIS, {"rollout_to_regions"}, {"rollout_to_regions": [
            ("(1 - residual) * self_w.mean(dim=1)", "(1 - residual) * self_w.mean(dim=1).transpose(-1, -2)")]},
        "wrong direction"),
    "rollout: the earlier positions' image shares not passed on": (
        VIS, {"rollout_to_regions"}, {"rollout_to_regions": [("residual * (mix @ shares)", "residual * shares")]},
        "not passed on"),
    "rope: pairs from the two halves (rotate_half)": (
        PE, {"apply_rope"}, {"apply_rope": [(ROPE_PAIRS, "h = d // 2\n    a, b = x[..., :h], x[..., h:]"),
                                            (ROPE_RETURN, "return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)")]},
        "rotate_half"),
    "rope: rotated the other way": (
        PE, {"apply_rope"}, {"apply_rope": [(ROPE_RETURN, ROPE_RETURN.replace(
            "a * cos - b * sin, a * sin + b * cos", "a * cos + b * sin, b * cos - a * sin"))]}, "rotated the other way"),
    "rope: the offset ignored": (
        PE, {"apply_rope"}, {"apply_rope": [("torch.arange(offset, offset + x.shape[-2]", "torch.arange(0, x.shape[-2]")]},
        "offset is ignored"),
    "rope: angles in float32": (
        PE, {"apply_rope"}, {"apply_rope": [("dtype=torch.float64)\n    omega", "dtype=torch.float32)\n    omega"),
                                            ("torch.arange(0, d, 2, dtype=torch.float64)", "torch.arange(0, d, 2, dtype=torch.float32)")]},
        "lose digits"),
}

ALTERNATIVES = {
    "rollout: both sublayers as one matrix over words and regions, heads summed and divided": (
        VIS, {"rollout_to_regions"}, {"rollout_to_regions": [
            ("        mix = residual * eye + (1 - residual) * self_w.mean(dim=1)         # (B, T, T): who passes what to whom\n"
             "        shares = residual * (mix @ shares) + (1 - residual) * cross_w.mean(dim=1)",
             "        heads = self_w.shape[1]\n"
             "        mixed = torch.einsum('bts,bsr->btr', residual * eye + (1 - residual) * self_w.sum(1) / heads, shares)\n"
             "        shares = torch.lerp(cross_w.sum(1) / heads, mixed, residual)")]}),
    "rope: the rotation as a complex multiplication": (
        PE, {"apply_rope"}, {"apply_rope": [
            ("    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)\n", ""),
            (ROPE_PAIRS, "z = torch.view_as_complex(x.to(torch.float64).unflatten(-1, (-1, 2)).contiguous())"),
            (ROPE_RETURN, "return torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).flatten(-2).to(x.dtype)")]}),
    "posenc: table added first, a persistent buffer": (
        PE, {"PositionalEncoding", "follows_module(PositionalEncoding)"}, {"PositionalEncoding": [
            (BUFFER, 'self.register_buffer("pe", sinusoidal_encoding(max_len, d_model))'),
            (RETURN_PE, "return nn.functional.dropout(self.pe[:T].to(x.dtype) + x, self.dropout.p, self.training)")]}),
    "mha: einsum, and dropout on a transposed view of the weights": (
        # the weights dropped through a non-contiguous view: the same values in another memory layout must be
        # dropped alike (starter.compare.value_dropout)
        MHA, {"MultiHeadAttention", "TransformerDecoderLayer"}, {"MultiHeadAttention": [(
            DROP_WEIGHTS, "dropped = F.dropout(weights.transpose(-1, -2).contiguous().transpose(-1, -2), "
                          "self.dropout.p, self.training)\n        out = torch.einsum('bhts,bhsd->bhtd', dropped, v)")]}),
    "mha: a loop over the heads, each head's weights dropped on their own": (
        # as many dropout calls as heads, each on a (B, T_q, T_k) slice: a random mask drawn per call would
        # differ from the reference's everywhere, though the answer is right
        MHA, {"MultiHeadAttention", "TransformerDecoderLayer"}, {"MultiHeadAttention": [(
            DROP_WEIGHTS, "out = torch.stack([nn.Dropout(self.dropout.p).train(self.training)(weights[:, i]) "
                          "@ v[:, i] for i in range(self.num_heads)], dim=1)")]}),
    "decoder: the sublayers as helper methods, one Dropout per use": (
        MHA, {"TransformerDecoderLayer"}, {"TransformerDecoderLayer": [(SELF_ADD, (
            "        attended, self_weights = self.self_attn(h, h, h, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask)\n"
            "        x = torch.add(x, nn.Dropout(self.dropout.p).train(self.training)(attended))"))]}),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_loses_points_with_a_message_naming_it(bug, hidden_references):
    stem, targets, edits, words = BUGS[bug]
    results = _results(stem, mutated_namespace(stem, edits), targets)
    failed = {name: message for name, message in results.items() if message}
    hidden = set(case_names_in(nbs.HIDDEN_REFERENCES / f"{stem}.h5"))
    assert failed.keys() & hidden, f"{bug}: no hidden case fails, so no point is lost ({sorted(failed)} fail)"
    assert any(words in message for message in failed.values()), f"{bug}: {failed}"


@pytest.mark.parametrize("alternative", sorted(ALTERNATIVES))
def test_each_correct_alternative_passes_every_case(alternative, hidden_references):
    stem, targets, edits = ALTERNATIVES[alternative]
    results = _results(stem, mutated_namespace(stem, edits), targets)
    assert results and not any(results.values()), {k: v for k, v in results.items() if v}


# No cascades: a bug in split_heads/merge_heads or MultiHeadAttention costs points in its own tests, not in
# the decoder layer's, whose check runs the layer with PyTorch's attention on the layer's own projections
# (the decoder cases' `stand_ins`, starter.stand_ins.torch_attention).
UPSTREAM_BUGS = {
    "mha: dropout on the output": BUGS["mha: dropout on the output"][2],
    "mha: scaled by sqrt(d_model)": {"MultiHeadAttention": [("math.sqrt(self.head_dim)", "math.sqrt(self.embed_dim)")]},
    "mha: padding mask ignored": {"MultiHeadAttention": [("if key_padding_mask is not None:", "if False:")]},
    "split_heads without the transpose": {"split_heads": [(".transpose(1, 2)", "")]},
}


@pytest.mark.parametrize("bug", sorted(UPSTREAM_BUGS))
def test_an_attention_bug_costs_no_decoder_points(bug, hidden_references):
    results = _results(MHA, mutated_namespace(MHA, UPSTREAM_BUGS[bug]), {"MultiHeadAttention", "TransformerDecoderLayer"})
    mha = {n: m for n, m in results.items() if n.startswith("mha/") and m}
    decoder = {n: m for n, m in results.items() if n.startswith("decoder/") and m}
    assert mha, f"{bug}: the attention's own cases should fail"
    assert not decoder, f"{bug}: the decoder layer lost points for its attention: {decoder}"


# Every mask shape a docstring documents is exercised by a case (public or hidden): (rank, the axes of size 1).
DOCUMENTED_MASKS = {
    ("01_scaled_dot_product_attention", "scaled_dot_product_attention", "mask"): {
        (2, ()),  # (T_q, T_k), shared by the batch
        (3, ()),  # (B, T_q, T_k)
        (3, (1,)),  # (B, 1, T_k): per key, broadcast over the queries
    },
    ("01_scaled_dot_product_attention", "SelfAttention", "mask"): {(2, ()), (3, ())},  # (T, T), (B, T, T)
    ("03_multi_head_attention", "MultiHeadAttention", "attn_mask"): {
        (2, ()),  # (T_q, T_k)
        (4, ()),  # (B, h, T_q, T_k)
        (4, (1,)),  # (B, 1, T_q, T_k): per sequence, shared by the heads
    },
    ("03_multi_head_attention", "MultiHeadAttention", "key_padding_mask"): {(2, ())},  # (B, T_k)
    ("03_multi_head_attention", "TransformerDecoderLayer", "tgt_mask"): {(2, ()), (4, ())},  # (T, T), (B, h, T, T)
    ("03_multi_head_attention", "TransformerDecoderLayer", "tgt_key_padding_mask"): {(2, ())},
    ("03_multi_head_attention", "TransformerDecoderLayer", "memory_key_padding_mask"): {(2, ())},
}


@pytest.mark.parametrize("stem, target, mask", sorted(DOCUMENTED_MASKS))
def test_every_documented_mask_shape_has_a_case(stem, target, mask):
    seen = set()
    for name in case_names(stem):
        case = load_any_case(name)
        if case.target == target and mask in case.inputs:
            shape = case.inputs[mask].shape
            seen.add((len(shape), tuple(i for i, n in enumerate(shape) if n == 1)))
    missing = DOCUMENTED_MASKS[stem, target, mask] - seen
    assert not missing, f"{target}'s {mask}: no case of shape (rank, axes of size 1) {sorted(missing)}"
