"""The kit's import graph, read from the source: every `import` and `from ... import`, those inside functions
too (an import moved into a function still ties the two modules together)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """{module: the modules of `packages` it imports}, for every module of `packages`."""
    graph: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            module, is_package = _module(path), path.name == "__init__.py"
            named: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    named |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    base = module.split(".")[:len(module.split(".")) - node.level + is_package] if node.level else []
                    target = ".".join(base + ([node.module] if node.module else []))
                    named |= {target} | {f"{target}.{a.name}" for a in node.names}
            graph[module] = {n for n in named if n.split(".")[0] in packages}
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another in a circle (strongly connected, more than one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found
