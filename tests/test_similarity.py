"""The similarity check of a class (grading/similarity.py), measured on independent work and planted copies
(tests/support/similarity_class.py): every planted copy is ranked above every pair of independent work, the copies
of a whole notebook set are flagged, no independent pair is flagged; the page marks the shared parts; bad input is
skipped with a line."""
from __future__ import annotations

import json
import re

import pytest
from support import similarity_class as sc

from grading import similarity

COPY_PAIRS = {frozenset((copier, source)) for copier, source, _ in sc.COPIES}
WHOLE_COPIES = {frozenset((copier, source)) for copier, source, how in sc.COPIES if how != "one_task"}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    work = sc.planted_class()
    assert {f"student_{x}" for x in "abc"} <= set(work), "the independent students' fixtures are missing"
    root = sc.stage(tmp_path_factory.mktemp("course"), work)
    out = tmp_path_factory.mktemp("out")
    flags = similarity.check_class(root, out)
    answers, skipped = similarity.class_answers(root / "submitted")
    pairs = similarity.score_pairs(answers, sorted(work))
    return {"flags": flags, "pairs": pairs, "out": out, "skipped": skipped, "work": work}


def test_every_planted_copy_ranks_above_every_independent_pair(checked):
    pairs = checked["pairs"]
    ranked = [frozenset((p.a, p.b)) for p in pairs]
    lowest_copy = max(ranked.index(c) for c in COPY_PAIRS)
    assert set(ranked[: len(COPY_PAIRS)]) == COPY_PAIRS, [(p.a, p.b, round(p.score, 2)) for p in pairs[:8]]
    best_independent = pairs[len(COPY_PAIRS)]
    assert pairs[lowest_copy].score > best_independent.score


def test_whole_copies_are_flagged_and_no_independent_pair_is(checked):
    flagged = {frozenset((p.a, p.b)) for p in checked["pairs"] if p.flagged}
    assert WHOLE_COPIES <= flagged, [(p.a, p.b, round(p.score, 2), p.flagged) for p in checked["pairs"][:8]]
    assert flagged <= COPY_PAIRS, flagged - COPY_PAIRS
    for pair in flagged:
        for me, other in (tuple(pair), tuple(pair)[::-1]):
            assert any(other in line and similarity.PAGE in line for line in checked["flags"][me]), checked["flags"][me]
    assert set(checked["flags"]) == {s for pair in flagged for s in pair}


def test_independent_solutions_share_little_above_the_typical(checked):
    """The measure, not only the ranks: independent pairs stay well under the flag's score."""
    independent = [p for p in checked["pairs"] if frozenset((p.a, p.b)) not in COPY_PAIRS]
    assert max(p.score for p in independent) < similarity.FLAG_SCORE / 2, \
        [(p.a, p.b, round(p.score, 2)) for p in independent[:3]]


def test_the_page_shows_the_pairs_side_by_side_with_the_shared_parts_marked(checked):
    page = (checked["out"] / similarity.PAGE).read_text(encoding="utf-8")
    top = checked["pairs"][0]
    section = page[page.index("id='pair-1'"):page.index("id='pair-2'")]
    assert top.a in section and top.b in section and section.count("<mark>") >= 2
    assert section.count("<pre>") == 2 * min(12, len(top.tasks))
    found = re.search(r"https?:|<[^>]*\s(?:src|href)\s*=\s*['\"](?!#)|@import|url\(", page)
    assert found is None, found.group(0)  # self-contained: only links within the page


def test_bad_input_is_skipped_with_a_line_and_nothing_else_changes(tmp_path):
    work = {s: w for s, w in sc.planted_class().items() if s in ("solution", "renamed", "student_a")}
    root = sc.stage(tmp_path / "course", work)
    staged = root / "submitted"
    (staged / "no_notebooks" / "attention").mkdir(parents=True)
    broken = staged / "broken" / "attention"
    broken.mkdir(parents=True)
    (broken / f"{sc.STEMS[0]}.ipynb").write_text("{ not json")
    (broken / f"{sc.STEMS[1]}.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {
        "nbgrader": {"solution": True, "grade_id": "sinusoidal_encoding"}}, "source": "x = 1\n" * 50_000}, 5, None]}))
    answers, skipped = similarity.class_answers(staged)
    assert "no_notebooks: no notebooks" in skipped
    assert all("broken" not in by_student for task, by_student in answers.items() if task.startswith(sc.STEMS[0]))
    assert "broken" in answers[f"{sc.STEMS[1]}/sinusoidal_encoding"]  # the giant cell is compared, within bounds
    flags = similarity.check_class(root, tmp_path / "out")
    assert {"renamed", "student_a"} <= set(flags) and "broken" not in flags and "no_notebooks" not in flags
