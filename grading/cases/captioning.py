"""Reference cases of notebooks 04-06 (the captioning Transformer: data and model, training and
evaluation, decoding), made together: `cases_of("05", ns)` gives one notebook's share (the thin modules
nb04, nb05 and nb06 ask for theirs), and every case keeps the inputs its generator gives it in one sequence.

The model cases always build the model with ``layers="torch"`` (PyTorch-backed layers from
``starter.layers``), so they never depend on notebooks 02-03. The decoding and teacher-forcing cases
run the student's function on ``starter.layers.ToyCaptioner`` (a small causal stand-in model) through
``starter.layers.with_model``, so they don't depend on the student's model either. Variants are known
bugs written here independently of the solution; variants that coincide with the correct output on a
case are dropped for that case.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from grading.references import CaseSpec, Row, build_case, randn, with_forward
from starter.layers import with_attention, with_bigram, with_model
from starter.pipeline import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    over_steps,
    with_batches,
    with_cnn,
    with_h5_file,
    with_items,
    with_loader,
    with_long_output,
    with_optimizer,
    with_param_groups,
    with_probe_words,
    with_split,
)

# ---- CaptioningTransformer.forward ------------------------------------------------------------------

def _forward(self, features, captions, *, mask="ok", project=True, region=True, pos=True, final_norm=True,
             scale=False, softmax=False):
    R, T = features.shape[1], captions.shape[1]
    memory = self.feature_proj(features) if project else features
    if region:
        memory = memory + self.region_embed.weight[:R]
    x = self.word_embed(captions)
    if scale:
        x = x * x.shape[-1] ** 0.5
    if pos:
        x = self.pos_encoding(x)
    full = torch.ones(T, T, dtype=torch.bool, device=captions.device)
    m = {"ok": full.tril(), "none": None, "plus_one": full.tril(1), "strict": full.tril(-1),
         "inverted": ~full.tril(), "upper": full.triu()}[mask]
    sw, cw = [], []
    for layer in self.decoder_layers:
        x, a, b = layer(x, memory, tgt_mask=m)
        sw.append(a)
        cw.append(b)
    logits = self.vocab_head(self.final_norm(x) if final_norm else x)
    if softmax:
        logits = F.log_softmax(logits, dim=-1)
    return logits, {"self": sw, "cross": cw}


FORWARD_BUGS = {
    "no_causal_mask": ("causal mask missing: pass tgt_mask=torch.ones(T, T, dtype=torch.bool).tril() to every layer, "
                       "or each word sees the word it must predict.", dict(mask="none")),
    "mask_plus_one": ("causal mask off by one: it lets position t see word t+1; position t may attend to 0..t "
                      "(.tril(), diagonal 0).", dict(mask="plus_one")),
    "mask_strict": ("causal mask off by one: position t must also attend to itself (.tril() keeps the diagonal; "
                    ".tril(-1) leaves the first word nothing to attend to).", dict(mask="strict")),
    "mask_inverted": ("causal mask inverted: our tgt_mask is True where attention is ALLOWED (the lower triangle).",
                      dict(mask="inverted")),
    "mask_upper": ("causal mask is the upper triangle: tgt_mask is True where attention is ALLOWED, i.e. on and "
                   "below the diagonal (.tril()).", dict(mask="upper")),
    "no_projection": ("features not projected: the memory is feature_proj(features) + region embeddings.",
                      dict(project=False)),
    "no_region_embedding": ("region position embedding missing: add self.region_embed.weight[:R] to the projected "
                            "features, or the model can't tell where a region is.", dict(region=False)),
    "no_positional_encoding": ("positional encoding missing: x = pos_encoding(word_embed(captions)).",
                               dict(pos=False)),
    "no_final_norm": ("final LayerNorm missing: logits = vocab_head(final_norm(x)) after the pre-norm stack.",
                      dict(final_norm=False)),
    "scaled_embedding": ("word embeddings multiplied by sqrt(d_model): this model uses them as they are.",
                         dict(scale=True)),
    "log_softmax": ("forward returns (log-)probabilities: return the raw logits of vocab_head, the loss applies "
                    "the softmax.", dict(softmax=True)),
}


def _variants(bugs, maker, adapter=None):
    """The known bugs of a table {name: message} as variants, name -> (message, make(ns)): make(ns) is maker(name),
    the buggy function, in the adapter the test cell wraps the student's function in (if any)."""
    return {k: (m, lambda ns, k=k: maker(k) if adapter is None else adapter(maker(k))) for k, m in bugs.items()}


def _forward_variants(attention=False):
    out = {}
    for name, (message, kw) in FORWARD_BUGS.items():
        def make(ns, kw=kw):
            def forward(self, features, captions, return_attention=False):
                logits, att = _forward(self, features, captions, **kw)
                return (logits, att) if return_attention else logits
            cls = with_forward(ns, "CaptioningTransformer", forward)
            return with_attention(cls) if attention else cls
        out[name] = (message, make)
    return out


# ---- caption_loss -------------------------------------------------------------------------------------

def _nll(logits, targets):
    return -F.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]


def _loss_bug(kind):
    def loss(logits, targets, null_idx=0):
        real = (targets != (0 if kind == "hardcoded_null" else null_idx)).to(logits.dtype)
        if kind == "probs_input":
            return (_nll(torch.softmax(logits, -1), targets) * real).sum() / real.sum()
        nll = _nll(logits, targets)
        if kind == "mean_over_padding":
            return nll.mean()
        if kind == "padding_zeroed_mean":
            return (nll * real).mean()
        if kind == "sum":
            return (nll * real).sum()
        if kind == "per_caption":
            return ((nll * real).sum(1) / real.sum(1).clamp(min=1)).mean()
        if kind == "divide_by_batch":
            return (nll * real).sum() / targets.shape[0]
        return (nll * real).sum() / real.sum()  # hardcoded_null
    return loss


LOSS_BUGS = {
    "mean_over_padding": "the loss is averaged over the padding too: average over the positions whose target is not "
                         "null_idx only (a mask, or ignore_index=null_idx).",
    "padding_zeroed_mean": "padding masked out but still counted in the mean: divide by the number of real words, "
                           "not by B*T.",
    "sum": "summed instead of averaged: divide by the number of real (non-null) target words.",
    "per_caption": "averaged per caption, then over captions: average over all real words of the batch at once, "
                   "so that every word has the same weight.",
    "divide_by_batch": "divided by the batch size: divide by the number of real (non-null) target words.",
    "hardcoded_null": "padding taken to be index 0: use the null_idx argument.",
    "probs_input": "a softmax was applied before the cross-entropy: pass raw logits (log_softmax / F.cross_entropy "
                   "normalise them).",
}


# ---- teacher_forcing_loss -----------------------------------------------------------------------------

def _masked_mean(logits, targets, null_idx):
    real = (targets != null_idx).to(logits.dtype)
    return (_nll(logits, targets) * real).sum() / real.sum()


def _teacher_bug(kind):
    def fn(model, features, captions, null_idx=0):
        if kind == "no_shift":
            return _masked_mean(model(features, captions), captions, null_idx)
        if kind == "swapped":
            return _masked_mean(model(features, captions[:, 1:]), captions[:, :-1], null_idx)
        if kind == "targets_not_shifted":
            return _masked_mean(model(features, captions[:, :-1]), captions[:, :-1], null_idx)
        if kind == "padding_counted":
            logits = model(features, captions[:, :-1])
            return _nll(logits, captions[:, 1:]).mean()
        raise ValueError(kind)
    return fn


TEACHER_BUGS = {
    "no_shift": "inputs and targets are the same words: position t must predict word t+1, so the inputs are "
                "captions[:, :-1] and the targets captions[:, 1:].",
    "swapped": "inputs and targets swapped: inputs captions[:, :-1] (from <START>), targets captions[:, 1:].",
    "targets_not_shifted": "targets not shifted: the targets are captions[:, 1:], one word ahead of the inputs.",
    "padding_counted": "the loss counts the padding: return caption_loss(logits, targets, null_idx) (make "
                       "caption_loss pass its check first).",
}


# ---- greedy_decode ------------------------------------------------------------------------------------

@torch.no_grad()
def _greedy(model, features, max_len, start_idx=1, end_idx=2, null_idx=0, *, bug=None):
    B = features.shape[0]
    seq = torch.full((B, 1), 1 if bug == "start_ignored" else start_idx, dtype=torch.long)
    outs = []
    for t in range(max_len):
        if bug in ("start_only", "start_only_raw"):
            inp = seq[:, :1]
        elif bug == "no_feedback":
            inp = torch.full((B, t + 1), start_idx, dtype=torch.long)
        elif bug == "last_token_only":
            inp = seq[:, -1:]
        else:
            inp = seq
        logits = model(features, inp)
        nxt = (logits[:, 0] if bug == "first_position" else logits[:, -1]).argmax(-1)
        outs.append(nxt)
        seq = torch.cat([seq, nxt[:, None]], 1)
    out = torch.stack(outs, 1)
    if bug in ("no_null_after_end", "start_only_raw"):
        return out
    ended = (out == end_idx).long().cumsum(1)
    after = (ended - (out == end_idx).long()) > 0  # strictly after the first <END>
    out = out.masked_fill(after, null_idx)
    if bug == "end_dropped":
        out = out.masked_fill(out == end_idx, null_idx)
    if bug == "includes_start":
        out = torch.cat([torch.full((B, 1), start_idx, dtype=torch.long), out[:, :-1]], 1)
    return out


GREEDY_BUGS = {
    # the first four describe what the captions look like: other bugs (e.g. reading a fixed position) can give
    # the same captions, so the message says what was seen and what to check, not which line is wrong
    "start_only": "every caption repeats one word, the captions a decoder gives when the model sees only <START> "
                  "at every step: check that each chosen word is appended to the input and that the next word is "
                  "read from the last position (and each caption stopped at <END>).",
    "start_only_raw": "every caption repeats one word, even past <END>, the captions a decoder gives when the "
                      "model sees only <START> at every step: check that each chosen word is appended to the input, "
                      "that the next word is read from the last position, and that each caption stops at <END>.",
    "no_feedback": "the captions are those a decoder gives when the model's input is <START> repeated, never the "
                   "words it chose: check that each chosen word is appended to the input before the next step.",
    "last_token_only": "the captions are those a decoder gives when the model sees only the last word: pass the "
                       "whole prefix (<START> and every word so far) and read the logits of its last position.",
    "first_position": "the captions are those a decoder gives when the next word is read from the first "
                      "position's logits: use the last position, logits[:, -1].",
    "no_null_after_end": "words after <END> must be null_idx: once a caption has produced <END> it is finished.",
    "end_dropped": "the <END> token is missing from the output: keep it, then null_idx after it.",
    "includes_start": "the output starts with <START>: return the generated words only (max_len of them).",
    "start_ignored": "the captions are those a decoder gives when it starts from index 1, not from start_idx: "
                     "check that every caption begins with the start_idx you are given.",
}


def _greedy_bug(kind):
    def decode(model, features, max_len, start_idx=1, end_idx=2, null_idx=0):
        return _greedy(model, features, max_len, start_idx, end_idx, null_idx, bug=kind)
    return decode


# ---- beam_search --------------------------------------------------------------------------------------

@torch.no_grad()
def _beam(model, features, beam_width, max_len, start_idx=1, end_idx=2, null_idx=0, length_penalty=0.7, *,
          bug=None):
    if bug == "greedy":
        return _greedy(model, features, max_len, start_idx, end_idx, null_idx)
    B = features.shape[0]
    out = torch.full((B, max_len), null_idx, dtype=torch.long)

    def finish(score, h):  # the score a finished hypothesis is compared by
        length = len(h) - (1 if bug == "length_without_end" and h[-1] == end_idx else 0)
        return (score if bug == "raw_final" else score / max(1, length) ** length_penalty), h

    for b in range(B):
        hyps = [([], 0.0)]
        done = []
        for step in range(max_len):
            first = 1 if bug == "start_ignored" else start_idx
            inp = torch.tensor([[first] + h for h, _ in hyps], dtype=torch.long)
            lp = F.log_softmax(model(features[b:b + 1].expand(len(hyps), -1, -1), inp)[:, -1], -1)
            cands = []
            for i, (h, s) in enumerate(hyps):
                # per_hypothesis_best: the first step's best words seed the beam, then each hypothesis follows
                # its own best word (beam_width greedy captions side by side)
                own = bug == "per_hypothesis_best" and step > 0
                for w in [int(lp[i].argmax())] if own else range(lp.shape[1]):
                    score = float(lp[i, w]) if bug == "no_accumulation" else s + float(lp[i, w])
                    cands.append((score, h + [w]))
            cands.sort(key=lambda c: -c[0])
            hyps = []
            if bug == "keep_k_live":  # the beam never narrows: the best beam_width candidates that go on
                for score, h in cands:
                    if len(hyps) == beam_width:
                        break
                    if h[-1] == end_idx:
                        done.append(finish(score, h))
                    else:
                        hyps.append((h, score))
                if step == max_len - 1:
                    done += [finish(score, h) for h, score in hyps]
                    hyps = []
                if len(done) >= beam_width:
                    break
            else:
                for score, h in cands[:beam_width - (0 if bug == "no_narrowing" else len(done))]:
                    if h[-1] == end_idx or step == max_len - 1:
                        done.append(finish(score, h))
                    else:
                        hyps.append((h, score))
            if not hyps:
                break
        best = max(done, key=lambda d: d[0])[1]
        out[b, :len(best)] = torch.tensor(best)
    return out


BEAM_BUGS = {  # each names its own bug and advice; as other mistakes can give the same captions, each says
    # what the captions are like ("those a beam search gives when ...") and what to check, not which line is wrong
    "greedy": "the captions are the greedy ones (the best word at every step), not those a beam search of this "
              "width finds here; several mistakes give them: check that several hypotheses stay alive, each "
              "extended by every word, that their scores add log-probabilities, and that finished ones are "
              "compared by their score over L ** length_penalty.",
    "per_hypothesis_best": "the captions are those a beam search gives when each hypothesis is extended by its own "
                           "best word only (beam_width greedy captions side by side): check that every hypothesis x "
                           "word candidate is ranked together, so one hypothesis may give two of the kept "
                           "candidates and another none.",
    "no_accumulation": "the captions are those a beam search gives when hypothesis scores don't accumulate: check "
                       "that a candidate's score is its hypothesis' score + the word's log-probability.",
    "raw_final": "the captions are those a beam search gives when finished hypotheses are compared by their raw sum "
                 "of log-probabilities, with no length normalisation: check that you divide each finished score by "
                 "length ** length_penalty.",
    "length_without_end": "the captions are those a beam search gives when the length in the length penalty leaves "
                          "out <END>: check that L counts the <END> token too (3 words and <END> give L = 4).",
    "keep_k_live": "the captions are those a beam search gives that keeps beam_width live hypotheses at every step: "
                   "check that the beam narrows as hypotheses finish (the best beam_width - finished candidates) and "
                   "stops when none is left alive.",
    "no_narrowing": "the captions are those a beam search gives that keeps the best beam_width candidates at every "
                    "step, whatever finished before: check that hypotheses finished at earlier steps count too "
                    "(keep beam_width - number finished so far).",
    "start_ignored": "the captions are those a beam search gives when hypotheses start from index 1, not from "
                     "start_idx: check that each begins with the start_idx you are given.",
}


def _beam_bug(kind):
    def search(model, features, beam_width, max_len, start_idx=1, end_idx=2, null_idx=0, length_penalty=0.7):
        return _beam(model, features, beam_width, max_len, start_idx, end_idx, null_idx, length_penalty, bug=kind)
    return search


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


# ---- cases --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelCase(Row):
    """CaptioningTransformer(...).forward(features (B, R, D), captions (B, T)), with layers="torch"."""
    batch: int  # B
    length: int  # T
    regions: int  # R
    feature_dim: int  # D
    vocab: int  # V
    d_model: int
    heads: int
    layers: int
    dim_feedforward: int
    attention: bool = False  # through with_attention: the attention weights are outputs too
    dtype: torch.dtype = torch.float32
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class LossCase(Row):
    """caption_loss(logits (B, T, V), targets (B, T), null_idx); caption b has lengths[b] real targets."""
    lengths: list[int]
    length: int  # T
    vocab: int  # V
    null_idx: int = 0
    dtype: torch.dtype = torch.float32
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class TeacherCase(Row):
    """teacher_forcing_loss(model, features (B, R, D), captions (B, T), null_idx) on the toy model."""
    lengths: list[int]  # words of each caption, between <START> and <END>
    length: int  # T
    regions: int  # R
    feature_dim: int  # D
    vocab: int  # V
    null_idx: int = 0
    grad: bool = False


@dataclass(frozen=True, kw_only=True)
class GreedyCase(Row):
    """greedy_decode(model, features (B, R, D), max_len, start_idx, end_idx, null_idx) on the toy model."""
    batch: int  # B
    regions: int  # R
    feature_dim: int  # D
    vocab: int  # V
    max_len: int
    start_idx: int = 1
    end_idx: int = 2
    null_idx: int = 0
    dtype: torch.dtype = torch.float32
    # the output the model's seed is chosen for: "varied" (captions end at different steps, one never does),
    # "ends" (the one caption ends, not before its third word), "all_early" (all end in the first half)
    want: str = "varied"
    told_apart: tuple[str, ...] = ()  # known bugs (GREEDY_BUGS) whose output must differ from the right one


@dataclass(frozen=True, kw_only=True)
class BeamCase(Row):
    """beam_search(model, features (B, R, D), beam_width, max_len, ..., length_penalty) on the toy model."""
    batch: int  # B
    regions: int  # R
    feature_dim: int  # D
    vocab: int  # V
    beam_width: int
    max_len: int
    start_idx: int = 1
    end_idx: int = 2
    null_idx: int = 0
    length_penalty: float = 0.7
    # known bugs (BEAM_BUGS) the case must tell apart: the model's seed is drawn until each is stored
    want: tuple[str, ...] = ()


MODEL_GRAD_WRT = ["features", "feature_proj.weight", "region_embed.weight", "word_embed.weight",
                  "pos_encoding.embedding.weight", "decoder_layers.0.self_attn.in_proj_weight",
                  "decoder_layers.1.multihead_attn.out_proj.weight", "final_norm.weight", "vocab_head.bias"]


def _model_spec(c: ModelCase, g: torch.Generator) -> CaseSpec:
    inputs = {"features": randn(c.batch, c.regions, c.feature_dim, g=g, dtype=c.dtype),
              "captions": torch.randint(1, c.vocab, (c.batch, c.length), generator=g)}  # no <NULL>: padding is free
    init = dict(vocab_size=c.vocab, feature_dim=c.feature_dim, num_regions=c.regions, d_model=c.d_model,
                num_heads=c.heads, num_layers=c.layers, dim_feedforward=c.dim_feedforward, max_len=c.length + 3,
                dropout=0.1, layers="torch")
    attention = ["self_attn_weights", "cross_attn_weights"] if c.attention else []
    return CaseSpec(
        name=c.name, target="with_attention(CaptioningTransformer)" if c.attention else "CaptioningTransformer",
        kind="module", init=init, args=["features", "captions"], inputs=inputs, outputs=["logits"] + attention,
        grad_wrt=list(MODEL_GRAD_WRT) if c.grad else [], variants=_forward_variants(c.attention),
        properties=[["rows_sum_to_one", w] for w in attention], public=c.public, atol=5e-5,
        hint="memory = feature_proj(features) + region_embed.weight[:R]; x = pos_encoding(word_embed(captions)); "
             "causal mask tril(); layers; vocab_head(final_norm(x)).")


def _loss_spec(c: LossCase, g: torch.Generator) -> CaseSpec:
    targets = torch.randint(0, c.vocab, (len(c.lengths), c.length), generator=g)
    targets[targets == c.null_idx] = (c.null_idx + 1) % c.vocab
    for i, n in enumerate(c.lengths):
        targets[i, n:] = c.null_idx
    return CaseSpec(
        name=c.name, target="caption_loss", args=["logits", "targets"], const_kwargs={"null_idx": c.null_idx},
        inputs={"logits": randn(len(c.lengths), c.length, c.vocab, g=g, dtype=c.dtype) * 2, "targets": targets},
        outputs=["loss"], grad_wrt=["logits"] if c.grad else [], variants=_variants(LOSS_BUGS, _loss_bug),
        public=c.public,
        hint="loss = sum of -log softmax(logits)[target] over positions with target != null_idx, divided by "
             "their number.")


def _teacher_spec(c: TeacherCase, g: torch.Generator) -> CaseSpec:
    caps = _captions(c.lengths, c.length, c.vocab, g, null=c.null_idx, specials=(1, 2, 3))
    return CaseSpec(
        name=c.name, target="with_model(teacher_forcing_loss)", kind="module", init=_toy(c.vocab, c.feature_dim),
        args=["features"], kwargs={"captions": "captions"}, const_kwargs={"null_idx": c.null_idx},
        inputs={"features": randn(len(c.lengths), c.regions, c.feature_dim, g=g), "captions": caps},
        outputs=["loss"], grad_wrt=["model.out.weight", "model.token.weight"] if c.grad else [],
        variants=_variants(TEACHER_BUGS, _teacher_bug, with_model), public=c.public,
        hint="caption_loss(model(features, captions[:, :-1]), captions[:, 1:], null_idx).")


def _greedy_spec(c: GreedyCase, g: torch.Generator, ns: dict) -> CaseSpec:
    spec = CaseSpec(
        name=c.name, target="with_model(greedy_decode)", kind="module", init=_toy(c.vocab, c.feature_dim),
        args=["features"],
        const_kwargs={"max_len": c.max_len, "start_idx": c.start_idx, "end_idx": c.end_idx, "null_idx": c.null_idx},
        inputs={"features": randn(c.batch, c.regions, c.feature_dim, g=g, dtype=c.dtype) * 3}, outputs=["tokens"],
        variants=_variants(GREEDY_BUGS, _greedy_bug, with_model), public=c.public,
        hint="start from <START>; each step append argmax of the last position's logits; <END> kept, "
             "null_idx after it.")

    def ok(exp):
        pos = [row.index(c.end_idx) if c.end_idx in row else None for row in exp["tokens"].tolist()]
        if c.want == "all_early":
            wanted = all(p is not None and p < c.max_len // 2 for p in pos)
        elif c.want == "ends":
            wanted = pos[0] is not None and pos[0] >= 2
        else:
            wanted = sum(p is not None for p in pos) >= 2 and None in pos and len(set(pos)) >= 3
        return wanted and (not c.told_apart or set(c.told_apart) <= _distinct_bugs(spec, ns))

    return _seeded(spec, ns, ok)


def _beam_spec(c: BeamCase, g: torch.Generator, ns: dict) -> CaseSpec:
    spec = CaseSpec(
        name=c.name, target="with_model(beam_search)", kind="module", init=_toy(c.vocab, c.feature_dim),
        args=["features"],
        const_kwargs={"beam_width": c.beam_width, "max_len": c.max_len, "start_idx": c.start_idx,
                      "end_idx": c.end_idx, "null_idx": c.null_idx, "length_penalty": c.length_penalty},
        inputs={"features": randn(c.batch, c.regions, c.feature_dim, g=g) * 3}, outputs=["tokens"],
        variants=_variants(BEAM_BUGS, _beam_bug, with_model), public=c.public,
        hint="keep the best (beam_width - finished) of all hypotheses x words at each step; "
             "rank finished hypotheses by sum(log p) / length ** length_penalty, the length counting <END>.")

    def ok(exp):  # a caption ends, and (beam_width > 1) beam search finds other captions than greedy decoding;
        toks = torch.from_numpy(exp["tokens"])  # and each known bug of c.want gives an output of its own
        if c.beam_width == 1:
            return bool((toks == c.end_idx).any())
        greedy = _greedy_on(spec, ns)
        if not (toks == c.end_idx).any() or torch.equal(greedy, toks):
            return False
        return not c.want or set(c.want) <= _distinct_bugs(spec, ns)

    spec = _seeded(spec, ns, ok)
    distinct = _distinct_bugs(spec, ns)
    spec.variants = {k: v for k, v in spec.variants.items() if k in distinct}
    return spec


# notebook 06's worked example: a bigram model over 7 words, beam width 2, 3 words at most. The narrowing beam
# finds "a" (a <END>: -1.109 / 2 ** 0.7 = -0.682, better than big dog <END>: -1.532 / 3 ** 0.7 = -0.710); a beam
# that keeps two hypotheses alive also follows "a cat" and returns it (-1.309 / 3 ** 0.7 = -0.607)
WORKED_WORDS = ["<NULL>", "<START>", "<END>", "a", "big", "cat", "dog"]
WORKED_NEXT = {"<START>": {"a": 0.6, "big": 0.4}, "a": {"<END>": 0.55, "cat": 0.45}, "big": {"dog": 0.9, "<END>": 0.1},
               "dog": {"<END>": 0.6, "cat": 0.4}, "cat": {"<END>": 1.0}, "<NULL>": {"<END>": 1.0},
               "<END>": {"<END>": 1.0}}


def _worked_beam_spec(ns: dict) -> CaseSpec:
    probabilities = [[WORKED_NEXT[w].get(v, 0.0) for v in WORKED_WORDS] for w in WORKED_WORDS]
    spec = CaseSpec(
        name="beam/worked_example", target="with_bigram(beam_search)", kind="module",
        init={"vocab_size": len(WORKED_WORDS), "probabilities": probabilities}, args=["features"],
        const_kwargs={"beam_width": 2, "max_len": 3, "start_idx": 1, "end_idx": 2, "null_idx": 0,
                      "length_penalty": 0.7},
        inputs={"features": torch.zeros(1, 1, 1)}, outputs=["tokens"], init_weights=True,
        variants=_variants(BEAM_BUGS, _beam_bug, with_bigram), public=True,
        hint="the worked example of the text: step 2 keeps big dog and a <END> (finished), so step 3 keeps 2 - 1 = 1 "
             "candidate, big dog <END>; a <END> wins on its length-normalised score.")
    ns.setdefault("with_bigram(beam_search)", with_bigram(ns["beam_search"]))
    distinct = _distinct_bugs(spec, ns)
    spec.variants = {k: v for k, v in spec.variants.items() if k in distinct}
    return spec


def _distinct_bugs(spec: CaseSpec, ns: dict) -> set[str]:
    """The known bugs whose output on `spec` (at its current seed) differs from the correct one and from every
    other bug's: two bugs that give the same captions are both left out, since the check would name one for the
    other (e.g. each hypothesis' own best word told to count <END> in the length), and the hint speaks for them;
    but a bug that gives the greedy captions leaves "greedy" in, whose message says just that."""
    outs = {}
    for name, variant in spec.variants.items():
        rec = build_case(dataclasses.replace(spec, variants={name: variant}, grad_wrt=[]), ns)
        if name in rec.variants:  # differs from the correct output (and did not crash)
            outs[name] = rec.variants[name][1]["tokens"]

    def clashes(k):  # another bug gives the same captions
        return any(o != k and outs[o].shape == outs[k].shape and (outs[o] == outs[k]).all() for o in outs)

    return {k for k in outs if k == "greedy" or not clashes(k)}


# which notebook a case belongs to, by the task its name starts with
PREFIXES = {"04": ("features/", "vocab/", "encode/", "dataset/", "collate/", "captioner/", "loss/", "teacher/"),
            "05": ("schedule/", "optimizer/", "step/", "validation/", "fit/", "greedy/", "evaluate/", "trained/"),
            "06": ("beam/",)}


def solutions_namespace(ns: dict | None = None) -> dict:
    """`ns` (default: a new dict) with every name of the solution notebooks 04-06 it lacks."""
    from grading import notebooks

    ns = {} if ns is None else ns
    for name, value in notebooks.captioning_solution().items():
        ns.setdefault(name, value)
    return ns


def cases_of(number: str, ns: dict) -> list[CaseSpec]:
    """The cases of notebook `number` ("04", "05" or "06"); `ns`, its solution's namespace, gets the names of the
    other two and the adapters the test cells show."""
    specs = all_cases(solutions_namespace(ns))
    unplaced = [s.name for s in specs if not s.name.startswith(sum(PREFIXES.values(), ()))]
    if unplaced:
        raise ValueError(f"cases of no notebook (add their prefix to PREFIXES): {unplaced}")
    return [s for s in specs if s.name.startswith(PREFIXES[number])]


def all_cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(2027)
    # the adapters the test cells wrap the answers in, under the names the messages show
    ns["with_attention(CaptioningTransformer)"] = with_attention(ns["CaptioningTransformer"])
    for fn in ("teacher_forcing_loss", "greedy_decode", "beam_search"):
        ns[f"with_model({fn})"] = with_model(ns[fn])
    out = []

    # CaptioningTransformer(...).forward(features, captions)
    out += [_model_spec(c, g) for c in [
        ModelCase(name="captioner/basic", batch=2, length=6, regions=9, feature_dim=12, vocab=15, d_model=16, heads=2,
                  layers=2, dim_feedforward=32, public=True),
        ModelCase(name="captioner/square", batch=3, length=5, regions=4, feature_dim=16, vocab=11, d_model=16, heads=4,
                  layers=2, dim_feedforward=24),
        ModelCase(name="captioner/one_region", batch=2, length=7, regions=1, feature_dim=10, vocab=13, d_model=8,
                  heads=2, layers=1, dim_feedforward=16),
        ModelCase(name="captioner/three_layers_float64", batch=2, length=5, regions=6, feature_dim=8, vocab=9,
                  d_model=12, heads=3, layers=3, dim_feedforward=20, dtype=torch.float64),
        ModelCase(name="captioner/grad", batch=2, length=4, regions=5, feature_dim=6, vocab=10, d_model=8, heads=2,
                  layers=2, dim_feedforward=16, grad=True),
        ModelCase(name="captioner/attention", batch=2, length=5, regions=9, feature_dim=12, vocab=15, d_model=16,
                  heads=2, layers=2, dim_feedforward=32, attention=True, public=True),
        ModelCase(name="captioner/attention_one_layer", batch=1, length=6, regions=4, feature_dim=8, vocab=10,
                  d_model=8, heads=4, layers=1, dim_feedforward=16, attention=True),
    ]]

    # caption_loss(logits, targets, null_idx)
    out += [_loss_spec(c, g) for c in [
        LossCase(name="loss/basic", lengths=[5, 3, 1], length=7, vocab=9, public=True),
        LossCase(name="loss/other_null_idx", lengths=[4, 2], length=6, vocab=8, null_idx=5),
        LossCase(name="loss/uneven_lengths", lengths=[8, 1, 2, 5], length=10, vocab=12),
        LossCase(name="loss/no_padding_float64", lengths=[6, 6], length=6, vocab=7, dtype=torch.float64),
        LossCase(name="loss/large_vocab", lengths=[3, 5, 2], length=6, vocab=40),
        LossCase(name="loss/grad", lengths=[4, 7, 2], length=7, vocab=10, grad=True),  # no padding leaks in
    ]]

    # teacher_forcing_loss(model, features, captions, null_idx) on the toy model
    out += [_teacher_spec(c, g) for c in [
        TeacherCase(name="teacher/basic", lengths=[4, 2, 6], length=9, regions=3, feature_dim=5, vocab=10, public=True),
        TeacherCase(name="teacher/other_null_idx", lengths=[3, 5], length=8, regions=2, feature_dim=4, vocab=9,
                    null_idx=7),
        TeacherCase(name="teacher/long_captions", lengths=[2, 9], length=12, regions=3, feature_dim=4, vocab=8),
        # a full-length caption: its last word counts
        TeacherCase(name="teacher/grad", lengths=[3, 10, 5], length=12, regions=3, feature_dim=4, vocab=9, grad=True),
    ]]

    # greedy_decode(model, features, max_len, start_idx, end_idx, null_idx) on the toy model
    out += [_greedy_spec(c, g, ns) for c in [
        GreedyCase(name="greedy/basic", batch=4, regions=3, feature_dim=5, vocab=8, max_len=7, public=True),
        GreedyCase(name="greedy/one_image", batch=1, regions=2, feature_dim=4, vocab=9, max_len=6, want="ends"),
        GreedyCase(name="greedy/all_end_early", batch=3, regions=3, feature_dim=4, vocab=6, max_len=12,
                   want="all_early"),
        GreedyCase(name="greedy/other_special_tokens", batch=3, regions=2, feature_dim=6, vocab=9, max_len=8,
                   start_idx=4, end_idx=7, null_idx=5, told_apart=("start_ignored",)),
        GreedyCase(name="greedy/float64", batch=3, regions=4, feature_dim=5, vocab=7, max_len=6, dtype=torch.float64),
    ]]

    # beam_search(model, features, beam_width, max_len, ..., length_penalty) on the toy model
    out += [_beam_spec(c, g, ns) for c in [
        BeamCase(name="beam/basic", batch=2, regions=3, feature_dim=5, vocab=7, beam_width=3, max_len=6, public=True),
        BeamCase(name="beam/width_one_is_greedy", batch=3, regions=2, feature_dim=4, vocab=7, beam_width=1, max_len=6),
        BeamCase(name="beam/raw_scores", batch=2, regions=3, feature_dim=4, vocab=6, beam_width=3, max_len=7,
                 length_penalty=0.0),
        BeamCase(name="beam/batch_wide", batch=3, regions=3, feature_dim=5, vocab=8, beam_width=5, max_len=6,
                 length_penalty=1.0),
        BeamCase(name="beam/other_special_tokens", batch=2, regions=2, feature_dim=4, vocab=8, beam_width=2,
                 max_len=6, start_idx=4, end_idx=6, null_idx=5, want=("start_ignored",)),
    ]]
    # cases that separate the width rules and the length conventions, from their own generator so
    # that the cases above keep their inputs: the beam narrows as hypotheses finish (not k live at every step),
    # all hypotheses x words are ranked together (not each hypothesis' own best word), L counts <END>
    g_rules = torch.Generator().manual_seed(1414)
    out += [_beam_spec(c, g_rules, ns) for c in [
        BeamCase(name="beam/narrowing_beam", batch=3, regions=2, feature_dim=4, vocab=8, beam_width=4, max_len=6,
                 length_penalty=1.0, want=("keep_k_live", "per_hypothesis_best", "no_narrowing")),
        BeamCase(name="beam/end_in_length", batch=3, regions=3, feature_dim=5, vocab=8, beam_width=3, max_len=7,
                 want=("length_without_end", "per_hypothesis_best")),
    ]]
    out += [_worked_beam_spec(ns)]
    # every layer's attention, hidden (the public case has two layers too), from its own generator
    g_layers = torch.Generator().manual_seed(3031)
    out += [_model_spec(ModelCase(name="captioner/attention_three_layers", batch=2, length=4, regions=6,
                                  feature_dim=8, vocab=11, d_model=12, heads=3, layers=3, dim_feedforward=16,
                                  attention=True), g_layers)]
    # the pipeline tasks' adapters (starter.pipeline), under the names their test cells show
    for fn, adapter in PIPELINE_ADAPTERS.items():
        ns[f"{adapter.__name__}({fn})"] = adapter(ns[fn])
    return out + feature_cases(ns) + pipeline_cases(ns) + validation_cases(ns) + fit_cases(ns) + trained_cases()


@dataclass(frozen=True, kw_only=True)
class TrainedCase(Row):
    """The model notebook 05 trained and saved, captioning `images` new scenes of `shapes` (drawn from random
    stream `stream`, see data.shapes.unseen_images): at least `share` of its greedy captions must be one of
    their image's three references, word for word."""
    images: int
    stream: int
    share: float


TRAINED_TARGET = "trained_captioner(CaptioningTransformer, greedy_decode)"
PUBLIC_STREAM = 1
# The hidden scenes' random stream. Student code can call data.shapes.unseen_images (data/ is mounted in the
# sandbox and published), so a stream it can name would give it the hidden scenes and their captions; this one
# lives only here (grading/ is neither mounted nor published) and is too large to search for: 128 random bits.
HIDDEN_STREAM = 223817195532500176294206531246373579868


def trained_cases() -> list[CaseSpec]:
    """The trained-model outcome. The references are the scenes' own captions (no solution runs); the images
    are new scenes of the held-out validation combinations. Three hidden thresholds on the same 100 images give
    partial credit. Notebook 05's model (700 steps, seed 0) gets 85 % of the public and 86 % of the hidden scenes
    right, the same model trained on the kit's sampler instead of the notebook's loader 91 % and 97 %
    (`python -m grading execute 05`, then `python -m grading.cases.captioning build/executed/runs/captioning_transformer.pt
    --kit-sampler` prints both); over seeds the notebook's gets 81-89 % of the validation captions right: hence a
    top mark of 65 %."""
    from data import shapes

    path = shapes.default_path()
    if not path.exists():
        shapes.build(path)
    with h5py.File(path, "r") as f:
        words = [w.decode() if isinstance(w, bytes) else str(w) for w in f["vocab"][()]]
    out = []
    for c in [
        TrainedCase(name="trained/new_scenes", images=100, stream=PUBLIC_STREAM, share=0.65, public=True),
        TrainedCase(name="trained/hidden_scenes_40", images=100, stream=HIDDEN_STREAM, share=0.4),
        TrainedCase(name="trained/hidden_scenes_55", images=100, stream=HIDDEN_STREAM, share=0.55),
        TrainedCase(name="trained/hidden_scenes_65", images=100, stream=HIDDEN_STREAM, share=0.65),
    ]:
        features, captions = shapes.unseen_images(path, c.images, c.stream)
        references = torch.tensor(np.stack([shapes.caption_indices(cs)[:, 1:] for cs in captions]),
                                  dtype=torch.int64)  # (N, 3, MAX_LEN - 1): no <START>, as decoders return
        out.append(CaseSpec(
            name=c.name, target=TRAINED_TARGET, args=["features"], const_args=[words],
            inputs={"features": torch.from_numpy(features)}, outputs=["captions"],
            expected={"captions": references}, properties=[["exact_match_at_least", "captions", str(c.share)]],
            public=c.public,
            hint="the model saved at runs/captioning_transformer.pt, decoded with your greedy_decode"))
    return out


def trained_shares(checkpoint) -> dict[str, float]:
    """The share of each stored trained-model case's images (public and hidden) that the model saved at
    `checkpoint` captions exactly right, decoded by the solution's greedy_decode and counted as the check counts."""
    from grading import notebooks
    from starter.checks import case_groups, load_case, observe, share_exactly_right
    from starter.layers import layers_from, trained_captioner

    ns = solutions_namespace()
    stem = "05_training_and_evaluation.h5"
    names = []
    for folder in (notebooks.PUBLIC_REFERENCES, notebooks.HIDDEN_REFERENCES):
        with h5py.File(folder / stem, "r") as f:
            names += [n for n, g in case_groups(f) if str(g.attrs["target"]) == TRAINED_TARGET]
    shares = {}
    with layers_from(notebooks.SOLUTIONS):  # layers="mine": the solution's notebooks 02-03
        for name in names:
            case = load_case(name, dirs=[notebooks.PUBLIC_REFERENCES, notebooks.HIDDEN_REFERENCES])
            obs = observe(case, trained_captioner(ns["CaptioningTransformer"], ns["greedy_decode"], path=checkpoint))
            if obs.error:
                raise RuntimeError(f"{name}: {obs.error}")
            shares[name] = share_exactly_right(case.const_args[0], obs.outputs["captions"], case.expected["captions"])
    return shares


def main(argv: Sequence[str] | None = None) -> int:
    """python -m grading.cases.captioning [CHECKPOINT ...] [--kit-sampler]: the trained-model cases' shares."""
    import argparse
    import tempfile
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m grading.cases.captioning", description=(
        "Print the share of the trained-model cases' images (public and hidden) that each checkpoint captions "
        "exactly right: the figures behind their marks. Notebook 05's model is the one its solution saves "
        "(python -m grading execute 05 writes build/executed/runs/captioning_transformer.pt)."))
    parser.add_argument("checkpoints", nargs="*", type=Path)
    parser.add_argument("--kit-sampler", action="store_true",
                        help="also train the notebook's model on the kit's sampler (700 steps, seed 0) and measure it")
    args = parser.parse_args(argv)
    runs = [(str(p), p) for p in args.checkpoints]
    with tempfile.TemporaryDirectory() as tmp:
        if args.kit_sampler:
            from grading import notebooks

            runs.append(("the kit's sampler, 700 steps, seed 0",
                         notebooks.trained_checkpoint(Path(tmp) / "captioning_transformer.pt")))
        for label, path in runs:
            shares = trained_shares(path)
            public = [v for k, v in shares.items() if k == "trained/new_scenes"]
            hidden = sorted({v for k, v in shares.items() if k != "trained/new_scenes"})
            print(f"{label}: public scenes {', '.join(f'{v:.0%}' for v in public)}, "
                  f"hidden scenes {', '.join(f'{v:.0%}' for v in hidden)}")
    return 0



def _greedy_on(spec, ns):
    """The greedy output of the toy model of `spec` (to choose beam cases where beam search matters)."""
    kw = {k: spec.const_kwargs[k] for k in ("max_len", "start_idx", "end_idx", "null_idx")}
    greedy = dataclasses.replace(spec, const_kwargs=kw, variants={}, grad_wrt=[])
    greedy.target = "_greedy_probe"
    ns["_greedy_probe"] = with_model(lambda model, features, **kws: _greedy(model, features, **kws))
    return torch.from_numpy(build_case(greedy, ns).expected["tokens"])


# ==== the data pipeline, training step and evaluation =====================================================
# Variants are written here from the task text, independently of the solution; each takes the place of the
# student's function under the same adapter as the check (starter.pipeline).

SPECIALS = ["<NULL>", "<START>", "<END>", "<UNK>"]
PIPELINE_ADAPTERS = {"extract_grid_features": with_cnn, "build_vocab": with_probe_words,
                     "encode_captions": with_long_output, "CaptionFeatures": with_h5_file,
                     "collate_captions": with_items, "lr_at_step": over_steps, "make_optimizer": with_param_groups,
                     "train_step": with_optimizer,
                     "validation_loss": with_batches, "fit": with_loader, "evaluate_captions": with_split}


def _words(caption, kind=None):
    if kind == "no_lowercase":
        return re.findall(r"[A-Za-z0-9]+", caption)
    if kind == "split_on_spaces":
        return caption.lower().split()
    return re.findall(r"[a-z0-9]+", caption.lower())


def _vocab_bug(kind):
    def build(captions, min_count=1):
        seen = [w for c in captions for w in _words(c, kind)]
        counts = Counter(seen)
        keep = (lambda n: n > min_count) if kind == "strictly_more" else (
            (lambda n: True) if kind == "min_count_ignored" else (lambda n: n >= min_count))
        words = [w for w, n in counts.items() if keep(n)]  # Counter keeps first-seen order
        if kind == "first_seen_order":
            ordered = words
        elif kind == "alphabetical":
            ordered = sorted(words)
        elif kind == "ties_first_seen":
            ordered = sorted(words, key=lambda w: -counts[w])  # stable: ties in first-seen order
        elif kind == "least_frequent_first":
            ordered = sorted(words, key=lambda w: (counts[w], w))
        else:
            ordered = sorted(words, key=lambda w: (-counts[w], w))
        if kind == "no_specials":
            return ordered
        if kind == "specials_last":
            return ordered + SPECIALS
        return SPECIALS + ordered
    return build


VOCAB_BUGS = {
    "no_specials": "the special tokens are missing: the list starts with <NULL>, <START>, <END>, <UNK> (indices 0-3).",
    "specials_last": "the special tokens must come first (indices 0-3), before the words.",
    "strictly_more": "words seen exactly min_count times are missing: keep a word seen AT LEAST min_count times (>=).",
    "min_count_ignored": "rare words are kept: drop the words seen fewer than min_count times.",
    "first_seen_order": "words are in the order they first appear: sort them, most frequent first.",
    "alphabetical": "words are in alphabetical order: sort by count first (most frequent first), alphabetically only "
                    "among words with the same count.",
    "ties_first_seen": "words with the same count are in first-seen order: break ties alphabetically "
                       "(key=lambda w: (-counts[w], w)).",
    "least_frequent_first": "the least frequent words come first: sort by decreasing count.",
    "no_lowercase": "words are not lower-cased ('Red' and 'red' are counted apart): tokenise with tokenize().",
    "split_on_spaces": "punctuation stays attached to words ('circle,' is not 'circle'): tokenise with tokenize().",
}


def _encode_bug(kind):
    def encode(captions, word_to_idx, max_len):
        out = torch.zeros((len(captions), max_len), dtype=torch.long)
        for i, c in enumerate(captions):
            words = _words(c, "split_on_spaces" if kind == "split_on_spaces" else None)
            if kind == "unknown_dropped":
                ids = [word_to_idx[w] for w in words if w in word_to_idx]
            else:
                ids = [word_to_idx.get(w, 0 if kind == "unknown_as_null" else 3) for w in words]
            if kind == "end_cut":
                row = ([1] + ids + [2])[:max_len]
            elif kind == "one_word_short":
                row = [1] + ids[: max_len - 3] + [2]
            elif kind == "no_start":
                row = ids[: max_len - 1] + [2]
            elif kind == "no_end":
                row = [1] + ids[: max_len - 1]
            else:
                row = [1] + ids[: max_len - 2] + [2]
            out[i, : len(row)] = torch.tensor(row)
        return out
    return encode


ENCODE_BUGS = {
    "unknown_dropped": "words missing from the vocabulary are dropped: encode each as <UNK> (index 3).",
    "unknown_as_null": "words missing from the vocabulary become <NULL>: encode them as <UNK> (index 3).",
    "end_cut": "a caption longer than max_len - 2 words loses its <END>: keep the first max_len - 2 words, then <END>.",
    "one_word_short": "a long caption keeps one word too few: max_len - 2 words fit between <START> and <END>.",
    "no_start": "the rows don't begin with <START> (index 1).",
    "no_end": "<END> (index 2) is missing after the last word.",
    "split_on_spaces": "punctuation stays attached to words ('circle,' is not 'circle'): tokenise with tokenize().",
}


def _dataset_bug(kind):
    class Buggy(torch.utils.data.Dataset):
        def __init__(self, path, key, captions, image_idxs):
            import h5py
            with h5py.File(path, "r") as f:
                self.features = torch.from_numpy(f[key][()])
            self.captions, self.image_idxs = captions, image_idxs

        def __len__(self):
            return len(self.captions)

        def __getitem__(self, i):
            row = i if kind == "caption_row_as_image" else int(self.image_idxs[i])
            feats = self.features[row].float()
            cap = self.captions[i]
            end = int((cap == 2).nonzero()[0]) if (cap == 2).any() else len(cap) - 1
            if kind == "padding_kept":
                return feats, cap
            if kind == "end_dropped":
                return feats, cap[:end]
            return feats, cap[:end + 1]
    return Buggy


DATASET_BUGS = {
    "caption_row_as_image": "item i has the features of image i, not of its caption's image: use image_idxs[i].",
    "padding_kept": "the caption keeps its padding: cut it after its <END> (padding is added per batch).",
    "end_dropped": "the caption stops before <END>: keep <END>, the model must learn to stop.",
}


def _collate_bug(kind):
    def collate(batch, null_idx=0):
        feats = torch.stack([f for f, _ in batch])
        longest = max(len(c) for _, c in batch)
        pad = 0 if kind == "hardcoded_null" else null_idx
        caps = torch.full((len(batch), longest), pad, dtype=torch.long)
        for b, (_, c) in enumerate(batch):
            if kind == "pad_left":
                caps[b, longest - len(c):] = c
            else:
                caps[b, : len(c)] = c
        return feats, caps
    return collate


COLLATE_BUGS = {
    "hardcoded_null": "padding uses index 0: pad with the null_idx argument.",
    "pad_left": "padding is added before the caption: pad at the end, so every caption starts with <START>.",
}


def _schedule_bug(kind):
    def lr(step, total_steps, warmup_steps, peak_lr):
        if warmup_steps and step < warmup_steps and kind != "no_warmup":
            return peak_lr * min(1.0, (step if kind == "warmup_from_zero" else step + 1) / warmup_steps)
        if kind == "progress_over_total":
            p = min(1.0, step / max(1, total_steps))
        else:
            p = (step - warmup_steps) / max(1, total_steps - warmup_steps)
            if kind != "no_clamp":
                p = min(1.0, p)
        floor = 0.0 if kind == "cosine_to_zero" else 0.1
        return peak_lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))
    return lr


SCHEDULE_BUGS = {
    "warmup_from_zero": "the warm-up starts at 0 (the first step doesn't move): use (step + 1) / warmup_steps.",
    "no_warmup": "there is no warm-up: for step < warmup_steps the rate rises linearly to the peak.",
    "cosine_to_zero": "the cosine decays to 0: it ends at 10 % of the peak (0.1 + 0.45 (1 + cos(pi p))).",
    "progress_over_total": "the cosine's progress must start at the end of the warm-up: "
                           "p = (step - warmup_steps) / (total_steps - warmup_steps).",
    "no_clamp": "after total_steps the rate rises again: clamp the progress at 1 (min(1, ...)).",
}


def _optimizer_bug(kind):
    def make(model, lr, weight_decay):
        params = list(model.parameters())
        matrices = [p for p in params if p.dim() >= 2]
        if kind == "linear_weights_only":  # the embedding tables counted with the vectors
            tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
            matrices = [p for p in matrices if id(p) not in tables]
        vectors = [p for p in params if all(p is not q for q in matrices)]
        decay, none = (vectors, matrices) if kind == "swapped" else (matrices, vectors)
        if kind == "decay_everything":
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        if kind == "defaults":
            return torch.optim.AdamW(params)
        if kind == "default_lr":
            return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                      {"params": none, "weight_decay": 0.0}])
        if kind == "matrices_only":
            return torch.optim.AdamW(decay, lr=lr, weight_decay=weight_decay)
        optimizer = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        return optimizer([{"params": decay, "weight_decay": weight_decay}, {"params": none, "weight_decay": 0.0}],
                         lr=lr)
    return make


OPTIMIZER_BUGS = {
    "decay_everything": "the biases and LayerNorm parameters (1-D) are decayed too: put them in a group with "
                        "weight_decay 0.0, and the parameters of 2 or more dimensions in one with weight_decay.",
    "defaults": "every parameter has AdamW's default weight decay 0.01 and learning rate 0.001, not `lr` and "
                "`weight_decay`: pass them, in two groups.",
    "default_lr": "the learning rate is AdamW's default 0.001: pass lr=lr.",
    "swapped": "the weight decay is on the 1-D parameters and not on the matrices: the other way round.",
    "linear_weights_only": "the embedding tables get no weight decay: they are 2-D like the weight matrices, and the "
                           "rule is by dimension (p.dim() >= 2 decays).",
    "matrices_only": "the 1-D parameters are in no group, so they would never be trained: every parameter goes in "
                     "exactly one group.",
    "adam": "torch.optim.Adam adds the weight decay to the gradient, where Adam's scaling changes it; AdamW shrinks "
            "the weights directly (decoupled weight decay): use torch.optim.AdamW.",
}


def _step_bug(kind):
    def step(model, loss_fn, optimizer, features, captions, lr, grad_clip=1.0):
        if kind == "lr_first_group_only":
            optimizer.param_groups[0]["lr"] = lr
        elif kind != "lr_ignored" and kind != "lr_set_after_step":
            for g in optimizer.param_groups:
                g["lr"] = lr
        model.train()
        if kind not in ("no_zero_grad", "zero_grad_after_backward"):
            optimizer.zero_grad()
        loss = loss_fn(model, features, captions)
        loss.backward()
        if kind == "zero_grad_after_backward":
            optimizer.zero_grad()
        if grad_clip is not None and kind != "no_clipping":
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        if kind == "lr_set_after_step":
            for g in optimizer.param_groups:
                g["lr"] = lr
        return loss.item()
    return step


STEP_BUGS = {
    "no_zero_grad": "gradients accumulate across steps: call optimizer.zero_grad() before backward().",
    "zero_grad_after_backward": "the gradients are cleared between backward() and step(), so nothing is learned: "
                                "zero_grad() comes before backward().",
    # clipping after step() changes nothing (the next step clears the gradients): one bug, one message
    "no_clipping": "the update uses unclipped gradients: call torch.nn.utils.clip_grad_norm_(model.parameters(), "
                   "grad_clip) after backward() and before optimizer.step().",
    "lr_ignored": "the learning rate `lr` is not used: set group['lr'] = lr in every optimizer.param_groups entry.",
    "lr_set_after_step": "the learning rate is set after optimizer.step(), so each step uses the previous step's "
                         "rate: set it first.",
    "lr_first_group_only": "the learning rate is set in the first parameter group only (this optimizer has two): "
                           "set group['lr'] = lr for every group in optimizer.param_groups.",
}


def _tokens_to_words(row, idx_to_word, kind):
    words = []
    for t in row:
        if t == 2 and kind != "no_stop_at_end":
            if kind == "end_kept":
                words.append(idx_to_word[t])
            break
        if t in (0, 1, 2) or (kind == "unk_dropped" and t == 3):  # <NULL>, <START>, <END> if the caption goes on
            continue
        words.append(idx_to_word[t])
    return " ".join(words)


def _evaluate_bug(kind):
    def evaluate(model, decode_fn, split, vocab, max_len, batch_size=250):
        from starter.metrics import caption_scores
        if kind != "train_mode":
            model.eval()
        n = split.num_images
        stop = n - n % batch_size if kind == "last_batch_dropped" and n % batch_size else n
        generated = []
        with (torch.enable_grad() if kind == "grad_enabled" else torch.no_grad()):
            for start in range(0, stop, batch_size):
                idx = list(range(start, min(stop, start + batch_size)))
                for row in decode_fn(model, split.features(idx), max_len).tolist():
                    generated.append(_tokens_to_words(row, vocab.idx_to_word, kind))
        refs = {i: split.references(i)[:1] if kind == "one_reference" else split.references(i)
                for i in range(len(generated))}
        scores = caption_scores(refs, dict(enumerate(generated)))
        exact_refs = {i: split.references(i)[:1] if kind in ("exact_first_reference", "one_reference")
                      else split.references(i) for i in range(len(generated))}
        hits = [_words(generated[i]) in [_words(r) for r in rs] for i, rs in exact_refs.items()]
        scores["exact_match"] = sum(hits) / len(hits) * (100 if kind == "exact_percent" else 1)
        return scores, generated
    return evaluate


EVALUATE_BUGS = {
    "train_mode": "the model is in train mode while evaluating (dropout on): call model.eval() first.",
    "grad_enabled": "the evaluation runs with gradients on: wrap it in torch.no_grad().",
    "last_batch_dropped": "the last, smaller batch of images is skipped: range(0, num_images, batch_size) with "
                          "idx up to min(num_images, start + batch_size).",
    "one_reference": "captions are scored against one reference only: pass all of split.references(i).",
    "end_kept": "the <END> token is part of the caption text: stop before it.",
    "no_stop_at_end": "words after <END> are kept: stop at the first <END>.",
    "exact_first_reference": "exact match compares with the first reference only: a caption matching any of the "
                             "image's references counts.",
    "exact_percent": "exact_match is a percentage: return the fraction (between 0 and 1).",
    "unk_dropped": "<UNK> is left out of the captions: skip only <NULL> and <START> (the model did say a word, one "
                   "the vocabulary does not have), and stop at <END>.",
}


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


@dataclass(frozen=True, kw_only=True)
class VocabCase(Row):
    """build_vocab(captions, min_count), seen through where each probe word lands."""
    captions: list[str]
    min_count: int = 1


@dataclass(frozen=True, kw_only=True)
class EncodeCase(Row):
    """encode_captions(captions, word_to_idx, max_len) over a fixed small vocabulary."""
    captions: list[str]
    max_len: int


@dataclass(frozen=True, kw_only=True)
class DatasetCase(Row):
    """CaptionFeatures(path, key, captions, image_idxs)[i] for every i, over features (N, R, D) stored in a file."""
    images: int  # N
    regions: int  # R
    feature_dim: int  # D
    lengths: list[int]  # words of each caption
    length: int  # T, with padding


@dataclass(frozen=True, kw_only=True)
class CollateCase(Row):
    """collate_captions(batch of (features (R, D), caption) items, null_idx)."""
    lengths: list[int]  # words of each caption
    regions: int  # R
    feature_dim: int  # D
    null_idx: int = 0


@dataclass(frozen=True, kw_only=True)
class ScheduleCase(Row):
    """lr_at_step(step, total_steps, warmup_steps, peak_lr) at each of `steps`."""
    steps: Sequence[float]
    total_steps: int
    warmup_steps: int
    peak_lr: float


@dataclass(frozen=True, kw_only=True)
class OptimizerCase(Row):
    """make_optimizer(model, lr, weight_decay) on starter.pipeline.ParameterKinds, then `steps` AdamW steps."""
    lr: float
    weight_decay: float
    steps: int = 3
    vocab: int = 7
    hidden: int = 4


@dataclass(frozen=True, kw_only=True)
class StepCase(Row):
    """train_step(...) once per learning rate of `lrs`, on the toy model and one batch of captions."""
    optimizer: str
    lrs: list[float]
    grad_clip: float | None
    lengths: list[int]  # words of each caption of the batch


@dataclass(frozen=True, kw_only=True)
class EvaluateCase(Row):
    """evaluate_captions(model, decode_fn, split, vocab, max_len, batch_size) on stored tokens and references."""
    images: int
    references: int  # per image
    batch_size: int
    words_after_end: bool = False  # the decoded rows go on with words after <END>
    unknown_words: bool = False  # the decoded rows have <UNK> among their words


ENCODE_WORDS = SPECIALS + ["a", "red", "circle", "left", "blue", "square", "of", "the"]
EVAL_WORDS = SPECIALS + ["a", "red", "blue", "circle", "square", "left", "right", "of", "the", "big"]


def _vocab_spec(c: VocabCase) -> CaseSpec:
    # every word any tokenisation (right or buggy) could make of the captions
    probe = SPECIALS + sorted({w for cap in c.captions for w in _words(cap)}
                              | {w.lower() for cap in c.captions for w in re.findall(r"[A-Za-z0-9]+", cap)}
                              | {w for cap in c.captions for w in cap.lower().split()}
                              | {w for cap in c.captions for w in re.findall(r"[A-Za-z0-9]+", cap)})
    return CaseSpec(
        name=c.name, target="with_probe_words(build_vocab)", args=[], inputs={},
        const_kwargs={"captions": c.captions, "min_count": c.min_count, "probe": probe},
        outputs=["size", "positions"], variants=_variants(VOCAB_BUGS, _vocab_bug, with_probe_words),
        public=c.public, hint="SPECIAL_TOKENS + the words with count >= min_count, sorted by (-count, word).")


def _encode_spec(c: EncodeCase) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="with_long_output(encode_captions)", args=[], inputs={},
        const_kwargs={"captions": c.captions, "word_to_idx": {w: i for i, w in enumerate(ENCODE_WORDS)},
                      "max_len": c.max_len}, outputs=["captions"],
        variants=_variants(ENCODE_BUGS, _encode_bug, with_long_output), public=c.public,
        hint="<START>, the first max_len - 2 words (unknown -> <UNK>), <END>, then <NULL>.")


def _dataset_spec(c: DatasetCase, g: torch.Generator) -> CaseSpec:
    caps = _captions(c.lengths, c.length, 12, g)
    idxs = torch.randint(c.images, (len(c.lengths),), generator=g)
    idxs[0] = c.images - 1  # rows differ from their image index
    return CaseSpec(
        name=c.name, target="with_h5_file(CaptionFeatures)", args=["features", "captions", "image_idxs"],
        inputs={"features": randn(c.images, c.regions, c.feature_dim, g=g).half().float(), "captions": caps,
                "image_idxs": idxs},
        outputs=["item_features", "item_captions", "item_lengths"],
        variants=_variants(DATASET_BUGS, _dataset_bug, with_h5_file), public=c.public,
        hint="item i: (features of image image_idxs[i] as float32, captions[i] up to and including <END>).")


def _collate_spec(c: CollateCase, g: torch.Generator) -> CaseSpec:
    caps = _captions(c.lengths, max(c.lengths) + 4, 12, g, null=c.null_idx, specials=(0, 1, 2, 3, c.null_idx))
    return CaseSpec(
        name=c.name, target="with_items(collate_captions)", args=["features", "captions", "lengths"],
        const_kwargs={"null_idx": c.null_idx},
        inputs={"features": randn(len(c.lengths), c.regions, c.feature_dim, g=g), "captions": caps,
                "lengths": torch.tensor([n + 2 for n in c.lengths])},
        outputs=["features", "captions"], variants=_variants(COLLATE_BUGS, _collate_bug, with_items),
        public=c.public, hint="torch.stack the features; pad the captions at the end with null_idx to the "
                              "longest caption of the batch.")


def _schedule_spec(c: ScheduleCase) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="over_steps(lr_at_step)", args=["steps"],
        const_kwargs={"total_steps": c.total_steps, "warmup_steps": c.warmup_steps, "peak_lr": c.peak_lr},
        inputs={"steps": torch.tensor(c.steps, dtype=torch.float64)}, outputs=["lr"], atol=1e-9, rtol=1e-6,
        variants=_variants(SCHEDULE_BUGS, _schedule_bug, over_steps), public=c.public,
        hint="warm-up peak * min(1, (step + 1) / warmup); then peak * (0.1 + 0.45 (1 + cos(pi p))).")


def _optimizer_spec(c: OptimizerCase) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="with_param_groups(make_optimizer)", kind="module",
        init={"vocab_size": c.vocab, "hidden": c.hidden}, args=[], inputs={},
        const_kwargs={"lr": c.lr, "weight_decay": c.weight_decay, "steps": c.steps, "grad_seed": 5},
        outputs=["groups", "parameters"], atol=1e-6, rtol=1e-5,
        variants=_variants(OPTIMIZER_BUGS, _optimizer_bug, with_param_groups), public=c.public,
        hint="torch.optim.AdamW([{'params': the parameters with p.dim() >= 2, 'weight_decay': weight_decay}, "
             "{'params': the others, 'weight_decay': 0.0}], lr=lr).")


def _step_spec(c: StepCase, g: torch.Generator) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="with_optimizer(train_step)", kind="module", init=_toy(9, 4, hidden=8, max_len=16),
        args=["features", "captions"], const_kwargs={"optimizer": c.optimizer, "lrs": c.lrs, "grad_clip": c.grad_clip},
        inputs=_toy_batch(c.lengths, g), outputs=["losses", "parameters"], atol=1e-5, rtol=1e-4,
        variants=_variants(STEP_BUGS, _step_bug, with_optimizer), public=c.public,
        hint="set lr; model.train(); zero_grad(); loss = loss_fn(...); backward(); clip_grad_norm_; step(); "
             "return loss.item().")


def _evaluate_spec(c: EvaluateCase, g: torch.Generator) -> CaseSpec:
    max_len, words = 8, EVAL_WORDS
    tokens = torch.zeros((c.images, max_len), dtype=torch.long)
    references = []
    for i in range(c.images):
        length = int(torch.randint(2, 6, (1,), generator=g))
        drawn = torch.randint(3 if c.unknown_words else 4, len(words), (length,), generator=g)
        if c.unknown_words and i % 2 == 0:
            drawn[0] = 3  # <UNK> in every other caption, at least
        tokens[i, :length] = drawn
        tokens[i, length] = 2
        if c.words_after_end:
            tokens[i, length + 1:] = torch.randint(4, len(words), (max_len - length - 1,), generator=g)
        caption = " ".join(words[int(w)] for w in drawn)
        refs = [" ".join(words[int(w)] for w in torch.randint(4, len(words), (length,), generator=g))
                for _ in range(c.references)]
        hit = i % 3  # a third of the images have their caption among the references, not always first
        if hit < 2:
            refs[min(hit + (i % 2), c.references - 1)] = caption.capitalize() + "."
        references.append(refs)
    return CaseSpec(
        name=c.name, target="with_split(evaluate_captions)", args=["tokens"],
        const_kwargs={"references": references, "idx_to_word": list(words), "max_len": max_len,
                      "batch_size": c.batch_size},
        inputs={"tokens": tokens}, outputs=["scores"], atol=1e-6, rtol=1e-5,
        variants=_variants(EVALUATE_BUGS, _evaluate_bug, with_split), public=c.public,
        hint="model.eval(); torch.no_grad(); decode every batch; words up to <END> without <NULL>/<START>; "
             "caption_scores against all references; exact_match as a fraction.")


def pipeline_cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(2117)
    out = []
    pool = ["a", "red", "blue", "circle", "square", "left", "right", "of", "the", "small", "big", "above", "there",
            "is", "green", "triangle"]

    # build_vocab(captions, min_count) -> where each probe word landed
    out += [_vocab_spec(c) for c in [
        VocabCase(name="vocab/basic", captions=_text_captions(g, 12, pool[:10]), public=True),
        VocabCase(name="vocab/min_count", captions=_text_captions(g, 20, pool), min_count=3),
        VocabCase(name="vocab/punctuation_and_case", captions=["A red circle, left.", "The RED square; right!",
                                                               "a dog's ball (red)", "Red-ish circle... left",
                                                               "red circle 2 left"]),
        VocabCase(name="vocab/ties", captions=["d c", "c d", "b a", "a b", "e", "a"]),  # ties first seen d, c, b
        VocabCase(name="vocab/single_caption", captions=["One small step"], min_count=2),
    ]]

    # encode_captions(captions, word_to_idx, max_len)
    out += [_encode_spec(c) for c in [
        EncodeCase(name="encode/basic", captions=["a red circle", "The blue square, left.", "a circle"], max_len=7,
                   public=True),
        EncodeCase(name="encode/unknown_words", captions=["a purple circle", "zebra",
                                                          "the red hexagon left of a square"], max_len=10),
        EncodeCase(name="encode/too_long", captions=["a red circle left of the blue square",
                                                     "a red circle left of a square", "a"], max_len=6),
        EncodeCase(name="encode/punctuation_and_case", captions=["A RED circle!", "(left) of: the square",
                                                                 "red,blue;circle"], max_len=8),
        EncodeCase(name="encode/exact_fit", captions=["a red circle left", "a red circle left of"], max_len=6),
    ]]

    # CaptionFeatures(path, key, captions, image_idxs)[i] for every i
    out += [_dataset_spec(c, g) for c in [
        DatasetCase(name="dataset/basic", images=3, regions=4, feature_dim=5, lengths=[2, 4, 1, 3], length=8,
                    public=True),
        DatasetCase(name="dataset/shared_images", images=2, regions=3, feature_dim=4, lengths=[3, 1, 2, 5, 2],
                    length=8),
        DatasetCase(name="dataset/full_length", images=3, regions=2, feature_dim=3, lengths=[6, 1, 4], length=8),
        DatasetCase(name="dataset/one_region", images=4, regions=1, feature_dim=6, lengths=[2, 3, 2], length=6),
    ]]
    caps = _captions([2, 3, 1], 6, 12, g)
    caps[1] = 0  # an empty caption: no <START>, no <END>
    out.append(CaseSpec(
        name="dataset/caption_without_end", target="with_h5_file(CaptionFeatures)",
        args=["features", "captions", "image_idxs"],
        inputs={"features": randn(2, 3, 4, g=g).half().float(), "captions": caps,
                "image_idxs": torch.tensor([1, 0, 1])},
        outputs=["item_features", "item_captions", "item_lengths"], public=False,
        properties=[["raises", "ValueError", "naming the row when a caption (row 1, all <NULL>) has no <END>"]]))

    # collate_captions(batch, null_idx)
    out += [_collate_spec(c, g) for c in [
        CollateCase(name="collate/basic", lengths=[3, 1, 5], regions=4, feature_dim=3, public=True),
        CollateCase(name="collate/other_null_idx", lengths=[2, 6, 4], regions=2, feature_dim=3, null_idx=7),
        CollateCase(name="collate/equal_lengths", lengths=[3, 3], regions=3, feature_dim=2),
        CollateCase(name="collate/one_item", lengths=[4], regions=2, feature_dim=2),
    ]]

    # lr_at_step(step, total_steps, warmup_steps, peak_lr) at many steps
    out += [_schedule_spec(c) for c in [
        ScheduleCase(name="schedule/basic", steps=list(range(0, 100, 3)) + [99], total_steps=100, warmup_steps=10,
                     peak_lr=1e-3, public=True),
        ScheduleCase(name="schedule/long_warmup", steps=list(range(0, 60, 2)), total_steps=60, warmup_steps=40,
                     peak_lr=5e-4),
        ScheduleCase(name="schedule/fractional_steps", steps=[0.5, 4.25, 9.5, 9.99, 10.5, 33.3, 71.7], total_steps=80,
                     warmup_steps=10, peak_lr=2e-3),
        ScheduleCase(name="schedule/past_the_end", steps=[0, 5, 49, 50, 60, 75, 120], total_steps=50, warmup_steps=5,
                     peak_lr=3e-3),
        ScheduleCase(name="schedule/no_warmup", steps=[0, 1, 2, 10, 20, 29, 30], total_steps=30, warmup_steps=0,
                     peak_lr=1e-2),
    ]]

    # train_step(...) a few times on the toy model
    out += [_step_spec(c, g) for c in [
        StepCase(name="step/adamw", optimizer="adamw", lrs=[0.01, 0.02, 0.005], grad_clip=0.5, lengths=[3, 5],
                 public=True),
        StepCase(name="step/sgd", optimizer="sgd", lrs=[0.5, 0.3], grad_clip=1.0, lengths=[4, 2, 3]),
        StepCase(name="step/sgd_clipped", optimizer="sgd", lrs=[0.2, 0.2, 0.2], grad_clip=0.05, lengths=[2, 5]),
        StepCase(name="step/no_clipping", optimizer="sgd", lrs=[0.3, 0.1], grad_clip=None, lengths=[3, 3]),
        StepCase(name="step/adamw_changing_lr", optimizer="adamw", lrs=[0.001, 0.05, 0.02], grad_clip=2.0,
                 lengths=[5, 1, 2]),
    ]]

    # evaluate_captions(model, decode_fn, split, vocab, max_len, batch_size) on stored tokens and references
    out += [_evaluate_spec(c, g) for c in [
        EvaluateCase(name="evaluate/basic", images=6, references=3, batch_size=4, public=True),
        EvaluateCase(name="evaluate/uneven_batches", images=7, references=2, batch_size=3),
        EvaluateCase(name="evaluate/many_references", images=5, references=5, batch_size=5),
        EvaluateCase(name="evaluate/words_after_end", images=6, references=3, batch_size=2, words_after_end=True),
        EvaluateCase(name="evaluate/one_batch", images=4, references=2, batch_size=10),
    ]]
    # the parts of the spec the cases above do not reach (from their own generator, so that the cases above keep
    # their inputs): an optimizer with two parameter groups, <UNK> in a generated caption
    g_spec = torch.Generator().manual_seed(3030)
    out += [_step_spec(StepCase(name="step/two_param_groups", optimizer="sgd_two_groups", lrs=[0.4, 0.1],
                                grad_clip=1.0, lengths=[2, 4, 3]), g_spec)]
    out += [_evaluate_spec(EvaluateCase(name="evaluate/unknown_words", images=6, references=2, batch_size=4,
                                        unknown_words=True), g_spec)]

    # make_optimizer(model, lr, weight_decay): the groups, and the weights after a few steps (no random inputs:
    # the weights come from the case's seed, the gradients from the adapter's)
    out += [_optimizer_spec(c) for c in [
        OptimizerCase(name="optimizer/basic", lr=0.01, weight_decay=0.1, public=True),
        OptimizerCase(name="optimizer/strong_decay", lr=0.05, weight_decay=0.5, steps=4),
        OptimizerCase(name="optimizer/no_decay", lr=0.002, weight_decay=0.0, steps=2),
        OptimizerCase(name="optimizer/wider", lr=0.02, weight_decay=0.01, vocab=11, hidden=6),
    ]]
    return out


# ---- extract_grid_features(cnn, images, size) on the stand-in CNN ---------------------------------------


def _extract_bug(kind):
    def extract(cnn, images, size=224):
        if kind != "train_mode":
            cnn.eval()
        with torch.no_grad():
            x = torch.as_tensor(images)
            B, H, W, _ = x.shape
            x = x.reshape(B, 3, H, W).float() if kind == "reshape_not_permute" else x.permute(0, 3, 1, 2).float()
            if kind != "not_scaled":
                x = x / 255
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=kind != "no_antialias")
            if kind != "not_normalised":
                x = (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
            fmap = cnn(x)
            if kind == "column_by_column":
                return fmap.transpose(2, 3).flatten(2).transpose(1, 2)
            return fmap.flatten(2).transpose(1, 2)
    return extract


EXTRACT_BUGS = {
    "train_mode": "the CNN runs in train mode (BatchNorm uses the batch's statistics): call cnn.eval() first.",
    "reshape_not_permute": "the images were reshaped to (B, 3, H, W), which scrambles the pixels: permute(0, 3, 1, 2).",
    "not_scaled": "the pixels were not scaled to [0, 1]: divide the uint8 values by 255 before normalising.",
    "not_normalised": "the images are not normalised: subtract IMAGENET_MEAN and divide by IMAGENET_STD per channel.",
    "no_antialias": "the resize skips pixels when it shrinks: F.interpolate(..., mode='bilinear', antialias=True).",
    "column_by_column": "the regions are flattened column by column: flatten the (h, w) map row by row "
                        "(fmap.flatten(2).transpose(1, 2)).",
}


@dataclass(frozen=True, kw_only=True)
class FeatureCase(Row):
    """extract_grid_features(cnn, images (B, H, W, 3) uint8, size) on the stand-in CNN."""
    images: tuple[int, ...]  # the shape of images; not (B, H, W, 3): a case of bad input (a ValueError)
    size: int


def feature_cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(4)
    out = []
    for c in [
        FeatureCase(name="features/basic", images=(2, 16, 16, 3), size=16, public=True),
        FeatureCase(name="features/resize", images=(2, 20, 20, 3), size=12),
        FeatureCase(name="features/rectangular", images=(3, 24, 16, 3), size=16),
        FeatureCase(name="features/one_image", images=(1, 8, 8, 3), size=8),
    ]:
        out.append(CaseSpec(
            name=c.name, target="with_cnn(extract_grid_features)", args=["images"], const_kwargs={"size": c.size},
            inputs={"images": torch.randint(0, 256, c.images, generator=g, dtype=torch.uint8)},
            outputs=["features"], atol=1e-4, rtol=1e-4, variants=_variants(EXTRACT_BUGS, _extract_bug, with_cnn),
            public=c.public, hint="eval mode, no_grad; permute to (B, 3, H, W), / 255, bilinear antialiased resize, "
                                  "(x - mean) / std; (B, C, h, w) -> (B, h*w, C)."))
    for c in [
        FeatureCase(name="features/rgba_images", images=(2, 16, 16, 4), size=16),
        FeatureCase(name="features/grayscale_images", images=(2, 16, 16), size=16),
    ]:
        out.append(CaseSpec(
            name=c.name, target="with_cnn(extract_grid_features)", args=["images"], const_kwargs={"size": c.size},
            inputs={"images": torch.randint(0, 256, c.images, generator=g, dtype=torch.uint8)}, outputs=["features"],
            public=c.public,
            properties=[["raises", "ValueError", f"naming the shape of images {c.images}, not (B, H, W, 3)"]]))
    return out


# ---- validation_loss(model, loss_fn, batches) -------------------------------------------------------------


def _validation_bug(kind):
    def validation(model, loss_fn, batches):
        was = model.training
        if kind != "train_mode":
            model.eval()
        ctx = torch.enable_grad() if kind == "grad_enabled" else torch.no_grad()
        with ctx:
            losses = [loss_fn(model, f, c).item() for f, c in batches]
        if kind == "train_after":
            model.train()
        elif kind != "mode_not_restored":
            model.train(was)
        if kind == "summed":
            return sum(losses)
        if kind == "last_batch":
            return losses[-1]
        if kind == "weighted_by_size":
            sizes = [len(f) for f, _ in batches]
            return sum(n * x for n, x in zip(sizes, losses)) / sum(sizes)
        return sum(losses) / len(losses)
    return validation


VALIDATION_BUGS = {
    "train_mode": "the validation loss is measured in train mode (dropout on): call model.eval() first.",
    "grad_enabled": "the validation loss is computed with gradients on: wrap it in torch.no_grad().",
    "mode_not_restored": "the model stays in eval mode afterwards, so training would go on without dropout: "
                         "restore model.train(was_training).",
    "train_after": "the model is put in train mode afterwards, though it came in eval mode: restore the mode it "
                   "came in with, model.train(was_training).",
    "summed": "the batches' losses are summed: return their mean.",
    "last_batch": "only the last batch's loss is returned: average over all the batches.",
    "weighted_by_size": "the mean is weighted by batch size: each batch counts once (the mean of the batches' "
                        "losses).",
}


@dataclass(frozen=True, kw_only=True)
class ValidationCase(Row):
    """validation_loss(model, loss_fn, batches) on the toy model, over batches of these sizes."""
    sizes: list[int]
    handed_over_training: bool = True  # the mode the model is in when validation_loss gets it


def validation_cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(11)
    out = []
    for c in [
        ValidationCase(name="validation/basic", sizes=[2, 2, 2], public=True),
        ValidationCase(name="validation/uneven_batches", sizes=[3, 1, 2]),
        ValidationCase(name="validation/one_batch", sizes=[3]),
        ValidationCase(name="validation/handed_over_in_eval_mode", sizes=[2, 3], handed_over_training=False),
    ]:
        out.append(CaseSpec(
            name=c.name, target="with_batches(validation_loss)", kind="module", init=_toy(9, 4, hidden=8, max_len=16),
            args=["features", "captions"],
            const_kwargs={"sizes": c.sizes, **({} if c.handed_over_training else {"handed_over_training": False})},
            inputs=_toy_batch(_random_lengths(sum(c.sizes), g), g), outputs=["loss_and_modes"], atol=1e-5,
            variants=_variants(VALIDATION_BUGS, _validation_bug, with_batches), public=c.public,
            hint="[loss, share of calls in train mode, share with gradients, in train mode afterwards]: "
                 "model.eval(); torch.no_grad(); mean of the batches' losses; model.train(was)."))
    return out


# ---- fit(model, loss_fn, optimizer, loader, plan, val_batches, val_every, step_fn, val_fn, device) --------


def _fit_bug(kind):
    def fit(model, loss_fn, optimizer, loader, plan, val_batches, val_every, step_fn, val_fn, device):
        history = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": []}
        first_epoch = list(loader) if kind == "first_epoch_reused" else None
        batches, first_lr = iter(loader), None

        def validate(done, features, captions, lr):
            measured = [(features, captions)] if kind == "validates_on_training_batch" else val_batches
            history["val_step"].append(done - 1 if kind == "val_step_zero_based" else done)
            history["val_loss"].append(val_fn(model, loss_fn, measured))
            if kind == "trains_on_validation":
                for f, c in val_batches:
                    step_fn(model, loss_fn, optimizer, f.to(device), c.to(device), lr)

        for step, lr in plan:
            if kind == "first_batch_only":
                batch = next(iter(loader))
            elif kind == "first_epoch_reused":
                batch = first_epoch[step % len(first_epoch)]
            else:
                batch = next(batches, None)
                if batch is None:
                    if kind == "one_epoch":
                        break
                    batches = iter(loader)
                    batch = next(batches)
            first_lr = lr if first_lr is None else first_lr
            features, captions = (t.to(device) for t in batch)
            loss = step_fn(model, loss_fn, optimizer, features, captions, first_lr if kind == "lr_of_first_step" else lr)
            history["step"].append(step + 1)
            history["loss"].append(loss)
            history["lr"].append(lr)
            due = step % val_every == 0 if kind == "validates_after_first_step" else (step + 1) % val_every == 0
            if due:
                validate(step + 1, features, captions, lr)
        if kind != "no_final_validation" and history["step"] and history["val_step"][-1:] != history["step"][-1:]:
            validate(history["step"][-1], features, captions, lr)
        return history
    return fit


FIT_BUGS = {
    "one_epoch": "training stops when the loader runs out: start a new epoch (batches = iter(loader)) and go on "
                 "until the plan ends.",
    "first_batch_only": "every step trains on the loader's first batch (next(iter(loader)) starts a new epoch each "
                        "time): keep one iterator and draw the next batch from it.",
    "first_epoch_reused": "every epoch repeats the first epoch's batches in the same order: start each epoch with a "
                          "new iter(loader), so that a shuffling loader draws a new order.",
    "lr_of_first_step": "every step uses the first step's learning rate: pass each step's lr from the plan to step_fn.",
    "validates_on_training_batch": "the validation loss is measured on the training batch: measure it on val_batches.",
    "trains_on_validation": "the model also trains on the validation batches, so the validation loss no longer "
                            "measures held-out data: val_batches only go to val_fn, never to step_fn.",
    "validates_after_first_step": "the validation loss is measured after steps 1, 1 + val_every, ...: measure it "
                                  "after every val_every steps, when (step + 1) % val_every == 0.",
    "no_final_validation": "there is no validation after the last step: when the run does not end on a multiple "
                           "of val_every, measure once more at the end.",
    "val_step_zero_based": "val_step records the 0-based index of the step: record the number of steps done "
                           "(step + 1), as history['step'] does.",
}


@dataclass(frozen=True, kw_only=True)
class FitCase(Row):
    """fit(...) on the toy model for `steps` steps over a stand-in loader whose order changes each epoch."""
    sizes: list[int]  # the batch sizes of one epoch
    val_rows: int  # captions in the validation batches
    steps: int
    val_every: int


def fit_cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(1212)
    out = []
    for c in [
        FitCase(name="fit/basic", sizes=[2, 2, 2], val_rows=3, steps=7, val_every=3, public=True),
        FitCase(name="fit/whole_epochs", sizes=[3, 2], val_rows=2, steps=6, val_every=2),
        FitCase(name="fit/validate_once", sizes=[2, 3, 1], val_rows=3, steps=4, val_every=10),
        FitCase(name="fit/every_step", sizes=[4, 2], val_rows=2, steps=3, val_every=1),
    ]:
        lengths = _random_lengths(sum(c.sizes) + c.val_rows, g)
        lrs = [round(float(x), 4) for x in 0.05 + 0.4 * torch.rand(c.steps, generator=g)]
        out.append(CaseSpec(
            name=c.name, target="with_loader(fit)", kind="module", init=_toy(9, 4, hidden=8, max_len=16),
            args=["features", "captions"], const_kwargs={"sizes": c.sizes, "lrs": lrs, "val_every": c.val_every},
            inputs=_toy_batch(lengths, g),
            outputs=["steps", "losses", "lrs", "val_steps", "val_losses", "parameters"], atol=1e-5, rtol=1e-4,
            variants=_variants(FIT_BUGS, _fit_bug, with_loader), public=c.public,
            hint="for step, lr in plan: next batch (a new iter(loader) when it runs out); loss = step_fn(...); "
                 "record; validate when (step + 1) % val_every == 0, and after the last step.",
            forbid=["starter.training.train"]))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
