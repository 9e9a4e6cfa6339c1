"""Instructor tools: release, reference outputs, autograding. See `python -m grading --help`."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def _defer_rfc3987_syntax() -> None:
    """Import `rfc3987_syntax` when it is first used instead of with jsonschema (which nbformat and nbgrader import).

    jsonschema imports it to offer an "iri" format check, and its import builds a parser: 1.9 s in the grader's
    process and again in each worker's, for a check that grading never makes. In its place until then: a module
    whose one function, `is_valid_syntax` (all jsonschema takes of it), imports the real one on its first call."""
    name = "rfc3987_syntax"
    if name in sys.modules or importlib.util.find_spec(name) is None:
        return
    stand_in = types.ModuleType(name, "rfc3987_syntax, imported on the first use of is_valid_syntax (grading/__init__)")
    real: list = []

    def is_valid_syntax(*args, **kwargs):
        if not real:
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
            real.append(importlib.import_module(name).is_valid_syntax)
        return real[0](*args, **kwargs)

    stand_in.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
    sys.modules[name] = stand_in


_defer_rfc3987_syntax()
