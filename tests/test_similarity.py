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


def test_a_trained_model_copied_with_a_little_noise_is_flagged_and_honest_ones_are_not(tmp_path, trained_model_file):
    """Trained models (grading/similarity.py's NEAR_COPY, measured by benchmarks/bench_checkpoint_closeness.py): the
    same weights are what two students with the same code hand in, not flagged here; weights with noise of 1e-4 of
    their spread are a copy of a run made to look like another; 3e-2 is as far as independent runs are apart. A
    file that is not a checkpoint is left out."""
    import torch

    from grading import notebooks as nbs

    payload = torch.load(trained_model_file, weights_only=True)
    staged = tmp_path / "submitted"

    def hand_in(student: str, noise: float, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        state = {k: v.clone() for k, v in payload["state_dict"].items()}
        for v in state.values():
            if v.is_floating_point() and noise:
                v.add_(torch.randn(v.shape, generator=generator, dtype=v.dtype) * v.std().nan_to_num(0.0) * noise)
        path = staged / student / nbs.ASSIGNMENT / nbs.TRAINED_CHECKPOINT
        path.parent.mkdir(parents=True)
        torch.save({**payload, "state_dict": state}, path)

    hand_in("original", 0, 0)
    hand_in("same_code", 0, 0)
    hand_in("noisy_copy", 1e-4, 1)
    hand_in("other_run", 3e-2, 2)
    broken = staged / "broken" / nbs.ASSIGNMENT / nbs.TRAINED_CHECKPOINT
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a checkpoint")
    found = similarity.near_copies(staged)
    assert {frozenset(f[:2]) for f in found} == {frozenset(("original", "noisy_copy")),
                                                  frozenset(("same_code", "noisy_copy"))}, found
    assert all(0 < apart < similarity.NEAR_COPY for *_, apart in found)


def test_the_page_shows_hostile_answers_as_text(tmp_path):
    """A student's code and written answers are shown on the instructor's page: markup in them stays text."""
    work = {s: w for s, w in sc.planted_class().items() if s in ("student_a", "renamed", "solution")}
    payload = '</pre><script>alert("code")</script><img src=x onerror=alert(1)>'
    for student in ("student_a", "renamed"):  # a copied pair, so the page shows both side by side
        cells = work[student][sc.STEMS[2]]
        cells["MultiHeadAttention"] = cells["MultiHeadAttention"] + f"\n# {payload}\n"
        cells["q_prenorm"] = cells["q_prenorm"] + "\n\n" + payload
    root = sc.stage(tmp_path / "course", work)
    similarity.check_class(root, tmp_path / "out")
    page = (tmp_path / "out" / similarity.PAGE).read_text(encoding="utf-8")
    assert "&lt;script&gt;" in page and "<script" not in page and "<img" not in page
