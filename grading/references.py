"""Build the stored reference cases from the solution notebooks.

Each notebook has a case module, ``grading/cases/nbNN.py``, with ``cases(ns)`` returning a list of
``CaseSpec``: inputs (generated once, here, from a seed), which function or module of the notebook
to call, which known bugs to recognise. This module runs the solution on those inputs (in float64,
then cast back to the inputs' dtype) and writes inputs, outputs, gradients and the bug variants'
outputs to HDF5: public cases into ``starter/references``, hidden ones into ``grading/references``.

    python -m grading references
"""
from __future__ import annotations

import importlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

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
        module.eval()
        fn = module
    else:
        fn = obj
    out = fn(*[inputs[k] for k in spec.args], *spec.const_args, **{k: inputs[v] for k, v in spec.kwargs.items()}, **spec.const_kwargs)
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


def build_case(spec: CaseSpec, ns: dict) -> dict:
    """Evaluate one case with the solution in `ns`; return everything to store."""
    obj = ns[spec.target]
    dtype = _out_dtype(spec)
    params = None
    if spec.kind == "module":
        torch.manual_seed(spec.seed)
        module = obj(**spec.init)
        g = torch.Generator().manual_seed(spec.seed + 1)
        params = {}
        for name, p in module.named_parameters():  # random weights, not the init's: any order bug shows
            params[name] = (torch.randn(p.shape, generator=g) / max(1, p.shape[-1]) ** 0.5).to(p.dtype)
            if name.endswith("bias") or p.dim() == 1:
                params[name] = torch.randn(p.shape, generator=g).mul(0.1).to(p.dtype)
            if "norm" in name and name.endswith("weight"):
                params[name] = 1 + torch.randn(p.shape, generator=g).mul(0.1).to(p.dtype)
    raises = next((p for p in spec.properties if p[0] == "raises"), None)
    if raises is not None:  # a case of bad input: the solution must raise; the outputs stored are placeholders
        try:
            _run(spec, obj, params, dtype64=True, with_grad=False)
        except Exception as exc:
            if raises[1] not in [c.__name__ for c in type(exc).__mro__]:
                raise ValueError(f"{spec.name}: the solution raised {type(exc).__name__}, not {raises[1]}") from exc
        else:
            raise ValueError(f"{spec.name}: the solution does not raise {raises[1]}")
        return {"spec": spec, "inputs": {k: v.cpu().numpy() for k, v in spec.inputs.items()},
                "params": {k: v.numpy() for k, v in (params or {}).items()},
                "expected": {k: np.zeros(0, dtype=_to_numpy(torch.zeros(0), dtype).dtype) for k in spec.outputs},
                "grad_weights": {}, "grads": {}, "variants": {}}
    with_grad = bool(spec.grad_wrt)
    outs, inputs, module = _run(spec, obj, params, dtype64=True, with_grad=with_grad)
    record: dict[str, Any] = {
        "spec": spec,
        "inputs": {k: v.cpu().numpy() for k, v in spec.inputs.items()},
        "params": {k: v.numpy() for k, v in (params or {}).items()},
        "expected": {k: _to_numpy(v, dtype) for k, v in outs.items()},
        "grad_weights": {}, "grads": {}, "variants": {},
    }
    if with_grad:
        g = torch.Generator().manual_seed(spec.seed + 2)
        loss = torch.zeros((), dtype=torch.float64)
        for k, v in outs.items():
            if v.is_floating_point():
                w = torch.randn(v.shape, generator=g, dtype=torch.float64)
                record["grad_weights"][k] = w.to(dtype).numpy()
                loss = loss + (v * w.to(dtype).double()).sum()
        loss.backward()
        named = dict(module.named_parameters()) if module is not None else {}
        for key in spec.grad_wrt:
            grad = inputs[key].grad if key in inputs else named[key].grad
            record["grads"][key] = _to_numpy(grad, dtype)
    for vname, (message, make) in spec.variants.items():
        vouts, _, _ = _run(spec, make(ns), params, dtype64=True, with_grad=False)
        vouts = {k: _to_numpy(v, dtype) for k, v in vouts.items()}
        same = all(vouts[k].shape == record["expected"][k].shape and np.allclose(vouts[k], record["expected"][k],
                   rtol=spec.rtol, atol=spec.atol) for k in vouts)
        if same:
            raise ValueError(f"{spec.name}: variant '{vname}' gives the correct output; it diagnoses nothing")
        record["variants"][vname] = (message, vouts)
    return record


def _write_group(group, arrays: dict[str, np.ndarray]) -> None:
    for k, v in arrays.items():
        group.create_dataset(k, data=v)


def write_cases(path: Path, records: list[dict]) -> None:
    """Write records atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".h5.tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)
    try:
        with h5py.File(tmp, "w") as f:
            for r in records:
                s: CaseSpec = r["spec"]
                g = f.create_group(s.name)
                attrs = {
                    "target": s.target, "kind": s.kind, "args": json.dumps(s.args), "kwargs": json.dumps(s.kwargs),
                    "const_args": json.dumps(s.const_args),
                    "const_kwargs": json.dumps(s.const_kwargs), "init": json.dumps(s.init),
                    "outputs": json.dumps(s.outputs), "grad_wrt": json.dumps(s.grad_wrt),
                    "properties": json.dumps(s.properties), "forbid": json.dumps(s.forbid), "rtol": s.rtol, "atol": s.atol, "hint": s.hint,
                }
                g.attrs.update(attrs)
                for key in ("inputs", "params", "expected", "grad_weights", "grads"):
                    if r[key]:
                        _write_group(g.create_group(key), r[key])
                if r["variants"]:
                    vg = g.create_group("variants")
                    for vname, (message, vouts) in r["variants"].items():
                        one = vg.create_group(vname)
                        one.attrs["message"] = message
                        _write_group(one, vouts)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def case_module(notebook: Path):
    return importlib.import_module(f"grading.cases.nb{notebook.name[:2]}")


def build(notebook: Path, public_dir: Path = notebooks.PUBLIC_REFERENCES,
          hidden_dir: Path = notebooks.HIDDEN_REFERENCES) -> tuple[Path, Path]:
    """Build the public and hidden reference files of one notebook."""
    ns = notebooks.execute_definitions(notebook)
    torch.manual_seed(0)
    specs = case_module(notebook).cases(ns)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate case names in {notebook.name}")
    records = [build_case(s, ns) for s in specs]
    public = public_dir / f"{notebook.stem}.h5"
    hidden = hidden_dir / f"{notebook.stem}.h5"
    write_cases(public, [r for r in records if r["spec"].public])
    write_cases(hidden, [r for r in records if not r["spec"].public])
    return public, hidden


def build_all(public_dir: Path = notebooks.PUBLIC_REFERENCES, hidden_dir: Path = notebooks.HIDDEN_REFERENCES):
    out = []
    for nb in notebooks.solution_notebooks():
        try:
            case_module(nb)
        except ModuleNotFoundError as exc:
            if exc.name != f"grading.cases.nb{nb.name[:2]}":
                raise
            continue
        out.append(build(nb, public_dir, hidden_dir))
    return out
