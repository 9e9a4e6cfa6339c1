"""The authored notebooks, their student release and the stored references stay consistent."""
from __future__ import annotations

import json
import re

import h5py
import nbformat
import numpy as np
import pytest
from conftest import SOLUTION_STEMS, case_names_in
from nbclient import NotebookClient
from nbgrader.validator import Validator

from grading import course
from grading import notebooks as nbs
from grading.cases import registry


@pytest.mark.parametrize("stem", SOLUTION_STEMS)
def test_solution_passes_nbgrader_validation(stem, hidden_references, tmp_path, monkeypatch, request):
    """Every test cell of the solution passes, hidden tests included (read the Validator's result), with
    files beside it that the grader puts there (notebook 05's trained model, the notebooks its model and
    layers come from) as a student would hand them in."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for rel in nbs.FILES_BESIDE.get(stem, []):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        source = request.getfixturevalue("trained_model_file") if rel == nbs.TRAINED_CHECKPOINT else nbs.SOLUTIONS / rel
        (tmp_path / rel).write_bytes(source.read_bytes())
    path = tmp_path / f"{stem}.ipynb"
    path.write_bytes((nbs.SOLUTIONS / f"{stem}.ipynb").read_bytes())
    result = Validator().validate(str(path))
    failed = [f"{c['source'][:60]!r}: {c.get('raw_error', '')[-200:]}" for c in result.get("failed", [])]
    assert not failed, f"{stem}: solution fails its own tests: {failed}"
    assert not result.get("type_changed") and not result.get("changed"), result


@pytest.mark.parametrize("stem", SOLUTION_STEMS)
def test_every_test_cell_fails_on_the_untouched_release(stem, tmp_path):
    nb = nbs.read(nbs.RELEASE / f"{stem}.ipynb")
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    tests = list(nbs.test_cells(nb))
    assert tests, f"{stem} has no test cells"
    for cell in tests:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert errors, f"{stem}: test cell {nbs.nbgrader_meta(cell)['grade_id']} passes without any student code"
        # the trained-model cell first needs notebook 05's model (not beside it here) and what the training cell
        # saves: it says so
        trained = nbs.nbgrader_meta(cell)["grade_id"] == "test_trained_model"
        assert "not implemented yet" in errors[0].evalue or (trained and any(
            words in errors[0].evalue for words in ("no trained model at", "finish notebooks 05"))), errors[0].evalue
        assert not [o for o in cell.outputs if o.output_type == "stream" and o.name == "stderr"]
    # a beginner sees one line per stopped cell, never a traceback, and no cascade of unrelated errors
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                assert len(out.traceback) == 1, f"{stem} cell {index}: a {out.ename} traceback: {out.traceback[-1][:200]}"
                assert out.ename in {"CheckFailed", "NotImplementedError", "LayerLoadError", "NotebookLoadError",
                                     "CheckpointNotFound", "NameError"}, \
                    f"{stem} cell {index}: {out.ename}: {out.evalue[:200]}"


def test_release_is_up_to_date(tmp_path):
    written = course.release(tmp_path)
    assert {p.name for p in written} == {p.name for p in nbs.RELEASE.glob("*.ipynb")}, \
        "notebooks/ does not match solutions/: run `python -m grading release`"
    for fresh in written:
        assert fresh.read_bytes() == (nbs.RELEASE / fresh.name).read_bytes(), \
            f"notebooks/{fresh.name} is stale: run `python -m grading release`"


def _compare_h5(a, b, where=""):
    for key in a:
        assert key in b, f"{where}/{key} missing"
        if isinstance(a[key], h5py.Group):
            assert dict(a[key].attrs) == dict(b[key].attrs) or all(
                str(a[key].attrs[k]) == str(b[key].attrs[k]) for k in a[key].attrs), f"{where}/{key} attrs differ"
            _compare_h5(a[key], b[key], f"{where}/{key}")
        else:
            x, y = a[key][()], b[key][()]
            assert x.shape == y.shape and x.dtype == y.dtype, f"{where}/{key}"
            # float16 arrays are the dataset's stored features (the trained-model cases' images): made by a CNN
            # that CPUs round differently, one float16 step apart from machine to machine
            tolerance = dict(rtol=2e-3, atol=2e-3) if x.dtype == np.float16 else dict(rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64), **tolerance,
                                       err_msg=f"{where}/{key} is stale: run `python -m grading references`")
    assert set(a) == set(b), f"{where}: keys differ"


@pytest.mark.budget(240, reason="every notebook's reference cases built again: 56 s alone on 2 cores")
def test_references_are_up_to_date(tmp_path):
    built = registry.build_all(tmp_path / "public", tmp_path / "hidden")
    assert built, "no notebook has reference cases"
    for public, hidden in built:
        for fresh, stored in ((public, nbs.PUBLIC_REFERENCES / public.name), (hidden, nbs.HIDDEN_REFERENCES / hidden.name)):
            assert stored.exists(), f"{stored} missing: run `python -m grading references`"
            with h5py.File(fresh, "r") as a, h5py.File(stored, "r") as b:
                _compare_h5(a, b, stored.name)


def test_nothing_hidden_ships_to_students():
    hidden_names = set()
    for path in nbs.HIDDEN_REFERENCES.glob("*.h5"):
        hidden_names |= set(case_names_in(path))
    public_names = set()
    for path in nbs.PUBLIC_REFERENCES.glob("*.h5"):
        public_names |= set(case_names_in(path))
    assert hidden_names and public_names
    assert not hidden_names & public_names, f"hidden cases in the public files: {hidden_names & public_names}"
    for path in nbs.RELEASE.glob("*.ipynb"):
        text = path.read_text()
        assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text, path
        leaked = [n for n in hidden_names if f'"{n}"' in text or f"\\\"{n}\\\"" in text]
        assert not leaked, f"{path.name} mentions hidden cases {leaked}"
    # the student package holds only public data
    assert not list((nbs.ROOT / "starter").rglob("hidden*")), "hidden files inside starter/"
    # every case a hidden test uses exists, and every public test's case ships
    for sol in nbs.solution_notebooks():
        used = set(re.findall(r'check\("([^"]+)"', sol.read_text().replace('\\"', '"')))
        assert used <= hidden_names | public_names, f"{sol.name}: checks of unknown cases {used - hidden_names - public_names}"


@pytest.mark.parametrize("stem", SOLUTION_STEMS)
def test_notebook_structure(stem):
    nb = nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "google.colab" in code[0].source, "the first code cell must be the Colab set-up cell"
    ids = [nbs.nbgrader_meta(c).get("grade_id") for c in nb.cells if nbs.nbgrader_meta(c)]
    assert len(ids) == len(set(ids)), "duplicate grade_id"
    text = json.dumps(nbformat.v4.new_notebook(cells=nb.cells))
    assert "autoreload" not in text and "/content/drive" not in text
    for cell in nbs.test_cells(nb):
        meta = nbs.nbgrader_meta(cell)
        assert meta.get("points", 0) > 0 and meta.get("locked"), meta
        assert "check(" in cell.source, "test cells call starter.checks.check"
    solutions = [c for c in nb.cells if nbs.is_solution(c)]
    assert solutions and all("### BEGIN SOLUTION" in c.source for c in solutions)


def test_starter_contains_no_graded_code():
    graded = set()
    for sol in nbs.solution_notebooks():
        for cell in nbs.read(sol).cells:
            if nbs.is_solution(cell):
                graded |= set(re.findall(r"^(?:def|class) (\w+)", cell.source, re.M))
    graded -= {"main"}  # a script's entry point (05's scripts): a command-line tool of the kit has its own
    for py in (nbs.ROOT / "starter").rglob("*.py"):
        defined = set(re.findall(r"^(?:def|class) (\w+)", py.read_text(), re.M))
        assert not defined & graded, f"{py.name} defines graded names {defined & graded}"


def test_every_notebook_starts_with_the_same_set_up_cell():
    """The first code cell (tagged "colab": on Colab it installs the kit and mounts the course folder, everywhere it
    calls start_notebook) is the same in all ten notebooks, so a fix to one reaches every notebook."""
    cells = {stem: [c for c in nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb").cells
                    if "colab" in c.get("metadata", {}).get("tags", [])] for stem in SOLUTION_STEMS}
    assert all(len(found) == 1 for found in cells.values()), {s: len(c) for s, c in cells.items()}
    first = cells[SOLUTION_STEMS[0]][0].source
    differ = [stem for stem, (cell,) in cells.items() if cell.source != first]
    assert not differ, f"the set-up cell of {differ} differs from {SOLUTION_STEMS[0]}'s"
    not_first = [stem for stem in SOLUTION_STEMS
                 if next(c for c in nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb").cells if c.cell_type == "code").source != first]
    assert not not_first, f"the set-up cell is not the first code cell of {not_first}"
