"""A run's gradebook, made with nbgrader's own API from hand-made outcomes (no grading): the fast tests of
what is written from a run's results."""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from grading import notebooks as nbs
from grading.outcome import StudentOutcome


def judged_gradebook(path: Path, outcomes: list[StudentOutcome], notebook: str) -> Path:
    """A gradebook at `path` holding the assignment's cells and, for each graded outcome, the judge's points
    of `notebook` as its automatic scores."""
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    # nbgrader runs the `alembic` command when it makes a gradebook: this interpreter's scripts first
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    with Gradebook(f"sqlite:///{path}") as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's own ORM use, as grading.course says
        gb.add_assignment(nbs.ASSIGNMENT)
        for stem in dict.fromkeys(stem for stem, *_ in nbs.graded_columns() + nbs.written_columns()):
            gb.add_notebook(stem, nbs.ASSIGNMENT)
        for cells, kind in ((nbs.graded_columns(), "code"), (nbs.written_columns(), "markdown")):
            for stem, task, points in cells:
                gb.add_grade_cell(task, stem, nbs.ASSIGNMENT, max_score=points, cell_type=kind)
        for outcome in outcomes:
            if outcome.status != "graded":
                continue
            gb.add_student(outcome.student)
            gb.add_submission(nbs.ASSIGNMENT, outcome.student)
            for cell in outcome.judged[0].cells:
                gb.find_grade(cell.grade_id, notebook, nbs.ASSIGNMENT, outcome.student).auto_score = cell.points
        gb.db.commit()
    return path
