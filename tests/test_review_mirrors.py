"""The Python mirrors of the solution notebooks (solutions/py/, written by `python -m grading release` for code
review) are up to date, hold only what a reviewer needs, and an edited mirror copies back into its notebook
without losing a cell's source or nbgrader metadata."""
from __future__ import annotations

import importlib.util
import re

import pytest
from conftest import SOLUTION_STEMS, needs

from grading import notebooks as nbs

if importlib.util.find_spec("jupytext") is None:
    needs("jupytext (requirements.txt)")

from grading import mirrors


def _cells(nb) -> list[tuple]:
    return [(c.cell_type, c.source, c.metadata.get("nbgrader"), c.metadata.get("tags")) for c in nb.cells]


def test_every_mirror_is_up_to_date():
    problems = mirrors.stale_mirrors()
    assert not problems, "\n".join(problems)


def test_a_stale_mirror_is_named_in_one_line(tmp_path):
    sources = [nbs.SOLUTIONS / f"{stem}.ipynb" for stem in SOLUTION_STEMS[:2]]
    mirrors.write_mirrors(tmp_path, sources)
    assert mirrors.stale_mirrors(tmp_path, sources) == []
    edited = mirrors.mirror_path(sources[1], tmp_path)
    edited.write_text(edited.read_text(encoding="utf-8").replace("import", "import  ", 1), encoding="utf-8")
    (tmp_path / "99_gone.py").write_text("# %%\n", encoding="utf-8")
    problems = mirrors.stale_mirrors(tmp_path, sources)
    assert len(problems) == 2 and "\n" not in "".join(problems)
    assert problems[0].startswith(f"{sources[1].name} was changed") and "python -m grading release" in problems[0]
    assert problems[1].startswith("99_gone.py")


@pytest.mark.parametrize("stem", SOLUTION_STEMS)
def test_a_mirror_holds_sources_and_nbgrader_metadata_only(stem):
    nb = nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb")
    text = mirrors.mirror_text(nb)  # what release writes (test_every_mirror_is_up_to_date: what is committed)
    assert not text.startswith("# ---"), "a mirror has no notebook metadata header (jupytext version, kernel)"
    # a cell's header, not a commented magic of its source (`# %%writefile train_captioner.py`)
    headers = [line for line in text.splitlines() if re.match(r"# %%( |$)", line)]
    assert len(headers) == len(nb.cells)
    for cell, header in zip(nb.cells, headers):
        # nothing but the nbgrader metadata and the tags: no ids, execution counts, outputs, widget state
        assert re.fullmatch(r'# %%( \[(markdown|raw)\])? nbgrader=\{[^{}]*\}( tags=\[[^]]*\])?', header), header
        grade_id = nbs.nbgrader_meta(cell)["grade_id"]
        assert f'"grade_id": "{grade_id}"' in header, f"{stem}.py: cell {grade_id}'s header is {header!r}"
        if "points" in nbs.nbgrader_meta(cell):
            assert f'"points": {nbs.nbgrader_meta(cell)["points"]}' in header


@pytest.mark.parametrize("stem", SOLUTION_STEMS)
def test_round_trip_keeps_every_cell(stem):
    """.ipynb -> .py -> .ipynb: jupytext reads back every source and every cell's nbgrader metadata and tags (up
    to blank lines at a cell's end), and copying the unedited mirror back gives the notebook unchanged, ids
    and notebook metadata included."""
    import jupytext

    nb = nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb")
    text = mirrors.mirror_text(nb)
    back = jupytext.reads(text, fmt=mirrors.FORMAT)
    assert [(t, s.rstrip("\n"), g, tags) for t, s, g, tags in _cells(back)] == \
        [(t, s.rstrip("\n"), g, tags) for t, s, g, tags in _cells(nb)]
    assert {k for c in back.cells for k in c.metadata} <= set(mirrors.CELL_METADATA)
    assert mirrors.notebook_from_mirror(text, nb) == nb


def test_an_edited_mirror_changes_only_what_was_edited(tmp_path):
    stem = SOLUTION_STEMS[0]
    notebook = tmp_path / f"{stem}.ipynb"
    notebook.write_bytes((nbs.SOLUTIONS / f"{stem}.ipynb").read_bytes())
    nb = nbs.read(notebook)
    graded = next(c for c in nbs.test_cells(nb) if "points" in nbs.nbgrader_meta(c))
    grade_id, points = nbs.nbgrader_meta(graded)["grade_id"], nbs.nbgrader_meta(graded)["points"]
    text = mirrors.mirror_text(nb)
    old_header = next(line for line in text.splitlines() if f'"grade_id": "{grade_id}"' in line)
    new_header = old_header.replace(f'"points": {points}', f'"points": {points + 1}')
    first_line = graded.source.splitlines()[0]
    text = text.replace(old_header + "\n" + first_line, new_header + "\n" + first_line + "  # reviewed", 1)
    mirror = tmp_path / f"{stem}.py"
    mirror.write_text(text, encoding="utf-8")

    mirrors.update_notebook(mirror, notebook)
    updated = nbs.read(notebook)
    changed = [i for i, (a, b) in enumerate(zip(nb.cells, updated.cells)) if a != b]
    assert len(updated.cells) == len(nb.cells) and changed == [nb.cells.index(graded)]
    cell = updated.cells[changed[0]]
    assert cell.id == graded.id and cell.source.splitlines()[0] == first_line + "  # reviewed"
    assert nbs.nbgrader_meta(cell) == {**nbs.nbgrader_meta(graded), "points": points + 1}
    assert updated.metadata == nb.metadata
    assert mirrors.stale_mirrors(tmp_path, [notebook]) == []  # the edited mirror is the notebook's mirror now
