"""The similarity check of a class (grading/similarity.py) at the size of a large class, timed.

A class of N students (default 300) is staged as intake stages one: each student's answer to each task of notebooks
01 to 03 is one of the independent solutions of tests/support/similarity_class.py, drawn at random, with its names
renamed (so no two answers are the same text). Then `check_class` runs on it as autograde runs it: every pair of
students, every task and written question, the page written. Printed: the students, the pairs, the seconds (reading
and fingerprinting, then scoring and the page), the page's size.

    python benchmarks/bench_similarity.py [--students 300]
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import similarity_class as sc

from grading import similarity


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=300)
    args = parser.parse_args(argv)
    sources = list(sc.independent().values())
    rng = random.Random(0)
    work = {}
    for n in range(args.students):
        answers: dict[str, dict[str, str]] = {}
        for stem in sc.STEMS:
            for gid in sources[0][stem]:
                text = rng.choice(sources)[stem].get(gid, "")
                answers.setdefault(stem, {})[gid] = sc.rename(text, n) if not gid.startswith("q_") else text
        work[f"student_{n:03d}"] = answers
    with tempfile.TemporaryDirectory() as tmp:
        root = sc.stage(Path(tmp) / "course", work)
        started = time.perf_counter()
        answers_read, _ = similarity.class_answers(root / "submitted")
        read = time.perf_counter() - started
        students = sorted(work)
        pairs = similarity.score_pairs(answers_read, students)
        scored = time.perf_counter() - started - read
        page = similarity.write_page(Path(tmp), pairs, answers_read, students, [])
        total = time.perf_counter() - started
        answered = sum(len(by_student) > 1 for by_student in answers_read.values())
        print(f"{len(students)} students, {len(pairs):,} pairs, {answered} tasks answered: read and fingerprinted in "
              f"{read:.1f} s, scored in {scored:.1f} s, {total:.1f} s with the page ({page.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
