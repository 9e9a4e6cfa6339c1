"""A class for the similarity check (grading/similarity.py): independent solutions and planted copies, staged as intake
stages a class (`<root>/submitted/<student>/attention/<stem>.ipynb`).

Independent work: the course's solutions and three students who each wrote notebooks 01 to 03 from the student copy
alone, each in a style of their own (tests/fixtures/similarity/*.json: their answer cells, by notebook and grade_id).
Planted copies, each of one source: every answer with its names renamed; statements reordered, reformatted, with
comments and blank lines added; a copy with one of its source's lines changed (a bug fixed); and one task copied by a
student who answered nothing else.
"""
from __future__ import annotations

import ast
import json
import random
import re
from pathlib import Path

from grading import notebooks as nbs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "similarity"
STEMS = ("01_scaled_dot_product_attention", "02_positional_encoding", "03_multi_head_attention")
# the planted copies: (copier, source, how)
COPIES = [("renamed", "student_a", "rename"), ("reordered", "student_b", "reorder"),
          ("bug_fixed", "student_c", "fix"), ("one_task", "solution", "one_task")]
ONE_TASK = ("03_multi_head_attention", "MultiHeadAttention")  # the task the one-task copier took


def solution_answers() -> dict[str, dict[str, str]]:
    """{stem: {grade_id: source}} of the solutions' answer cells, as a student would hand them in (no markers)."""
    out: dict[str, dict[str, str]] = {}
    for stem in STEMS:
        for cell in nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb").cells:
            meta = nbs.nbgrader_meta(cell)
            if meta.get("solution"):
                text = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|$)", "", cell.source, flags=re.M)
                out.setdefault(stem, {})[meta["grade_id"]] = text
    return out


def independent() -> dict[str, dict[str, dict[str, str]]]:
    """{student: {stem: {grade_id: source}}} of the independent work."""
    work = {"solution": solution_answers()}
    for path in sorted(FIXTURES.glob("student_*.json")):
        work[path.stem] = json.loads(path.read_text(encoding="utf-8"))
    return work


class _Renamer(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node):
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = self.names.get(node.arg, node.arg)
        return node


def _assigned(tree) -> set[str]:
    found = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda))):
        found |= {a.arg for a in fn.args.args[1:] if fn.args.args}  # (not self; a function's own name stays)
    return found


def rename(source: str, seed: int) -> str:
    """Every local name renamed (a function's own name and its first argument kept); reformatted by ast."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    rng = random.Random(seed)
    words = ["val", "tmp", "res", "arr", "buf", "acc", "data", "item", "part", "thing"]
    names = {n: f"{rng.choice(words)}_{i}" for i, n in enumerate(sorted(_assigned(tree)))}
    return ast.unparse(_Renamer(names).visit(tree))


def reorder(source: str) -> str:
    """Adjacent statements swapped where the second reads nothing the first writes; a comment over every statement
    and blank lines between; reformatted by ast."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source

    def writes(stmt):
        return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    def reads(stmt):
        return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        i = 0
        while i + 1 < len(body):
            a, b = body[i], body[i + 1]
            plain = all(isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)) for s in (a, b))
            if plain and not (writes(a) & reads(b)) and not (writes(b) & (reads(a) | writes(a))):
                body[i], body[i + 1] = b, a
                i += 2
            else:
                i += 1
    lines = []
    for line in ast.unparse(tree).splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        if line.strip() and not line.strip().startswith(("else", "elif", "except", "finally", ")", "]")):
            lines += ["", f"{indent}# next step of the computation"]
        lines.append(line)
    return "\n".join(lines)


def fix_one_line(source: str) -> str:
    """The source with one line changed, as a copier fixing a bug of it would: the first `- 1` or `+ 1` flipped, or
    a line added."""
    changed = re.sub(r"([-+]) 1\b", lambda m: ("+" if m.group(1) == "-" else "-") + " 1", source, count=1)
    return changed if changed != source else source + "\n    pass"


def reworded(text: str) -> str:
    """A written answer with a few words changed."""
    swaps = {"the": "this", "is": "becomes", "because": "since", "a": "one"}
    words = text.split(" ")
    return " ".join(swaps.get(w, w) if i % 7 == 3 else w for i, w in enumerate(words))


def copied(source: dict[str, dict[str, str]], how: str, seed: int) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for stem, cells in source.items():
        for gid, text in cells.items():
            code = not gid.startswith("q_")
            if how == "one_task":
                if (stem, gid) == ONE_TASK:
                    out.setdefault(stem, {})[gid] = rename(text, seed)
                continue
            if how == "rename":
                new = rename(text, seed) if code else reworded(text)
            elif how == "reorder":
                new = reorder(text) if code else reworded(text)
            else:
                new = text
            out.setdefault(stem, {})[gid] = new
    if how == "fix":
        stem = STEMS[-1]
        gid = max(out[stem], key=lambda g: len(out[stem][g]))
        out[stem][gid] = fix_one_line(out[stem][gid])
    return out


def planted_class() -> dict[str, dict[str, dict[str, str]]]:
    """{student: {stem: {grade_id: source}}}: the independent work and the planted copies."""
    work = independent()
    for k, (copier, source, how) in enumerate(COPIES):
        if source in work:
            work[copier] = copied(work[source], how, seed=k)
    return work


def stage(root: Path, work: dict[str, dict[str, dict[str, str]]]) -> Path:
    """Write each student's notebooks as intake stages them: the release notebook, its answer cells replaced."""
    for student, by_stem in work.items():
        folder = root / "submitted" / student / nbs.ASSIGNMENT
        folder.mkdir(parents=True, exist_ok=True)
        for stem in STEMS:
            nb = nbs.read(nbs.RELEASE / f"{stem}.ipynb")
            for cell in nb.cells:
                gid = nbs.nbgrader_meta(cell).get("grade_id")
                if gid in by_stem.get(stem, {}):
                    cell.source = by_stem[stem][gid]
            (folder / f"{stem}.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    return root
