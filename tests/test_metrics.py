"""What is wrong with a generated `shapes` caption (starter.metrics.shapes_error), on hand-written captions."""
from __future__ import annotations

import pytest

from starter import metrics
from starter.metrics import SHAPES_ERRORS, shapes_error

ONE = ["a small red circle in the top left", "there is a small red circle in the top left",
       "in the top left there is a small red circle"]
TWO = ["a large blue square to the left of a small yellow cross",
       "a small yellow cross to the right of a large blue square",
       "there is a large blue square and a small yellow cross"]
VERTICAL = ["a small red circle above a large green triangle", "a large green triangle below a small red circle",
            "there is a small red circle and a large green triangle"]


@pytest.mark.parametrize("generated,references,kind", [
    ("a small red circle in the top left", ONE, "correct"),
    ("In the top left, there is a small red circle.", ONE, "correct"),
    ("a small yellow cross to the left of a large blue square", TWO, "relation"),
    ("a large green triangle above a small red circle", VERTICAL, "relation"),
    ("a large blue square to the right of a small yellow cross", TWO, "relation"),
    ("a small red circle below a large green triangle", VERTICAL, "relation"),
    ("a small blue circle in the top left", ONE, "colour"),
    ("there is a small red square in the top left", ONE, "shape"),
    ("a large red circle in the top left", ONE, "size"),
    ("a small red circle in the bottom left", ONE, "position"),
    ("a small green circle in the middle left", ONE, "several"),
    ("a small red circle", ONE, "wording"),
    ("a small yellow cross in the middle left", TWO, "missing_object"),
    ("a large blue square", TWO, "missing_object"),
    ("a small red circle above a large green triangle", ONE, "extra_object"),
    ("a small red circle in the top of", ONE, "wording"),
])
def test_kinds_of_error(generated, references, kind):
    assert kind in SHAPES_ERRORS
    assert shapes_error(generated, references) == kind


def test_a_caption_of_vocabulary_words_can_equal_a_reference_with_an_apostrophe():
    """The vocabulary splits "dog's" into "dog" and "s" (notebook 04's tokenize), so the model can only write
    "dog s": the metrics tokenize references the same way, and such a caption scores as a perfect match."""
    from grading import notebooks as nbs
    vocab_words = nbs.solution("07_generation_and_evaluation")["tokenize"]("A dog's ball.")
    scores = metrics.caption_scores({0: ["A dog's ball."], 1: ["Two cats' toys, on the sofa."]},
                                    {0: " ".join(vocab_words), 1: "two cats toys on the sofa"})
    assert scores["BLEU-1"] == pytest.approx(1.0) and scores["BLEU-2"] == pytest.approx(1.0), scores
