"""Grading on Dask: parallel workers on a real PostgreSQL gradebook, a real multi-process cluster on
localhost, a worker killed mid-run, the parent killed and resumed, and dynamic scheduling."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import filled_submission, free_port, write_nb
from support import holdback

from grading import engine
from grading import notebooks as nbs
from grading.autograde import autograde, graded_columns
from grading.settings import Settings

NB = "01_scaled_dot_product_attention"
FULL = sum(p for s, _, p in graded_columns() if s == NB)
CAUSAL_BUG = '''
def causal_mask(T, device=None):
    return torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)
'''


def _class(folder: Path, n: int) -> dict[str, float]:
    """n students alternating correct / buggy notebook 01; returns the expected totals."""
    expected = {}
    for i in range(n):
        name = f"s{i:02d}"
        buggy = i % 2 == 1
        write_nb(filled_submission(NB, {"causal_mask": CAUSAL_BUG} if buggy else None), folder / name / f"{NB}.ipynb")
        expected[name] = FULL - 1 if buggy else FULL
    return expected


def _totals(out: Path) -> dict[str, float]:
    with open(out / "grades.csv") as f:
        return {r["student"]: float(r[f"{NB}:total"]) for r in csv.DictReader(f) if r["student"] != "(max points)"}


def _wait_for_status(status: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (status.is_dir() and list(status.glob("*.json"))):
        assert time.monotonic() < deadline, "no student ever finished"
        time.sleep(0.2)


def _wait_for(paths: list[Path], proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, f"the run ended (exit code {proc.returncode}) before {paths} all existed"
        assert time.monotonic() < deadline, f"not there after {timeout} s: {[p for p in paths if not p.exists()]}"
        time.sleep(0.2)


def test_dask_stays_out_of_the_workers_way(tmp_path):
    """With as many workers as cores, Dask's background work takes its CPU from the students: the
    workers run without the 10 ms stack sampling and with rarer monitoring (engine.QUIET)."""
    records = engine.run(tmp_path, ["a", "b"], workers=2, progress=False, task=holdback.background_of_its_worker)
    for student, record in records.items():
        assert record["profile_samples"] == 0, f"{student}: its worker sampled the task's stack " \
                                                f"{record['profile_samples']} times in 0.5 s (profiling is on)"
        assert record["settings"] == {**record["settings"], **engine.QUIET}, \
            f"{student}: the worker did not get engine.QUIET: {record['settings']}"
    # workers started by hand (`dask worker`) get them from the environment engine.worker_env() gives
    read = subprocess.run([sys.executable, "-c", "import dask, distributed, json; print(json.dumps("
                           f"{{k: dask.config.get(k) for k in {list(engine.QUIET)!r}}}))"],
                          env=engine.worker_env(), capture_output=True, text=True, check=True)
    assert json.loads(read.stdout) == engine.QUIET, f"dask worker's settings from worker_env(): {read.stdout}"


def test_local_workers_are_forked_with_the_grader_imported_once():
    """A local cluster's workers are forked from one process that imported the grader (engine.WORKER_PRELOAD),
    not each started anew to import it, and run with engine.WORKER_ENV in force from their start: one thread
    for torch, warnings off. The cluster starts no dashboard and warns of nothing, even with Dask's port 8787
    taken (by another cluster, as two runs or a notebook's own Dask have it)."""
    import socket
    import warnings

    with socket.socket() as taken, warnings.catch_warnings(record=True) as warned:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # already taken: as good
            taken.bind(("127.0.0.1", 8787))
            taken.listen()
        warnings.simplefilter("always")
        with engine.cluster(2) as client:
            records = {f"worker {i}": f.result() for i, f in
                       enumerate(engine.on_each_worker(client, holdback.state_of_its_worker, "-"))}
    assert not [str(w.message) for w in warned if "8787" in str(w.message)], [str(w.message) for w in warned]
    for student, record in records.items():
        assert record["grader_imported"], f"{student}: its worker had not imported grading.worker before its task"
        assert record["env"] == engine.WORKER_ENV, f"{student}: its worker's environment: {record['env']}"
        assert record["torch_threads"] == 1, f"{student}: torch runs {record['torch_threads']} threads in a worker"
        assert record["warnings"] == ["ignore"], f"{student}: warnings filter {record['warnings']} (PYTHONWARNINGS)"
    parents = {r["parent"] for r in records.values()}
    assert len({r["pid"] for r in records.values()}) == 2 and len(parents) == 1 and os.getpid() not in parents, \
        f"two workers are forked from one server, not from this process: pids and parents {records}"


def test_each_worker_is_sent_the_references_the_run_read():
    """The run reads the judge's references once and sends them to each worker (grading.autograde._send_references)
    instead of each worker reading them at the start, where two workers' sandboxes are starting beside them: each
    worker then holds every case, and judging there reads none of them again."""
    from grading import autograde as run_module
    from grading.course import CourseFiles

    dirs = (nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES)
    with engine.cluster(2) as client:
        sent = [f.result() for f in run_module._send_references(client, CourseFiles(None, None, dirs))]
        held = [f.result() for f in engine.on_each_worker(client, holdback.references_of_its_worker, list(dirs))]
    assert len(sent) == 2 and sent[0] == sent[1] > 200, f"cases each worker was sent: {sent}"
    assert held == [{"held": sent[0], "read_again": 0}] * 2, f"what each worker's judge holds: {held}"


@pytest.mark.parametrize("settled", [True, False])
def test_students_sent_once_the_workers_warmed_up_are_shared_between_them(tmp_path, settled):
    """Dask places each task of a small class (up to twice the workers) at once, on the least busy worker: two
    students sent while one worker was still warming up both went to the other, and the first sat idle. The run
    waits for every worker's warm-up (`engine.settle`, as `autograde` does); then two students go to two workers.
    Unsettled, the same two students (the control) share one worker."""
    with engine.cluster(2) as client:
        warming = engine.on_each_worker(client, holdback.warm_up_unequally, str(tmp_path / "first"))
        if settled:
            engine.settle(warming)
        ran = engine.run(tmp_path, ["s0", "s1"], holdback.worker_of, progress=False, client=client)
    workers = {r["pid"] for r in ran.values()}
    assert len(workers) == (2 if settled else 1), f"settled={settled}: the workers that graded s0 and s1: {ran}"


def test_more_workers_need_a_real_database(tmp_path):
    _class(tmp_path / "subs", 1)
    with pytest.raises(ValueError, match="SQLite"):
        autograde(tmp_path / "subs", tmp_path / "out", course_dir=tmp_path / "course", settings=Settings(workers=2))


def test_an_existing_cluster_grades_the_same_and_survives_a_killed_worker(tmp_path, postgres_gradebook):
    """`dask scheduler` and two `dask worker` processes on localhost; one worker is killed with -9
    while grading: its student is retried on the other, and every student gets the grade it earns."""
    expected = _class(tmp_path / "subs", 4)
    address = f"tcp://127.0.0.1:{free_port()}"
    env = engine.worker_env()
    env["PYTHONPATH"] += os.pathsep + str(Path(holdback.__file__).parents[1])  # support.holdback, by reference too
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env, "cwd": tmp_path}
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", address.rsplit(":", 1)[1], "--no-dashboard"], **quiet)]
    try:
        workers = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                                     "--no-nanny", "--no-dashboard", "--name", f"w{i}"], **quiet) for i in range(2)]
        procs += workers
        done: dict = {}
        go = tmp_path / "go"  # s03 is held back until the kill is done: the kill is certainly mid-run
        run = threading.Thread(target=lambda: done.update(results=autograde(
            tmp_path / "subs", tmp_path / "out", course_dir=tmp_path / "course", db_url=postgres_gradebook,
            settings=Settings(scheduler=address),
            task=holdback.HoldBack("s03", file=str(go)))))
        run.start()
        _wait_for_status(tmp_path / "course" / "outcomes")
        workers[0].send_signal(signal.SIGKILL)
        assert not (tmp_path / "course" / "outcomes" / "s03.json").exists()
        go.touch()
        run.join(timeout=600)
        assert not run.is_alive()
        assert {r.student: r.status for r in done["results"]} == {s: "graded" for s in expected}
        assert _totals(tmp_path / "out") == expected
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_interrupted_run_resumes_without_regrading(tmp_path):
    """The whole run is killed once every student but one is finished, that one being held back (on the
    one worker, which it leaves to the others), so the kill certainly comes mid-run; `--resume` (the
    command) then grades that student only and writes the whole report."""
    subs, course, out = tmp_path / "subs", tmp_path / "course", tmp_path / "out"
    expected = _class(subs, 3)
    held, others = "s01", ["s00", "s02"]
    proc = subprocess.Popen([sys.executable, holdback.__file__, str(subs), str(out), str(course), held,
                             str(tmp_path / "never created")],
                            cwd=nbs.ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for([course / "held.json"] + [course / "outcomes" / f"{s}.json" for s in others], proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole run dies: the parent, its cluster, the held task
        proc.wait()
    finished = {p.stem: p.stat().st_mtime_ns for p in (course / "outcomes").glob("*.json")}
    assert sorted(finished) == others
    shutil.rmtree(out, ignore_errors=True)

    done = subprocess.run([sys.executable, "-m", "grading", "autograde", str(subs), "--out", str(out),
                           "--course", str(course), "--resume"], cwd=nbs.ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "graded 3 of 3 students" in done.stdout
    assert _totals(out) == expected
    for student, mtime in finished.items():  # not graded again
        assert (course / "outcomes" / f"{student}.json").stat().st_mtime_ns == mtime
    assert (out / "failures.csv").exists() and (out / "failures.png").exists()


def test_two_workers_on_postgres_and_a_slow_student_does_not_hold_up_the_others(tmp_path, postgres_gradebook):
    """Two workers on a PostgreSQL gradebook, with dynamic scheduling: the student first in line holds its worker
    until every other student is finished, which they can only do if the other worker takes them all (with a static
    split, one of them would wait behind it until the hold gives up). Asserted on the order of events, not on time;
    then every student has the grade it earns, in the PostgreSQL gradebook."""
    expected = _class(tmp_path / "subs", 4)
    write_nb(filled_submission(NB), tmp_path / "subs" / "a_slow" / f"{NB}.ipynb")  # first in line
    results = autograde(tmp_path / "subs", tmp_path / "out", course_dir=tmp_path / "course", db_url=postgres_gradebook,
                        settings=Settings(workers=2), task=holdback.HoldBack("a_slow", others=tuple(expected)))
    held = json.loads((tmp_path / "course" / "held.json").read_text())
    assert set(held["finished_at_start"]) < set(expected), "the slow student came last in line: nothing tested"
    assert held["gave_up"] is False, "the other students were not all finished while the slow one held its worker"
    order = sorted((tmp_path / "course" / "outcomes").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    assert order[-1].stem == "a_slow", [p.stem for p in order]
    assert {r.student: r.status for r in results} == {s: "graded" for s in [*expected, "a_slow"]}
    assert _totals(tmp_path / "out") == {**expected, "a_slow": FULL}
    from nbgrader.api import Gradebook

    with Gradebook(postgres_gradebook) as gb:  # the gradebook really is the PostgreSQL one
        assert sorted(s.id for s in gb.students) == sorted([*expected, "a_slow"])


SCRIPTS_NB = "06_training"


def test_two_workers_grade_the_training_script_and_name_a_lost_optimiser_state(tmp_path, postgres_gradebook):
    """Notebook 06 graded as a class on two workers: a training script whose --resume starts the optimiser
    afresh loses its cell's points (every hidden case resumes), and the student's outcome names the bug; the correct one loses none."""
    train_script = nbs.solution_sources(SCRIPTS_NB)["train_script"]
    assert 'optimizer.load_state_dict(state["optimizer"])' in train_script
    fresh_optimiser = train_script.replace('optimizer.load_state_dict(state["optimizer"])', "pass")
    write_nb(filled_submission(SCRIPTS_NB), tmp_path / "subs" / "right" / f"{SCRIPTS_NB}.ipynb")
    write_nb(filled_submission(SCRIPTS_NB, {"train_script": fresh_optimiser}),
             tmp_path / "subs" / "fresh" / f"{SCRIPTS_NB}.ipynb")
    results = autograde(tmp_path / "subs", tmp_path / "out", course_dir=tmp_path / "course", db_url=postgres_gradebook,
                        settings=Settings(workers=2))
    assert {r.student: r.status for r in results} == {"right": "graded", "fresh": "graded"}
    with open(tmp_path / "out" / "grades.csv") as f:
        cell = {r["student"]: float(r[f"{SCRIPTS_NB}:test_train_script"]) for r in csv.DictReader(f)}
    assert cell["right"] == cell["(max points)"] == 2
    assert cell["fresh"] == 0, cell  # every hidden case resumes a run
    outcomes = {s: (tmp_path / "course" / "outcomes" / f"{s}.json").read_text() for s in ("right", "fresh")}
    assert "the optimiser starts afresh" in outcomes["fresh"]
    assert "the optimiser starts afresh" not in outcomes["right"]
