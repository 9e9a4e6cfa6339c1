"""A grading task for the engine tests: `grading.worker.grade_student`, except that one student is held
back until a condition holds, so that the tests assert on an order of events rather than on wall time.

This module is pickled by value, so worker processes need not have `tests/` on their path.
Run as a script, it grades like `autograde` with one student held back until a file exists (the
interrupted-run test kills it mid-run): `python tests/support/holdback.py SUBMISSIONS OUT COURSE STUDENT FILE`.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import cloudpickle

DEADLINE = 300.0  # seconds: past this the held student goes ahead anyway, and the test fails instead of hanging


@dataclass(frozen=True)
class HoldBack:
    """A task for `autograde(task=...)`: grades every student with `grading.worker.grade_student`, but
    `held` first waits until the students `others` are finished (their outcomes/<student>.json exist) and
    `file` exists, or DEADLINE. Its worker stays busy while it waits unless `let_others_run` (it then
    secedes from the worker's thread pool). It writes <root>/held.json when it starts waiting (the
    students finished by then) and again when it stops (whether it gave up)."""
    held: str
    others: tuple[str, ...] = ()
    file: str | None = None
    let_others_run: bool = False

    def __call__(self, run, student: str):
        from grading.worker import grade_student

        if student == self.held:
            self.wait(run.root)
        return grade_student(run, student)

    def wait(self, root: Path) -> None:
        status, log = root / "outcomes", root / "held.json"
        finished = sorted(p.stem for p in status.glob("*.json"))
        log.write_text(json.dumps({"finished_at_start": finished, "gave_up": None}))
        if self.let_others_run:
            from distributed import secede

            secede()
        deadline, gave_up = time.monotonic() + DEADLINE, False
        while not (all((status / f"{s}.json").exists() for s in self.others)
                   and (self.file is None or Path(self.file).exists())):
            gave_up = time.monotonic() > deadline
            if gave_up:
                break
            time.sleep(0.1)
        log.write_text(json.dumps({"finished_at_start": finished, "gave_up": gave_up}))


def background_of_its_worker(student: str) -> dict:
    """A task for `engine.run(task=...)` that grades nothing: it keeps its worker busy for half a second,
    then reports what Dask did in the background meanwhile (the stack samples the worker took) and the
    settings the worker runs with."""
    import dask
    from distributed import get_worker

    from grading.engine import QUIET

    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        pass
    return {"student": student, "ok": True, "profile_samples": get_worker().profile_recent.get("count", 0),
            "settings": {k: dask.config.get(k) for k in QUIET}}


def state_of_its_worker(student: str) -> dict:
    """A task for `engine.run(task=...)` that grades nothing: what its worker process had imported and set before
    the task ran, and the process it was started from."""
    preloaded = "grading.worker" in sys.modules  # before this task imports anything of the grader
    import warnings

    import torch

    return {"student": student, "ok": True, "grader_imported": preloaded, "parent": os.getppid(), "pid": os.getpid(),
            "torch_threads": torch.get_num_threads(), "warnings": [f[0] for f in warnings.filters[:1]],
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "PYTHONWARNINGS", "MPLBACKEND")}}


def references_of_its_worker(dirs: list) -> dict:
    """A task for `engine.on_each_worker`: how many reference cases of the folders `dirs` the judge in this worker
    process holds, and how many of them judging would read from their file again."""
    from grading import judge

    key, load, read_again = tuple(dirs), judge.load_case, []
    judge.load_case = lambda name, folders: read_again.append(name) or load(name, folders)
    try:
        held = [name for (name, folders) in list(judge._CASES) if folders == key]
        for name in held:
            judge._reference(name, key)
    finally:
        judge.load_case = load
    return {"held": len(held), "read_again": len(read_again)}


def warm_up_unequally(flag: str) -> None:
    """A stand-in for a worker's warm-up, for `engine.on_each_worker`: the first worker to run it takes 1 s (and
    makes the file `flag`), the other 5 s."""
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
        time.sleep(1)
    except FileExistsError:
        time.sleep(5)


def worker_of(student: str) -> dict:
    """A stand-in for a student's grading, for `engine.run`: 2 s of the worker's time, then which worker process
    did it. Two seconds of the clock, not of CPU work: on a loaded machine (two test workers on two cores) CPU work
    stretched past the other worker's warm-up, and the unsettled control took both workers."""
    time.sleep(2)
    return {"student": student, "pid": os.getpid()}


cloudpickle.register_pickle_by_value(sys.modules[__name__])


if __name__ == "__main__":
    from grading.autograde import autograde

    submissions, out, course, student, file = sys.argv[1:]
    autograde(Path(submissions), Path(out), course_dir=Path(course),
              task=HoldBack(student, file=file, let_others_run=True))
