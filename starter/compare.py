"""The comparison shared by the notebooks' checks and the grader's judge.

A reference case (`starter.cases.Case`) holds inputs, expected outputs, expected gradients and the outputs of
known buggy implementations, in an HDF5 file built by ``python -m grading references``. Public cases ship in
``starter/references``; hidden cases are only present while grading.

A comparison is two steps with plain data between them: ``observe`` runs the student's code on the case's
inputs and records what came out (an ``Observation``: arrays, dtype names, an error message), and ``verdict``
(``diagnose``, with the kind of failure) compares that with the expected outputs. In a notebook both run in
the student's kernel (``starter.checks.check``). While grading, the student's code runs in a sandbox that holds
only the cases' *inputs*: there the observation is written to a folder (``record``, JSON and .npz) and the
grader's judge, outside the sandbox, reads it back (``read_observations``) and calls the same ``diagnose``. One
implementation, so the grade and the student's message always agree.

Imports only the case format, the kit's stand-in layers and (for trained-model cases) the vocabulary: never
the notebooks' adapters or the student API, which import this.
"""
from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import re
import stat
import sys
import threading
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .cases import Case, case_groups, read_case
from .stand_ins import stand_in

# Primitives bound once, when this module is imported (before any student code runs), and used
# instead of attribute look-ups that student code could monkeypatch (torch.Tensor methods,
# numpy functions, builtins). `torch._C.TensorBase` is a C type: its methods cannot be replaced.
_TB = torch._C.TensorBase
_isinstance, _tuple, _len = builtins.isinstance, builtins.tuple, builtins.len
_get_ident = threading.get_ident
_np_abs, _np_isnan, _np_array_equal = np.abs, np.isnan, np.array_equal
_from_numpy, _mul, _sum, _backward = torch.from_numpy, torch.mul, torch.sum, torch.autograd.backward
# (getset descriptors of the C type, which mypy sees as the attributes' values)
_dtype_of = _TB.dtype.__get__  # type: ignore[attr-defined]
_grad_of = _TB.grad.__get__  # type: ignore[union-attr]
_requires_grad_of = _TB.requires_grad.__get__  # type: ignore[attr-defined]

PUBLIC_DIR = Path(__file__).resolve().parent / "references"
HIDDEN_ENV = "COURSE_HIDDEN_REFERENCES"  # a folder of hidden reference files (grading only)
RESULTS_ENV = "COURSE_RESULTS_DIR"  # grading sandbox: record observations there instead of judging
CASE_INPUTS_ENV = "COURSE_CASE_INPUTS"  # grading sandbox: a folder of hidden cases without expected outputs


class CheckFailed(AssertionError):
    """A check failed. Shown in Jupyter as this one line, without a traceback."""

    error: BaseException | None = None  # the student's exception behind it, if any

    def _render_traceback_(self):  # IPython calls this instead of printing the traceback
        return [f"\x1b[31mCheckFailed\x1b[0m: {self}"]


# --------------------------------------------------------------------------------------------------
# Finding and reading cases

def reference_dirs() -> list[Path]:
    dirs = [PUBLIC_DIR] + [Path(os.environ[env]) for env in (HIDDEN_ENV, CASE_INPUTS_ENV) if os.environ.get(env)]
    return [d for d in dirs if d.is_dir()]


def case_file(name: str, dirs: list[Path] | None = None) -> Path | None:
    """The reference file that holds case `name` (None: no such case in `dirs`)."""
    for d in reference_dirs() if dirs is None else dirs:
        path = _case_index(Path(d)).get(name)
        if path is not None:
            return path
    return None


_INDEX: dict[Path, tuple[tuple, dict[str, Path]]] = {}


def _case_index(folder: Path) -> dict[str, Path]:
    """{case name: file} of the .h5 files of `folder`; read again only when a file changes."""
    files = sorted(folder.glob("*.h5")) if folder.is_dir() else []
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    cached = _INDEX.get(folder)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    index: dict[str, Path] = {}
    for path in files:
        try:
            with h5py.File(path, "r") as f:
                for n, _ in case_groups(f):
                    index.setdefault(n, path)
        except OSError:
            continue
    _INDEX[folder] = (stamp, index)
    return index


def case_names(folder: Path) -> set[str]:
    """The names of the reference cases stored in the .h5 files of `folder`."""
    return set(_case_index(Path(folder))) if folder else set()


def load_case(name: str, dirs: list[Path] | None = None) -> Case:
    """Load a stored reference case by name, e.g. ``load_case("sdpa/basic")``.

    Useful for debugging: ``case.inputs``, ``case.expected`` are numpy arrays. `dirs`: the folders
    to look in (default: the public references, and the hidden ones while grading).
    """
    path = case_file(name, dirs)
    if path is None:
        raise CheckFailed(
            f"reference case '{name}' not found. Hidden cases exist only while grading; "
            f"public ones ship in {PUBLIC_DIR} (reinstall the course kit if it is missing)."
        )
    try:
        with h5py.File(path, "r") as f:
            return read_case(f[name], name)
    except (OSError, KeyError, ValueError) as exc:
        raise CheckFailed(f"reference file {path.name} is damaged ({exc}); reinstall the course kit.") from None


# --------------------------------------------------------------------------------------------------
# Running the student's code

class _Forbidden(Exception):
    """The student's code reached something its case forbids: `name` is what it called, `rule` the rule of
    RULES it broke (None for a dotted name of `forbid`); `named` once `name` is the torch function the
    student's code called rather than the ATen operator it ended in."""

    def __init__(self, name: str, rule: str | None = None, named: bool = False, held: int = 0, limit: int = 0):
        super().__init__(name)
        self.name, self.rule, self.named = name, rule, named
        self.held, self.limit = held, limit


# Rules a case's `forbid` may name besides dotted names: what a task is to write by hand, refused however the
# student's code reaches it. A dotted name is swapped for a tripwire while the case runs, which an alias taken
# before (`_mm = torch.matmul`) escapes; a rule is enforced by watching every operation torch runs for the
# student's code (_watching), whatever name reached it. Neither sees work done outside torch (NumPy).
MATRIX_PRODUCTS = "matrix products"  # any torch product of whole matrices: more than one dot product at once
READY_MADE_SOFTMAX = "ready-made softmax"  # torch's softmax in any form (softmax, log_softmax, softmin, ...)
READY_MADE_ATTENTION = "ready-made attention"  # torch's fused attention kernels, whatever name or alias reached them
RULES = (MATRIX_PRODUCTS, READY_MADE_SOFTMAX, READY_MADE_ATTENTION)
# A rule with a number: f"{HELD_AT_MOST}{n}" refuses any operation that makes a tensor holding more than n numbers
# (its storage, so a view or a broadcast of an input counts what it shares, not its shape): a task whose point is
# to never hold a large intermediate, attention in blocks without the whole score matrix.
HELD_AT_MOST = "tensors of at most "


def _held_limit(rules: list[str]) -> int | None:
    limits = [int(r[_len(HELD_AT_MOST):]) for r in rules if r.startswith(HELD_AT_MOST)]
    return min(limits) if limits else None


def held_numbers(t) -> int:
    """How many numbers a tensor's storage holds (its own memory, however it is viewed)."""
    return _TB.untyped_storage(t).nbytes() // max(1, _TB.element_size(t))


def largest_held(result) -> int:
    """The most numbers any tensor of an operation's result (a tensor, or a tuple or list of them) holds."""
    parts = result if _isinstance(result, (_tuple, list)) else (result,)
    return max((held_numbers(t) for t in parts if _isinstance(t, _TB)), default=0)


# Where the work of a case with rules may not go: another thread or process, where the rules' watch (per thread) does
# not see it. Swapped for tripwires while such a case runs.
THREAD_STARTS = ("threading.Thread.start", "multiprocessing.process.BaseProcess.start")


def _is_rule(name: str) -> bool:
    return name in RULES or name.startswith(HELD_AT_MOST)
# The ATen operators (by name) that each rule refuses: what every torch function doing that work ends in on the
# CPU, where checks run (torch.matmul, @, mm, bmm, einsum, tensordot, F.linear, convolutions and the fused
# attention kernels of F.scaled_dot_product_attention end in the products; F.softmax, Tensor.softmax,
# torch.special.softmax, log_softmax and softmin in the softmaxes). A dot product of two vectors ends in
# `dot` (or in a product whose result is one number) and is allowed.
_PRODUCT_OPS = frozenset({"mm", "bmm", "mv", "addmm", "addmv", "addbmm", "baddbmm", "_addmm_activation", "_int_mm",
                          "convolution", "_convolution"})
_FUSED_ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention")  # parts of their names
_SOFTMAX_OPS = frozenset({"_softmax", "_log_softmax", "_safe_softmax", "_masked_softmax", "_sparse_softmax",
                          "_sparse_log_softmax"})


@contextlib.contextmanager
def value_dropout(seed: int | None):
    """For a case about dropout (`seed` not None): while the case runs, F.dropout (which nn.Dropout calls)
    scales each element by a smooth function of its own value and of p instead of a random mask, and the
    random generator is seeded for anything else. Where dropout goes still shows (on the weights, the
    output, after the residual: each gives other numbers), but not how the answer calls it: per head or
    once, one module or one per use, on a view or a copy, the same values get the same factors. A random
    mask depends on the order and shape of the calls, so a correct answer that loops over the heads would
    differ from the reference everywhere. Nothing changes when `seed` is None."""
    if seed is None:
        yield
        return
    functional = torch.nn.functional
    original = functional.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return input
        kept = 1 - p * (1 + torch.cos(6 * input + 1)) / 2  # in [1 - p, 1]: how much of each value stays
        out = input * kept / (1 - p) if p < 1 else input * 0
        return input.copy_(out) if inplace else out

    torch.manual_seed(seed)
    functional.dropout = dropout
    try:
        yield
    finally:
        functional.dropout = original


@contextlib.contextmanager
def _tripwires(names: list[str]):
    """Temporarily replace library functions (dotted names) with ones that raise _Forbidden; the rules among
    `names` (RULES) are _watching's."""
    import importlib

    saved, checking = [], _get_ident()
    try:
        for dotted in names:
            if _is_rule(dotted):
                continue
            owner_name, attr = dotted.rsplit(".", 1)
            try:
                owner = importlib.import_module(owner_name)
            except ImportError:
                mod_name, cls_name = owner_name.rsplit(".", 1)
                owner = getattr(importlib.import_module(mod_name), cls_name)
            original = getattr(owner, attr)

            def tripwire(*args, _name=dotted, _original=original, **kwargs):
                # a thread or process started by another thread (the kernel's own machinery) is not the checked code's
                if _name in THREAD_STARTS and _get_ident() != checking:
                    return _original(*args, **kwargs)
                raise _Forbidden(_name)

            saved.append((owner, attr, original))
            setattr(owner, attr, tripwire)
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


class _RefuseOperators(TorchDispatchMode):
    """Sees every ATen operator torch runs while it is active, whatever Python name or alias reached it, and
    raises _Forbidden for those that `rules` refuse (a product is refused only when it yields more than one
    number: a dot product of two vectors is fine)."""

    def __init__(self, rules: list[str]):
        super().__init__()
        self.rules = rules
        self.limit = _held_limit(rules)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = func.overloadpacket.__name__
        if READY_MADE_SOFTMAX in self.rules and op in _SOFTMAX_OPS:
            raise _Forbidden(f"aten.{op}", READY_MADE_SOFTMAX)
        if READY_MADE_ATTENTION in self.rules and any(p in op for p in _FUSED_ATTENTION_OPS):
            raise _Forbidden(f"aten.{op}", READY_MADE_ATTENTION)
        out = func(*args, **(kwargs or {}))
        if self.limit is not None and (held := largest_held(out)) > self.limit:
            raise _Forbidden(f"aten.{op}", HELD_AT_MOST, held=held, limit=self.limit)
        if MATRIX_PRODUCTS in self.rules and (op in _PRODUCT_OPS or any(p in op for p in _FUSED_ATTENTION_OPS)):
            if not (_isinstance(out, _TB) and _TB.numel(out) <= 1):
                raise _Forbidden(f"aten.{op}", MATRIX_PRODUCTS)
        return out


class _NameTheCall(TorchFunctionMode):
    """Sees every torch function the student's code calls (the mode is off inside it, so only the outermost
    call): when _RefuseOperators refuses an operator under it, the message names the function the student
    wrote (`torch.matmul`, `torch.Tensor.softmax`), not the ATen operator it ended in. Without it (code that
    switched torch functions' overrides off) the operator is named."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            return func(*args, **(kwargs or {}))
        except _Forbidden as exc:
            if exc.named:
                raise
            raise _Forbidden(_public_name(func), exc.rule, named=True, held=exc.held, limit=exc.limit) from None


_TORCH_NAMES: dict[Any, str] = {}


def _public_name(func) -> str:
    """The dotted name a student would write for a torch function (`torch.nn.functional.softmax`)."""
    if not _TORCH_NAMES:  # built on the first refusal only: module dictionaries, nothing imported
        tensor_attrs: dict[str, Any] = {}
        for cls in torch.Tensor.__mro__:
            for key, value in vars(cls).items():
                tensor_attrs.setdefault(key, value)
        for prefix, space in (("torch", vars(torch)), ("torch.Tensor", tensor_attrs),
                              ("torch.nn.functional", vars(torch.nn.functional)), ("torch.linalg", vars(torch.linalg)),
                              ("torch.special", vars(torch.special))):
            for key, value in space.items():
                if callable(value) and not _isinstance(value, type):
                    with contextlib.suppress(TypeError):  # unhashable
                        _TORCH_NAMES.setdefault(value, f"{prefix}.{key}")
    with contextlib.suppress(TypeError):
        if func in _TORCH_NAMES:
            return _TORCH_NAMES[func]
    if _isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{func}"
    return f"{getattr(func, '__module__', None) or 'torch'}.{getattr(func, '__qualname__', func)}"


@contextlib.contextmanager
def _watching(rules: list[str]):
    """While it lasts, the operations that `rules` forbid raise _Forbidden, whatever name reached them."""
    if not rules:
        yield
        return
    with _NameTheCall(), _RefuseOperators(rules):
        yield


@contextlib.contextmanager
def _quiet():
    """Swallow warnings and stderr from student code: a test cell must not write to stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stderr(io.StringIO()):
            yield


def _describe_exception(what: str, exc: BaseException) -> str:
    if isinstance(exc, NotImplementedError):
        return f"{what} is not implemented yet: replace `raise NotImplementedError()` in its cell with your code."
    where = ""
    tb = exc.__traceback__
    while tb is not None:  # innermost frame that is notebook code (not a library), named by its function:
        code = tb.tb_frame.f_code  # a helper may live in another cell than the one being checked
        if "ipykernel" in code.co_filename or code.co_filename.startswith("<"):
            where = (f" (line {tb.tb_lineno} of the cell that defines `{code.co_name}`)" if not code.co_name.startswith("<")
                     else f" (line {tb.tb_lineno} of your cell)")
        tb = tb.tb_next
    return f"{what} raised {type(exc).__name__}: {exc}{where}"


def _situation(case: Case) -> str:
    """The case's call in a few words, so that an error names its situation (an odd d_model, T equal to
    max_len): "`sinusoidal_encoding(6, 5)`", "`PositionalEncoding(d_model=7, max_len=5)` on x: (2, 5, 7) float32"."""
    def shown(value) -> str:
        if isinstance(value, np.ndarray) and value.ndim:
            return f"{value.shape} {value.dtype}"
        if isinstance(value, (list, tuple, dict)) and len(value) > 4:
            return f"<{type(value).__name__} of {len(value)}>"
        return repr(value.item() if isinstance(value, np.ndarray) else value)[:40]

    named = [(k, case.inputs[k]) for k in case.args] + [(k, case.inputs[v]) for k, v in case.kwargs.items()]
    parts = [f"{k}: {shown(v)}" for k, v in named] + [shown(v) for v in case.const_args]
    parts += [f"{k}={shown(v)}" for k, v in case.const_kwargs.items()]
    if case.kind == "module":
        init = ", ".join(f"{k}={v!r}" for k, v in case.init.items())
        return f"`{case.target}({init})` on {', '.join(parts)}"[:240]
    return f"`{case.target}({', '.join(parts)})`"[:240]


def _to_torch(value: np.ndarray, requires_grad: bool = False):
    t = torch.from_numpy(np.array(value))
    if requires_grad and t.is_floating_point():
        t.requires_grad_(True)
    return t


def _call(case: Case, fn: Callable, requires_grad: bool):
    """Build inputs, call the student's function or module, return (outputs, inputs, module)."""
    inputs = {k: _to_torch(v, requires_grad and k in case.grad_wrt) for k, v in case.inputs.items()}
    module = None
    what = f"`{case.target}`"
    if fn is None:
        raise CheckFailed(f"{what} is None: run the cell that defines it first.")
    if case.kind == "module":
        if not (isinstance(fn, type) and issubclass(fn, torch.nn.Module)):
            raise CheckFailed(f"{what} should be an nn.Module class, got {type(fn).__name__}.")
        try:
            with _quiet():
                torch.manual_seed(0)
                module = fn(**case.init)
        except Exception as exc:
            raise _failed(_describe_exception(f"{what}(**{case.init})", exc), exc) from None
        _load_params(case, module)
        if any(v.dtype == np.float64 for v in case.inputs.values()):
            # float64 cases run the module's parameters (stored as float32) in float64 too; buffers keep
            # their dtype, so a forward that mixes a float32 buffer into float64 inputs is still caught
            for p in module.parameters():
                p.data = p.data.double()
        module.train(case.train_seed is not None)  # dropout off, except in the cases about dropout
        if case.stand_ins:
            stand_in(module, case.stand_ins)
        call: Callable[..., Any] = module
    else:
        if not callable(fn):
            raise CheckFailed(f"{what} should be a function, got {type(fn).__name__}.")
        call = fn
    args = [inputs[k] for k in case.args] + list(case.const_args)
    kwargs = {k: inputs[v] for k, v in case.kwargs.items()}
    kwargs.update(case.const_kwargs)
    try:
        rules = [r for r in case.forbid if _is_rule(r)]
        wires = [*case.forbid, *(THREAD_STARTS if rules else ())]
        with _quiet(), _tripwires(wires), value_dropout(case.train_seed):  # dropout as the reference saw it
            with _watching(rules):
                out = call(*args, **kwargs)
    except CheckFailed:
        raise
    except _Forbidden as exc:
        if exc.rule == MATRIX_PRODUCTS:
            raise CheckFailed(f"{what} multiplies whole matrices (`{exc.name}`): this task asks for loops over the "
                              "queries and keys (a dot product of two vectors is fine).") from None
        if exc.name in THREAD_STARTS:
            raise CheckFailed(f"{what} starts a thread or a process (`{exc.name}`): this task's rules are watched "
                              "in the thread that calls it, so its work must be done there.") from None
        if exc.rule == HELD_AT_MOST:
            raise CheckFailed(f"{what} made a tensor of {exc.held:,} numbers (`{exc.name}`) where this case allows "
                              f"{exc.limit:,} in any one tensor (as many as an input holds, padded to whole blocks, or one block_size x "
                              "block_size block of scores per batch and head): score one block of queries against one "
                              "block of keys at a time; a T x T mask counts too.") from None
        raise CheckFailed(f"{what} calls `{exc.name}`: this task is to implement it yourself, not to call a "
                          "ready-made version.") from None
    except NotImplementedError as exc:
        raise _failed(_describe_exception(what, exc), exc) from None
    except Exception as exc:
        raise _failed(_describe_exception(_situation(case), exc), exc) from None
    return _split_outputs(case, out), inputs, module


def _failed(message: str, error: BaseException) -> CheckFailed:
    """A CheckFailed that remembers the student's exception (for cases that expect one)."""
    failed = CheckFailed(message)
    failed.error = error
    return failed


def _load_params(case: Case, module) -> None:
    own = dict(module.named_parameters())
    missing = sorted(set(case.params) - set(own))
    unexpected = sorted(set(own) - set(case.params))
    if missing or unexpected:
        raise CheckFailed(
            f"`{case.target}` parameters don't match the given ones (missing {missing}, unexpected {unexpected}): "
            "keep the layers declared in the given part of __init__ and add no others."
        )
    with torch.no_grad():
        for name, p in own.items():
            ref = case.params[name]
            if tuple(p.shape) != ref.shape:
                raise CheckFailed(
                    f"`{case.target}` parameter '{name}' has shape {tuple(p.shape)}, expected {ref.shape}: "
                    "keep the layer sizes given in __init__."
                )
            p.copy_(torch.from_numpy(ref))


def _split_outputs(case: Case, out) -> dict:
    what = f"`{case.target}`"
    n = len(case.outputs)
    if out is None:
        raise CheckFailed(f"{what} returned None: did you forget the `return` statement?")
    if n == 1:
        if isinstance(out, (tuple, list)):
            raise CheckFailed(f"{what} returned a {type(out).__name__} of {len(out)}; expected one tensor ({case.outputs[0]}).")
        values = [out]
    else:
        if not isinstance(out, (tuple, list)) or len(out) != n:
            got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else f"one {type(out).__name__}"
            raise CheckFailed(f"{what} returned {got}; expected a tuple ({', '.join(case.outputs)}).")
        values = list(out)
    for name, v in zip(case.outputs, values):
        if v is None:
            raise CheckFailed(f"{what} returned None for `{name}`.")
        if not _isinstance(v, _TB):
            raise CheckFailed(f"{what} returned {type(v).__name__} for `{name}`; expected a torch.Tensor.")
    return dict(zip(case.outputs, values))


# --------------------------------------------------------------------------------------------------
# Comparing

def _close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype == bool or b.dtype == bool:  # booleans only ever equal booleans (no truthiness of floats)
        return a.dtype == bool and b.dtype == bool and bool(_np_array_equal(a, b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if not _np_array_equal(_np_isnan(a64), _np_isnan(b64)):
        return False
    ok = _np_isnan(b64) | (_np_abs(a64 - b64) <= atol + rtol * _np_abs(b64))
    return bool(ok.all())


def _shape_message(what: str, name: str, got: tuple, want: tuple) -> str:
    msg = f"{what}: `{name}` has shape {got}, expected {want}"
    if len(got) != len(want):
        msg += f" ({len(got)} dims instead of {len(want)}: keep every leading batch dim, don't squeeze or flatten them)"
    elif sorted(got) == sorted(want):
        axes = [i - len(got) for i, (g, w) in enumerate(zip(got, want)) if g != w]
        msg += f" (axes {axes} are swapped: check your transposes)"
    else:
        axes = [i - len(got) for i, (g, w) in enumerate(zip(got, want)) if g != w]
        msg += f" (axis {', '.join(map(str, axes))} differs)"
    return msg + "."


def _numpy(t) -> np.ndarray:
    return _TB.numpy(_TB.cpu(_TB.detach(t)))


def _property_message(case: Case, got: dict[str, np.ndarray]) -> tuple[str, str] | None:
    """Generic symptoms that need no reference implementation: (symptom, one-line message)."""
    for prop in case.properties:
        kind, out = prop[0], prop[1]
        w = got[out].astype(np.float64)
        if kind == "rows_sum_to_one":
            sums = w.sum(axis=-1)
            if not np.allclose(sums, 1.0, atol=1e-4):
                for axis in range(-2, -w.ndim - 1, -1):
                    if np.allclose(w.sum(axis=axis), 1.0, atol=1e-4):
                        return ("softmax over the wrong axis",
                                (f"`{out}` sums to 1 along axis {axis} instead of the last axis: the softmax "
                                 "is taken over the wrong axis (it must be over the keys, dim=-1)."))
                first = tuple(int(i) for i in np.argwhere(~np.isclose(sums, 1.0, atol=1e-4))[0])
                return ("rows don't sum to 1",
                        (f"the weights of a query don't sum to 1 over the keys (`{out}` at {first} sums to "
                         f"{float(sums[first]):.3f}): each row must be one softmax over all of its keys (dim=-1)."))
        elif kind == "zero_where_masked":
            mask = case.inputs[prop[2]].astype(bool)
            blocked = ~np.broadcast_to(mask, w.shape)
            if blocked.any() and np.abs(w[blocked]).max() > 1e-6:
                return ("non-zero at masked positions",
                        (f"`{out}` is non-zero at masked positions: fill the scores with -inf where mask is "
                         "False *before* the softmax (not after, and not with 0)."))
        elif kind == "zero_where_padded":  # key padding mask (B, T_k), True = padding; weights (B, ..., T_k)
            pad = case.inputs[prop[2]].astype(bool)
            pad = pad.reshape(pad.shape[:1] + (1,) * (w.ndim - 2) + pad.shape[1:])
            blocked = np.broadcast_to(pad, w.shape)
            if blocked.any() and np.abs(np.nan_to_num(w[blocked], nan=1.0)).max() > 1e-6:
                return ("non-zero for padded keys",
                        (f"`{out}` is non-zero for padded keys: key_padding_mask is True at padding (the "
                         "opposite of attn_mask); block those keys (scores to -inf) before the softmax."))
    return None


@dataclass
class Observation:
    """What the student's code did on one case: plain data only, nothing that runs code when read.

    `error`: a one-line message when the code could not produce outputs (an exception, None, a wrong
    type or count); `raised`: for cases that expect an exception, the class names of the exception
    raised (its MRO), [] when the call returned normally; `outputs`/`grads`: arrays; `dtypes`: the
    outputs' torch dtype names; `grad_error`: why no gradient could be taken.
    """

    case: str
    error: str = ""
    raised: list[str] | None = None
    raised_text: str = ""
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    grads: dict[str, np.ndarray] = field(default_factory=dict)
    grad_error: str = ""


def _array(t) -> np.ndarray:
    try:
        return _numpy(t)
    except TypeError:  # a dtype NumPy lacks (bfloat16): its values in float32; the dtype is kept by name
        return _TB.numpy(_TB.float(_TB.cpu(_TB.detach(t))))


def observe(case: Case, fn: Callable) -> Observation:
    """Run the student's `fn` on the case's inputs (CPU, eval mode, quiet) and record what it did."""
    if any(p[0] == "raises" for p in case.properties):
        try:
            _call(case, fn, False)
        except CheckFailed as failed:
            error = getattr(failed, "error", None)
            if error is None or isinstance(error, NotImplementedError):
                return Observation(case.name, error=str(failed))
            return Observation(case.name, raised=[c.__name__ for c in type(error).__mro__],
                               raised_text=f"{type(error).__name__} ({error})")
        return Observation(case.name, raised=[])
    try:
        outs, inputs, module = _call(case, fn, bool(case.grad_wrt))
    except CheckFailed as failed:  # what it raised is kept: a hidden case that expects an error is told apart outside
        error = getattr(failed, "error", None)
        if error is None or isinstance(error, NotImplementedError):
            return Observation(case.name, error=str(failed))
        return Observation(case.name, error=str(failed), raised=[c.__name__ for c in type(error).__mro__],
                           raised_text=f"{type(error).__name__} ({error})")
    obs = Observation(case.name, outputs={n: _array(v) for n, v in outs.items()},
                      dtypes={n: str(_dtype_of(v)) for n, v in outs.items()})
    if case.grad_wrt:
        try:
            obs.grads = _observe_grads(case, outs, inputs, module)
        except CheckFailed as failed:
            obs.grad_error = str(failed)
    return obs


def _observe_grads(case: Case, outs: dict, inputs: dict, module) -> dict[str, np.ndarray]:
    loss = torch.zeros((), dtype=torch.float64)
    for out_name, w in case.grad_weights.items():
        value = outs[out_name]
        if not _requires_grad_of(value):
            raise CheckFailed(f"`{case.target}`: `{out_name}` is not connected to the inputs' graph "
                              "(don't use .detach(), .data, .item() or NumPy inside the function).")
        if _tuple(value.shape) != np.shape(w):  # the outputs' check names the shape; no gradient to take
            raise CheckFailed(f"`{case.target}`: `{out_name}` has shape {_tuple(value.shape)}, expected {np.shape(w)}.")
        loss = loss + _sum(_mul(value, _TB.to(_from_numpy(np.asarray(w)), _dtype_of(value))))
    with _quiet():
        try:
            _backward(loss)
        except Exception as exc:
            raise CheckFailed(_describe_exception(f"`{case.target}`: backward pass", exc)) from None
    grads = {}
    for key in case.grad_wrt:
        grad = _grad_of(inputs[key]) if key in inputs else _grad_of(dict(module.named_parameters())[key])
        if grad is None:
            raise CheckFailed(f"`{case.target}`: no gradient reaches `{key}`: it must be used through "
                              "differentiable torch ops.")
        grads[key] = _array(grad)
    return grads


@dataclass(frozen=True)
class Diagnosis:
    """Why a case failed. `kind` is the same for every student with the same mistake (a known bug's
    name, a symptom, an exception type): the class report counts students by it. `message` is the
    one line the student sees, without the case's name."""

    kind: str
    message: str


def _error_kind(error: str) -> str:
    if "is not implemented yet" in error:
        return "not implemented"
    if "this task is to implement it yourself" in error:
        return "calls a forbidden built-in"
    raised = re.search(r"` raised (\w+)", error)
    return f"raises {raised.group(1)}" if raised else "no usable output"


def verdict(case: Case, obs: Observation) -> str | None:
    """None if the observation matches the case's expected outputs (and gradients); otherwise the
    one-line diagnosis, without the case's name (the caller adds it where the name may be shown)."""
    found = diagnose(case, obs)
    return None if found is None else found.message


def diagnose(case: Case, obs: Observation) -> Diagnosis | None:
    """`verdict` with the kind of failure: None if the observation matches the case."""
    what = f"`{case.target}`"
    raises = next((p for p in case.properties if p[0] == "raises"), None)
    if obs.error and not (raises is not None and obs.raised):
        return Diagnosis(_error_kind(obs.error), obs.error)
    if raises is not None:
        expected, when = raises[1], (f" {raises[2]}" if len(raises) > 2 and raises[2] else "")
        if not obs.raised:
            return Diagnosis("does not raise", f"{what} returned normally; it should raise a {expected}{when}.")
        if expected in obs.raised:
            return None
        return Diagnosis("raises the wrong exception", f"{what} raised {obs.raised_text}; expected a clear {expected}{when}.")
    share = next((p for p in case.properties if p[0] == "exact_match_at_least"), None)
    if share is not None:
        return _exact_match(case, obs, share[1], float(share[2]))
    got = {}
    for out_name in case.outputs:
        want = case.expected[out_name]
        if out_name not in obs.outputs:
            return Diagnosis("output missing", f"{what}: no `{out_name}` was recorded.")
        value = obs.outputs[out_name]
        if value.shape != want.shape:
            # a known bug can change a shape too (a loop that stops early records fewer steps): name it
            for vname, (message, vouts) in case.variants.items():
                if all(n in vouts and n in obs.outputs and _close(obs.outputs[n], vouts[n], case.rtol, case.atol)
                       for n in case.outputs):
                    return Diagnosis(f"known bug: {vname}", f"{what}: {message}")
            return Diagnosis("wrong shape", _shape_message(what, out_name, value.shape, want.shape))
        want_dtype = str(_dtype_of(_from_numpy(np.zeros(0, dtype=want.dtype))))
        if obs.dtypes.get(out_name) != want_dtype or value.dtype != want.dtype:  # the name and the data agree
            hint = ""
            if want.dtype.kind == "f":
                hint = (" (return the dtype the task names; where it names none, make new tensors in the inputs' dtype, "
                        "e.g. `dtype=q.dtype`, not a fixed one)")
            elif want.dtype == bool:
                hint = " (return a boolean tensor, e.g. from a comparison or `.bool()`)"
            return Diagnosis("wrong dtype", f"{what}: `{out_name}` has dtype {obs.dtypes.get(out_name)}, expected {want_dtype}{hint}.")
        got[out_name] = value

    mismatched = [n for n in case.outputs if not _close(got[n], case.expected[n], case.rtol, case.atol)]
    if mismatched:
        for vname, (message, vouts) in case.variants.items():
            if all(n in vouts and _close(got[n], vouts[n], case.rtol, case.atol) for n in mismatched):
                return Diagnosis(f"known bug: {vname}", f"{what}: {message}")
        for n in mismatched:  # right values, last two axes swapped: not a softmax over the wrong axis
            v = got[n]
            if v.ndim >= 2 and v.shape[-1] == v.shape[-2] and _close(np.swapaxes(v, -1, -2), case.expected[n],
                                                                      case.rtol, case.atol):
                return Diagnosis("transposed output", (
                    f"{what}: `{n}` has the right values with its last two axes swapped: return it as computed "
                    f"(shape {case.expected[n].shape}, e.g. queries on axis -2 and keys on axis -1), not transposed."))
        prop = _property_message(case, got)
        if prop:
            return Diagnosis(prop[0], f"{what}: {prop[1]}")
        n = mismatched[0]
        a, b = got[n].astype(np.float64), case.expected[n].astype(np.float64)
        if got[n].dtype == bool or case.expected[n].dtype == bool:
            bad = np.argwhere(got[n] != case.expected[n])
            return Diagnosis("wrong values", (f"{what}: `{n}` differs from the reference at {len(bad)} entries, "
                                              f"first at index {tuple(int(i) for i in bad[0])}. {case.hint}").rstrip())
        err = np.abs(a - b)
        err = np.where(np.isnan(err), np.inf, err)
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape)) if err.size else ()
        frac = float(np.mean(err > case.atol + case.rtol * np.abs(b))) if err.size else 0.0
        return Diagnosis("wrong values", (f"{what}: `{n}` differs from the reference at {frac:.0%} of entries "
                                          f"(largest error {float(err.max()):.3g} at index {idx}). {case.hint}").rstrip())

    if case.grad_wrt:
        if obs.grad_error:
            return Diagnosis("no gradient", obs.grad_error)
        for key in case.grad_wrt:
            grad = obs.grads.get(key)
            if grad is None or grad.dtype != case.grads[key].dtype or not _close(
                    grad, case.grads[key], case.rtol * 10, case.atol * 10):
                return Diagnosis("wrong gradient", (
                    f"{what}: outputs are right but the gradient w.r.t. `{key}` is wrong: part of the "
                    "computation is hidden from autograd (.detach(), .data, torch.no_grad, NumPy) or "
                    "edited in place; use out-of-place ops such as `masked_fill`."))
    return None


def share_exactly_right(words, captions: np.ndarray, references: np.ndarray) -> float:
    """The share of images whose caption (row i of `captions`, indices into `words`) is word for word one of
    its references (`references[i]`: rows of indices), read up to <END>; an index outside the vocabulary
    reads as <UNK>. How a trained-model case counts."""
    from .data import Vocab

    vocab = Vocab(words)

    def text(rows: np.ndarray) -> list[str]:
        return vocab.decode(np.where((rows >= 0) & (rows < len(vocab)), rows, vocab.unk_idx))

    return float(np.mean([caption in text(refs) for caption, refs in zip(text(captions), references)]))


def measured(case: Case, obs: Observation) -> str:
    """What a passed case measured, for its line ("" for a case that compares outputs): a trained-model case's
    share of images captioned exactly right, and the share it asks for."""
    share = next((p for p in case.properties if p[0] == "exact_match_at_least"), None)
    got = None if share is None else obs.outputs.get(share[1])
    if share is None or got is None or got.ndim != 2 or got.dtype.kind not in "iu":
        return ""
    refs = case.expected[share[1]]
    if len(got) != len(refs):
        return ""
    return (f"the model captions {share_exactly_right(case.const_args[0], got, refs):.0%} of the {len(refs)} new "
            f"scenes exactly right (this case asks for {float(share[2]):.0%})")


def _exact_match(case: Case, obs: Observation, out: str, need: float) -> Diagnosis | None:
    """A trained model's outcome: enough of its captions must be exactly right (case.expected[out] holds the
    references of each image; the model's captions are case.outputs' `out`)."""
    refs, got = case.expected[out], obs.outputs.get(out)
    if got is None or got.ndim != 2 or len(got) != len(refs) or got.dtype.kind not in "iu":
        shape = None if got is None else got.shape
        return Diagnosis("wrong shape", f"`{case.target}`: expected ({len(refs)}, words) integer captions, got {shape}.")
    # the words the captions index (trained_captioner's `words`)
    share = share_exactly_right(case.const_args[0], got, refs)
    if share >= need:
        return None
    measured = f" ({case.hint})" if case.hint else ""
    return Diagnosis("trained model below its mark", (
        f"the trained model{measured} captions {share:.0%} of these {len(refs)} images exactly right (one of their references, "
        f"word for word); this case asks for {need:.0%}. Train it fully (notebook 06, section 2, then save), and see which "
        "mistakes it makes in notebook 08, section 3 (what kind of mistakes)."))


# --------------------------------------------------------------------------------------------------
# Observations as files: how results leave the grading sandbox (JSON + .npz, never a pickle)

MAX_RESULT_BYTES = 32 * 2**20  # one observation's arrays; larger is recorded as an error
_META_FIELDS: dict[str, Any] = {"case": str, "error": str, "raised": (list, type(None)), "raised_text": str, "dtypes": dict,
                "grad_error": str, "outputs": list, "grads": list}


def record(obs: Observation, folder: Path) -> Path:
    """Write `obs` as NNNN.json (+ NNNN.npz) in `folder`; later files win for the same case."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{_len(list(folder.glob('*.json'))):04d}"
    arrays = {f"out:{k}": v for k, v in obs.outputs.items()} | {f"grad:{k}": v for k, v in obs.grads.items()}
    if sum(a.nbytes for a in arrays.values()) > MAX_RESULT_BYTES:
        obs, arrays = Observation(obs.case, error="the outputs are too large to grade."), {}
    meta = {"case": obs.case, "error": obs.error, "raised": obs.raised, "raised_text": obs.raised_text,
            "dtypes": obs.dtypes, "grad_error": obs.grad_error, "outputs": list(obs.outputs), "grads": list(obs.grads)}
    if arrays:
        np.savez(f"{stem}.npz", **arrays)  # type: ignore[arg-type]  # (numpy's stub types **kwds as allow_pickle)
    Path(f"{stem}.json").write_text(json.dumps(meta))
    return Path(f"{stem}.json")


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path` if it is a regular file (not a link, a FIFO or a device) of at most `limit`
    bytes; opened so that neither a link nor a FIFO can make the reader follow or wait."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise ValueError("not a regular file within the size limit")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def _read_arrays(data: bytes) -> dict[str, np.ndarray]:
    """Arrays of an .npz, refusing pickles, and members that would expand past MAX_RESULT_BYTES."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        if sum(info.file_size for info in zf.infolist()) > MAX_RESULT_BYTES + 2**16:
            raise ValueError("arrays expand past the size limit")
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def read_observations(folder: Path, max_files: int = 2000) -> tuple[dict[str, Observation], list[str]]:
    """The observations in `folder` by case (the last one of a case wins), and the problems found.

    Written by untrusted code: only regular files are read (no links, FIFOs or devices), each
    size-capped, parsed as plain JSON or as .npz with pickles refused, and type-checked; anything
    else is reported and ignored."""
    found: dict[str, Observation] = {}
    problems: list[str] = []
    if folder.is_symlink() or not folder.is_dir():
        return found, ([f"{folder.name}: not a folder"] if folder.is_symlink() else [])
    files = sorted(folder.glob("*.json"))
    for meta_path in files[:max_files]:
        try:
            meta = json.loads(_read_regular(meta_path, 2**20))
            if not isinstance(meta, dict) or any(not isinstance(meta.get(k), t) for k, t in _META_FIELDS.items()):
                raise ValueError("unexpected fields")
            arrays: dict[str, np.ndarray] = {}
            if meta["outputs"] or meta["grads"]:
                arrays = _read_arrays(_read_regular(meta_path.with_suffix(".npz"), MAX_RESULT_BYTES + 2**20))
            for key, arr in arrays.items():
                if arr.dtype.kind not in "biuf":
                    raise ValueError(f"{key} has dtype {arr.dtype}")
            obs = Observation(
                case=meta["case"], error=meta["error"][:2000], raised=meta["raised"],
                raised_text=meta["raised_text"][:500], dtypes={str(k): str(v) for k, v in meta["dtypes"].items()},
                grad_error=meta["grad_error"][:2000],
                outputs={str(k): arrays[f"out:{k}"] for k in meta["outputs"]},
                grads={str(k): arrays[f"grad:{k}"] for k in meta["grads"]})
            if obs.raised is not None and not all(isinstance(x, str) for x in obs.raised):
                raise ValueError("raised is not a list of names")
            found[obs.case] = obs
        except Exception as exc:
            problems.append(f"{meta_path.name}: unreadable result ({type(exc).__name__}: {str(exc)[:100]})")
    if len(files) > max_files:
        problems.append(f"{len(files)} result files; only the first {max_files} were read")
    return found, problems


__all__ = ["CheckFailed", "Case", "load_case", "case_file", "case_names", "reference_dirs", "value_dropout",
           "Observation", "observe", "Diagnosis", "diagnose", "verdict", "share_exactly_right", "measured", "record",
           "read_observations", "MATRIX_PRODUCTS", "READY_MADE_SOFTMAX", "RULES"]


class ReadOnlyModule(type(contextlib)):  # type: ignore[misc]  # (the module type, as types.ModuleType)
    """A module none of whose names can be replaced or deleted, its private helpers included, nor its class changed
    back: `starter.checks.check = ...` or `starter.compare._watching = ...` raises, so a test cell that imports
    `check` again gets the real one, and the checks call the real comparison under their real rules."""

    def _protected(self, name: str) -> bool:
        return name in self.__dict__ or name == "__class__"

    def __setattr__(self, name, value):
        if self._protected(name):
            raise AttributeError(f"{self.__name__}.{name} is read-only")
        super().__setattr__(name, value)

    def __delattr__(self, name):
        if self._protected(name):
            raise AttributeError(f"{self.__name__}.{name} is read-only")
        super().__delattr__(name)


if __name__ in sys.modules:
    sys.modules[__name__].__class__ = ReadOnlyModule
