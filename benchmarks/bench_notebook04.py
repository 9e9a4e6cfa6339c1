"""Notebook 04 end to end, as a student runs it, now and at an earlier commit, side by side on this machine.

    python benchmarks/bench_notebook04.py [--before REV] [--rounds N]

Executes the solution notebook 04 of this working tree and of commit REV (default: ec66fa1, the last commit
before students wrote their own data pipeline, training loop and evaluation script), alternating
between the two for N rounds (default 1), each in a fresh kernel with its own kit (PYTHONPATH) and the
same dataset files. Prints, per run, the wall time of the whole notebook, the training line and the
greedy scores it printed, then the ratio of the medians (now / before).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nbformat
from nbclient import NotebookClient

NOTEBOOK = "04_captioning_transformer.ipynb"


def _tree_at(rev: str, dest: Path) -> Path:
    """The files of commit `rev` (git archive: no worktree to clean up)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _run(tree: Path, scratch: Path) -> dict:
    """Execute notebook 04 of `tree` with that tree's kit; returns the wall time and the printed results."""
    folder = scratch / f"run-{time.monotonic_ns()}"
    folder.mkdir()
    for nb in sorted((tree / "solutions").glob("0[1-4]*.ipynb")):  # 04 loads 02-03 from the course folder
        shutil.copy(nb, folder / nb.name)
    env = {**os.environ, "PYTHONPATH": str(tree), "COURSE_NOTEBOOKS_DIR": str(folder), "MPLBACKEND": "Agg",
           "COURSE_HIDDEN_REFERENCES": str(tree / "grading" / "references"),  # the solutions run their hidden tests
           "COURSE_DATA_DIR": os.environ.get("COURSE_DATA_DIR", str(ROOT / "data" / "cache"))}
    env.pop("NBGRADER_EXECUTION", None)
    nb = nbformat.read(str(folder / NOTEBOOK), as_version=4)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(folder)}})
    client.execute(env=env)  # (handed to the kernel manager: the kernel's environment, not this process's)
    seconds = time.perf_counter() - start
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if o.get("output_type") == "stream")
    training = re.search(r"training on .*", text)
    scores = re.search(r"BLEU-1 [^\n]*", text[text.find("greedy, "):] if "greedy, " in text else text)
    exact = re.search(r"exact match: [\d.]+%", text)
    return {"seconds": seconds, "training": training.group(0) if training else "?",
            "scores": scores.group(0).strip() if scores else "?", "exact": exact.group(0) if exact else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="ec66fa1")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench04-") as tmp:
        scratch = Path(tmp)
        trees = {"before": _tree_at(args.before, scratch / "before"), "now": ROOT}
        times: dict[str, list[float]] = {"before": [], "now": []}
        for r in range(args.rounds):
            for label in (("before", "now") if r % 2 == 0 else ("now", "before")):
                result = _run(trees[label], scratch)
                times[label].append(result["seconds"])
                print(f"{label:>6} ({args.before if label == 'before' else 'working tree'}): whole notebook "
                      f"{result['seconds']:.1f} s | {result['training']} | {result['scores']} {result['exact']}",
                      flush=True)
        before, now = statistics.median(times["before"]), statistics.median(times["now"])
        print(f"notebook 04, median over {args.rounds} round(s): now {now:.1f} s, before {before:.1f} s, "
              f"ratio {now / before:.2f}")


if __name__ == "__main__":
    main()
