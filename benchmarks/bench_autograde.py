"""Autograde throughput: the kit (sandbox + judge, on Dask) against plain nbgrader, and 1 vs 2 workers.

    python benchmarks/bench_autograde.py [--students 6] [--plain-agg]

Each canned submission holds every notebook, filled with the reference answers (every other student
with one bug in notebook 01), and notebook 05's trained model. In one run, on this machine, one after the other:
- plain nbgrader: `autograde` + `generate_feedback` of the same submissions through its API, with
  its own Execute step (student code in the grader's kernel, checks judged in there);
- the kit, 1 worker (SQLite, as plain nbgrader), then 1 and 2 workers on one PostgreSQL gradebook (if
  its binaries are installed), so that the speed-up compares worker counts and nothing else.
Before any figure that compares them, it checks that the comparison is real: every student graded on
every side (nbgrader's API results say `success` for autograde and feedback; the kit's outcomes say
"graded") and the same points per student and notebook on every side (each side's own gradebook);
otherwise it stops (SystemExit) naming the student and what each side gave. Then it prints seconds per
submission for each, the kit/plain ratio, the speed-up of 2 workers over 1, and a projection for 500
submissions on 16 cores. For each pair of runs it also prints the most the two-worker run could have sped up
given the CPU it used (its busy core-seconds over the cores, read from /proc/stat: start-up work on each worker counts,
idle time does not), and what the hypervisor held back meanwhile ("steal"). First, a control: the engine alone (grading/engine.py) with a stand-in task
of fixed pure-Python work, 1 and 2 workers, with Dask's default background work and with the engine's
(`engine.QUIET`), so that what the engine itself costs is measured apart from grading. The kit's seconds per submission
come two ways: the run's wall time over the class (the cluster's start-up and the course's preparation shared by
few students), and the steady state a large class sees, the mean time inside the worker of the students graded in
a sandbox they did not start (kept warm from the worker's previous student, or, for its first, started while the
course was prepared: that student's wait for its imports is counted). On both sides the course is prepared once before
the timed run, as when the assignment was released (nbgrader's generate_assignment records it in the gradebook); the
kit's timed run prepares the folder again all the same (new hidden-case ids) and finds the assignment recorded.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NamedTuple
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent

# A Dask worker starts by importing the main module again, as __mp_main__ (multiprocessing's forkserver): the kit's own
# command, `python -m grading`, has a main module that imports next to nothing, so here too the grader is imported
# only where this file runs as itself, or the kit's start-up would be timed seconds slower than the command's.
if __name__ != "__mp_main__":
    import nbformat

    from grading import course, engine, notebooks
    from grading import local_postgres as postgres
    from grading.autograde import autograde
    from grading.execute import README, replace_block
    from grading.notebooks import filled_submission
    from grading.settings import Settings
    from starter.compare import HIDDEN_ENV

BUG = {"causal_mask": "def causal_mask(T, device=None):\n    return torch.ones(T, T, dtype=torch.bool).tril(-1)\n"}
PLAIN = """
c.Autograde.autograde_preprocessors = [
    "nbgrader.preprocessors.Execute", "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor", "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades", "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata"]
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput", "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec", "nbgrader.preprocessors.OverwriteCells",
    "nbgrader.preprocessors.CheckCellMetadata"]
c.Execute.timeout = 30
"""


def make_class(folder: Path, n: int, stems: list[str] | None = None) -> list[str]:
    """n submissions of the notebooks `stems` (default: every notebook) and, where notebook 05 is one of them,
    its trained model (trained once, as the notebook does)."""
    stems = stems or [p.stem for p in notebooks.solution_notebooks()]
    beside = {f for stem in stems for f in notebooks.FILES_BESIDE.get(stem, [])}
    checkpoint = (notebooks.trained_checkpoint(folder.parent / "trained.pt")
                  if notebooks.TRAINED_CHECKPOINT in beside else None)
    for i in range(n):
        student = folder / f"student{i:03d}"
        for stem in stems:
            overrides = BUG if (i % 2 and stem.startswith("01")) else None
            path = student / f"{stem}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(filled_submission(stem, overrides), str(path))
        if checkpoint is not None:
            (student / "runs").mkdir()
            shutil.copy(checkpoint, student / notebooks.TRAINED_CHECKPOINT)
    return [f"student{i:03d}" for i in range(n)]


Points = dict[str, dict[str, float]]  # student -> notebook -> points in the gradebook


def gradebook_points(db_url: str, students: list[str]) -> Points:
    """Each student's points per notebook, as the gradebook at `db_url` holds them (what nbgrader's reports and
    formgrader show)."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        return {s: {nb.name: float(nb.score) for nb in gb.find_submission(notebooks.ASSIGNMENT, s).notebooks}
                for s in students}


def same_points(plain: Points, kit_points: Points, name: str) -> None:
    """Stop unless the kit's run `name` gave every student what plain nbgrader gave, notebook by notebook."""
    for student in plain:
        mine, theirs = kit_points.get(student, {}), plain[student]
        if mine != theirs:
            notebooks_apart = {nb: (theirs.get(nb), mine.get(nb)) for nb in sorted(theirs.keys() | mine.keys())
                               if theirs.get(nb) != mine.get(nb)}
            raise SystemExit(f"{student}: plain nbgrader gave {sum(theirs.values()):g} points, the kit ({name}) "
                             f"{sum(mine.values()):g}; per notebook (plain, kit): {notebooks_apart}")


def plain_api(root: Path):
    """nbgrader's API made from the course's nbgrader_config.py as it reads now. Not `course.api(root)`: that
    one was made (and kept) when the course was prepared, with the kit's steps, which refuse to run outside
    the kit's autograde, so a "plain" run through it would grade nobody."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    coursedir = CourseDirectory(config=config)
    coursedir.root = str(root)
    return NbGraderAPI(coursedir, config=config)


def plain_nbgrader(subs: Path, tmp: Path, students: list[str], agg: bool = False) -> tuple[float, Points]:
    """(seconds per submission, points) of nbgrader's own autograde + feedback (no sandbox, no judge). Its
    kernels draw the figures as Jupyter does (the inline backend), unless `agg`: then, like the kit's sandbox,
    Agg (no figure becomes an output). Stops (SystemExit) at the first student nbgrader did not grade."""
    root = tmp / "course-plain"
    course.prepare_grading_course(root)
    with open(root / "nbgrader_config.py", "a") as f:
        f.write(PLAIN)
    for student in students:
        shutil.copytree(subs / student, root / "submitted" / student / notebooks.ASSIGNMENT)
    api = plain_api(root)
    if api.config.Autograde.autograde_preprocessors[0] != "nbgrader.preprocessors.Execute":
        raise SystemExit(f"plain nbgrader would not run its own Execute: {api.config.Autograde.autograde_preprocessors}")
    with mock.patch.dict(os.environ):  # the kernels inherit this process's environment; restored on leaving
        os.environ[HIDDEN_ENV] = str(notebooks.HIDDEN_REFERENCES)  # checks judge in the kernel
        os.environ.pop("MPLBACKEND", None)
        if agg:
            os.environ["MPLBACKEND"] = "Agg"
        start = time.perf_counter()
        for student in students:
            for step, result in (("autograde", api.autograde(notebooks.ASSIGNMENT, student, force=True, create=True)),
                                 ("feedback", api.generate_feedback(notebooks.ASSIGNMENT, student, force=True))):
                if not result.get("success"):
                    raise SystemExit(f"plain nbgrader's {step} failed for {student}: {course.last_error(result)}")
        seconds = (time.perf_counter() - start) / len(students)
    return seconds, gradebook_points(course.sqlite_url(root), students)


class CPU(NamedTuple):
    """What this machine's CPUs did between two readings of /proc/stat, in core-seconds."""
    busy: float  # user, nice, system, irq and softirq: work done here, by this run or anything else
    stolen: float  # "steal": time the hypervisor gave another machine while this one had work


def machine_cpu() -> CPU | None:
    """This machine's CPU since it booted (`CPU`); None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return CPU((user + nice + system + irq + softirq) / tick, steal / tick)


class KitRun(NamedTuple):
    per_submission: float  # wall seconds over the class, the cluster's start-up and the report included
    inside: float  # mean seconds a student took inside its worker
    steady: float  # the same, for the students graded in a sandbox they did not start: the steady state
    points: Points  # as its gradebook holds them
    cpu: CPU | None  # what the machine's CPUs did during the timed run


def kit(subs: Path, tmp: Path, name: str, n: int, db_url=None, workers=1) -> KitRun:
    """The kit's timed autograde of the class (`KitRun`); the steady state counts the students graded in a sandbox
    they did not start (kept from the worker's previous student, or started ahead while the course was
    prepared). Stops (SystemExit) if a student was not graded."""
    root = tmp / f"course-{name}"
    # once per course, untimed, as for plain nbgrader: the timed run prepares it again (new hidden-case ids), and
    # finds the assignment recorded in the gradebook (course.record_assignment; a first run records it, 8 s more)
    course.prepare_grading_course(root, db_url)
    before, start = machine_cpu(), time.perf_counter()
    results = autograde(subs, tmp / f"out-{name}", course_dir=root, db_url=db_url, settings=Settings(workers=workers))
    total, after = time.perf_counter() - start, machine_cpu()
    bad = {r.student: r.error or r.status for r in results if r.status != "graded"}
    if bad or len(results) != n:
        raise SystemExit(f"kit ({name}): {len(results)} students found of {n}; not graded: {bad}")
    points = gradebook_points(db_url or course.sqlite_url(root), [r.student for r in results])
    warm = [r.seconds for r in results if r.sandboxes_started == 0]
    sandbox = sum(rec.seconds for r in results for rec in r.judged) / n
    inside = sum(r.seconds for r in results) / n
    steady = sum(warm) / len(warm) if warm else inside
    cpu = CPU(after.busy - before.busy, after.stolen - before.stolen) if before and after else None
    used = (f"; the machine's CPUs were busy {cpu.busy:.0f} core-s in its {total:.0f} s ({cpu.busy / total:.2f} of "
            f"{os.cpu_count()} cores on average), the hypervisor held back {cpu.stolen:.1f} core-s") if cpu else ""
    print(f"  {name}: {inside:.1f} s per student inside its worker, of which {sandbox:.1f} s in the sandbox (its "
          f"start and the notebooks' own cells); {steady:.1f} s for the {len(warm)} graded in a sandbox they did not "
          f"start{used}")
    return KitRun(total / n, inside, steady, points, cpu)


def cpu_bound(one: float, two: KitRun, n: int) -> float | None:
    """The most the two-worker run `two` could have sped up over one worker's `one` seconds per submission on this
    machine, given the CPU it used: the shortest any run doing that much work could take here is its core-seconds
    spread over every core with none ever idle. Each worker's start-up counts in that work; a core left idle (the
    serial tail, a worker waiting for another) does not."""
    if two.cpu is None:
        return None
    return one / (two.cpu.busy / (os.cpu_count() or 1) / n)


def class_points(points: Points) -> str:
    return ", ".join(f"{sum(p.values()):g}" for p in points.values())


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


# the README's paragraph on grading speed, between these two lines, is written by a run of this benchmark
SPEED = ("<!-- grading speed: written by `python benchmarks/bench_autograde.py --readme`; do not edit by hand -->",
         "<!-- end of grading speed -->")


def commit() -> str:
    """The commit measured, and whether the tree differed from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    return f"{head or 'an unknown commit'}{' with uncommitted changes' if changed else ''}"


def speed_paragraph(n: int, plain: float, one: float, speedup: float | None, measured: str, pairs: int = 1,
                    bound: float | None = None) -> str:
    """The README's paragraph on grading speed, from one run of this benchmark."""
    median = f", the median of {pairs} runs of each, one after the other" if pairs > 1 else ""
    most = (f"; the CPU its two-worker runs used allowed at most {bound:.2f} times on these {os.cpu_count()} cores "
            "(their core-seconds with no core ever idle, against one worker's wall time)") if bound else ""
    workers = (f" With two workers (PostgreSQL) the class was graded {speedup:.2f} times as fast as with one (wall time, "
               f"start-up included{median}){most}." if speedup is not None else
               " (PostgreSQL was not installed: no 2-worker figure.)")
    option = f" --pairs {pairs}" if pairs > 1 else ""
    return (f"**Speed.** Measured by `python benchmarks/bench_autograde.py --students {n}{option} --readme` on {measured}: plain "
            f"nbgrader's autograde and feedback took {plain:.1f} s per submission, the kit {one:.1f} s (sandbox and "
            f"judge, 1 worker, start-up included), {one / plain:.2f} times plain nbgrader's time; both graded the same "
            f"{n} submissions of all {len(notebooks.solution_notebooks())} notebooks to the same points.{workers} "
            "How it is measured and what each change brought: "
            "[docs/benchmarks.md](docs/benchmarks.md#grading-a-class).")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=6)
    parser.add_argument("--plain-agg", action="store_true",
                        help="plain nbgrader's kernels without figures (Agg), as in the kit's sandbox")
    parser.add_argument("--pairs", type=int, default=1,
                        help="runs of 1 worker then 2 workers (PostgreSQL): the speed-up is their median, each printed")
    parser.add_argument("--readme", action="store_true",
                        help="write the README's paragraph on grading speed from this run (once every check passed)")
    args = parser.parse_args()
    measured = f"{time.strftime('%Y-%m-%d')}, commit {commit()} ({os.cpu_count()} CPU cores, {platform.machine()})"
    n = args.students
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        students = make_class(tmp / "subs", n)
        print(f"{n} submissions x {len(notebooks.solution_notebooks())} notebooks, {os.cpu_count()} cores")
        print(f"the engine alone, {n} stand-in tasks of fixed pure-Python work (no sandbox, no nbgrader):")
        engine_alone(tmp, n)
        plain, plain_points = plain_nbgrader(tmp / "subs", tmp, students, args.plain_agg)
        print(f"plain nbgrader autograde + feedback: {plain:6.1f} s per submission "
              f"({'Agg: no figures drawn' if args.plain_agg else 'figures drawn inline, as in Jupyter'}); "
              f"{n}/{n} graded, points {class_points(plain_points)}")
        one, _, steady, points, _ = kit(tmp / "subs", tmp, "1worker", n)
        same_points(plain_points, points, "1worker")  # before any ratio: both sides graded the same
        print(f"kit, 1 worker (SQLite):             {one:6.1f} s per submission, start-up included "
              f"(kit / plain nbgrader = {one / plain:.2f}); {steady:.1f} s per submission in the steady state "
              f"(kit / plain nbgrader = {steady / plain:.2f}); {n}/{n} graded, the same points as plain nbgrader")
        if not postgres.available():
            print("PostgreSQL not available: the 1 vs 2 workers comparison is skipped")
            if args.readme and not args.plain_agg:
                replace_block(README, SPEED, speed_paragraph(n, plain, one, None, measured), "grading speed")
            return
        pairs = []  # (1 worker, 2 workers) wall seconds per submission, run one after the other
        bounds = []  # each pair's most the two-worker run's CPU allowed (cpu_bound)
        for pair in range(args.pairs):
            with postgres.server() as url:  # both on the same gradebook server, so only the worker count differs
                one_pg, inside_one, steady_one, points, _ = kit(tmp / "subs", tmp, f"1worker-pg-{pair}", n, url)
                same_points(plain_points, points, "1worker-pg")
                print(f"kit, 1 worker (PostgreSQL):         {one_pg:6.1f} s per submission ({inside_one:.1f} s per "
                      "student inside the worker)")
            with postgres.server() as url:
                run_two = kit(tmp / "subs", tmp, f"2workers-{pair}", n, url, workers=2)
                two, inside_two, steady_two, points, _ = run_two
                same_points(plain_points, points, "2workers")
            print(f"kit, 2 workers (PostgreSQL):        {two:6.1f} s per submission ({inside_two:.1f} s per "
                  "student inside a worker)")
            print(f"speed-up of 2 workers over 1: {one_pg / two:.2f}x wall, start-up included (parallel efficiency "
                  f"{one_pg / two / 2:.2f}); {2 * inside_one / inside_two:.2f}x once started (per-student time, 1 vs 2 "
                  f"side by side); {2 * steady_one / steady_two:.2f}x in the steady state (a student in a warm sandbox: "
                  f"{steady_one:.1f} s alone, {steady_two:.1f} s with two side by side)")
            if (allowed := cpu_bound(one_pg, run_two, n)) is not None:
                print(f"  the most the two-worker run's CPU allowed: {allowed:.2f}x (its {run_two.cpu.busy:.0f} core-s on "
                      f"{os.cpu_count()} cores with none ever idle take {run_two.cpu.busy / (os.cpu_count() or 1):.0f} s, "
                      f"against {one_pg * n:.0f} s for one worker)")
                bounds.append(allowed)
            pairs.append((one_pg, two))
        speedups = [alone / side_by_side for alone, side_by_side in pairs]  # in the order run
        speedup = statistics.median(speedups)
        bound = statistics.median(bounds) if len(bounds) == len(pairs) else None
        if len(pairs) > 1:
            print(f"speed-up of 2 workers over 1, median of {len(pairs)} pairs run one after the other: {speedup:.2f}x "
                  f"wall (each pair: {', '.join(f'{r:.2f}x' for r in speedups)})"
                  + (f"; the most their CPU allowed, median: {bound:.2f}x" if bound else ""))
        efficiency = speedup / 2
        print(f"projection, 500 submissions on 16 cores with 16 workers: "
              f"{500 * statistics.median(alone for alone, _ in pairs) / (16 * efficiency) / 60:.1f} min (the wall "
              "efficiency assumed to hold)")
        if args.readme and not args.plain_agg:  # the README quotes plain nbgrader as Jupyter runs it (figures drawn)
            replace_block(README, SPEED, speed_paragraph(n, plain, one, speedup, measured, len(pairs), bound),
                          "grading speed")
            print(f"wrote the README's paragraph on grading speed ({README})")


if __name__ == "__main__":
    main()
