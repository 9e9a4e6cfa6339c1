"""The captioner's notebooks end to end, as a student runs them, now and at an earlier commit, side by side.

    python benchmarks/bench_captioner.py [--before REV] [--rounds N]

Executes the solution notebooks of the captioner (04-08 now; 04-06 after the first split, 04 alone before it) of this
working tree and of commit REV (default: ec66fa1, the last commit before students wrote their own data
pipeline, training loop and evaluation script), alternating between the two for N rounds (default 1), each
notebook in a fresh kernel with its own kit (PYTHONPATH) and the same dataset files, one after the other in
one course folder (as a student runs them). Prints, per run, the wall time of each notebook and of all,
the training line and the greedy scores printed, then the ratio of the medians (now / before).
"""
from __future__ import annotations

import argparse
import re
import shutil
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from side_by_side import alternate, shared_data_env

from starter.compare import HIDDEN_ENV
from starter.runtime import GRADING_ENV, NOTEBOOKS_ENV


def captioner_notebooks(tree: Path) -> list[str]:
    """The notebooks that build, train and decode with the captioner: 04-08 (04-06, or 04 alone, at commits before
    they were split)."""
    return [p.name for p in sorted((tree / "solutions").glob("0[4-8]_*.ipynb")) if "visualiz" not in p.name]


def _run(tree: Path, scratch: Path) -> dict:
    """Execute the captioner's notebooks of `tree` with that tree's kit; returns the wall times and the
    printed results."""
    folder = scratch / f"run-{time.monotonic_ns()}"
    folder.mkdir()
    for nb in sorted((tree / "solutions").glob("0*.ipynb")):  # each loads the earlier ones from the course folder
        shutil.copy(nb, folder / nb.name)
    env = shared_data_env(PYTHONPATH=str(tree), MPLBACKEND="Agg", **{
        NOTEBOOKS_ENV: str(folder), HIDDEN_ENV: str(tree / "grading" / "references")})  # the solutions run their hidden tests
    env.pop(GRADING_ENV, None)
    seconds, text = {}, ""
    for name in captioner_notebooks(tree):
        nb = nbformat.read(str(folder / name), as_version=4)
        start = time.perf_counter()
        client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(folder)}})
        client.execute(env=env)  # (handed to the kernel manager: the kernel's environment, not this process's)
        seconds[name[:2]] = time.perf_counter() - start
        text += "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                          if o.get("output_type") == "stream")
    training = re.search(r"training on .*", text)
    scores = re.search(r"BLEU-1 [^\n]*", text[text.find("greedy, "):] if "greedy, " in text else text)
    exact = re.search(r"exact match: [\d.]+%", text)
    return {"seconds": seconds, "training": training.group(0) if training else "?",
            "scores": scores.group(0).strip() if scores else "?", "exact": exact.group(0) if exact else ""}


def _timed(tree: Path, scratch: Path) -> tuple[float, str]:
    result = _run(tree, scratch)
    each = ", ".join(f"{nb} {s:.1f} s" for nb, s in result["seconds"].items())
    return sum(result["seconds"].values()), f"({each}) | {result['training']} | {result['scores']} {result['exact']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="ec66fa1")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    alternate(args.before, args.rounds, _timed, "the captioner's notebooks")


if __name__ == "__main__":
    main()
