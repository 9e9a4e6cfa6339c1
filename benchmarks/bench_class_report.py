"""How long the class report takes for a large class: a synthetic graded run of N students.

    python benchmarks/bench_class_report.py [--students 500]

Writes what autograde leaves in its --out folder (grades.csv, outcomes/<student>.json)
for N students, every test cell of the five notebooks, each hidden case passed or failed at random with
one of a few diagnoses; then times `grading.class_report.write` on it. Prints seconds and page size.
"""
from __future__ import annotations

import argparse
import csv
import random
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from grading import class_report, notebooks
from grading.judge import NotebookRecord
from grading.outcome import StudentOutcome, write_outcome
from grading.report import graded_columns

KINDS = ["known bug: no_scale", "known bug: mask_after", "wrong shape", "raises RuntimeError", "wrong values",
         "did not run"]


def synthetic_run(out: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    cols = graded_columns()
    stems = list(dict.fromkeys(c[0] for c in cols))
    students = [f"s{i:04d}" for i in range(n)]
    skill = {s: rng.random() for s in students}
    header = ["student", "status"] + [f"{s}:{g}" for s, g, _ in cols] + [f"{s}:total" for s in stems]
    header += ["total", "max_total", "review", "notes"]
    rows = [["(max points)", ""] + [p for *_, p in cols] + [sum(p for s2, _, p in cols if s2 == s) for s in stems]
            + [sum(p for *_, p in cols)] * 2 + ["", ""]]
    for s in students:
        scores, judged = [], []
        for stem in stems:
            cells = []
            for _, grade_id, points in (c for c in cols if c[0] == stem):
                cases = []
                for k in range(4):
                    passed = rng.random() < 0.4 + 0.6 * skill[s]
                    cases.append({"case": f"{grade_id}/{k}", "label": f"hidden case {k + 1}", "public": False,
                                  "passed": passed, "message": "" if passed else f"`f`: {rng.choice(KINDS)}",
                                  "diagnosis": "" if passed else rng.choice(KINDS)})
                got = points * sum(c["passed"] for c in cases) / len(cases)
                scores.append(got)
                cells.append({"grade_id": grade_id, "points": got, "max_points": points, "cases": cases})
            judged.append(NotebookRecord.from_dict({
                "student": s, "notebook": stem, "sandbox": "finished", "sandbox_message": "", "isolated": True,
                "seconds": 1.0, "problems": [], "cells": cells}))
        write_outcome(out / "outcomes", StudentOutcome(s, notebooks={stem: f"{stem}.ipynb" for stem in stems},
                                                       status="graded", judged=judged))
        totals = [sum(v for (s2, _, _), v in zip(cols, scores) if s2 == stem) for stem in stems]
        rows.append([s, "graded"] + scores + totals + [sum(scores), sum(p for *_, p in cols), "", ""])
    with open(out / "grades.csv", "w", newline="") as f:
        csv.writer(f).writerows([header] + rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=500)
    n = parser.parse_args().students
    with tempfile.TemporaryDirectory() as t:
        out = Path(t)
        synthetic_run(out, n)
        start = time.perf_counter()
        data, page = class_report.write(out)
        seconds = time.perf_counter() - start
        print(f"class report for {n} students x {len(notebooks.solution_notebooks())} notebooks: {seconds:.1f} s "
              f"(page {page.stat().st_size / 1e6:.1f} MB, data {data.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
