"""Where grading runs: a Dask cluster, one task per student.

By default a `LocalCluster` on this machine, one worker process per core (`workers`); with
`scheduler="tcp://HOST:PORT"` the tasks go to a running cluster instead, whose workers were started
with `dask worker tcp://HOST:PORT` on machines that have this kit installed and see the course
folder at the same path (a shared file system) and the same PostgreSQL gradebook. `cluster()` gives
the client (`autograde` opens it before it prepares the course, so that the workers start and import
the grader meanwhile); `run()` sends it one task per student.

Scheduling is dynamic: a worker holds one student at a time and takes the next when it finishes, so
nobody waits behind a slow student (for a scheduler started by hand, set
DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION=1.0: by default Dask queues a second task on each worker,
which waits there until work stealing moves it).
A task whose worker dies (killed, out of memory, machine lost) is retried once on another
worker, then recorded as failed with the reason; an exception in grading is recorded as it is and
never retried (it would fail the same way). Every student ends with an outcome (grading/outcome.py), written
(`outcomes/<student>.json`, by the task itself) as soon as that student is done, so a run whose parent was
killed continues with `resume=True` where it stopped.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .outcome import FOLDER, Status, StudentOutcome, read_outcomes, write_outcome

if TYPE_CHECKING:
    from dask.distributed import Client

log = logging.getLogger(__name__)

RETRIES_AFTER_A_DEAD_WORKER = 1

# Dask's background work, made rare: with as many workers as cores it takes its CPU from the students
# being graded. Each worker samples its task's stack every 10 ms (the dashboard's profile; this engine
# has no dashboard); the parent process (scheduler and nannies) checks its event loop every 20 ms and
# each worker's memory every 100 ms. Measured on 2 cores, 2 workers running a stand-in task (the control in
# benchmarks/bench_autograde.py): a task had the CPU 96.3 % of its time by default, 98.7 % with these
# (alone: 97.9 and 99.6 %). The memory limit still holds (checked every second; the sandbox has its own).
QUIET = {"distributed.worker.profile.enabled": False,
         "distributed.admin.system-monitor.interval": "5s",
         "distributed.admin.tick.interval": "500ms",
         "distributed.worker.memory.monitor-interval": "1s"}


def finished(root: Path) -> dict[str, StudentOutcome]:
    """The outcomes of the students an earlier run finished."""
    return read_outcomes(root / FOLDER)


def _failed(root: Path, student: str, reason: str) -> StudentOutcome:
    outcome = StudentOutcome(student, status=Status.FAILED, error=reason)
    write_outcome(root / FOLDER, outcome)
    return outcome


# Each local worker process is forked from one server process that has imported the grader (multiprocessing's
# forkserver), so the grader is imported once for all of them: two workers each importing it on 2 cores took 4.2 s
# of CPU each, while the course was being prepared beside them. A fork of a process that has imported torch but run
# no thread is safe; WORKER_ENV is set before the server starts, as torch and the warnings filters read it at import.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "MPLBACKEND": "Agg"}
WORKER_PRELOAD = ["distributed", "grading.worker_preload"]
_environ_lock = threading.Lock()
WARM_UP_WAIT = 180  # seconds the students wait for each worker's warm-up (`settle`): a sandbox starts in 6-10 s


def _start_forkserver() -> None:
    """Start the server the workers are forked from, if it is not running: it imports WORKER_PRELOAD in a process
    of its own while the caller goes on (a worker started before it is done waits for it)."""
    from distributed.utils import get_mp_context

    context = get_mp_context()  # Dask chooses its preload list once, on its first call; this one replaces it
    context.set_forkserver_preload(WORKER_PRELOAD)
    with _environ_lock:
        saved = {key: os.environ.get(key) for key in WORKER_ENV}
        os.environ.update(WORKER_ENV)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@contextlib.contextmanager
def cluster(workers: int = 1, scheduler: str | None = None, warm: bool = False) -> Iterator[Client]:
    """A client of the cluster that grades: a `LocalCluster` of `workers` processes, or the running one at
    `scheduler`. A local cluster's workers start in the background, forked with the grader imported
    (`on_each_worker` waits for them); `warm`: each worker of a running cluster imports the grader at once (a task
    each, about 5 s), so that it does so while the caller prepares the course instead of after."""
    import dask
    from dask.distributed import Client, LocalCluster

    # held while the cluster lives: a worker that dies is started again by its nanny with these
    with dask.config.set({"distributed.scheduler.allowed-failures": RETRIES_AFTER_A_DEAD_WORKER,
                          "distributed.scheduler.worker-saturation": 1.0,  # one student per worker at a time
                          "distributed.worker.daemon": False,  # a worker starts processes (sandboxes)
                          "distributed.worker.multiprocessing-method": "forkserver",
                          "distributed.logging.distributed": "error", **QUIET}):
        local = None
        if scheduler:
            client = Client(scheduler, timeout=30)
        else:
            _start_forkserver()
            # no dashboard; the scheduler's own HTTP server (health, metrics) on a free port, not on 8787, which
            # another cluster (another run's, a notebook's) may hold: Dask warned of it on every run
            local = LocalCluster(n_workers=0, threads_per_worker=1, processes=True, dashboard_address=None,
                                 scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                                 silence_logs=logging.ERROR, env=WORKER_ENV)
            client = Client(local)  # before the workers are asked for: a client waits for those asked for already
            local.scale(workers)  # started in the background: the caller goes on meanwhile
        try:
            imports = on_each_worker(client, importlib.import_module, "grading.worker") if warm and scheduler else []
            yield client
            del imports  # held until here: a future no one holds is cancelled
        finally:
            client.close()
            if local is not None:
                local.close()


def on_each_worker(client: Client, task: Callable[..., Any], *args: Any) -> list:
    """`task(*args)` once on each worker of the cluster, now: the futures, which the caller holds for as long as the
    tasks matter (Dask cancels a task no one holds). A worker runs one task at a time, so a student sent to it
    after these waits for its one. On a local cluster, waits until all its workers have started."""
    if client.cluster is not None:
        client.wait_for_workers(len(client.cluster.worker_spec))
    return [client.submit(task, *args, key=f"{task.__name__}-{address}-{uuid.uuid4().hex[:8]}", workers=[address],
                          pure=False)
            for address in client.scheduler_info()["workers"]]


def settle(futures: list, timeout: float = WARM_UP_WAIT) -> None:
    """Wait until each of `futures` (tasks sent to the workers: `on_each_worker`'s) has finished, whether it failed
    or not, or until `timeout` seconds have passed. A student sent while a worker is still busy with such a task
    waits behind it; sent once they are done, Dask sends each student to an idle worker. (Dask places a task of a
    small class, up to twice the workers, at once, on the least busy worker: sent while one worker was still
    warming up and the other not, every student went to the other, and the first sat idle.)"""
    from dask.distributed import wait

    with contextlib.suppress(Exception):  # one that failed or is late: its worker's first student does it instead
        wait(futures, timeout=timeout)


def run(root: Path, students: list[str], task: Callable[[str], Any], workers: int = 1, scheduler: str | None = None,
        progress: bool = True, client: Client | None = None) -> dict[str, Any]:
    """Grade `students` (those without an outcome yet in the course folder `root`) on a cluster (`client`'s, or one
    made for this call: `cluster(workers, scheduler)`); return every student's outcome.

    `task(student)` grades one student on a worker, writes its outcome and returns it (autograde's is
    `worker.grade_student` with the run's `GradingRun` bound to it); it must be picklable to the workers."""
    from dask.distributed import as_completed
    from distributed.scheduler import KilledWorker
    from tqdm.auto import tqdm

    outcomes = {s: r for s, r in finished(root).items() if s in students}
    todo = [s for s in students if s not in outcomes]
    if not todo:
        return outcomes
    if client is None:
        with cluster(workers, scheduler) as client:
            return run(root, students, task, progress=progress, client=client)
    futures = {client.submit(task, s, key=f"grade-{s}", pure=False): s for s in todo}
    bar = tqdm(total=len(futures), desc="grading", unit="student", disable=not progress)
    for future in as_completed(futures):
        student = futures[future]
        try:
            outcomes[student] = future.result()
        except KilledWorker:
            outcomes[student] = _failed(root, student, "the grading worker died twice on this student "
                                                      "(out of memory, or killed)")
            log.error("%s: %s", student, outcomes[student].error)
        except Exception as exc:
            outcomes[student] = _failed(root, student, f"{type(exc).__name__}: {exc}"[:400])
            log.error("%s: grading failed: %s", student, outcomes[student].error)
        bar.update(1)
    bar.close()
    return outcomes


def worker_env() -> dict:
    """Environment for `dask worker` processes started by hand or by tests: the kit importable, and QUIET
    (as Dask reads settings from the environment: DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False, ...)."""
    from . import notebooks

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(notebooks.ROOT), env.get("PYTHONPATH", "")]))
    for key, value in QUIET.items():
        env["DASK_" + key.upper().replace(".", "__").replace("-", "_")] = str(value)
    return env
