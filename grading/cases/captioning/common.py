"""What the captioning cases share: the known-bug variants' wrapper, random captions and the toy model."""
from __future__ import annotations

import dataclasses
import re

import torch

from grading.references import CaseSpec, build_case, randn


def _variants(bugs, maker, adapter=None):
    """The known bugs of a table {name: message} as variants, name -> (message, make(ns)): make(ns) is maker(name),
    the buggy function, in the adapter the test cell wraps the student's function in (if any)."""
    return {k: (m, lambda ns, k=k: maker(k) if adapter is None else adapter(maker(k))) for k, m in bugs.items()}


# ---- helpers ------------------------------------------------------------------------------------------


def _captions(lengths, T, V, g, start=1, end=2, null=0, specials=(0, 1, 2, 3)):
    """(B, T) captions <START> w... <END> then null; words drawn from the non-special indices."""
    words = [i for i in range(V) if i not in specials and i not in (start, end, null)]
    B = len(lengths)
    caps = torch.full((B, T), null, dtype=torch.long)
    for b, n in enumerate(lengths):  # n = number of words between <START> and <END>
        caps[b, 0] = start
        pick = torch.randint(len(words), (n,), generator=g)
        caps[b, 1:n + 1] = torch.tensor([words[i] for i in pick.tolist()], dtype=torch.long)
        if n + 1 < T:
            caps[b, n + 1] = end
    return caps


def _seeded(spec: CaseSpec, ns, ok) -> CaseSpec:
    """Pick the first module seed whose expected output satisfies `ok` (e.g. captions ending at varied steps)."""
    for seed in range(200):
        spec.seed = seed
        rec = build_case(dataclasses.replace(spec, variants={}, grad_wrt=[]), ns)
        if ok(rec.expected):
            return spec
    raise ValueError(f"{spec.name}: no seed gives the wanted output")


def _toy(vocab, feature_dim, hidden=16, max_len=32):
    """The init of the toy model (starter.layers.ToyCaptioner) the decoding and training tasks run on."""
    return {"vocab_size": vocab, "feature_dim": feature_dim, "hidden": hidden, "max_len": max_len}


def _toy_batch(lengths, g):
    """Features (B, 3, 4) and captions (B, 8) over 9 words with `lengths` words each: the inputs of the training
    tasks' cases (step, validation, fit), on the toy model _toy(9, 4, hidden=8, max_len=16)."""
    return {"features": randn(len(lengths), 3, 4, g=g), "captions": _captions(lengths, 8, 9, g)}


def _random_lengths(n, g):
    return [int(x) for x in torch.randint(1, 6, (n,), generator=g)]


# ==== the data pipeline, training step and evaluation =====================================================
# Variants are written here from the task text, independently of the solution; each takes the place of the
# student's function under the same adapter as the check (starter.pipeline).

SPECIALS = ["<NULL>", "<START>", "<END>", "<UNK>"]


def _words(caption, kind=None):
    if kind == "no_lowercase":
        return re.findall(r"[A-Za-z0-9]+", caption)
    if kind == "split_on_spaces":
        return caption.lower().split()
    return re.findall(r"[a-z0-9]+", caption.lower())


def _text_captions(g, n, words, extra=(), length=(2, 7)):
    """`n` captions of random words from `words`, with capitals and punctuation sprinkled in."""
    out = []
    for _ in range(n):
        k = int(torch.randint(length[0], length[1] + 1, (1,), generator=g))
        picked = [words[int(i)] for i in torch.randint(len(words), (k,), generator=g)]
        if torch.rand(1, generator=g) < 0.4:
            picked[0] = picked[0].capitalize()
        if torch.rand(1, generator=g) < 0.4:
            picked[-1] += "."
        if k > 2 and torch.rand(1, generator=g) < 0.3:
            picked[1] += ","
        out.append(" ".join(picked))
    return out + list(extra)


def solutions_namespace(ns: dict | None = None) -> dict:
    """`ns` (default: a new dict) with every name of the solution notebooks 04-06 it lacks."""
    from grading import notebooks

    ns = {} if ns is None else ns
    for name, value in notebooks.captioning_solution().items():
        ns.setdefault(name, value)
    return ns
