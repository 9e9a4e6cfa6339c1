"""Reference cases of notebook 02 (positional encoding).

Public cases (public=True) are what students see in the test cells; hidden ones use an odd d_model,
a single position, long tables, batched and float64 inputs, gradients, and the off-by-one length.
Variants are known bugs, written here independently of the solution, that the check names.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from grading.references import CaseSpec, Row, deviation, randn, with_forward
from starter.layers import follows_module

LONG_ATOL = 1e-4  # float32 angles pos * omega lose ~1e-5 at position 200; the reference is float64

# ---- known bugs -----------------------------------------------------------------------------------

def _table(max_len, d, exponent="pair", layout="interleaved", first="sin", start=0, invert=False):
    """A sinusoidal table with one deliberate deviation (NumPy, float64 -> float32 tensor)."""
    pos = np.arange(start, start + max_len, dtype=np.float64)[:, None]
    j = np.arange(d)[None, :]
    if layout == "halves":  # [sin of all frequencies | cos of all frequencies]
        half = (d + 1) // 2
        i = np.where(j < half, j, j - half)
        rate = 10000.0 ** (-(2 * i) / d)
        ang = pos * rate
        pe = np.where(j < half, np.sin(ang), np.cos(ang))
        return torch.from_numpy(pe).float()
    if exponent == "pair":
        e = 2 * (j // 2) / d
    elif exponent == "column":  # cos column 2i+1 uses (2i+1)/d
        e = j / d
    else:  # "half": i/d instead of 2i/d
        e = (j // 2) / d
    ang = pos * 10000.0 ** (e if invert else -e)
    even = j % 2 == 0
    if first == "sin":
        pe = np.where(even, np.sin(ang), np.cos(ang))
    else:
        pe = np.where(even, np.cos(ang), np.sin(ang))
    return torch.from_numpy(pe).float()


def _sinusoidal_variants() -> dict:
    return {
        "halves": ("sines in the first half and cosines in the second: interleave them "
                   "(column 2i = sin, column 2i+1 = cos of the same frequency).", deviation(_table, layout="halves")),
        "cos_first": ("sin and cos swapped: even columns (0, 2, ...) hold sin, odd columns hold cos.",
                      deviation(_table, first="cos")),
        "column_exponent": ("column 2i+1 uses exponent (2i+1)/d_model: the cosine must share the frequency of "
                            "its sine, 10000^(2i/d_model).", deviation(_table, exponent="column")),
        "half_exponent": ("exponent i/d_model instead of 2i/d_model (i is the pair index, 2i the even column).",
                          deviation(_table, exponent="half")),
        "inverted": ("frequencies grow with the dimension: divide the position by 10000^(2i/d_model), "
                     "don't multiply.", deviation(_table, invert=True)),
        "start_one": ("positions start at 1; they start at 0 (row 0 is sin 0, cos 0 = 0, 1, 0, 1, ...).",
                      deviation(_table, start=1)),
    }


def _rotation(omega, phi, transpose=False, no_omega=False):
    angle = (torch.ones_like(omega) if no_omega else omega) * phi
    c, s = torch.cos(angle), torch.sin(angle)
    m = torch.stack([c, s, -s, c], -1).reshape(*omega.shape, 2, 2)
    return m.transpose(-1, -2) if transpose else m


def _shiftmat_variants() -> dict:
    return {
        "transposed": ("that is M(-phi), the transpose: it shifts by -phi. The sine of pos + phi is the sine "
                       "of pos times cos(omega phi) plus its cosine times sin(omega phi).",
                       deviation(_rotation, transpose=True)),
        "no_omega": ("the rotation angle is omega * phi, not phi.",
                     deviation(_rotation, no_omega=True)),
    }


def _shift(pe, omega, phi, transpose=False, halves=False):
    m = _rotation(omega.to(pe.dtype), phi, transpose=transpose)
    if halves:
        h = pe.shape[-1] // 2
        pairs = torch.stack([pe[..., :h], pe[..., h:]], -1)
        out = (m @ pairs.unsqueeze(-1)).squeeze(-1)
        return torch.cat([out[..., 0], out[..., 1]], -1)
    pairs = pe.unflatten(-1, (-1, 2))
    return (m @ pairs.unsqueeze(-1)).squeeze(-1).flatten(-2)


def _shift_variants() -> dict:
    return {
        "transposed": ("each pair is rotated by M transposed, i.e. shifted by -phi: multiply M @ pair, "
                       "with pair = [column 2i, column 2i+1] as a column vector.",
                       deviation(_shift, transpose=True)),
        "halves": ("pairs taken from the two halves of the code; pair i is the interleaved columns (2i, 2i+1).",
                   deviation(_shift, halves=True)),
        "unchanged": ("returned the codes unchanged: rotate every pair by its matrix.",
                      lambda ns: lambda pe, omega, phi: pe.clone()),
    }


def _posenc_variants(full_length: bool = False) -> dict:
    def subclass(ns, forward):
        return with_forward(ns, "PositionalEncoding", forward)

    def batch_axis(self, x):  # seq-first code on batch-first inputs: position b added to sequence b
        pe = _table(self.max_len, self.d_model).to(x.dtype)
        return x + pe[: x.shape[0]][:, None, :]

    def scaled(self, x):
        pe = _table(self.max_len, self.d_model).to(x.dtype)
        return x * self.d_model ** 0.5 + pe[: x.shape[1]]

    def last_rows(self, x):
        pe = _table(self.max_len, self.d_model).to(x.dtype)
        return x + pe[-x.shape[1]:]

    def dropout_first(self, x):  # dropout on the embeddings only, the table added after it
        return self.dropout(x) + _table(self.max_len, self.d_model).to(x.dtype)[: x.shape[1]]

    def table_dropped(self, x):  # dropout on the table only
        return x + self.dropout(_table(self.max_len, self.d_model).to(x.dtype)[: x.shape[1]])

    def no_dropout(self, x):
        return x + _table(self.max_len, self.d_model).to(x.dtype)[: x.shape[1]]

    variants = {
        "dropout_before_add": ("dropout applied to x before the table is added: the layer returns "
                               "dropout(x + pe[:T]), one dropout on the sum.", lambda ns: subclass(ns, dropout_first)),
        "dropout_on_table": ("dropout applied to the table only: the layer returns dropout(x + pe[:T]), one "
                             "dropout on the sum.", lambda ns: subclass(ns, table_dropped)),
        "no_dropout": ("no dropout in training mode: apply the given self.dropout to x + pe[:T] (it is off only in "
                       "eval mode).", lambda ns: subclass(ns, no_dropout)),
        "batch_axis": ("positions taken along the batch axis: inputs are batch-first (B, T, d_model), "
                       "so T = x.shape[1] and pe[:T] is added to every sequence.", lambda ns: subclass(ns, batch_axis)),
        "scaled": ("x was scaled by sqrt(d_model): this layer only adds pe[:T] (scaling belongs to the "
                   "embedding layer, if anywhere).", lambda ns: subclass(ns, scaled)),
        "last_rows": ("added the last T rows of the table: positions 0..T-1 are pe[:T].",
                      lambda ns: subclass(ns, last_rows)),
    }
    if full_length:  # T == max_len: the last T rows are the first T rows
        del variants["last_rows"]
    return variants


def _rope(x, offset, halves=False, sign=1.0, use_offset=True, start=0, exponent="pair", angles=torch.float64):
    """Rotary position embedding with one deliberate deviation (angles in float64 unless `angles` says)."""
    d = x.shape[-1]
    pos = torch.arange(x.shape[-2], dtype=angles) + (offset if use_offset else 0) + start
    i = torch.arange(d // 2, dtype=angles)
    omega = 10000.0 ** (-(2 * i if exponent == "pair" else i) / d)
    angle = sign * pos[:, None] * omega[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    if halves:  # pairs (i, i + d/2): GPT-NeoX's and Llama's rotate_half layout
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


def _rope_variants(offset: int) -> dict:
    variants = {
        "halves": ("pairs taken as (i, i + d/2), the layout of GPT-NeoX's and Llama's rotate_half: here pair i is the "
                   "interleaved columns (2i, 2i+1), as in section 4.", deviation(_rope, halves=True)),
        "reversed": ("each pair is rotated the other way, by M(omega_i pos) itself: RoPE here is (a, b) -> "
                     "(a cos - b sin, a sin + b cos), the transpose.", deviation(_rope, sign=-1.0)),
        "from_one": ("positions start at offset + 1: row t of x is at position offset + t, row 0 at offset.",
                     deviation(_rope, start=1)),
        "half_exponent": ("omega_i = 10000^(-i/d) instead of 10000^(-2i/d) (i is the pair index, 2i its first "
                          "column).", deviation(_rope, exponent="half")),
        "float32_angles": ("the angles lose digits at large positions: pos * omega in float32 is off by about "
                           "a thousandth of a radian at positions in the hundreds of thousands; the angles must be "
                           "accurate before the rotation.",
                           deviation(_rope, angles=torch.float32)),
    }
    if offset:
        variants["offset_ignored"] = ("the offset is ignored: row t is at position offset + t, so a single row "
                                      "decoded after `offset` others is rotated for its own place.",
                                      deviation(_rope, use_offset=False))
    return variants


# ---- cases ----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SinusoidalCase(Row):
    """sinusoidal_encoding(max_len, d_model)."""
    max_len: int
    d_model: int
    atol: float = 1e-5


@dataclass(frozen=True, kw_only=True)
class ShiftMatrixCase(Row):
    """relative_shift_matrix(omega, phi)."""
    omega: torch.Tensor
    phi: float
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class ShiftCase(Row):
    """shift_encoding(pe, omega, phi)."""
    pe: torch.Tensor
    omega: torch.Tensor
    phi: float
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class PosEncCase(Row):
    """PositionalEncoding(d_model=shape[-1], max_len, dropout).forward(x of `shape`); a sequence longer than
    max_len is a case of bad input (a ValueError)."""
    shape: tuple[int, ...]  # of x, (B, T, d_model)
    max_len: int
    dtype: torch.dtype = torch.float32
    grad: bool = False
    train_seed: int | None = None  # train mode with dropout 0.5, this seed: where the dropout goes


@dataclass(frozen=True, kw_only=True)
class RopeCase(Row):
    """apply_rope(x, offset); an odd last axis is a case of bad input (a ValueError)."""
    shape: tuple[int, ...]
    offset: int = 0
    dtype: torch.dtype = torch.float32
    grad: bool = False
    atol: float = 1e-5


def _omegas(d, dtype=torch.float32):
    return (10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)).to(dtype)


def _sinusoidal_spec(c: SinusoidalCase) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="sinusoidal_encoding", args=[], const_args=[c.max_len, c.d_model], inputs={},
        outputs=["pe"], variants=_sinusoidal_variants(), atol=c.atol, public=c.public,
        hint="pe[pos, 2i] = sin(pos / 10000^(2i/d_model)), pe[pos, 2i+1] = cos(same angle).")


def _shift_matrix_spec(c: ShiftMatrixCase) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="relative_shift_matrix", args=["omega"], const_args=[c.phi], inputs={"omega": c.omega},
        outputs=["M"], grad_wrt=["omega"] if c.grad else [], variants=_shiftmat_variants(), public=c.public,
        hint="one 2 x 2 rotation M(phi) per frequency omega, as section 4 defines it (the matrix that turns "
             "PE(pos) into PE(pos + phi)).")


def _shift_spec(c: ShiftCase) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="shift_encoding", args=["pe", "omega"], const_args=[c.phi],
        inputs={"pe": c.pe, "omega": c.omega}, outputs=["shifted"], grad_wrt=["pe"] if c.grad else [],
        variants=_shift_variants(), public=c.public,
        hint="pair i = (pe[..., 2i], pe[..., 2i+1]) becomes relative_shift_matrix(omega[i], phi) @ pair i.")


def _posenc_spec(c: PosEncCase, g: torch.Generator) -> CaseSpec:
    too_long = c.shape[1] > c.max_len  # a case of bad input: the layer must raise, nothing is compared
    raises = ["raises", "ValueError", f"when the sequence (T = {c.shape[1]}) is longer than max_len = {c.max_len}"]
    return CaseSpec(
        name=c.name, target="PositionalEncoding", kind="module",
        init={"d_model": c.shape[-1], "max_len": c.max_len, "dropout": 0.1 if c.train_seed is None else 0.5},
        train_seed=c.train_seed,
        args=["x"], inputs={"x": randn(*c.shape, g=g, dtype=c.dtype)}, outputs=["output"],
        grad_wrt=["x"] if c.grad else [], variants={} if too_long else _posenc_variants(c.shape[1] == c.max_len),
        properties=[raises] if too_long else [], public=c.public,
        hint="" if too_long else "the output is dropout(x + pe[:T]) with T = x.shape[1] (dropout is off in the "
                                 "checks, except in the one about dropout, which runs in training mode).")


def _rope_spec(c: RopeCase, g: torch.Generator) -> CaseSpec:
    odd = c.shape[-1] % 2 == 1  # a case of bad input: apply_rope must raise, nothing is compared
    raises = ["raises", "ValueError", f"when the last axis is odd (d = {c.shape[-1]})"]
    return CaseSpec(
        name=c.name, target="apply_rope", args=["x"], const_args=[c.offset],
        inputs={"x": randn(*c.shape, g=g, dtype=c.dtype)}, outputs=["rotated"], grad_wrt=["x"] if c.grad else [],
        variants={} if odd else _rope_variants(c.offset), properties=[raises] if odd else [], atol=c.atol,
        public=c.public,
        hint="" if odd else "column pair (2i, 2i+1) of row t rotated by omega_i * (offset + t), "
                            "omega_i = 10000^(-2i/d): (a, b) -> (a cos - b sin, a sin + b cos).")


def _table_as_attribute(ns: dict, moved_in_forward: bool) -> type:
    """The notebook's PositionalEncoding with its table kept as a plain attribute instead of a buffer (and, if
    `moved_in_forward`, moved to the input's device by hand in forward)."""
    base: type = ns["PositionalEncoding"]

    class Attribute(base):  # the notebook's class, known at run time
        def __init__(self, d_model, max_len=5000, dropout=0.1):
            nn.Module.__init__(self)
            self.d_model, self.max_len, self.dropout = d_model, max_len, nn.Dropout(dropout)
            self.pe = _table(max_len, d_model)

        def forward(self, x):
            pe = self.pe[: x.shape[1]]
            return self.dropout(x + (pe.to(x) if moved_in_forward else pe))
    return Attribute


def _follows_spec(c: PosEncCase, g: torch.Generator) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="follows_module(PositionalEncoding)", args=["x"], const_args=[c.max_len],
        inputs={"x": randn(*c.shape, g=g, dtype=c.dtype)}, outputs=["follows"], public=c.public,
        variants={
            "plain_attribute": ("the table stays on the CPU when the module moves with `.to(device)`: store it "
                                "with self.register_buffer(\"pe\", table, persistent=False), not as an attribute.",
                                lambda ns: follows_module(_table_as_attribute(ns, False))),
            "moved_in_forward": ("the table is not a buffer named \"pe\" (it is moved by hand in forward): register "
                                 "it with self.register_buffer(\"pe\", table, persistent=False).",
                                 lambda ns: follows_module(_table_as_attribute(ns, True))),
        },
        hint="[the output is on the module's device, the table is the buffer `pe`]: register the table with "
             "self.register_buffer(\"pe\", table, persistent=False).")


def cases(ns) -> list[CaseSpec]:
    ns["follows_module(PositionalEncoding)"] = follows_module(ns["PositionalEncoding"])  # as the test cell wraps it
    g = torch.Generator().manual_seed(2025)
    out = []
    # sinusoidal_encoding(max_len, d_model)
    out += [_sinusoidal_spec(c) for c in [
        SinusoidalCase(name="sinusoidal/8x16", max_len=8, d_model=16, public=True),
        SinusoidalCase(name="sinusoidal/odd", max_len=12, d_model=7),
        SinusoidalCase(name="sinusoidal/one_position", max_len=1, d_model=6),
        SinusoidalCase(name="sinusoidal/long", max_len=200, d_model=64, atol=LONG_ATOL),
        SinusoidalCase(name="sinusoidal/d2", max_len=30, d_model=2),
        # public: an odd d_model (the last column is a sin with no cos partner), which hidden cases vary too
        SinusoidalCase(name="sinusoidal/odd_5", max_len=6, d_model=5, public=True),
    ]]
    # relative_shift_matrix(omega, phi)
    out += [_shift_matrix_spec(c) for c in [
        ShiftMatrixCase(name="shiftmat/basic", omega=torch.tensor([1.0, 0.3, 0.05, 0.001]), phi=3, public=True),
        ShiftMatrixCase(name="shiftmat/scalar", omega=torch.tensor(0.7), phi=1.5),
        ShiftMatrixCase(name="shiftmat/2d_float64", omega=torch.rand(2, 3, generator=g, dtype=torch.float64), phi=-2),
        ShiftMatrixCase(name="shiftmat/grad", omega=torch.rand(5, generator=g, dtype=torch.float64).float(), phi=4,
                        grad=True),
    ]]
    # shift_encoding(pe, omega, phi)
    pe_true = ns["sinusoidal_encoding"](12, 8)
    out += [_shift_spec(c) for c in [
        ShiftCase(name="shift/basic", pe=pe_true[:9], omega=_omegas(8), phi=3, public=True),
        ShiftCase(name="shift/batched", pe=randn(2, 5, 6, g=g), omega=_omegas(6), phi=2),
        ShiftCase(name="shift/float64", pe=randn(4, 10, g=g, dtype=torch.float64), omega=_omegas(10, torch.float64),
                  phi=-5),
        ShiftCase(name="shift/grad", pe=randn(3, 4, g=g), omega=_omegas(4), phi=7, grad=True),
    ]]
    # PositionalEncoding(d_model, max_len, dropout).forward(x); a sequence longer than max_len must raise
    out += [_posenc_spec(c, g) for c in [
        PosEncCase(name="posenc/basic", shape=(2, 6, 8), max_len=10, public=True),
        PosEncCase(name="posenc/full_length", shape=(3, 7, 4), max_len=7),
        PosEncCase(name="posenc/odd_float64", shape=(2, 5, 5), max_len=9, dtype=torch.float64),
        PosEncCase(name="posenc/grad", shape=(2, 3, 6), max_len=16, grad=True),
        PosEncCase(name="posenc/train_dropout", shape=(2, 6, 8), max_len=12, train_seed=11, public=True),
        PosEncCase(name="posenc/train_dropout_long", shape=(3, 9, 6), max_len=9, train_seed=12),
        PosEncCase(name="posenc/too_long", shape=(2, 12, 8), max_len=10, public=True),
        PosEncCase(name="posenc/too_long_by_one", shape=(1, 6, 4), max_len=5),
    ]]
    # the table is a buffer: it follows the module to another device (PyTorch's "meta" device here)
    out += [_follows_spec(c, g) for c in [
        PosEncCase(name="posenc/follows_module", shape=(2, 5, 8), max_len=10, public=True),
        PosEncCase(name="posenc/follows_module_float64", shape=(1, 7, 6), max_len=7, dtype=torch.float64),
    ]]
    # apply_rope(x, offset): its own generator, so that the cases above keep their inputs
    g_rope = torch.Generator().manual_seed(2031)
    out += [_rope_spec(c, g_rope) for c in [
        RopeCase(name="rope/basic", shape=(2, 6, 8), public=True),
        RopeCase(name="rope/offset", shape=(3, 4), offset=5, public=True),
        RopeCase(name="rope/heads", shape=(2, 3, 5, 6)),
        RopeCase(name="rope/one_cached_step", shape=(2, 4, 1, 8), offset=11),
        RopeCase(name="rope/long_float64", shape=(40, 16), offset=100, dtype=torch.float64, atol=1e-10),
        RopeCase(name="rope/d2", shape=(7, 2), offset=3),
        RopeCase(name="rope/grad", shape=(2, 5, 4), offset=2, grad=True),
        RopeCase(name="rope/far_float32", shape=(3, 32), offset=100_000, atol=1e-4),
        RopeCase(name="rope/odd_d", shape=(2, 4, 5), public=True),
    ]]
    # public: a far position (the float32 angles' loss shows), its own generator too
    out += [_rope_spec(RopeCase(name="rope/far", shape=(2, 16), offset=200_000, atol=1e-4, public=True),
                       torch.Generator().manual_seed(2032))]
    return out
