"""Whatever students hand in, the batch finishes and each gets the grade their real code earns.

One autograde run over a class of canned submissions, each built from the correct solution of
notebook 01 plus one kind of trouble. Decisions (also in the README):
- structural edits (tests edited, deleted, duplicated, points changed, metadata stripped, nbformat
  4.0 from Colab): repaired by rebuilding on the release template, graded normally, noted;
- tampering with the checks (rebinding `check`, patching `starter.checks`, `torch.allclose`,
  `numpy.allclose`, `torch.testing.assert_close`): the clean-room re-check decides; a test that
  passed only thanks to the tampering scores 0 and the student is flagged for manual review;
- an infinite loop: that cell times out, the tests that need it fail, the rest count;
- megabytes of output: truncated, graded normally;
- exiting the kernel: refused inside the kernel (the cell errors), graded normally otherwise;
- an exception at import (top level of a cell): the tests that need what the cell defines fail.
"""
from __future__ import annotations

import copy
import csv
import json

import nbformat
import pytest

from conftest import filled_submission, write_nb
from grading import notebooks as nbs
from grading.autograde import autograde, graded_columns

NB = "01_scaled_dot_product_attention"
POINTS = {g: p for s, g, p in graded_columns() if s == NB}
FULL = sum(POINTS.values())
CAUSAL_OK = '''
def causal_mask(T, device=None):
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()
'''


def _with_extra(nb, code: str, after_solution: str = "causal_mask"):
    idx = next(i for i, c in enumerate(nb.cells) if nbs.nbgrader_meta(c).get("grade_id") == after_solution)
    nb.cells.insert(idx + 1, nbformat.v4.new_code_cell(code))
    return nb


def _edited_tests():
    nb = filled_submission(NB)
    tests = [c for c in nb.cells if nbs.is_test(c)]
    tests[0].source = "pass"
    nb.cells.remove(tests[1])
    return nb


def _repointed():
    nb = filled_submission(NB)
    for c in nb.cells:
        if nbs.is_test(c):
            c.metadata.nbgrader["points"] = 100
    return nb


def _duplicated():
    nb = filled_submission(NB)
    nb.cells += [copy.deepcopy(c) for c in nb.cells if nbs.is_test(c)][:2]
    return nb


def _stripped():
    nb = filled_submission(NB)
    for c in nb.cells:
        c.metadata = {}
    return nb


REBIND_CHECK = '''
import starter.checks
check = lambda *args, **kwargs: print("passed")
try:
    starter.checks.check = check  # refused: the module's public names are read-only
except AttributeError:
    pass
'''
PATCH_CHECK = '''
import starter.checks
vars(starter.checks)["check"] = lambda *args, **kwargs: print("passed")  # past the read-only guard
'''
PATCH_ALLCLOSE = '''
import numpy, torch, torch.testing
torch.allclose = lambda *a, **k: True
numpy.allclose = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
'''

STUDENTS = {
    # name: (notebook, expected points per test cell (missing = full), expect a review flag)
    "edits_tests": (_edited_tests, {}, False),
    "changes_points": (_repointed, {}, False),
    "duplicates_cells": (_duplicated, {}, False),
    "strips_metadata": (_stripped, {}, False),
    # a wrong causal_mask and `check` rebound: test cells re-import the real `check`, so no gain
    "rebinds_check": (lambda: _with_extra(filled_submission(NB, {"causal_mask": CAUSAL_OK.replace(
        ".tril()", ".tril(-1)")}), REBIND_CHECK), {"test_causal_mask": 0}, False),
    # a wrong causal_mask, hidden behind a patched `check`: every test passes in the notebook
    "patches_check": (lambda: _with_extra(filled_submission(NB, {"causal_mask": CAUSAL_OK.replace(
        ".tril()", ".tril(-1)")}), PATCH_CHECK), {"test_causal_mask": 0}, True),
    # stubs left in place, comparison functions patched: nothing to gain
    "patches_allclose": (lambda: _with_extra(nbs.read(nbs.RELEASE / f"{NB}.ipynb"), PATCH_ALLCLOSE, "SelfAttention"),
                         {g: 0 for g in POINTS}, False),
    "loops_forever": (lambda: filled_submission(NB, {"causal_mask": CAUSAL_OK.replace(
        "    return", "    while True:\n        pass\n    return")}), {"test_causal_mask": 0}, False),
    "prints_megabytes": (lambda: _with_extra(filled_submission(NB), "print('x' * 100 + '\\n') \n" * 1
                                             + "for _ in range(50000):\n    print('spam ' * 20)"), {}, False),
    "exits_kernel": (lambda: _with_extra(filled_submission(NB), "import os\nos._exit(0)"), {}, False),
    "calls_exit": (lambda: _with_extra(filled_submission(NB), "exit()"), {}, False),
    "raises_at_import": (lambda: filled_submission(NB, {"causal_mask": "raise RuntimeError('boom')\n" + CAUSAL_OK}),
                         {"test_causal_mask": 0}, False),
}


def _colab_40(tmp_path):
    raw = json.loads(nbformat.writes(filled_submission(NB)))
    raw["nbformat_minor"] = 0
    raw["metadata"] = {"colab": {"provenance": []}, "kernelspec": {"name": "python3", "display_name": "Python 3"}}
    for cell in raw["cells"]:
        cell.pop("id", None)
        cell["metadata"]["colab"] = {"base_uri": "https://localhost:8080/"}
    return json.dumps(raw)


@pytest.fixture(scope="module")
def graded(tmp_path_factory, grading_db):
    subs = tmp_path_factory.mktemp("tampering")
    for name, (make, _, _) in STUDENTS.items():
        write_nb(make(), subs / name / f"{NB}.ipynb")
    (subs / "colab_40").mkdir()
    (subs / "colab_40" / f"{NB}.ipynb").write_text(_colab_40(subs))
    out = tmp_path_factory.mktemp("out")
    db_url, workers = grading_db
    results = autograde(subs, out, course_dir=tmp_path_factory.mktemp("course"), cell_timeout=20,
                        db_url=db_url, workers=workers)
    with open(out / "grades.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    return {r.student: r for r in results}, rows


@pytest.mark.parametrize("student", sorted(STUDENTS) + ["colab_40"])
def test_graded_as_decided(graded, student):
    results, rows = graded
    _, expected, flagged = STUDENTS.get(student, (None, {}, False))
    row = rows[student]
    assert row["status"] == "graded", (row["status"], row["notes"])
    for grade_id, points in POINTS.items():
        want = expected.get(grade_id, points)
        assert float(row[f"{NB}:{grade_id}"]) == want, (grade_id, row["review"], row["notes"])
    assert bool(row["review"]) == flagged, row["review"]


def test_the_whole_class_is_in_the_csv(graded):
    results, rows = graded
    assert set(STUDENTS) | {"colab_40"} == set(results) == set(rows) - {"(max points)"}
    assert float(rows["(max points)"]["total"]) == sum(p for *_, p in graded_columns())
