"""Shared fixtures: paths, and canned student submissions built from the release and the solutions."""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from support import suite

suite.one_thread_each()  # before anything imports torch

ROOT = Path(__file__).resolve().parent.parent  # the kit's packages are installed (editable) by `kit.py setup`

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


@pytest.fixture(scope="module")
def blank_gradebook(request, tmp_path_factory) -> Path:
    """The assignment's gradebook after the judge scored the graded students of the requesting test module: its
    `_outcomes()`, each cell of its notebook `NB` (tests/support/gradebooks.py)."""
    from support.gradebooks import judged_gradebook

    module = request.module
    return judged_gradebook(tmp_path_factory.mktemp("gradebook") / "gradebook.db", module._outcomes(), module.NB)


@pytest.fixture(scope="session")
def trained_model_file(request, tmp_path_factory) -> Path:
    """Notebook 06's model as a student who finished it hands it in (the solution's, layers from notebooks
    02-03, trained as the notebook trains it): built once per test run (about half a minute)."""
    from support.suite import made_once

    return made_once(request, tmp_path_factory, "trained",
                     lambda folder: nbs.trained_checkpoint(folder / "captioning_transformer.pt"))


@pytest.fixture(scope="session")
def colab_walk(tmp_path_factory):
    """A Colab student's walk through every notebook (tests/support/colab.py), once per session: the Colab test
    checks the path, the model-answer test reads what notebooks 06 to 08 printed on it."""
    from support import colab
    if not colab.available():
        pytest.skip("the Colab simulation mounts a fresh /content in a private mount namespace: needs root, "
                    "unshare and git")
    return colab.walk(tmp_path_factory.mktemp("colab"), SOLUTION_STEMS)


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


@pytest.fixture
def postgres_gradebook(request, grading_db) -> str:
    """A new, empty PostgreSQL gradebook of the test's own, on the session's server (grading_db's): a server
    started for each test took seconds. Skipped where there is no server (failed in CI, by grading_db)."""
    from grading import local_postgres as postgres

    url, _ = grading_db
    if url is None:
        pytest.skip("no PostgreSQL server binaries")
    test = re.sub(r"\W", "_", request.node.name).lower()[:40]
    return postgres.fresh_database(url, f"gb_{test}_{secrets.token_hex(3)}")


@pytest.fixture(scope="session")
def moodle_graded(tmp_path_factory, grading_db) -> dict:
    """The Moodle export of tests/test_lms_exports.py, graded once for the modules that read it (test_lms_exports,
    test_lms_export_formats: one unit of work, support/suite.py): {"out": OUT, "students": who is in it}."""
    from test_lms_exports import MOODLE, _grade

    return _grade(tmp_path_factory, grading_db, MOODLE, "moodle")


@pytest.fixture(scope="session")
def canvas_graded(tmp_path_factory, grading_db) -> dict:
    """The Canvas export of tests/test_lms_exports.py, graded once, as `moodle_graded`."""
    from test_lms_exports import CANVAS, _grade

    return _grade(tmp_path_factory, grading_db, CANVAS, "canvas")


def case_names_in(path: Path) -> list[str]:
    """Names of the reference cases stored in one HDF5 file."""
    import h5py

    from starter.compare import case_groups

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


def case_results(names, answer_of) -> dict:
    """Each stored case of `names` checked on `answer_of(case)` (the answer under its test cell's adapter): None if
    it passes, else its one-line message; for the mutation suites."""
    from starter.checks import CheckFailed, check

    out: dict = {}
    for name in names:
        try:
            check(name, answer_of(load_any_case(name)))
            out[name] = None
        except CheckFailed as failed:
            out[name] = str(failed)
    return out


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_jupyter_env(home: Path, *extra: str) -> dict:
    """The environment of a test's Jupyter server: private config, data and runtime folders (and `extra`
    ones, e.g. JupyterLab's settings), so that no user-level setting changes what is tested; the venv's
    own config and kernelspec (sys.prefix) stay on the path."""
    env = {k: v for k, v in os.environ.items() if k not in {"MPLBACKEND", "JUPYTER_PATH"}}
    env.update({name: str(home / name.lower())
                for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", *extra)})
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@contextlib.contextmanager
def jupyter_server(app: str, cwd: Path, env: dict, log_path: Path, ready: Callable[[str, str], object],
                   args: tuple[str, ...] = ()):
    """`python -m <app>` (e.g. "jupyter server", "jupyterlab") on a free local port with a random token,
    run in `cwd`; yields (base URL, token) once `ready(base, token)` stops raising OSError (30 s at most),
    then stops the server and any kernel it started."""
    import psutil

    port, token = free_port(), secrets.token_hex(16)
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", *app.split(), "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", *args],
            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                assert server.poll() is None, f"Jupyter server exited: {log_path.read_text()[-2000:]}"
                try:
                    ready(base, token)
                    break
                except OSError:
                    assert time.monotonic() < deadline, "Jupyter server not up after 30 s"
                    time.sleep(0.3)
            yield base, token
        finally:
            if server.poll() is None:
                # kernels run in their own session, outside the server's process group: note them
                # first, stop the server (SIGTERM shuts its kernels down), then kill whatever is left
                kernels = psutil.Process(server.pid).children(recursive=True)
                os.killpg(server.pid, signal.SIGTERM)
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait(timeout=5)
                for proc in psutil.wait_procs(kernels, timeout=5)[1]:
                    proc.kill()


# --- the suite's time: units of work for the xdist workers, in the order sent; a budget per test (support/suite.py)

def pytest_collection_modifyitems(config, items):
    if getattr(config, "workerinput", None) is not None:  # on xdist workers: the order units are sent in
        suite.sent_first(items)


@pytest.hookimpl(optionalhook=True)  # xdist's: `-p no:xdist` runs without it
def pytest_xdist_make_scheduler(config, log):
    return suite.scheduler(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    problem = suite.over_budget(item, call.when, call.duration, suite.slowness())
    if report.passed and problem:
        if suite.enforced():
            report.outcome, report.longrepr = "failed", problem
        else:
            report.user_properties.append(("over_budget", problem))


def pytest_terminal_summary(terminalreporter):
    over = [(r.nodeid, text) for reports in terminalreporter.stats.values() for r in reports
            for name, text in getattr(r, "user_properties", ()) if name == "over_budget"]
    if over:
        terminalreporter.section("over the suite's budget (a failure in CI)")
        for nodeid, text in over:
            terminalreporter.line(f"{nodeid}: {text}")
