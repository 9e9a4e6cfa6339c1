"""Autograde throughput: seconds per submission, 1 worker (SQLite) vs 2 workers (PostgreSQL).

    python benchmarks/bench_autograde.py [--students 20]

Each canned submission holds every notebook, filled with the reference answers (every other student
with one bug). Both runs grade the same submissions on this machine, one after the other. Prints
seconds per submission, the speed-up of 2 workers over 1, and a projection for 500 submissions on a
16-core machine (assuming the 2-worker parallel efficiency holds per pair of cores).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import filled_submission, write_nb  # noqa: E402
from grading import course, notebooks  # noqa: E402
from grading.autograde import autograde  # noqa: E402
import postgres  # noqa: E402

BUG = {"causal_mask": "def causal_mask(T, device=None):\n    return torch.ones(T, T, dtype=torch.bool).tril(-1)\n"}


def make_class(folder: Path, n: int) -> None:
    stems = [p.stem for p in notebooks.solution_notebooks()]
    for i in range(n):
        for stem in stems:
            overrides = BUG if (i % 2 and stem.startswith("01")) else None
            write_nb(filled_submission(stem, overrides), folder / f"student{i:03d}" / f"{stem}.ipynb")


def timed_run(subs: Path, tmp: Path, name: str, db_url=None, workers=1) -> tuple[float, float]:
    root = tmp / f"course-{name}"
    start = time.perf_counter()
    course.prepare_grading_course(root, db_url)
    prep = time.perf_counter() - start
    start = time.perf_counter()
    results = autograde(subs, tmp / f"out-{name}", course_dir=root, db_url=db_url, workers=workers)
    total = time.perf_counter() - start
    bad = [r.student for r in results if r.status != "graded"]
    if bad:
        raise SystemExit(f"{name}: not graded: {bad}")
    return prep, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=20)
    args = parser.parse_args()
    n = args.students
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        make_class(tmp / "subs", n)
        nbs = len(notebooks.solution_notebooks())
        print(f"{n} submissions x {nbs} notebooks")
        prep, one = timed_run(tmp / "subs", tmp, "1worker")
        per_one = (one - prep) / n
        print(f"1 worker, SQLite:      {one:7.1f} s total, {per_one:5.1f} s per submission "
              f"(course set-up {prep:.1f} s)")
        if not postgres.available():
            print("PostgreSQL not available: 2-worker run skipped")
            return
        with postgres.server() as url:
            prep2, two = timed_run(tmp / "subs", tmp, "2workers", url, workers=2)
        per_two = (two - prep2) / n
        speedup = per_one / per_two
        print(f"2 workers, PostgreSQL: {two:7.1f} s total, {per_two:5.1f} s per submission")
        print(f"speed-up of 2 workers over 1: {speedup:.2f}x")
        efficiency = speedup / 2
        projected = prep + 500 * per_one / (16 * efficiency)
        print(f"projection, 500 submissions on 16 cores with 16 workers: {projected / 60:.1f} min "
              f"(parallel efficiency {efficiency:.2f} assumed to hold)")


if __name__ == "__main__":
    main()
