"""Autograde throughput: the kit (sandbox + judge, on Dask) against plain nbgrader, and 1 vs 2 workers.

    python benchmarks/bench_autograde.py [--students 6] [--plain-agg]

Each canned submission holds every notebook, filled with the reference answers (every other student
with one bug in notebook 01), and notebook 05's trained model. In one run, on this machine, one after the other:
- plain nbgrader: `autograde` + `generate_feedback` of the same submissions through its API, with
  its own Execute step (student code in the grader's kernel, checks judged in there);
- the kit, 1 worker (SQLite, as plain nbgrader), then 1 and 2 workers on one PostgreSQL gradebook (if
  its binaries are installed), so that the speed-up compares worker counts and nothing else.
Prints seconds per submission for each, the kit/plain ratio, the speed-up of 2 workers over 1, and a
projection for 500 submissions on 16 cores. First, a control: the engine alone (grading/engine.py) with
a stand-in task of fixed pure-Python work, 1 and 2 workers, with Dask's default background work and
with the engine's (`engine.QUIET`), so that what the engine itself costs is measured apart from
grading. The kit's seconds per submission come two ways: the run's wall time over the class (the
cluster's start-up and each worker's first sandbox shared by few students), and the steady state a
large class sees, the mean time inside the worker of the students graded in a sandbox kept warm from
the worker's previous student.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent

import nbformat

from grading import course, engine, notebooks
from grading import local_postgres as postgres
from grading.autograde import autograde
from grading.notebooks import filled_submission
from grading.settings import Settings

BUG = {"causal_mask": "def causal_mask(T, device=None):\n    return torch.ones(T, T, dtype=torch.bool).tril(-1)\n"}
PLAIN = """
c.Autograde.autograde_preprocessors = [
    "nbgrader.preprocessors.Execute", "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor", "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades", "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata"]
c.Execute.timeout = 30
"""


def make_class(folder: Path, n: int) -> list[str]:
    """n submissions of every notebook and notebook 05's trained model (trained once, as the notebook does)."""
    stems = [p.stem for p in notebooks.solution_notebooks()]
    checkpoint = notebooks.trained_checkpoint(folder.parent / "trained.pt")
    for i in range(n):
        for stem in stems:
            overrides = BUG if (i % 2 and stem.startswith("01")) else None
            path = folder / f"student{i:03d}" / f"{stem}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(filled_submission(stem, overrides), str(path))
        (folder / f"student{i:03d}" / "runs").mkdir()
        shutil.copy(checkpoint, folder / f"student{i:03d}" / notebooks.TRAINED_CHECKPOINT)
    return [f"student{i:03d}" for i in range(n)]


def plain_nbgrader(subs: Path, tmp: Path, students: list[str], agg: bool = False) -> float:
    """Seconds per submission of nbgrader's own autograde + feedback (no sandbox, no judge). Its kernels draw
    the figures as Jupyter does (the inline backend), unless `agg`: then, like the kit's sandbox, Agg (no
    figure becomes an output)."""
    root = tmp / "course-plain"
    course.prepare_grading_course(root)
    with open(root / "nbgrader_config.py", "a") as f:
        f.write(PLAIN)
    for student in students:
        shutil.copytree(subs / student, root / "submitted" / student / notebooks.ASSIGNMENT)
    os.environ["COURSE_HIDDEN_REFERENCES"] = str(notebooks.HIDDEN_REFERENCES)  # checks judge in the kernel
    backend = os.environ.pop("MPLBACKEND", None)  # the kernels inherit this process's environment
    if agg:
        os.environ["MPLBACKEND"] = "Agg"
    api = course.api(root)
    start = time.perf_counter()
    for student in students:
        api.autograde(notebooks.ASSIGNMENT, student, force=True, create=True)
        api.generate_feedback(notebooks.ASSIGNMENT, student, force=True)
    seconds = (time.perf_counter() - start) / len(students)
    del os.environ["COURSE_HIDDEN_REFERENCES"]
    os.environ.pop("MPLBACKEND", None)
    if backend is not None:
        os.environ["MPLBACKEND"] = backend
    return seconds


def kit(subs: Path, tmp: Path, name: str, n: int, db_url=None, workers=1) -> tuple[float, float, float]:
    """(wall seconds per submission, start-up of the cluster and report included; mean seconds one student
    takes inside its worker; the same for the students graded in a warm sandbox, the steady state)."""
    root = tmp / f"course-{name}"
    course.prepare_grading_course(root, db_url)  # timed apart: done once per run, not per submission
    start = time.perf_counter()
    results = autograde(subs, tmp / f"out-{name}", course_dir=root, db_url=db_url, settings=Settings(workers=workers))
    total = time.perf_counter() - start
    bad = [r.student for r in results if r.status != "graded"]
    if bad:
        raise SystemExit(f"{name}: not graded: {bad}")
    warm = [r.seconds for r in results if r.sandboxes_started == 0]
    sandbox = sum(rec.seconds for r in results for rec in r.judged) / n
    inside = sum(r.seconds for r in results) / n
    steady = sum(warm) / len(warm) if warm else inside
    print(f"  {name}: {inside:.1f} s per student inside its worker, of which {sandbox:.1f} s in the sandbox (its "
          f"start and the notebooks' own cells); {steady:.1f} s for the {len(warm)} graded in a warm sandbox")
    return total / n, inside, steady


def stand_in(student: str) -> dict:
    """A task of fixed work that grades nothing: pure Python, about 3 s on one core here. Returns its wall
    time and the CPU time its thread got meanwhile."""
    start, cpu, total = time.perf_counter(), time.thread_time(), 0
    for i in range(100_000_000):
        total += i
    return {"student": student, "ok": True, "seconds": time.perf_counter() - start, "cpu": time.thread_time() - cpu}


def engine_alone(tmp: Path, n: int) -> None:
    """The control: `n` stand-in tasks through the engine, 1 and 2 workers, with Dask's defaults and QUIET."""
    for name, quiet in (("Dask's defaults", {}), ("engine.QUIET   ", dict(engine.QUIET))):
        times = {}
        with mock.patch.dict(engine.QUIET, quiet, clear=True):
            for workers in (1, 2):
                root = tmp / f"engine-{len(quiet)}-{workers}"
                root.mkdir()
                start = time.perf_counter()
                records = engine.run(root, [f"s{i}" for i in range(n)], workers=workers, progress=False, task=stand_in)
                share = sum(r["cpu"] for r in records.values()) / sum(r["seconds"] for r in records.values())
                times[workers] = (time.perf_counter() - start, share)
        (one, share1), (two, share2) = times[1], times[2]
        print(f"  {name}: 1 worker {one:5.1f} s, 2 workers {two:5.1f} s ({one / two:.2f}x); a task had the CPU "
              f"{100 * share1:.1f} % of its time alone, {100 * share2:.1f} % side by side")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=6)
    parser.add_argument("--plain-agg", action="store_true",
                        help="plain nbgrader's kernels without figures (Agg), as in the kit's sandbox")
    args = parser.parse_args()
    n = args.students
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        students = make_class(tmp / "subs", n)
        print(f"{n} submissions x {len(notebooks.solution_notebooks())} notebooks, {os.cpu_count()} cores")
        print(f"the engine alone, {n} stand-in tasks of fixed pure-Python work (no sandbox, no nbgrader):")
        engine_alone(tmp, n)
        plain = plain_nbgrader(tmp / "subs", tmp, students, args.plain_agg)
        print(f"plain nbgrader autograde + feedback: {plain:6.1f} s per submission "
              f"({'Agg: no figures drawn' if args.plain_agg else 'figures drawn inline, as in Jupyter'})")
        one, _, steady = kit(tmp / "subs", tmp, "1worker", n)
        print(f"kit, 1 worker (SQLite):             {one:6.1f} s per submission, start-up included "
              f"(kit / plain nbgrader = {one / plain:.2f}); {steady:.1f} s per submission in the steady state "
              f"(kit / plain nbgrader = {steady / plain:.2f})")
        if not postgres.available():
            print("PostgreSQL not available: the 1 vs 2 workers comparison is skipped")
            return
        with postgres.server() as url:  # both on the same gradebook, so only the worker count differs
            one_pg, inside_one, steady_one = kit(tmp / "subs", tmp, "1worker-pg", n, url, workers=1)
            print(f"kit, 1 worker (PostgreSQL):         {one_pg:6.1f} s per submission ({inside_one:.1f} s per "
                  "student inside the worker)")
        with postgres.server() as url:
            two, inside_two, steady_two = kit(tmp / "subs", tmp, "2workers", n, url, workers=2)
        print(f"kit, 2 workers (PostgreSQL):        {two:6.1f} s per submission ({inside_two:.1f} s per "
              "student inside a worker)")
        efficiency = one_pg / two / 2
        print(f"speed-up of 2 workers over 1: {one_pg / two:.2f}x wall, start-up included (parallel efficiency "
              f"{efficiency:.2f}); {2 * inside_one / inside_two:.2f}x once started (per-student time, 1 vs 2 side by side); "
              f"{2 * steady_one / steady_two:.2f}x in the steady state (a student in a warm sandbox: {steady_one:.1f} s "
              f"alone, {steady_two:.1f} s with two side by side)")
        print(f"projection, 500 submissions on 16 cores with 16 workers: "
              f"{500 * one_pg / (16 * efficiency) / 60:.1f} min (the wall efficiency assumed to hold)")


if __name__ == "__main__":
    main()
