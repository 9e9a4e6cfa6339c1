"""Run a measurement on this working tree and on the files of an earlier commit, alternating, and print the
ratio of the medians: the harness of bench_captioner.py and bench_course_run.py."""
from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from data.common import DATA_ENV, default_data_dir

ROOT = Path(__file__).resolve().parent.parent


def shared_data_env(**extra: str) -> dict[str, str]:
    """This process's environment and `extra`, with the data folder this checkout uses: both trees read the
    datasets built once."""
    return {**os.environ, DATA_ENV: str(default_data_dir()), **extra}


def tree_at(rev: str, dest: Path) -> Path:
    """The files of commit `rev` (git archive: no worktree to clean up)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def alternate(before: str, rounds: int, run: Callable[[Path, Path], tuple[float, str]], what: str) -> None:
    """`run(tree, scratch) -> (seconds, details)` on commit `before` and on this working tree, in turns (the
    order flips every round), printing each run's line and then the medians and their ratio (now / before)."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        scratch = Path(tmp)
        trees = {"before": tree_at(before, scratch / "before"), "now": ROOT}
        times: dict[str, list[float]] = {"before": [], "now": []}
        for r in range(rounds):
            for label in (("before", "now") if r % 2 == 0 else ("now", "before")):
                seconds, details = run(trees[label], scratch)
                times[label].append(seconds)
                print(f"{label:>6} ({before if label == 'before' else 'working tree'}): {seconds:.1f} s  {details}",
                      flush=True)
    old, new = statistics.median(times["before"]), statistics.median(times["now"])
    print(f"{what}, median over {rounds} round(s): now {new:.1f} s, before {old:.1f} s, ratio {new / old:.2f}")
