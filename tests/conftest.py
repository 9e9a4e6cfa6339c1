"""Shared fixtures: paths, and canned student submissions built from the release and the solutions."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grading import notebooks as nbs
from grading.notebooks import filled_submission, solution_sources  # noqa: F401 - the tests import them from here

os.environ.setdefault("MPLBACKEND", "Agg")


def write_nb(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def mutated_namespace(stem: str, edits: dict[str, list[tuple[str, str]]]) -> dict:
    """The notebook's definitions with its solution cells edited: {grade_id: [(old, new), ...]}: a plausible
    bug written as an edit of the solution, for the mutation suites."""
    sources = nbs.solution_sources(stem)
    for grade_id, changes in edits.items():
        for old, new in changes:
            assert old in sources[grade_id], f"{grade_id}: the solution no longer contains {old!r}"
            sources[grade_id] = sources[grade_id].replace(old, new)
    nb = nbs.filled_submission(stem, sources)
    namespace: dict = {"__name__": f"mutant_{stem}"}
    exec(compile(nbs.definitions_source(nb), stem, "exec"), namespace)
    return namespace


@pytest.fixture
def hidden_references(monkeypatch):
    monkeypatch.setenv("COURSE_HIDDEN_REFERENCES", str(nbs.HIDDEN_REFERENCES))
    return nbs.HIDDEN_REFERENCES


SOLUTION_STEMS = [p.stem for p in nbs.solution_notebooks()]


@pytest.fixture(scope="session")
def trained_model_file(tmp_path_factory) -> Path:
    """Notebook 04's model as a student who finished it hands it in (the solution's, layers from notebooks
    02-03, trained as the notebook trains it): built once per test session (about half a minute)."""
    return nbs.trained_checkpoint(tmp_path_factory.mktemp("trained") / "04_captioning_transformer.pt")


@pytest.fixture(scope="session")
def grading_db():
    """(db_url, workers) for autograde runs: a PostgreSQL server with 2 workers when one can be
    started (always in CI), else the default SQLite gradebook with 1 worker."""
    from grading import local_postgres as postgres

    if not postgres.available():
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries missing in CI (.ci/run installs them)")
        yield None, 1
        return
    with postgres.server() as url:
        yield url, 2


def case_names_in(path: Path) -> list[str]:
    """Names of the reference cases stored in one HDF5 file."""
    import h5py

    from starter.checks import case_groups

    with h5py.File(path, "r") as f:
        return [name for name, _ in case_groups(f)]


def case_names(stem: str) -> list[str]:
    """Every stored case of a notebook, public and hidden."""
    return [n for path in (nbs.PUBLIC_REFERENCES / f"{stem}.h5", nbs.HIDDEN_REFERENCES / f"{stem}.h5")
            for n in case_names_in(path)]


def load_any_case(name: str):
    """Load a public or hidden case (the tests can see the hidden references)."""
    from starter.checks import load_case

    return load_case(name, dirs=[nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES])  # no process-wide switch


def assert_matches_reference(name: str, case, outs, inputs) -> None:
    """Independent outputs `outs` (torch, float64, graph kept) agree with the stored case: values,
    shapes, stored dtype, and the gradients of sum(output * stored weights) w.r.t. `inputs`."""
    import numpy as np
    import torch

    for out_name, value in zip(case.outputs, outs):
        want = case.expected[out_name]
        assert tuple(value.shape) == want.shape, name
        np.testing.assert_allclose(value.detach().numpy(), want.astype(np.float64), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}: {out_name}")
        floats = [v.dtype for v in case.inputs.values() if v.dtype.kind == "f"]
        assert want.dtype == (floats[0] if floats else np.float32), f"{name}: stored dtype"
    if case.grad_wrt:
        loss = sum((o * torch.from_numpy(case.grad_weights[n]).double()).sum() for n, o in zip(case.outputs, outs))
        loss.backward()
        for key in case.grad_wrt:
            np.testing.assert_allclose(inputs[key].grad.numpy(), case.grads[key], rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name}: grad {key}")


CHROMIUM = Path("/usr/bin/chromium")


def needs(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} missing in CI (.ci/run installs it)")
    pytest.skip(f"{what} is not installed")


@pytest.fixture
def chromium():
    """Debian's Chromium driven by Playwright (never a downloaded browser)."""
    if not CHROMIUM.exists():
        needs(f"Chromium ({CHROMIUM}, Debian package `chromium`)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        needs("playwright (Python package)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


