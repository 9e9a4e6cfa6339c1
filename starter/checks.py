"""What the notebooks' test cells and students call.

A test cell is one line, e.g. ``check("sdpa/masked", scaled_dot_product_attention)``: the named case is a
stored reference (``load_case`` reads it: its inputs and expected outputs are numpy arrays), run on your code
and compared by ``starter.compare``. ``check_public("02_positional_encoding", globals())`` runs every public
case of a notebook at once.

A failed check raises ``CheckFailed`` whose message is one line that says what is wrong and the likely
cause. In Jupyter it is shown without a traceback. Checks write nothing to stderr: nbgrader gives zero points
to a test cell that does. While grading, ``check`` only records what your code did, for the grader's judge,
which compares it outside the sandbox with the same code.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py

from .cases import case_groups
from .compare import (
    PUBLIC_DIR,
    RESULTS_ENV,
    CheckFailed,
    ReadOnlyModule,
    load_case,
    measured,
    observe,
    record,
    verdict,
)


def check(name: str, fn: Callable) -> None:
    """Run the stored case `name` against the student's function or module class `fn`.

    Prints one line on success; raises CheckFailed with a one-line diagnosis otherwise. While
    grading (``$COURSE_RESULTS_DIR`` set) it only records what `fn` did: the judge decides.
    """
    case = load_case(name)
    obs = observe(case, fn)
    if os.environ.get(RESULTS_ENV):
        record(obs, Path(os.environ[RESULTS_ENV]))
        # on stderr, so that a test cell not rescored by the judge would earn nothing (nbgrader gives 0 to
        # a cell that writes to stderr): grading fails closed
        print(f"{name}: recorded for the judge", file=sys.stderr)
        return
    message = verdict(case, obs)
    if message:
        raise CheckFailed(f"{name}: {message}")
    figures = measured(case, obs)  # a trained model's share of captions right, beside the share asked for
    print(f"\u2713 {name} passed" + (f": {figures}" if figures else ""))


def _adapters() -> dict[str, Callable]:
    """The wrappers test cells put around an answer ("with_model(greedy_decode)"), by name."""
    from . import fast, layers, pipeline, scripts

    return {name: getattr(module, name) for module in (layers, pipeline, scripts, fast) for name in module.__all__}


def check_public(notebook: str, namespace: dict) -> int:
    """Run every public case of `notebook` (e.g. "02_positional_encoding") on the answers defined in
    `namespace` (the notebook's `globals()`), one line each, and return how many fail. A ✓ on every line
    means every situation the notebook shows you passes; hidden cases vary the same situations. Prints
    only: a failure is a line here, not an exception. Does nothing while grading."""
    if os.environ.get(RESULTS_ENV):
        print("(skipped while grading: the test cells above are what counts)")
        return 0
    with h5py.File(PUBLIC_DIR / f"{notebook}.h5", "r") as f:
        targets = {name: str(group.attrs["target"]) for name, group in case_groups(f)}
    adapters, failed = _adapters(), 0
    for name, target in targets.items():
        wrapper, _, inner = target.partition("(")
        answers: list[Any] = [namespace.get(n.strip()) for n in inner.rstrip(")").split(",")] if inner else []
        try:  # a missing answer is None: check says so
            answer: Any = adapters[wrapper](*answers) if inner else namespace.get(target)
            check(name, answer)
        except CheckFailed as exc:
            failed += 1
            print(f"\u2717 {exc}")
    print(f"{len(targets) - failed} of {len(targets)} public cases of {notebook} pass"
          + ("." if not failed else f"; fix the {failed} marked \u2717 above first."))
    return failed


def summary(fn_cases: dict[str, Callable]) -> None:
    """Run several checks and print a one-line result for each (for self-checking, not grading)."""
    for name, fn in fn_cases.items():
        try:
            check(name, fn)
        except CheckFailed as exc:
            print(f"\u2717 {exc}")


__all__ = ["check", "check_public", "load_case", "CheckFailed", "summary"]

if __name__ in sys.modules:
    sys.modules[__name__].__class__ = ReadOnlyModule
