"""A course folder prepared again records the assignment in the gradebook only when that changes something."""
from __future__ import annotations

import json

import nbformat
from nbgrader.api import Gradebook

from grading import course
from grading import notebooks as nbs


def _recording(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = course.generate_assignment
    monkeypatch.setattr(course, "generate_assignment", lambda root: (calls.append(str(root)), real(root))[1])
    return calls


def _points(root) -> dict[str, float]:
    with Gradebook(course.sqlite_url(root)) as gb:
        return {f"{nb.name}/{c.name}": c.max_score for nb in gb.find_assignment(nbs.ASSIGNMENT).notebooks
                for c in nb.grade_cells}


def test_a_course_prepared_again_is_recorded_again_only_when_the_gradebook_or_its_sources_differ(tmp_path,
                                                                                                  monkeypatch):
    root = tmp_path / "course"
    calls = _recording(monkeypatch)
    course.prepare_grading_course(root)
    assert len(calls) == 1 and (root / course.RECORDED_FILE).is_file()
    points = _points(root)
    course.prepare_grading_course(root)
    assert len(calls) == 1, "prepared again from the same notebooks, the assignment was recorded again"
    assert _points(root) == points

    # the gradebook no longer holds what was recorded: a cell's points changed, then the gradebook gone
    cell = next(iter(points))
    with Gradebook(course.sqlite_url(root)) as gb:
        nb = gb.find_notebook(cell.split("/")[0], nbs.ASSIGNMENT)
        grade_cell = next(c for c in nb.grade_cells if c.name == cell.split("/")[1])
        grade_cell.max_score += 5
        gb.db.commit()
    course.prepare_grading_course(root)
    assert len(calls) == 2 and _points(root) == points, "a gradebook changed since was not recorded again"
    (root / course.GRADEBOOK_FILE).unlink()
    course.prepare_grading_course(root)
    assert len(calls) == 3 and _points(root) == points, "a gradebook gone was not recorded again"

    # what this folder says it recorded: damaged, or its release short of a notebook
    (root / course.RECORDED_FILE).write_text("{not json")
    course.prepare_grading_course(root)
    assert len(calls) == 4, "a damaged record of the last recording was trusted"
    next((root / "release" / nbs.ASSIGNMENT).glob("*.ipynb")).unlink()
    course.prepare_grading_course(root)
    released = list((root / "release" / nbs.ASSIGNMENT).glob("*.ipynb"))
    assert len(calls) == 5 and len(released) == len(nbs.solution_notebooks()), "a release short of a notebook"

    # a source notebook that changed (a new release of the solutions): its new points are recorded
    populate = course.populate_source

    def changed_source(folder):
        source = populate(folder)
        path = sorted(source.glob("*.ipynb"))[0]
        nb = nbformat.read(str(path), as_version=4)
        graded = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))
        graded.metadata.nbgrader["points"] += 1
        nbformat.write(nb, str(path))
        return source

    monkeypatch.setattr(course, "populate_source", changed_source)
    course.prepare_grading_course(root)
    assert len(calls) == 6, "a changed source notebook was not recorded"
    changed = {k: v for k, v in _points(root).items() if v != points[k]}
    assert len(changed) == 1 and json.loads((root / course.RECORDED_FILE).read_text())["cells"]
