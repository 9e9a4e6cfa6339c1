"""Caption metrics with pycocoevalcap: BLEU-1..4, CIDEr, ROUGE-L (no Java needed).

    from starter.metrics import caption_scores
    caption_scores({0: ["a red circle", "a red circle on the left"]}, {0: "a red circle"})

pycocoevalcap's own ``PTBTokenizer`` runs a Java program; we tokenize in Python instead, with the rule the
vocabulary is built with (notebook 04's ``tokenize``: lower case, maximal runs of letters and digits, the
rest dropped), so that a caption the model writes from its vocabulary can match a reference word for word
("A dog's ball." is "a dog s ball" on both sides). Scores are corpus-level, as in the COCO evaluation: BLEU combines the n-gram counts of all
images (each generated caption against all the references of its image), CIDEr uses document
frequencies over the references of the evaluated images, so it depends on which images you evaluate.
"""
from __future__ import annotations

import contextlib
import io
import re

__all__ = ["tokenize", "caption_scores", "format_scores", "shapes_error",
           "SHAPES_ERRORS"]

_WORD = re.compile(r"[a-z0-9]+")  # the vocabulary's words: a caption made of them can equal a reference
METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "CIDEr", "ROUGE-L")


def tokenize(sentence: str) -> str:
    """"A red circle, left." -> "a red circle left"; "A dog's ball." -> "a dog s ball" (the vocabulary's rule)."""
    return " ".join(_WORD.findall(str(sentence).lower()))


def caption_scores(references, generated) -> dict[str, float]:
    """Corpus-level BLEU-1..4, CIDEr and ROUGE-L.

    references: dict image id -> list of reference strings (or a list of such lists).
    generated:  dict image id -> one generated string (or a list of strings, same order).
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    if not isinstance(references, dict):
        references = dict(enumerate(references))
    if not isinstance(generated, dict):
        generated = dict(enumerate(generated))
    if set(references) != set(generated):
        raise ValueError("references and generated captions must cover the same images")
    if not generated:
        raise ValueError("no captions to score")
    gts = {k: [tokenize(r) for r in refs] for k, refs in references.items()}
    res = {k: [tokenize(g if isinstance(g, str) else g[0])] for k, g in generated.items()}
    for k, refs in gts.items():
        if not refs:
            raise ValueError(f"image {k} has no reference captions")
    with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap prints its internals
        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
        cider, _ = Cider().compute_score(gts, res)
        rouge, _ = Rouge().compute_score(gts, res)
    scores = {f"BLEU-{n + 1}": float(b) for n, b in enumerate(bleu)}
    scores["CIDEr"], scores["ROUGE-L"] = float(cider), float(rouge)
    return scores


def format_scores(scores: dict[str, float]) -> str:
    return "  ".join(f"{k} {scores[k]:.3f}" for k in METRICS if k in scores)


# ---------------------------------------------------------------------- what is wrong with a caption
# The words of the `shapes` grammar (data/shapes.py) by what they describe.
_KINDS = {"colour": {"red", "green", "blue", "yellow", "purple"}, "shape": {"circle", "square", "triangle", "cross"},
          "size": {"small", "large"}, "position": {"top", "middle", "bottom", "left", "center", "right"}}
SHAPES_ERRORS = ("correct", "missing_object", "extra_object", "relation", "colour", "shape", "size", "position",
                 "several", "wording")


def _object_starts(words: list[str]) -> list[int]:
    return [i for i in range(len(words) - 2) if words[i] in _KINDS["size"] and words[i + 1] in _KINDS["colour"]
            and words[i + 2] in _KINDS["shape"]]


def shapes_error(generated: str, references: list[str]) -> str:
    """What is wrong with a generated `shapes` caption, given its image's references (one of SHAPES_ERRORS):
    "correct" (it equals a reference); "missing_object" or "extra_object" (it describes fewer or more objects,
    each a size, a colour and a shape, than the references do); "relation" (the spatial relation between the two objects reversed:
    a reference with its two objects in each other's place, or the wrong one of left of / right of /
    above / below); else, against the closest reference of the same length (fewest differing words), the
    kind of every differing word: "colour", "shape", "size", "position" (where a single object is),
    "several" (words of more than one kind); "wording" when no reference has its length or a differing
    word is none of these."""
    words = tokenize(generated).split()
    refs = [tokenize(r).split() for r in references]
    if words in refs:
        return "correct"
    described, present = len(_object_starts(words)), max(len(_object_starts(r)) for r in refs)
    if described != present:
        return "missing_object" if described < present else "extra_object"
    same_length = [r for r in refs if len(r) == len(words)]
    for ref in same_length:
        starts = _object_starts(ref)
        if len(starts) == 2:
            i, j = starts
            swapped = ref[:i] + ref[j:j + 3] + ref[i + 3:j] + ref[i:i + 3] + ref[j + 3:]
            if swapped == words:
                return "relation"
    if not same_length:
        return "wording"
    closest = min(same_length, key=lambda r: sum(a != b for a, b in zip(words, r)))
    two_objects = len(_object_starts(closest)) == 2
    kinds = set()
    for mine, theirs in zip(words, closest):
        if mine == theirs:
            continue
        kind = next((k for k, vocab in _KINDS.items() if mine in vocab and theirs in vocab), "wording")
        if kind == "position" and two_objects or {mine, theirs} <= {"above", "below"}:
            kind = "relation"
        kinds.add(kind)
    return kinds.pop() if len(kinds) == 1 else "wording" if "wording" in kinds else "several"
