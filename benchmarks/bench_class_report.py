"""How long the class report takes for a large class: a synthetic graded run of N students.

    python benchmarks/bench_class_report.py [--students 500]

Makes the class's results of N students (grading/results.py: each student's outcome and the points table),
every test cell of every notebook, each hidden case passed or failed at random with one of a few diagnoses;
then times `grading.class_report.write` on it. Prints seconds and page size.
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from grading import class_report, notebooks
from grading.judge import NotebookRecord
from grading.notebooks import graded_columns
from grading.outcome import StudentOutcome
from grading.results import ClassResults, class_results

KINDS = ["known bug: no_scale", "known bug: mask_after", "wrong shape", "raises RuntimeError", "wrong values",
         "did not run"]


def synthetic_run(n: int, seed: int = 0) -> ClassResults:
    rng = random.Random(seed)
    cols = graded_columns()
    stems = list(dict.fromkeys(c[0] for c in cols))
    students = [f"s{i:04d}" for i in range(n)]
    skill = {s: rng.random() for s in students}
    outcomes, points = [], {}
    for s in students:
        judged, points[s] = [], {}
        for stem in stems:
            cells = []
            for _, grade_id, most in (c for c in cols if c[0] == stem):
                cases = []
                for k in range(4):
                    passed = rng.random() < 0.4 + 0.6 * skill[s]
                    cases.append({"case": f"{grade_id}/{k}", "label": f"hidden case {k + 1}", "public": False,
                                  "passed": passed, "message": "" if passed else f"`f`: {rng.choice(KINDS)}",
                                  "diagnosis": "" if passed else rng.choice(KINDS)})
                got = most * sum(c["passed"] for c in cases) / len(cases)
                points[s][(stem, grade_id)] = got  # the gradebook holds the judge's points
                cells.append({"grade_id": grade_id, "points": got, "max_points": most, "cases": cases})
            judged.append(NotebookRecord.from_dict({
                "student": s, "notebook": stem, "sandbox": "finished", "sandbox_message": "", "isolated": True,
                "seconds": 1.0, "problems": [], "cells": cells}))
        outcomes.append(StudentOutcome(s, notebooks={stem: f"{stem}.ipynb" for stem in stems}, status="graded",
                                       judged=judged))
    return class_results(outcomes, points)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=500)
    n = parser.parse_args().students
    with tempfile.TemporaryDirectory() as t:
        results = synthetic_run(n)
        start = time.perf_counter()
        data, page = class_report.write(Path(t), results)
        seconds = time.perf_counter() - start
        print(f"class report for {n} students x {len(notebooks.solution_notebooks())} notebooks: {seconds:.1f} s "
              f"(page {page.stat().st_size / 1e6:.1f} MB, data {data.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
