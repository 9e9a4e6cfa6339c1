"""The suite's own machinery for its time (tests/support/suite.py): units of work that name real modules, the longest
first, a budget that fails a slow phase and names it, and what every xdist worker needs made once."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import suite

TESTS = Path(__file__).resolve().parent


def test_every_unit_named_is_a_module_of_the_suite():
    """A module renamed or removed would lose its place in the order, or its shared unit, without a word."""
    modules = {p.stem for p in TESTS.glob("test_*.py")}
    assert set(suite.SHARED_UNITS) <= modules, set(suite.SHARED_UNITS) - modules
    units = modules - set(suite.SHARED_UNITS) | set(suite.SHARED_UNITS.values())
    assert set(suite.SENT_FIRST) <= units, set(suite.SENT_FIRST) - units
    assert len(set(suite.SENT_FIRST)) == len(suite.SENT_FIRST)


def test_the_units_go_in_the_order_sent_and_each_module_keeps_its_order():
    ids = ["tests/test_a.py::x", "tests/test_lms_exports.py::one", "tests/test_a.py::y", "tests/test_colab.py::walk",
           "tests/test_prose_numbers.py::p", "tests/test_lms_exports.py::two"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    suite.sent_first(items)
    assert [i.nodeid for i in items] == ["tests/test_colab.py::walk", "tests/test_prose_numbers.py::p",
                                         "tests/test_lms_exports.py::one", "tests/test_lms_exports.py::two",
                                         "tests/test_a.py::x", "tests/test_a.py::y"]
    assert suite.unit_of("tests/test_model_answers.py::t[1]") == suite.unit_of("tests/test_colab.py::t") == "colab_walk"
    assert suite.unit_of("tests/test_judge.py::t") == "test_judge"


def _item(budget=None, fixtures=()):
    marker = None if budget is None else SimpleNamespace(args=(budget,), kwargs={"reason": "it grades a class"})
    return SimpleNamespace(get_closest_marker=lambda name: marker if name == "budget" else None, fixturenames=fixtures)


def test_a_phase_over_its_budget_is_named_with_its_time_and_what_allows_more():
    over = suite.over_budget(_item(), "call", suite.BUDGET_SECONDS + 1)
    assert over and over.startswith(f"call took {suite.BUDGET_SECONDS + 1} s, over its budget of "
                                    f"{suite.BUDGET_SECONDS} s (the suite's budget per test)"), over
    assert suite.over_budget(_item(), "call", suite.BUDGET_SECONDS) is None
    assert suite.over_budget(_item(budget=300), "setup", 299) is None
    # a machine twice as slow as CI's has twice the time, and the message says so
    assert suite.over_budget(_item(), "call", 2 * suite.BUDGET_SECONDS - 1, slower=2.0) is None
    slow = suite.over_budget(_item(), "call", 2 * suite.BUDGET_SECONDS + 1, slower=2.0)
    assert slow and f"({suite.BUDGET_SECONDS} s on CI's machine, this one 2 times slower)" in slow, slow
    assert "(it grades a class)" in suite.over_budget(_item(budget=300), "setup", 301)
    # a slow session fixture allows more only where it is made: in a set-up
    name, (seconds, _) = next(iter(suite.SLOW_FIXTURES.items()))
    assert suite.over_budget(_item(fixtures=(name,)), "setup", seconds - 1) is None
    assert suite.over_budget(_item(fixtures=(name,)), "call", seconds - 1)


def test_the_budget_fails_a_passing_test_in_a_real_run(tmp_path):
    """The conftest's hook turns a passing phase over its budget into a failure that says why; within it, a pass."""
    (tmp_path / "conftest.py").write_text(  # the suite's own hook, from its conftest loaded under another name
        "import importlib.util\nimport sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        f"spec = importlib.util.spec_from_file_location('the_suites_conftest', {str(TESTS / 'conftest.py')!r})\n"
        "module = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(module)\n"
        "pytest_runtest_makereport = module.pytest_runtest_makereport\n"
        "pytest_terminal_summary = module.pytest_terminal_summary\n")
    (tmp_path / "test_slow.py").write_text(
        "import time\nimport pytest\n\n"
        "@pytest.mark.budget(0.2, reason='a stand-in')\ndef test_slow():\n    time.sleep(1.5)\n\n"
        "@pytest.mark.budget(5, reason='a stand-in')\ndef test_quick():\n    time.sleep(0.01)\n")
    def run(ci: bool):
        env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": "true"} if ci else {})
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-o",
                               "addopts=", "-o", "markers=budget", "-q", "-rf", str(tmp_path)],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)

    # (on a machine slower than CI's, the budget is scaled, and the message says by how much)
    over = re.compile(r"call took 1\.[5-9]\d* s, over its budget of [\d.]+ s(?: \(0\.2 s on CI's machine, this one "
                      r"[\d.]+ times slower\))? \(a stand-in\)")
    in_ci = run(ci=True)
    assert in_ci.returncode == 1 and "1 failed, 1 passed" in in_ci.stdout, in_ci.stdout[-2000:]
    assert over.search(in_ci.stdout.split("short test summary")[0]), in_ci.stdout[-2000:]
    elsewhere = run(ci=False)  # a busy laptop: the summary says it, nothing fails
    assert elsewhere.returncode == 0 and "2 passed" in elsewhere.stdout, elsewhere.stdout[-2000:]
    assert "over the suite's budget (a failure in CI)" in elsewhere.stdout and over.search(elsewhere.stdout), \
        elsewhere.stdout[-2000:]


def test_what_every_worker_needs_is_made_once_and_the_others_wait_for_it(tmp_path):
    """Two xdist workers of one run (stand-ins: two threads) ask at once: one makes it, the other gets its path."""
    made = []

    def make(folder: Path) -> Path:
        made.append(folder)
        time.sleep(0.5)
        (folder / "thing").write_text("x")
        return folder / "thing"

    got = {}

    def worker(name: str) -> None:
        base = tmp_path / "run" / f"popen-{name}"
        base.mkdir(parents=True, exist_ok=True)
        request = SimpleNamespace(config=SimpleNamespace(workerinput={"testrunuid": "abc", "workerid": name}))
        factory = SimpleNamespace(getbasetemp=lambda: base)
        got[name] = suite.made_once(request, factory, "thing", make)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("gw0", "gw1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(made) == 1 and got["gw0"] == got["gw1"] == made[0] / "thing", (made, got)
    # another run (another uid) makes its own
    request = SimpleNamespace(config=SimpleNamespace(workerinput={"testrunuid": "def", "workerid": "gw0"}))
    again = suite.made_once(request, SimpleNamespace(getbasetemp=lambda: tmp_path / "run" / "popen-gw0"), "thing", make)
    assert len(made) == 2 and again != got["gw0"]


@pytest.mark.parametrize("when", ["setup", "call", "teardown"])
def test_every_phase_is_under_a_budget(when):
    assert suite.budget_of(_item(), when)[0] == suite.BUDGET_SECONDS


def test_the_calibration_is_near_what_ci_s_machine_takes():
    """The budgets are scaled by the calibration: one that took far less than CALIBRATION_SECONDS on any machine
    would be a calibration changed without its reference (every machine would be taken for CI's)."""
    assert suite.calibration() > suite.CALIBRATION_SECONDS / 10
    assert suite.slowness() >= 1.0


def test_the_time_report_reads_a_whole_runs_log_and_writes_the_readme_block(tmp_path):
    """benchmarks/suite_time.py: the wall time and counts from pytest's closing line, each phase's seconds, the
    slowest first; a log without them is refused; the README block between its markers, and only there."""
    sys.path.insert(0, str(TESTS.parent / "benchmarks"))
    import suite_time

    log = tmp_path / "run.log"
    log.write_text("....\n============ slowest durations ============\n"
                   "128.50s setup    tests/test_colab.py::test_walk\n55.80s call     tests/test_notebooks.py::test_refs\n"
                   "0.20s teardown tests/test_colab.py::test_walk\n"
                   "==== 1 failed, 1069 passed, 3 warnings in 1261.79s (0:21:01) ====\n")
    run = suite_time.read(log)
    assert (run.seconds, run.counts) == (1261.79, "1 failed, 1069 passed, 3 warnings")
    assert run.modules() == {"tests/test_colab.py": 128.7, "tests/test_notebooks.py": 55.8}
    text = suite_time.report([run], top=2)
    assert text.index("128.5 | setup | `tests/test_colab.py::test_walk`") < text.index("55.8 | call")
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{suite_time.BLOCK[0]}\nold\n{suite_time.BLOCK[1]}\nb\n")
    suite_time.write_readme(suite_time.readme_block(run, "python benchmarks/suite_time.py run.log --readme"), readme)
    written = readme.read_text()
    assert "old" not in written and written.startswith("a\n") and written.endswith(f"{suite_time.BLOCK[1]}\nb\n")
    assert "pytest took 21.0 minutes (1 failed, 1069 passed, 3 warnings)" in written, written
    log.write_text("no closing line\n")
    with pytest.raises(SystemExit, match="not a whole run's log"):
        suite_time.read(log)
