"""Reference cases of notebook 02 (positional encoding).

Public cases (public=True) are what students see in the test cells; hidden ones use an odd d_model,
a single position, long tables, batched and float64 inputs, gradients, and the off-by-one length.
Variants are known bugs, written here independently of the solution, that the check names.
"""
from __future__ import annotations

import numpy as np
import torch

from grading.references import CaseSpec, randn

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
    def v(**kw):
        return lambda ns: lambda max_len, d: _table(max_len, d, **kw)

    return {
        "halves": ("sines in the first half and cosines in the second: interleave them "
                   "(column 2i = sin, column 2i+1 = cos of the same frequency).", v(layout="halves")),
        "cos_first": ("sin and cos swapped: even columns (0, 2, ...) hold sin, odd columns hold cos.",
                      v(first="cos")),
        "column_exponent": ("column 2i+1 uses exponent (2i+1)/d_model: the cosine must share the frequency of "
                            "its sine, 10000^(2i/d_model).", v(exponent="column")),
        "half_exponent": ("exponent i/d_model instead of 2i/d_model (i is the pair index, 2i the even column).",
                          v(exponent="half")),
        "inverted": ("frequencies grow with the dimension: divide the position by 10000^(2i/d_model), "
                     "don't multiply.", v(invert=True)),
        "start_one": ("positions start at 1; they start at 0 (row 0 is sin 0, cos 0 = 0, 1, 0, 1, ...).",
                      v(start=1)),
    }


def _rotation(omega, phi, transpose=False, no_omega=False):
    angle = (torch.ones_like(omega) if no_omega else omega) * phi
    c, s = torch.cos(angle), torch.sin(angle)
    m = torch.stack([c, s, -s, c], -1).reshape(*omega.shape, 2, 2)
    return m.transpose(-1, -2) if transpose else m


def _shiftmat_variants() -> dict:
    return {
        "transposed": ("that is M(-phi), the transpose: it shifts by -phi. The sine row is "
                       "[cos(omega*phi), sin(omega*phi)], the cosine row [-sin(omega*phi), cos(omega*phi)].",
                       lambda ns: lambda omega, phi: _rotation(omega, phi, transpose=True)),
        "no_omega": ("the rotation angle is omega * phi, not phi.",
                     lambda ns: lambda omega, phi: _rotation(omega, phi, no_omega=True)),
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
                       lambda ns: lambda pe, omega, phi: _shift(pe, omega, phi, transpose=True)),
        "halves": ("pairs taken from the two halves of the code; pair i is the interleaved columns (2i, 2i+1).",
                   lambda ns: lambda pe, omega, phi: _shift(pe, omega, phi, halves=True)),
        "unchanged": ("returned the codes unchanged: rotate every pair by its matrix.",
                      lambda ns: lambda pe, omega, phi: pe.clone()),
    }


def _posenc_variants(full_length: bool = False) -> dict:
    def subclass(ns, forward):
        return type("Buggy", (ns["PositionalEncoding"],), {"forward": forward})

    def batch_axis(self, x):  # seq-first code on batch-first inputs: position b added to sequence b
        pe = _table(self.max_len, self.d_model).to(x.dtype)
        return x + pe[: x.shape[0]][:, None, :]

    def scaled(self, x):
        pe = _table(self.max_len, self.d_model).to(x.dtype)
        return x * self.d_model ** 0.5 + pe[: x.shape[1]]

    def last_rows(self, x):
        pe = _table(self.max_len, self.d_model).to(x.dtype)
        return x + pe[-x.shape[1]:]

    variants = {
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


# ---- cases ----------------------------------------------------------------------------------------


def cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(2025)
    out = []

    # sinusoidal_encoding(max_len, d_model)
    for name, (max_len, d, atol, public) in {
        "sinusoidal/8x16": (8, 16, 1e-5, True),
        "sinusoidal/odd": (12, 7, 1e-5, False),
        "sinusoidal/one_position": (1, 6, 1e-5, False),
        "sinusoidal/long": (200, 64, LONG_ATOL, False),
        "sinusoidal/d2": (30, 2, 1e-5, False),
    }.items():
        out.append(CaseSpec(
            name=name, target="sinusoidal_encoding", args=[], const_args=[max_len, d], inputs={}, outputs=["pe"],
            variants=_sinusoidal_variants(),
            atol=atol, public=public,
            hint="pe[pos, 2i] = sin(pos / 10000^(2i/d_model)), pe[pos, 2i+1] = cos(same angle)."))

    # relative_shift_matrix(omega, phi)
    for name, (omega, phi, grad, public) in {
        "shiftmat/basic": (torch.tensor([1.0, 0.3, 0.05, 0.001]), 3, False, True),
        "shiftmat/scalar": (torch.tensor(0.7), 1.5, False, False),
        "shiftmat/2d_float64": (torch.rand(2, 3, generator=g, dtype=torch.float64), -2, False, False),
        "shiftmat/grad": (torch.rand(5, generator=g, dtype=torch.float64).float(), 4, True, False),
    }.items():
        out.append(CaseSpec(
            name=name, target="relative_shift_matrix", args=["omega"], const_args=[phi], inputs={"omega": omega},
            outputs=["M"], grad_wrt=["omega"] if grad else [], variants=_shiftmat_variants(), public=public,
            hint="M = [[cos(omega*phi), sin(omega*phi)], [-sin(omega*phi), cos(omega*phi)]] for each omega."))

    # shift_encoding(pe, omega, phi)
    def omegas(d, dtype=torch.float32):
        return (10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)).to(dtype)

    pe_true = ns["sinusoidal_encoding"](12, 8)
    for name, (pe, omega, phi, grad, public) in {
        "shift/basic": (pe_true[:9], omegas(8), 3, False, True),
        "shift/batched": (randn(2, 5, 6, g=g), omegas(6), 2, False, False),
        "shift/float64": (randn(4, 10, g=g, dtype=torch.float64), omegas(10, torch.float64), -5, False, False),
        "shift/grad": (randn(3, 4, g=g), omegas(4), 7, True, False),
    }.items():
        out.append(CaseSpec(
            name=name, target="shift_encoding", args=["pe", "omega"], const_args=[phi],
            inputs={"pe": pe, "omega": omega}, outputs=["shifted"], grad_wrt=["pe"] if grad else [],
            variants=_shift_variants(), public=public,
            hint="pair i = (pe[..., 2i], pe[..., 2i+1]) becomes relative_shift_matrix(omega[i], phi) @ pair i."))

    # PositionalEncoding(d_model, max_len, dropout).forward(x)
    for name, (shape, max_len, dtype, grad, public) in {
        "posenc/basic": ((2, 6, 8), 10, torch.float32, False, True),
        "posenc/full_length": ((3, 7, 4), 7, torch.float32, False, False),
        "posenc/odd_float64": ((2, 5, 5), 9, torch.float64, False, False),
        "posenc/grad": ((2, 3, 6), 16, torch.float32, True, False),
    }.items():
        out.append(CaseSpec(
            name=name, target="PositionalEncoding", kind="module",
            init={"d_model": shape[-1], "max_len": max_len, "dropout": 0.1},
            args=["x"], inputs={"x": randn(*shape, g=g, dtype=dtype)}, outputs=["output"],
            grad_wrt=["x"] if grad else [], variants=_posenc_variants(shape[1] == max_len), public=public,
            hint="the output is x + pe[:T] with T = x.shape[1] (dropout is off in checks)."))

    for name, (shape, max_len, public) in {
        "posenc/too_long": ((2, 12, 8), 10, True),
        "posenc/too_long_by_one": ((1, 6, 4), 5, False),
    }.items():
        out.append(CaseSpec(
            name=name, target="PositionalEncoding", kind="module",
            init={"d_model": shape[-1], "max_len": max_len, "dropout": 0.1},
            args=["x"], inputs={"x": randn(*shape, g=g)}, outputs=["output"], public=public,
            properties=[["raises", "ValueError",
                         f"when the sequence (T = {shape[1]}) is longer than max_len = {max_len}"]]))
    return out
