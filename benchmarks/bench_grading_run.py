"""`python -m grading autograde` of one class, now and at an earlier commit, side by side.

    python benchmarks/bench_grading_run.py [--before REV] [--students N] [--rounds R]

Each tree grades a class of N students (default 3) made by its own `grading.notebooks.filled_submission`
(every notebook, filled with that tree's solutions; every other student with one bug in notebook 01) and
notebook 05's trained model (trained once, shared: the checkpoint format is the same), with one worker and a
fresh course folder each time (its preparation included in the time). The trees alternate for R rounds
(default 2). Prints each run's wall time and how many students it graded, then the medians and their ratio
(now / before). REV defaults to 7c8b475, the last commit before the outcome record and the starter/ split.

The sandbox imports the kit as a student's installation does (the environment's editable install of it, not
$PYTHONPATH), so REV's tree grades with an environment of its own: this one, hard-linked (no copy of its
files), with the editable install pointing at REV's tree.
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

from side_by_side import ROOT, alternate, shared_data_env

from grading.notebooks import trained_checkpoint

MAKE_CLASS = """
import shutil, sys
from pathlib import Path
import nbformat
from grading import notebooks
folder, n, checkpoint = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
bug = {"causal_mask": "def causal_mask(T, device=None):\\n    return torch.ones(T, T, dtype=torch.bool).tril(-1)\\n"}
for i in range(n):
    student = folder / f"student{i:03d}"
    for path in notebooks.solution_notebooks():
        overrides = bug if (i % 2 and path.stem.startswith("01")) else None
        student.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebooks.filled_submission(path.stem, overrides), str(student / path.name))
    (student / "runs").mkdir()
    shutil.copy(checkpoint, student / notebooks.TRAINED_CHECKPOINT)
"""


def python_for(tree: Path, scratch: Path) -> str:
    """The interpreter that grades with `tree`'s kit: this one for the working tree, else a hard-linked copy of
    its environment whose editable install maps the kit's packages to `tree`."""
    if tree == ROOT:
        return sys.executable
    venv = scratch / f"venv-{tree.name}"
    if not venv.exists():
        subprocess.run(["cp", "-al", sys.prefix, str(venv)], check=True)
        for finder in venv.glob("lib/python*/site-packages/__editable___*_finder.py"):
            text = finder.read_text().replace(str(ROOT), str(tree))
            finder.unlink()  # a new file: the hard link to this environment's stays as it was
            finder.write_text(text)
    return str(venv / "bin" / "python")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="7c8b475")
    ap.add_argument("--students", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    classes: dict[Path, Path] = {}

    def env(tree: Path) -> dict:
        return shared_data_env()

    def grade(tree: Path, scratch: Path) -> tuple[float, str]:
        if tree not in classes:  # each tree's class, made once (not timed)
            checkpoint = scratch / "trained.pt"
            if not checkpoint.exists():
                trained_checkpoint(checkpoint)
            classes[tree] = scratch / f"class-{len(classes)}"
            subprocess.run([python_for(tree, scratch), "-c", MAKE_CLASS, str(classes[tree]), str(args.students),
                            str(checkpoint)], cwd=tree, env=env(tree), check=True)
        run = scratch / f"run-{time.monotonic_ns()}"
        start = time.perf_counter()
        done = subprocess.run([python_for(tree, scratch), "-m", "grading", "autograde", str(classes[tree]), "--out",
                               str(run / "out"), "--course", str(run / "course")], cwd=tree, env=env(tree),
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"autograde failed in {tree}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        graded = done.stdout.strip().splitlines()[-1].split(";")[0]
        points = sum(float(row["total"] or 0) for row in csv.DictReader(open(run / "out" / "grades.csv"))
                     if row["student"] != "(max points)")  # a student not graded has empty points
        return seconds, f"{graded}, {points:g} points in all"

    alternate(args.before, args.rounds, grade, f"grading {args.students} students")


if __name__ == "__main__":
    main()
