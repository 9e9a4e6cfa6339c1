"""Rebuilding a submission on the release template repairs structural tampering."""
from __future__ import annotations

import copy
import json

import nbformat
import pytest
from conftest import filled_submission, solution_sources

from grading import notebooks as nbs
from grading.submission import read_any, rebuild

STEM = "01_scaled_dot_product_attention"


@pytest.fixture
def template():
    return nbs.read(nbs.RELEASE / f"{STEM}.ipynb")


def _solutions(nb):
    return {nbs.nbgrader_meta(c)["grade_id"]: c.source for c in nb.cells if nbs.is_solution(c)}


def _tests(nb):
    return {nbs.nbgrader_meta(c)["grade_id"]: (c.source, nbs.nbgrader_meta(c)["points"]) for c in nbs.test_cells(nb)}


def test_clean_submission_is_unchanged(template):
    result = rebuild(filled_submission(STEM), template)
    assert _solutions(result.notebook) == solution_sources(STEM)
    assert _tests(result.notebook) == _tests(template)
    assert set(result.matched.values()) == {"grade_id"} and not result.notes


def test_edited_deleted_and_repointed_tests_are_restored(template):
    nb = filled_submission(STEM)
    tests = [c for c in nb.cells if nbs.is_test(c)]
    tests[0].source = "pass  # trust me"
    tests[1].metadata.nbgrader["points"] = 100
    nb.cells.remove(tests[2])
    result = rebuild(nb, template)
    assert _tests(result.notebook) == _tests(template)
    assert any("restored" in n for n in result.notes)


def test_duplicated_cells_are_ignored(template):
    nb = filled_submission(STEM)
    test = next(c for c in nb.cells if nbs.is_test(c))
    sol = next(c for c in nb.cells if nbs.is_solution(c))
    evil = copy.deepcopy(sol)
    evil.source = "raise SystemExit"
    nb.cells.append(copy.deepcopy(test))
    nb.cells.append(evil)
    result = rebuild(nb, template)
    gids = [nbs.nbgrader_meta(c).get("grade_id") for c in result.notebook.cells if nbs.nbgrader_meta(c)]
    assert len(gids) == len(set(gids))
    assert _solutions(result.notebook) == solution_sources(STEM)
    assert any("second cell" in n for n in result.notes)


def test_stripped_metadata_is_recovered(template):
    nb = filled_submission(STEM)
    for cell in nb.cells:
        cell.metadata = {}
    result = rebuild(nb, template)
    assert _solutions(result.notebook) == solution_sources(STEM)
    assert any("metadata was missing" in n for n in result.notes)


def test_extra_student_cells_are_kept_in_place(template):
    nb = filled_submission(STEM)
    idx = next(i for i, c in enumerate(nb.cells) if nbs.is_solution(c))
    nb.cells.insert(idx + 1, nbformat.v4.new_code_cell("def my_helper():\n    return 42"))
    result = rebuild(nb, template)
    sources = [c.source for c in result.notebook.cells]
    pos = sources.index("def my_helper():\n    return 42")
    assert nbs.is_solution(result.notebook.cells[pos - 1])


def test_nbformat_40_from_colab(tmp_path, template):
    nb = filled_submission(STEM)
    raw = json.loads(nbformat.writes(nb))
    raw["nbformat_minor"] = 0
    raw["metadata"] = {"colab": {"name": "x.ipynb", "provenance": []}, "kernelspec": {"name": "python3",
                       "display_name": "Python 3"}, "accelerator": "GPU"}
    for cell in raw["cells"]:
        cell.pop("id", None)
        cell["metadata"]["colab"] = {"base_uri": "https://localhost:8080/"}
        cell["metadata"]["id"] = "abc"
    path = tmp_path / "old.ipynb"
    path.write_text(json.dumps(raw))
    result = rebuild(read_any(path), template)
    assert _solutions(result.notebook) == solution_sources(STEM)
    nbformat.validate(result.notebook)


def test_written_answers_are_kept_by_grade_id_or_after_their_question(template):
    """A written answer is a Markdown cell: it is graded by a person, so losing it would lose points silently."""
    answers = {g: s for g, s in solution_sources(STEM).items() if g.startswith("q_")}
    assert answers, "notebook 01 has written questions"
    nb = filled_submission(STEM, {g: f"my answer to {g}" for g in answers})
    result = rebuild(nb, template)
    assert {g: s for g, s in _solutions(result.notebook).items() if g in answers} == \
        {g: f"my answer to {g}" for g in answers}
    # an editor that drops the metadata: each answer still follows its (unchanged) question cell
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    result = rebuild(nb, template)
    assert {g: s for g, s in _solutions(result.notebook).items() if g in answers} == \
        {g: f"my answer to {g}" for g in answers}
    assert {result.matched[g] for g in answers} == {"position"}
