"""Build the stored reference cases from the solution notebooks.

Each notebook has a case maker (listed in ``grading/cases/registry.py``), ``cases(ns)`` returning a list of
``CaseSpec``: inputs (generated once, here, from a seed), which function or module of the notebook
to call, which known bugs to recognise. This module runs the solution on those inputs (in float64,
then cast back to the inputs' dtype) and writes inputs, outputs, gradients and the bug variants'
outputs to HDF5: public cases into ``starter/references``, hidden ones into ``grading/references``.

    python -m grading references
"""
from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from starter.cases import Case, write_case
from starter.compare import _close, value_dropout  # the check's own tolerance rule and dropout

from . import notebooks


@dataclass
class CaseSpec:
    name: str
    target: str  # name of the function or class in the notebook
    inputs: dict[str, torch.Tensor]
    args: list[str]
    outputs: list[str]
    kwargs: dict[str, str] = field(default_factory=dict)  # keyword -> input name
    const_args: list[Any] = field(default_factory=list)  # plain Python values passed after `args`
    const_kwargs: dict[str, Any] = field(default_factory=dict)
    kind: str = "function"
    init: dict[str, Any] = field(default_factory=dict)
    grad_wrt: list[str] = field(default_factory=list)  # input names, or parameter names of a module
    # name -> (message, make(ns) -> buggy function/class): outputs the check recognises as that bug
    variants: dict[str, tuple[str, Callable]] = field(default_factory=dict)
    properties: list[list[str]] = field(default_factory=list)
    rtol: float = 1e-4
    atol: float = 1e-5
    hint: str = ""
    public: bool = False
    seed: int = 0
    # dotted names of library functions the student's code must not call here (e.g. torch's own
    # attention when the task is to write it); the check replaces them with a tripwire while it runs
    forbid: list[str] = field(default_factory=list)
    train_seed: int | None = None  # module cases about dropout: train mode, this seed just before the call
    stand_ins: list[str] = field(default_factory=list)  # submodules the check runs as PyTorch's (no cascade)
    # outputs that come from data, not from running the solution (a trained model's references: the captions
    # of the images); such a case stores no known bugs and no gradients
    expected: dict[str, torch.Tensor] | None = None
    init_weights: bool = False  # keep the weights the module's init sets (a worked example), not random ones


def _run(spec: CaseSpec, obj, params: dict[str, torch.Tensor] | None, dtype64: bool, with_grad: bool):
    """Call obj on the spec's inputs; return (outputs dict, input tensors, module)."""
    inputs = {}
    for k, v in spec.inputs.items():
        t = v.clone()
        if dtype64 and t.is_floating_point():
            t = t.double()
        if with_grad and k in spec.grad_wrt:
            t.requires_grad_(True)
        inputs[k] = t
    module = None
    if spec.kind == "module":
        torch.manual_seed(spec.seed)
        module = obj(**spec.init)
        if params is not None:
            module.load_state_dict(params, strict=True)
        if dtype64:
            module.double()
        module.train(spec.train_seed is not None)
        fn = module
    else:
        fn = obj
    with value_dropout(spec.train_seed):
        out = fn(*[inputs[k] for k in spec.args], *spec.const_args, **{k: inputs[v] for k, v in spec.kwargs.items()},
                 **spec.const_kwargs)
    if len(spec.outputs) == 1:
        out = (out,)
    return dict(zip(spec.outputs, out)), inputs, module


def _out_dtype(spec: CaseSpec) -> torch.dtype:
    floats = [v.dtype for v in spec.inputs.values() if v.is_floating_point()]
    return floats[0] if floats else torch.float32


def _to_numpy(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    t = t.detach().cpu()
    if t.is_floating_point():
        t = t.to(dtype)
    return t.numpy()


def _stored(spec: CaseSpec, params: dict[str, torch.Tensor] | None) -> Case:
    """The Case record of `spec` without results yet: how to call the task, and on what."""
    return Case(name=spec.name, target=spec.target, kind=spec.kind, args=spec.args, kwargs=spec.kwargs,
                const_args=spec.const_args, const_kwargs=spec.const_kwargs, init=spec.init, outputs=spec.outputs,
                grad_wrt=spec.grad_wrt, properties=spec.properties, forbid=spec.forbid,
                train_seed=spec.train_seed, stand_ins=spec.stand_ins, rtol=spec.rtol,
                atol=spec.atol, hint=spec.hint, inputs={k: v.cpu().numpy() for k, v in spec.inputs.items()},
                params={k: v.numpy() for k, v in (params or {}).items()})


def build_case(spec: CaseSpec, ns: dict) -> Case:
    """Evaluate one case with the solution in `ns`: the Case to store (expected outputs, gradients, and
    the outputs of each known bug)."""
    if spec.expected is not None:
        case = _stored(spec, None)
        case.expected = {k: v.numpy() for k, v in spec.expected.items()}
        return case
    obj = ns[spec.target]
    dtype = _out_dtype(spec)
    params = None
    if spec.kind == "module":
        torch.manual_seed(spec.seed)
        module = obj(**spec.init)
        g = torch.Generator().manual_seed(spec.seed + 1)
        params = {}
        for name, p in module.named_parameters():  # random weights, not the init's: any order bug shows
            if spec.init_weights:
                params[name] = p.detach().clone()
                continue
            params[name] = (torch.randn(p.shape, generator=g) / max(1, p.shape[-1]) ** 0.5).to(p.dtype)
            if name.endswith("bias") or p.dim() == 1:
                params[name] = torch.randn(p.shape, generator=g).mul(0.1).to(p.dtype)
            if "norm" in name and name.endswith("weight"):
                params[name] = 1 + torch.randn(p.shape, generator=g).mul(0.1).to(p.dtype)
    case = _stored(spec, params)
    if case.expects_error:  # a case of bad input: the solution must raise; the outputs stored are placeholders
        expected = next(p[1] for p in spec.properties if p[0] == "raises")
        try:
            _run(spec, obj, params, dtype64=True, with_grad=False)
        except Exception as exc:
            if expected not in [c.__name__ for c in type(exc).__mro__]:
                raise ValueError(f"{spec.name}: the solution raised {type(exc).__name__}, not {expected}") from exc
        else:
            raise ValueError(f"{spec.name}: the solution does not raise {expected}")
        case.expected = {k: np.zeros(0, dtype=_to_numpy(torch.zeros(0), dtype).dtype) for k in spec.outputs}
        return case
    with_grad = bool(spec.grad_wrt)
    outs, inputs, module = _run(spec, obj, params, dtype64=True, with_grad=with_grad)
    case.expected = {k: _to_numpy(v, dtype) for k, v in outs.items()}
    if with_grad:
        g = torch.Generator().manual_seed(spec.seed + 2)
        loss = torch.zeros((), dtype=torch.float64)
        for k, v in outs.items():
            if v.is_floating_point():
                w = torch.randn(v.shape, generator=g, dtype=torch.float64)
                case.grad_weights[k] = w.to(dtype).numpy()
                loss = loss + (v * w.to(dtype).double()).sum()
        loss.backward()
        named = dict(module.named_parameters()) if module is not None else {}
        for key in spec.grad_wrt:
            grad = inputs[key].grad if key in inputs else named[key].grad
            case.grads[key] = _to_numpy(grad, dtype)
    case.variants = _telling_variants(spec, ns, params, case.expected, dtype)
    return case


def _telling_variants(spec: CaseSpec, ns: dict, params, expected: dict, dtype) -> dict:
    """The known bugs this case can tell apart, with their outputs: a variant is dropped when it crashes here,
    when it gives the correct output (within the check's own tolerance, on the stored dtype), or when it
    gives what a variant listed before it gives (the check would then name one bug for the other; the
    earlier, likelier one is kept). The one rule of "does this variant differ" for every notebook."""
    def same(a: dict, b: dict) -> bool:
        return all(k in b and _close(a[k], b[k], spec.rtol, spec.atol) for k in a)

    kept: dict[str, tuple[str, dict]] = {}
    for vname, (message, make) in spec.variants.items():
        try:
            raw, _, _ = _run(spec, make(ns), params, dtype64=True, with_grad=False)
        except Exception:
            continue
        vouts = {k: _to_numpy(v, dtype) for k, v in raw.items()}
        if not same(vouts, expected) and not any(same(vouts, other) for _, other in kept.values()):
            kept[vname] = (message, vouts)
    return kept


# ---- helpers of the case modules (grading/cases/nbNN.py): one definition for every notebook -------------


@dataclass(frozen=True, kw_only=True)
class Row:
    """One row of a notebook's case table: the case's name and whether students see it (public cases go to
    starter/references, the others stay hidden). Each table's record (a frozen dataclass deriving from this
    one) adds, by name, the fields its cases vary in, so that a row reads ``FitCase(name="fit/basic", ...)``."""
    name: str
    public: bool = False


def randn(*shape, g: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    """Standard normal inputs drawn in float64 and then cast, so a float32 and a float64 case of the same
    seed hold the same numbers (the one input generator of every notebook's cases)."""
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def causal(t: int) -> torch.Tensor:
    """The (t, t) causal mask, True where attention is allowed (the key is not after the query)."""
    return torch.ones(t, t, dtype=torch.bool).tril()


def with_forward(ns: dict, target: str, forward: Callable) -> type:
    """The notebook's class `target` with its forward replaced by `forward` (a known bug of that module)."""
    return type("Buggy", (ns[target],), {"forward": forward})


def deviation(fn: Callable, **switches) -> Callable[[dict], Callable]:
    """make(ns) of a known bug written as a switch of a reference-like function: `fn` with `switches` set
    (e.g. deviation(_attend, scale=1.0): attention without its 1/sqrt(d_k) scaling)."""
    return lambda ns: functools.partial(fn, **switches)


def forward_deviation(target: str, forward: Callable, **switches) -> Callable[[dict], type]:
    """make(ns) of a known bug of the notebook's module class `target`: its forward is the reference-like
    `forward(self, ...)` with `switches` set."""
    def make(ns: dict) -> type:
        def buggy(self, *args, **kwargs):
            return forward(self, *args, **kwargs, **switches)
        return with_forward(ns, target, buggy)
    return make


def write_cases(path: Path, cases: list[Case]) -> None:
    """Write cases atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".h5.tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)
    try:
        with h5py.File(tmp, "w") as f:
            for case in cases:
                write_case(f, case)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(notebook: Path, cases: Callable[[dict], list[CaseSpec]], public_dir: Path = notebooks.PUBLIC_REFERENCES,
          hidden_dir: Path = notebooks.HIDDEN_REFERENCES) -> tuple[Path, Path]:
    """Build the public and hidden reference files of one notebook from its case maker `cases`."""
    ns = notebooks.execute_definitions(notebook)
    torch.manual_seed(0)
    specs = cases(ns)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate case names in {notebook.name}")
    built = [(s.public, build_case(s, ns)) for s in specs]
    public = public_dir / f"{notebook.stem}.h5"
    hidden = hidden_dir / f"{notebook.stem}.h5"
    write_cases(public, [c for is_public, c in built if is_public])
    write_cases(hidden, [c for is_public, c in built if not is_public])
    return public, hidden
