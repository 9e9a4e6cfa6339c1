"""Reference cases as they are stored: the one definition of their record and of their HDF5 layout.

The case builders (`grading.references`) write `Case` records with `write_case`; the checks
(`starter.checks`) read them back with `read_case`. A case is a group named "<task>/<case>" in an .h5
file of reference cases:

    attrs   target, kind ("function" or "module"), hint, rtol, atol, and, as JSON: args, kwargs,
            const_args, const_kwargs, init, outputs, grad_wrt, properties, forbid, train_seed, stand_ins
    groups  inputs, params, expected, grad_weights, grads: one array per name
            variants/<bug>: attrs message; one array per output (what that known bug returns)

Every field is always written (an empty group is left out and reads back as {}), so the reader has no
defaults for older layouts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

JSON_FIELDS = ("args", "kwargs", "const_args", "const_kwargs", "init", "outputs", "grad_wrt", "properties", "forbid",
               "train_seed", "stand_ins")
ARRAY_FIELDS = ("inputs", "params", "expected", "grad_weights", "grads")
SCALAR_FIELDS = ("target", "kind", "hint", "rtol", "atol")
CASE_ATTRIBUTES = frozenset(SCALAR_FIELDS + JSON_FIELDS)  # the attributes `write_case` gives a case's group


@dataclass
class Case:
    """One reference case: how to call the task, on what, and what should come back.

    target: the function or class under test, as the test cell names it (e.g. "with_model(greedy_decode)");
    kind: "function" (called on the inputs) or "module" (built with `init`, given `params`, then called);
    args / kwargs: the input names passed positionally / as keyword -> input name; const_args and
    const_kwargs: plain values passed after them; outputs: the names of what the call returns, in order;
    grad_wrt: inputs or parameters whose gradient of sum(output * grad_weights) is compared with `grads`;
    variants: {bug: (message, outputs of that bug)}; properties: generic checks, e.g. ["raises",
    "ValueError", "when ..."] for a case of bad input; forbid: library functions the answer must not call;
    train_seed: None, or (module cases) run the module in train mode, its dropout a function of each value
    (`starter.compare.value_dropout`) and the random generator seeded with it just before the call; stand_ins: (module
    cases) class names of submodules that run as the kit's PyTorch-backed version while the case runs
    (`starter.stand_ins.STAND_INS`), so that a mistake in them is charged to their own test, not to this one.
    """

    name: str
    target: str
    kind: str = "function"
    args: list[str] = field(default_factory=list)
    kwargs: dict[str, str] = field(default_factory=dict)
    const_args: list[Any] = field(default_factory=list)
    const_kwargs: dict[str, Any] = field(default_factory=dict)
    init: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    expected: dict[str, np.ndarray] = field(default_factory=dict)
    grad_wrt: list[str] = field(default_factory=list)
    grad_weights: dict[str, np.ndarray] = field(default_factory=dict)
    grads: dict[str, np.ndarray] = field(default_factory=dict)
    # what each known bug returns (repr=False: printing a case shows what the student needs, not every bug)
    variants: dict[str, tuple[str, dict[str, np.ndarray]]] = field(default_factory=dict, repr=False)
    properties: list[list[str]] = field(default_factory=list)
    forbid: list[str] = field(default_factory=list)
    train_seed: int | None = None
    stand_ins: list[str] = field(default_factory=list)
    rtol: float = 1e-4
    atol: float = 1e-5
    hint: str = ""

    @property
    def expects_error(self) -> bool:
        """A case of bad input: the answer must raise (its stored outputs are empty placeholders)."""
        return any(p[0] == "raises" for p in self.properties)


def _arrays(group) -> dict[str, np.ndarray]:
    return {key: group[key][()] for key in group} if group is not None else {}


def write_case(f, case: Case, arrays: tuple[str, ...] = ARRAY_FIELDS, variants: bool = True) -> None:
    """Write `case` as the group `case.name` of the open HDF5 file `f` (`arrays` and `variants`: what of it
    to write; the sandbox's copy of a hidden case leaves out what it must not see)."""
    g = f.create_group(case.name)
    g.attrs.update({**{k: getattr(case, k) for k in SCALAR_FIELDS},
                    **{k: json.dumps(getattr(case, k)) for k in JSON_FIELDS}})
    for key in arrays:
        if getattr(case, key):
            sub = g.create_group(key)
            for name, value in getattr(case, key).items():
                sub.create_dataset(name, data=value)
    if variants and case.variants:
        vg = g.create_group("variants")
        for vname, (message, outs) in case.variants.items():
            one = vg.create_group(vname)
            one.attrs["message"] = message
            for name, value in outs.items():
                one.create_dataset(name, data=value)


def read_case(group, name: str) -> Case:
    """The Case stored in `group` (raises KeyError or ValueError on a damaged group)."""
    a = group.attrs
    stored: dict[str, Any] = {k: json.loads(a[k]) for k in JSON_FIELDS}
    stored.update({k: _arrays(group.get(k)) for k in ARRAY_FIELDS})
    variants = {vname: (str(vg.attrs["message"]), _arrays(vg)) for vname, vg in group.get("variants", {}).items()}
    return Case(name=name, target=str(a["target"]), kind=str(a["kind"]), hint=str(a["hint"]),
                rtol=float(a["rtol"]), atol=float(a["atol"]), variants=variants, **stored)


def case_groups(f) -> list[tuple[str, Any]]:
    """(name, group) of every reference case stored in an open reference file, in HDF5's order (by name, each
    group before what it holds). A case's own groups are not walked: they hold no case, and walking every array of
    every file took most of the time of reading a few cases."""
    import h5py

    found: list[tuple[str, Any]] = []

    def walk(prefix: str, group) -> None:
        for key, item in group.items():
            if isinstance(item, h5py.Group):
                if "target" in item.attrs:
                    found.append((prefix + key, item))
                else:
                    walk(prefix + key + "/", item)

    walk("", f)
    return found
