"""The suite's time: how `python3 kit.py test` shares the tests between its xdist workers, what is made once for all
of them, and the budget that fails a test or fixture grown slow (docs/testing.md). tests/conftest.py wires these into
pytest's hooks."""
from __future__ import annotations

import fcntl
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

# A module is one unit of work, sent whole to one worker, so its module fixtures (a graded class) are made once; the
# modules that read the Colab walk (a session fixture of minutes) are one unit together, and so are the two that read
# the graded LMS exports. The longest units go first, so that no worker is left with a long one at the end, and two
# units that each keep both cores busy (the Colab walk's installs and training; the tampering class, whose attackers
# spin until their cells' limits) are not sent together: the walk goes beside the sandbox tests, whose time is mostly
# deadlines (measured: docs/testing.md).
SHARED_UNITS = {"test_colab": "colab_walk", "test_model_answers": "colab_walk", "test_prose_numbers": "colab_walk",
                "test_reference_run": "colab_walk", "test_explorer_page": "colab_walk",
                "test_lms_exports": "lms_graded", "test_lms_export_formats": "lms_graded"}
SENT_FIRST = ["colab_walk", "test_judge", "test_tampering", "test_parallel", "test_notebooks", "test_training",
              "test_class_report", "test_autograde", "test_scripts", "test_course_lock", "lms_graded",
              "test_student_copy", "test_bench_autograde_baseline"]
# Each worker's torch (and the processes it starts) runs one thread: two workers on two cores, each with a pool of
# threads as large as the machine, spent their time waiting on each other's.
WORKER_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# A test's set-up, call or tear-down that takes longer than this fails, naming itself: a new slow test or fixture is
# seen the day it lands. What may take longer says so with @pytest.mark.budget(seconds, reason=...), or, for a
# session fixture (its set-up lands on whichever test asks first), in SLOW_FIXTURES.
BUDGET_SECONDS = 120
# The budgets are seconds of the machine CI runs on (2 cores). A slower machine gets them in proportion: the
# calibration, a fixed piece of Python work, took CALIBRATION_SECONDS there, and takes `slowness()` times as long here.
CALIBRATION_SECONDS = 0.1  # 0.08 s measured on a quiet 2-core CI machine, and a margin
SLOW_FIXTURES = {"colab_walk": (480, "a Colab student's ten notebooks, each in a new runtime with its own pip "
                                     "install, 06 training its model")}


def unit_of(nodeid: str) -> str:
    """The unit of work of a test: its module, or the unit its module shares."""
    stem = Path(nodeid.split("::")[0]).stem
    return SHARED_UNITS.get(stem, stem)


def sent_first(items: list) -> None:
    """Put the units of SENT_FIRST first, in its order; each module keeps its own order, the rest theirs."""
    rank = {unit: i for i, unit in enumerate(SENT_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))


def one_thread_each() -> None:
    """On an xdist worker, before torch is imported: WORKER_THREADS, for this process and the processes it starts
    (a value set by hand is kept)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name, value in WORKER_THREADS.items():
            os.environ.setdefault(name, value)


def scheduler(config, log):
    """xdist's scheduling by scope, each scope a unit of work (`unit_of`), sent in the order collected."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByUnit(config, log)


def budget_of(item, when: str) -> tuple[float, str]:
    """(seconds, why) that `item`'s phase `when` ("setup", "call", "teardown") may take."""
    marker = item.get_closest_marker("budget")
    seconds, why = float(BUDGET_SECONDS), "the suite's budget per test"
    if marker is not None:
        seconds, why = float(marker.args[0]), marker.kwargs.get("reason", "")
    if when == "setup":
        for name in getattr(item, "fixturenames", ()):
            if name in SLOW_FIXTURES and SLOW_FIXTURES[name][0] > seconds:
                seconds, why = float(SLOW_FIXTURES[name][0]), f"fixture {name}: {SLOW_FIXTURES[name][1]}"
    return seconds, why


def calibration() -> float:
    """Seconds this machine takes for a fixed piece of pure Python work (the best of three)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for i in range(2_000_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def slowness() -> float:
    """How many times slower than CI's machine this one is (at least 1), measured once per process."""
    return max(1.0, calibration() / CALIBRATION_SECONDS)


def over_budget(item, when: str, duration: float, slower: float = 1.0) -> str | None:
    """Why the phase `when` of `item`, which took `duration` seconds on a machine `slower` times slower than CI's,
    fails the budget; None within it."""
    seconds, why = budget_of(item, when)
    if duration <= seconds * slower:
        return None
    scaled = "" if slower == 1.0 else f" ({seconds:.3g} s on CI's machine, this one {slower:.2g} times slower)"
    return (f"{when} took {duration:.3g} s, over its budget of {seconds * slower:.3g} s{scaled} ({why}): make it faster, "
            "or mark it @pytest.mark.budget(seconds, reason=...) (tests/support/suite.py)")


def enforced() -> bool:
    """The budget fails a test in CI, where the day a slow test lands is seen; elsewhere (a busy laptop) the run's
    summary names what went over it."""
    return bool(os.environ.get("CI"))


def made_once(request, tmp_path_factory, name: str, make: Callable[[Path], Path]) -> Path:
    """`make(folder)`, run once for the whole test run: where the suite runs on several xdist workers, by the first
    worker that asks, in a folder all of them see, while any other that asks waits for it (a file lock) and gets the
    same path. A failed `make` is tried again by the next worker that asks."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None:  # one process: a session fixture is made once anyway
        return make(tmp_path_factory.mktemp(name))
    folder = tmp_path_factory.getbasetemp().parent / f"made-once-{workerinput['testrunuid']}" / name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = folder / ".made"
        if made.exists():
            return Path(made.read_text())
        path = make(folder)
        made.write_text(str(path))
        return path
