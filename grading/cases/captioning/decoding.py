"""Cases of the decoders: `greedy_decode` (notebook 05), `beam_search` and `sample_decode` (notebook 06), with their
known bugs and the worked beam example."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grading.cases.captioning.common import _seeded, _toy, _variants
from grading.references import CaseSpec, Row, build_case, randn
from starter.layers import with_bigram, with_model, with_sampler

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
    return finished_captions(torch.stack(outs, 1), start_idx, end_idx, null_idx,
                             bug="no_null_after_end" if bug == "start_only_raw" else bug)


def finished_captions(out, start_idx, end_idx, null_idx, bug=None):
    """The words a greedy decoder chose at each step, (B, max_len), as it returns them: null_idx after the first
    <END>; or as one of the known bugs of that last part of the task (`bug`) returns them."""
    if bug == "no_null_after_end":
        return out
    ended = (out == end_idx).long().cumsum(1)
    after = (ended - (out == end_idx).long()) > 0  # strictly after the first <END>
    out = out.masked_fill(after, null_idx)
    if bug == "end_dropped":
        out = out.masked_fill(out == end_idx, null_idx)
    if bug == "includes_start":
        out = torch.cat([torch.full((out.shape[0], 1), start_idx, dtype=torch.long), out[:, :-1]], 1)
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
        if bug == "end_dropped":
            best = [w for w in best if w != end_idx]
        out[b, :len(best)] = torch.tensor(best, dtype=torch.long)
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
    "end_dropped": "the captions are the right ones without their <END>: keep it in the output, then null_idx.",
}


def _beam_bug(kind):
    def search(model, features, beam_width, max_len, start_idx=1, end_idx=2, null_idx=0, length_penalty=0.7):
        return _beam(model, features, beam_width, max_len, start_idx, end_idx, null_idx, length_penalty, bug=kind)
    return search


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


def _decoding_toy(vocab: int, feature_dim: int, null_idx: int, start_idx: int) -> dict:
    """The toy model of a decoding case: it gives <NULL> and <START> no probability, so that a decoder that never
    writes them (common practice, and allowed by the text) and one that takes whatever ranks highest agree."""
    return {**_toy(vocab, feature_dim), "unsaid": [null_idx, start_idx]}


def _greedy_spec(c: GreedyCase, g: torch.Generator, ns: dict) -> CaseSpec:
    spec = CaseSpec(
        name=c.name, target="with_model(greedy_decode)", kind="module",
        init=_decoding_toy(c.vocab, c.feature_dim, c.null_idx, c.start_idx),
        args=["features"],
        const_kwargs={"max_len": c.max_len, "start_idx": c.start_idx, "end_idx": c.end_idx, "null_idx": c.null_idx},
        inputs={"features": randn(c.batch, c.regions, c.feature_dim, g=g, dtype=c.dtype) * 3}, outputs=["tokens"],
        variants=_variants(GREEDY_BUGS, _greedy_bug, with_model), public=c.public,
        hint="start from <START>; each step append argmax of the last position's logits; <END> kept, "
             "null_idx after it.")

    def ok(exp):
        pos = [row.index(c.end_idx) if c.end_idx in row else None for row in exp["tokens"].tolist()]
        if c.want == "all_early":  # and not all at once: one caption has a word before its <END>
            wanted = all(p is not None and p < c.max_len // 2 for p in pos) and any(p for p in pos)
        elif c.want == "ends":
            wanted = pos[0] is not None and pos[0] >= 2
        else:
            wanted = sum(p is not None for p in pos) >= 2 and None in pos and len(set(pos)) >= 3
        return wanted and (not c.told_apart or set(c.told_apart) <= _distinct_bugs(spec, ns))

    return _seeded(spec, ns, ok)


def _beam_spec(c: BeamCase, g: torch.Generator, ns: dict) -> CaseSpec:
    spec = CaseSpec(
        name=c.name, target="with_model(beam_search)", kind="module",
        init=_decoding_toy(c.vocab, c.feature_dim, c.null_idx, c.start_idx),
        args=["features"],
        const_kwargs={"beam_width": c.beam_width, "max_len": c.max_len, "start_idx": c.start_idx,
                      "end_idx": c.end_idx, "null_idx": c.null_idx, "length_penalty": c.length_penalty},
        inputs={"features": randn(c.batch, c.regions, c.feature_dim, g=g) * 3}, outputs=["tokens"],
        variants=_variants(BEAM_BUGS, _beam_bug, with_model), public=c.public,
        hint="keep the best (beam_width - finished) of all hypotheses x words at each step; "
             "rank finished hypotheses by sum(log p) / length ** length_penalty, the length counting <END>.")

    def ok(exp):  # a caption ends, and (beam_width > 1) beam search finds other captions than greedy decoding;
        toks = torch.from_numpy(exp["tokens"])  # and each known bug of c.want gives an output of its own
        if (toks[:, 0] == c.end_idx).all():  # a bare <END> for every image tells too few bugs apart
            return False
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


# ---- sample_decode --------------------------------------------------------------------------------------

@torch.no_grad()
def _sample(model, features, max_len, temperature=1.0, generator=None, start_idx=1, end_idx=2, null_idx=0, *,
            bug=None):
    """Sampling as notebook 06 states it: at each step the next word of every caption, finished or not, is drawn
    by one torch.multinomial call over the batch from softmax(last logits / temperature)."""
    B = features.shape[0]
    seq = torch.full((B, 1), 1 if bug == "start_ignored" else start_idx, dtype=torch.long)
    out = torch.full((B, max_len), null_idx, dtype=torch.long)
    ended = torch.zeros(B, dtype=torch.bool)
    for t in range(max_len):
        logits = model(features, seq)[:, -1].float()
        scaled = {"temperature_multiplied": logits * temperature, "no_temperature": logits}.get(bug, logits / temperature)
        probs = F.softmax(scaled, -1)
        if bug == "argmax":
            nxt = probs.argmax(-1)
        elif bug == "unfinished_only":
            nxt = torch.full((B,), null_idx, dtype=torch.long)
            if (~ended).any():
                nxt[~ended] = torch.multinomial(probs[~ended], 1, generator=generator)[:, 0]
        else:
            nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
        if bug != "no_null_after_end":
            nxt = nxt.masked_fill(ended, null_idx)
        out[:, t] = nxt
        ended = ended | (nxt == end_idx)
        seq = torch.cat([seq, nxt[:, None]], 1)
    if bug == "end_dropped":
        out = out.masked_fill(out == end_idx, null_idx)
    return out


SAMPLE_BUGS = {
    "argmax": "the captions are the greedy ones (the most likely word at every step): draw each word with "
              "torch.multinomial from the probabilities instead of taking their argmax.",
    "temperature_multiplied": "the captions are those drawn from softmax(logits * temperature): divide the logits "
                              "by the temperature (a low temperature must sharpen the distribution).",
    "no_temperature": "the captions are those drawn at temperature 1 whatever the temperature: divide the logits by "
                      "`temperature` before the softmax.",
    "unfinished_only": "the captions are those of a decoder that draws words only for the captions still running: "
                       "the text's rule draws for every caption at every step, finished ones too (their draw is "
                       "replaced by null_idx), so that the same generator gives the same captions.",
    "no_null_after_end": "words after <END> must be null_idx: once a caption has produced <END> it is finished.",
    "end_dropped": "the <END> token is missing from the output: keep it, then null_idx after it.",
    "start_ignored": "the captions are those a decoder gives when it starts from index 1, not from start_idx: "
                     "check that every caption begins with the start_idx you are given.",
}


def _sample_bug(kind):
    def decode(model, features, max_len, temperature=1.0, generator=None, start_idx=1, end_idx=2, null_idx=0):
        return _sample(model, features, max_len, temperature, generator, start_idx, end_idx, null_idx, bug=kind)
    return decode


@dataclass(frozen=True, kw_only=True)
class SampleCase(Row):
    """sample_decode(model, features (B, R, D), max_len, temperature, generator, ...) on the toy model; the
    generator is torch.Generator().manual_seed(seed) (starter.layers.with_sampler)."""
    batch: int  # B
    regions: int  # R
    feature_dim: int  # D
    vocab: int  # V
    max_len: int
    temperature: float = 1.0
    seed: int = 0  # the generator's
    start_idx: int = 1
    end_idx: int = 2
    null_idx: int = 0
    # known bugs (SAMPLE_BUGS) the case must tell apart: the model's seed is drawn until each gives captions of its own
    want: tuple[str, ...] = ()


def _sample_spec(c: SampleCase, g: torch.Generator, ns: dict) -> CaseSpec:
    spec = CaseSpec(
        name=c.name, target="with_sampler(sample_decode)", kind="module",
        init=_decoding_toy(c.vocab, c.feature_dim, c.null_idx, c.start_idx),
        args=["features"],
        const_kwargs={"seed": c.seed, "max_len": c.max_len, "temperature": c.temperature, "start_idx": c.start_idx,
                      "end_idx": c.end_idx, "null_idx": c.null_idx},
        inputs={"features": randn(c.batch, c.regions, c.feature_dim, g=g) * 3}, outputs=["tokens"],
        variants=_variants(SAMPLE_BUGS, _sample_bug, with_sampler), public=c.public,
        hint="at each step softmax(last logits / temperature) for every caption, finished ones too, and one "
             "torch.multinomial(probs, 1, generator=generator) call for the batch; <END> kept, null_idx after it.")

    def ok(exp):  # some captions end at different steps, not every caption is a bare <END>, and c.want told apart
        pos = [row.index(c.end_idx) if c.end_idx in row else None for row in exp["tokens"].tolist()]
        ends = [p for p in pos if p is not None]
        return len(set(ends)) >= 2 and any(p > 0 for p in ends) and set(c.want) <= _distinct_bugs(spec, ns)

    return _seeded(spec, ns, ok)


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



def _greedy_on(spec, ns):
    """The greedy output of the toy model of `spec` (to choose beam cases where beam search matters)."""
    kw = {k: spec.const_kwargs[k] for k in ("max_len", "start_idx", "end_idx", "null_idx")}
    greedy = dataclasses.replace(spec, const_kwargs=kw, variants={}, grad_wrt=[])
    greedy.target = "_greedy_probe"
    ns["_greedy_probe"] = with_model(lambda model, features, **kws: _greedy(model, features, **kws))
    return torch.from_numpy(build_case(greedy, ns).expected["tokens"])
