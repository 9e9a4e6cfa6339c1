"""Work the grader does on the host with what a student wrote, under limits of its own: time and memory.

The review scan (grading/scan.py) and the feedback pages read the student's code outside the sandbox, and
their cost grows with it: one extra cell of 4 MB of code once cost minutes of the host's time and gigabytes
of the worker's memory, and a few kilobytes of `out = !cmd` lines cost IPython's transformer seconds each.
Intake refuses notebooks past a size (grading/intake.py); this bounds the rest. `each_bounded` does such work
for each of a few items (a student's notebooks) in a child process forked from the worker: its address space
at most `Bound.memory_mb` over the worker's, each item's CPU time and wall-clock time at most `Bound.seconds`
(killed past them, and a new child goes on with the next item); each answer comes back as a line of JSON
through a pipe. Past a limit the caller hears why, and goes on without that answer: the student is still
graded. One child serves all the items because a fork of a worker (700 MB, torch loaded) costs about 0.1 s.
The child never runs student code and ends with `os._exit`: nothing the worker holds (its gradebook
connections, its Dask comms) is closed or flushed from the child.
"""
from __future__ import annotations

import gc
import json
import math
import os
import resource
import select
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

MAX_ANSWER_BYTES = 16 * 2**20  # of JSON from the child for one item (a feedback run's log, a notebook's findings)
Item = TypeVar("Item")


@dataclass(frozen=True)
class Bound:
    """What host work may take for one item: seconds of CPU and of wall-clock time, MB of memory over the worker's."""
    seconds: float
    memory_mb: int

    def __str__(self) -> str:
        return f"{self.seconds:g} s or {self.memory_mb} MB"


class PastBound(Exception):
    """The work went past its bound (time, memory), failed, or ended without an answer; the message says which."""


def _address_space() -> int:
    """This process's address space now, in bytes (the first field of /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _child(work: Callable[[Item], object], items: Sequence[Item], bound: Bound, answers: int) -> None:
    status = 1
    try:
        memory = _address_space() + bound.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        hard_cpu = resource.getrlimit(resource.RLIMIT_CPU)[1]
        for item in items:
            # SIGXCPU (which ends the child) past this item's seconds; the hard limit is left as it is
            resource.setrlimit(resource.RLIMIT_CPU, (math.ceil(_cpu_seconds() + bound.seconds), hard_cpu))
            try:
                message = {"result": work(item)}
            except Exception as exc:  # MemoryError past the limit included: said to the parent, in one line
                message = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            view = memoryview(json.dumps(message).encode() + b"\n")
            while view:
                view = view[os.write(answers, view):]
        status = 0
    finally:
        os._exit(status)


def _died(status: int, bound: Bound) -> PastBound:
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return PastBound(f"past {bound.seconds:g} s of CPU" if name == "SIGXCPU" else f"killed by {name}")
    return PastBound(f"ended without an answer (exit status {os.WEXITSTATUS(status)})")


def _answer(line: bytes) -> object:
    message = json.loads(line)
    if "result" in message:
        return message["result"]
    return PastBound(message["error"])


def _one_child(work: Callable[[Item], object], items: Sequence[Item], bound: Bound) -> list[object]:
    """Answers for the first items of `items` from one child: at least one (the item a child died on: PastBound)."""
    answers, child_end = os.pipe()
    gc.freeze()  # the child's collections then leave the worker's objects alone: no copy of the worker's memory
    try:
        pid = os.fork()
    finally:
        gc.unfreeze()
    if pid == 0:
        os.close(answers)
        _child(work, items, bound, child_end)
    os.close(child_end)
    found: list[object] = []
    pending = b""
    killed: PastBound | None = None
    try:
        deadline = time.monotonic() + bound.seconds
        while len(found) < len(items):
            left = deadline - time.monotonic()
            if left <= 0 or len(pending) > MAX_ANSWER_BYTES:
                os.kill(pid, signal.SIGKILL)
                killed = PastBound(f"still running after {bound.seconds:g} s" if left <= 0
                                   else f"an answer over {MAX_ANSWER_BYTES // 2**20} MB")
                break
            if not select.select([answers], [], [], left)[0]:
                continue
            chunk = os.read(answers, 2**16)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            found += [_answer(line) for line in lines]
            if lines:
                deadline = time.monotonic() + bound.seconds  # the next item's time starts
    finally:
        os.close(answers)
        _, status = os.waitpid(pid, 0)
    if len(found) < len(items):
        found.append(killed or _died(status, bound))
    return found


def each_bounded(work: Callable[[Item], object], items: Sequence[Item], bound: Bound) -> list[object]:
    """`work(item)` (JSON-able data) for each item, in order, done in child processes within `bound` each: per
    item its answer, or a PastBound that says why there is none (past its time or memory, or its error)."""
    found: list[object] = []
    while len(found) < len(items):
        found += _one_child(work, items[len(found):], bound)
    return found


def run_bounded(work: Callable[[], object], bound: Bound) -> object:
    """`work()` done in a child process within `bound`; PastBound if it went past it (or failed), with why."""
    answer = each_bounded(lambda _: work(), [None], bound)[0]
    if isinstance(answer, PastBound):
        raise answer
    return answer
