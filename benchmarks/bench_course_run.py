"""`python3 kit.py run` (every solution notebook, end to end), now and at an earlier commit, side by side.

    python benchmarks/bench_course_run.py [--before REV] [--rounds N]

Runs `python -m grading execute --out TMP` (what `kit.py run` runs, without rewriting the README) in the files of
commit REV (default a911ea6, the last commit with five notebooks) and in this working tree, alternating between
the two for N rounds (default 2), with the same Python and the same dataset files. Prints each run's wall time
and its per-notebook times as `grading execute` printed them, then the medians and their ratio (now / before).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from side_by_side import alternate, shared_data_env


def run_course(tree: Path, scratch: Path) -> tuple[float, str]:
    """Wall seconds of `python -m grading execute` in `tree`, and the per-notebook times it printed."""
    env = shared_data_env(PYTHONPATH=str(tree))
    start = time.perf_counter()
    out = scratch / f"out-{time.monotonic_ns()}"
    done = subprocess.run([sys.executable, "-m", "grading", "execute", "--out", str(out)], cwd=tree, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"grading execute failed in {tree}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    rows = [f"{m.group(1)[:2]} {m.group(2)} s" for m in re.finditer(r"^(\d\d_\w+)\s+([\d.]+) s", done.stdout, re.M)]
    return seconds, f"({', '.join(rows)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="a911ea6")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    alternate(args.before, args.rounds, run_course, "every notebook")


if __name__ == "__main__":
    main()
