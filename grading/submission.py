"""Rebuild a student's notebook on the release template, keeping only the student's own code.

Whatever a student did to the notebook's structure (edited, deleted or duplicated test cells, changed
points or other nbgrader metadata, metadata stripped by an editor, an old nbformat with Colab's
metadata), the notebook that gets graded is the release notebook with:

- each solution cell's source taken from the student's matching cell: by grade_id, or, where the
  metadata is gone, by the cell's first line (the given `def`/`class` line) or its position;
- each written answer (a Markdown solution cell) taken from the student's cell with its grade_id, or,
  where the metadata is gone, from the Markdown cell right after its question;
- the student's extra code cells (helpers, experiments) kept, after the cell they followed;

and every other cell (text, given code, tests) exactly as released. Each repair is noted. Reading
(`read_any`) takes a malformed but mostly valid notebook as well: a cell's metadata, nbgrader metadata or
source of the wrong JSON type counts as absent (like metadata an editor stripped), noted too.
"""
from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import notebooks


@dataclass
class Rebuilt:
    notebook: object
    notes: list[str] = field(default_factory=list)
    matched: dict[str, str] = field(default_factory=dict)  # solution grade_id -> how it was found


def _norm(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    return ""


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _written_answer(cell, src, meta, gid, anchor, solutions, out, t_cells, sol_index, fixed, has_meta) -> int:
    """A Markdown cell of the student: a written answer (kept, by its grade_id; without metadata, the Markdown
    cell right after its question), or a fixed cell of the release (it moves the anchor). Returns the anchor."""
    if gid in sol_index and meta.get("solution"):
        if gid in solutions:
            out.notes.append(f"a second cell with grade_id '{gid}' was ignored")
        else:
            solutions[gid], out.matched[gid] = src, "grade_id"
        return sol_index[gid]
    if _norm(src) in fixed:
        return fixed[_norm(src)]
    following = anchor + 1
    if (not has_meta and cell.get("cell_type") == "markdown" and following < len(t_cells)
            and t_cells[following].cell_type == "markdown" and notebooks.is_solution(t_cells[following])):
        answer_id = notebooks.nbgrader_meta(t_cells[following])["grade_id"]
        if answer_id not in solutions:
            solutions[answer_id], out.matched[answer_id] = src, "position"
            return following
    return anchor


def rebuild(student, template) -> Rebuilt:
    """`student` and `template` are notebook nodes (nbformat 4). Returns the notebook to grade."""
    out = Rebuilt(notebook=None)
    t_cells = list(template.cells)
    fixed = {_norm(c.source): i for i, c in enumerate(t_cells) if not notebooks.is_solution(c)}
    sol_ids = [notebooks.nbgrader_meta(c)["grade_id"] for c in t_cells if notebooks.is_solution(c)]
    sol_index = {notebooks.nbgrader_meta(c)["grade_id"]: i for i, c in enumerate(t_cells) if notebooks.is_solution(c)}
    first_lines = {gid: _first_line(t_cells[i].source) for gid, i in sol_index.items()}
    test_ids = {notebooks.nbgrader_meta(c)["grade_id"] for c in t_cells if notebooks.is_test(c)}

    has_meta = any(notebooks.nbgrader_meta(c).get("grade_id") for c in student.cells)
    if not has_meta:
        out.notes.append("nbgrader metadata was missing: solution cells matched by their first line or position")

    solutions: dict[str, str] = {}
    extras: dict[int, list[str]] = {}  # template position -> extra student code after it
    anchor = -1  # template position of the last recognised cell
    seen_tests: set[str] = set()
    for cell in student.cells:
        src = _source(cell)
        meta = notebooks.nbgrader_meta(cell)
        gid = str(meta.get("grade_id") or "")
        if cell.get("cell_type") != "code":
            anchor = _written_answer(cell, src, meta, gid, anchor, solutions, out, t_cells, sol_index, fixed, has_meta)
            continue
        if gid in sol_index and meta.get("solution"):
            if gid in solutions:
                out.notes.append(f"a second cell with grade_id '{gid}' was ignored")
            else:
                solutions[gid], out.matched[gid] = src, "grade_id"
            anchor = sol_index[gid]
            continue
        if gid in test_ids or _norm(src) in fixed:
            if gid in test_ids and gid in seen_tests:
                out.notes.append(f"a copy of test cell '{gid}' was ignored")
            seen_tests.add(gid or "")
            if _norm(src) in fixed:
                anchor = fixed[_norm(src)]
            elif gid in test_ids:
                anchor = next(i for i, c in enumerate(t_cells) if notebooks.nbgrader_meta(c).get("grade_id") == gid)
            continue
        # a cell without usable metadata: a solution recognised by its first line, or by position
        line = _first_line(src)
        by_line = [g for g, fl in first_lines.items() if fl and fl == line and g not in solutions]
        next_code = next((i for i in range(anchor + 1, len(t_cells)) if t_cells[i].cell_type == "code"), None)
        next_gid = notebooks.nbgrader_meta(t_cells[next_code]).get("grade_id") if next_code is not None else None
        if by_line:
            gid = by_line[0]
            solutions[gid], out.matched[gid] = src, "first line"
            anchor = sol_index[gid]
        elif not has_meta and next_gid is not None and next_gid in sol_index and next_gid not in solutions:
            solutions[next_gid], out.matched[next_gid] = src, "position"
            anchor = sol_index[next_gid]
        elif src.strip():
            extras.setdefault(anchor, []).append(src)

    missing = [g for g in sol_ids if g not in solutions]
    if missing:
        out.notes.append(f"no answer found for {', '.join(missing)} (left as released)")
    edited = [notebooks.nbgrader_meta(c)["grade_id"] for c in t_cells if notebooks.is_test(c)
              and notebooks.nbgrader_meta(c)["grade_id"] not in seen_tests]
    if edited and has_meta:
        out.notes.append(f"test cells edited or deleted, restored: {', '.join(edited)}")

    cells = []
    for extra in extras.get(-1, []):
        cells.append(nbformat.v4.new_code_cell(extra))
    for i, cell in enumerate(t_cells):
        cell = copy.deepcopy(cell)
        gid = str(notebooks.nbgrader_meta(cell).get("grade_id") or "")
        if notebooks.is_solution(cell) and gid in solutions:
            cell.source = solutions[gid]
        cell.outputs = [] if cell.cell_type == "code" else None
        if cell.cell_type != "code":
            del cell["outputs"]
        else:
            cell.execution_count = None
        cells.append(cell)
        for extra in extras.get(i, []):
            cells.append(nbformat.v4.new_code_cell(extra))
    if sum(len(v) for v in extras.values()):
        out.notes.append(f"{sum(len(v) for v in extras.values())} extra code cell(s) of the student kept")
    nb = copy.deepcopy(template)
    nb.cells = cells
    out.notebook = nb
    return out


MAX_NOTEBOOK_BYTES = 256 * 2**20  # a submitted notebook read into memory (a zip's member has the same cap)
CELL_TYPES = ("code", "markdown", "raw", "heading")  # heading: nbformat 3


def _tidy_cells(cells: list, counts: dict[str, int]) -> list:
    """The cells of a submitted notebook as nbformat can read them, whatever their details: a cell that is not
    an object is dropped; metadata, nbgrader metadata or a source of the wrong JSON type count as absent (as
    if an editor had stripped them); outputs and attachments are dropped (the notebook is run again, and
    nothing of them is graded or shown)."""
    kept = []
    for cell in cells:
        if not isinstance(cell, dict):
            counts["item(s) of the cell list that are not cells: dropped"] += 1
            continue
        if cell.get("cell_type") not in CELL_TYPES:
            counts["cell(s) of no known type: read as raw cells"] += 1
            cell["cell_type"] = "raw"
        if not isinstance(cell.get("metadata", {}), dict):
            counts["cell(s) whose metadata is not a dictionary: ignored (as if stripped)"] += 1
            cell["metadata"] = {}
        cell.setdefault("metadata", {})
        if "nbgrader" in cell["metadata"] and not isinstance(cell["metadata"]["nbgrader"], dict):
            counts["cell(s) whose nbgrader metadata is not a dictionary: ignored (as if stripped)"] += 1
            del cell["metadata"]["nbgrader"]
        key = "input" if "input" in cell and "source" not in cell else "source"  # nbformat 3 code cells: input
        source = cell.get(key, "")
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            source = "".join(source)
        if not isinstance(source, str):
            counts["cell(s) whose source is not text: read as empty"] += 1
            source = ""
        cell[key] = source
        cell.pop("attachments", None)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        else:
            cell.pop("outputs", None)
        kept.append(cell)
    return kept


def read_any(path, repairs: list[str] | None = None) -> object:
    """Read a submitted notebook of any nbformat 4.x (e.g. 4.0 from Colab; 3 is converted) as nbformat 4,
    malformed details repaired (`_tidy_cells`); what was repaired is appended to `repairs`, one line each.
    Raises ValueError (or nbformat's errors) for a file that is not a notebook at all."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"{size / 2**20:.0f} MB, over the {MAX_NOTEBOOK_BYTES / 2**20:.0f} MB a notebook may have")
    raw = json.loads(path.read_bytes())
    if not isinstance(raw, dict):
        raise ValueError("the file's JSON is not a notebook (not an object)")
    if not isinstance(raw.get("metadata", {}), dict):
        raw["metadata"] = {}
        (repairs if repairs is not None else []).append("the notebook's metadata is not a dictionary: ignored")
    counts: dict[str, int] = Counter()
    if "cells" in raw:
        if not isinstance(raw["cells"], list):
            raise ValueError("the notebook's cells are not a list")
        raw["cells"] = _tidy_cells(raw["cells"], counts)
    worksheets = raw.get("worksheets")  # nbformat 3
    for sheet in worksheets if isinstance(worksheets, list) else []:
        if isinstance(sheet, dict) and isinstance(sheet.get("cells"), list):
            sheet["cells"] = _tidy_cells(sheet["cells"], counts)
    if repairs is not None:
        repairs += [f"{n} {what}" for what, n in counts.items()]
    nb = nbformat.reads(json.dumps(raw), as_version=4)
    for cell in nb.cells:  # old minors lack cell ids; nbformat adds them on validate/normalise
        cell.setdefault("metadata", {})
    return nb
