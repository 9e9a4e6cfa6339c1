"""Spot student code that reaches for the checks, the interpreter or the system, for an instructor's look.

It decides nothing: scores come from the judge, which compares recorded outputs with expected ones
that never enter the sandbox, so such code cannot gain points. The findings go to the `review`
column. Honest notebook code (functions, classes, `self.x = ...`, tensor maths) raises none.
"""
from __future__ import annotations

import ast

PROTECTED_NAMES = {"check", "load_case", "CheckFailed", "summary"}
RISKY_CALLS = {"setattr", "delattr", "globals", "vars", "__import__", "exec", "eval", "compile", "get_ipython",
               "locals"}
RISKY_MODULES = {"builtins", "ctypes", "gc", "importlib", "inspect", "sys", "starter", "unittest", "IPython",
                 "ipykernel", "signal", "subprocess", "grading", "nbgrader", "os"}


def _root_name(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def suspicious(source: str) -> list[str]:
    """Reasons to look at this code (empty for ordinary code)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # it fails on its own; nothing it could patch
    reasons = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in PROTECTED_NAMES:
            reasons.append(f"redefines {node.name}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names = [a.asname or a.name for a in node.names]
            for mod in mods:
                if mod.split(".")[0] in RISKY_MODULES:
                    reasons.append(f"imports {mod}")
            for name in names:
                if name in PROTECTED_NAMES:
                    reasons.append(f"binds {name} by import")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in RISKY_CALLS:
            reasons.append(f"calls {node.func.id}()")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr not in (
                "__init__", "__name__", "__class__", "__len__", "__call__"):
            reasons.append(f"uses {node.attr}")
        for target in targets:
            for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                root = _root_name(t)
                if isinstance(t, ast.Name) and t.id in PROTECTED_NAMES:
                    reasons.append(f"rebinds {t.id}")
                elif isinstance(t, (ast.Attribute, ast.Subscript)) and root not in (None, "self"):
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and root == t.value.id:
                        continue  # x[i] = ... on a local tensor or list
                    reasons.append(f"assigns to {ast.unparse(t)[:60]}")
    return sorted(set(reasons))
