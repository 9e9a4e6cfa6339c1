"""Reference cases of notebook 10 (a cache of keys and values, and attention in blocks).

Every task runs on stored inputs and stand-ins: `attend_with_cache` on tensors fed in pieces
(`starter.fast.in_steps`), `decode_step` on `starter.fast.CaptionerWeights` (the model's weights under the names of
notebooks 02, 03 and 05, no forward) through `stepwise`, `cached_greedy_decode` on the toy model's own cached step
(`with_toy_steps`), `blockwise_attention` on tensors under a limit on the largest tensor it may make. Variants are
known bugs written here from the task text, independently of the solution; each is a full-sequence computation
with the mask or positions the bug amounts to.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grading.cases.captioning.common import _seeded
from grading.cases.captioning.decoding import GREEDY_BUGS, _decoding_toy, finished_captions
from grading.references import CaseSpec, Row, randn
from starter.compare import HELD_AT_MOST, READY_MADE_ATTENTION, READY_MADE_SOFTMAX
from starter.fast import in_steps, stepwise, with_toy_steps

# ---- attend_with_cache, fed in pieces ---------------------------------------------------------------------


def _pieces(steps):
    """piece index of each position, and the first position of each piece."""
    owner, first = [], []
    for p, n in enumerate(steps):
        first.append(sum(steps[:p]))
        owner += [p] * n
    return torch.tensor(owner), torch.tensor(first)


def _visible(steps, bug=None):
    """(T, T) bool: which keys each position attends to, for the right cache or a known bug of one."""
    T = sum(steps)
    owner, _ = _pieces(steps)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    same = owner[:, None] == owner[None, :]
    if bug == "no_causal_in_piece":  # the cache, plus every position of its own piece, later ones too
        return (j < i) | same
    if bug == "own_key_excluded":
        return j < i
    if bug == "cache_ignored":  # each piece on its own
        return same & (j <= i)
    if bug == "cache_not_extended":  # the cache stays what the first call made
        return (j <= i) & (same | (owner[None, :] == 0))
    return j <= i


def _softmax_rows(scores, empty_rows_zero):
    """softmax over the keys; a query with no key left gets NaN (a softmax written out) or, with
    `empty_rows_zero`, zeros (what F.scaled_dot_product_attention gives it)."""
    weights = scores.softmax(-1)
    return weights.nan_to_num(0.0) if empty_rows_zero else weights


def _attend(q, k, v, steps, bug=None):
    scale = 1.0 if bug == "no_scale" else 1 / math.sqrt(q.shape[-1])
    zeros = bug == "own_key_excluded_zeros"
    bug = "own_key_excluded" if zeros else bug
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~_visible(steps, bug), -math.inf)
    out = _softmax_rows(scores, zeros) @ v
    keys, values = k, v
    if bug == "cache_not_extended":
        keys, values = k[..., :steps[0], :], v[..., :steps[0], :]
    elif bug == "cache_ignored":
        keys, values = k[..., -steps[-1]:, :], v[..., -steps[-1]:, :]
    return out, keys, values


CACHE_BUGS = {
    "no_scale": "the scores are not divided by sqrt(d_k): scale q @ k^T by 1 / sqrt(d_k) as in notebook 01.",
    "own_key_excluded": "each new position does not attend to its own key: position s + i may attend to positions "
                        "0 .. s + i, itself included (append the new keys before attending).",
    "own_key_excluded_zeros": "each new position does not attend to its own key: position s + i may attend to "
                              "positions 0 .. s + i, itself included (append the new keys before attending).",
    "no_causal_in_piece": "new positions of one call see each other's later keys: within a call, new position i may "
                          "attend to the cached keys and the new ones up to itself, not after.",
    "cache_ignored": "the output does not use the cached keys and values: attend over the cached ones followed by "
                     "the new ones.",
    "cache_not_extended": "the cache returned does not grow: return the cached keys and values with the new ones "
                          "appended along the position axis (..., s + n, d).",
}


def _cache_variants():
    return {k: (m, lambda ns, k=k: lambda q, kk, v, steps: _attend(q, kk, v, steps, bug=k))
            for k, m in CACHE_BUGS.items()}


@dataclass(frozen=True, kw_only=True)
class CacheCase(Row):
    """in_steps(attend_with_cache)(q, k, v, steps)."""
    shape: tuple[int, ...]  # of q and k, (..., T, d_k)
    steps: tuple[int, ...]
    d_v: int | None = None
    dtype: torch.dtype = torch.float32


def _cache_spec(c: CacheCase, g: torch.Generator) -> CaseSpec:
    v_shape = (*c.shape[:-1], c.d_v or c.shape[-1])
    return CaseSpec(
        name=c.name, target="in_steps(attend_with_cache)", args=["q", "k", "v"], const_args=[list(c.steps)],
        inputs={"q": randn(*c.shape, g=g, dtype=c.dtype), "k": randn(*c.shape, g=g, dtype=c.dtype),
                "v": randn(*v_shape, g=g, dtype=c.dtype)},
        outputs=["out", "keys", "values"], variants=_cache_variants(), public=c.public,
        hint=f"fed in pieces of {list(c.steps)} positions: the outputs side by side must be causal attention over "
             "the whole sequence, and the last cache all its keys and values.")


# ---- decode_step, fed in pieces -------------------------------------------------------------------------


def _heads(x, h):
    return x.unflatten(-1, (h, -1)).transpose(1, 2)


def _mha(attn, query, key, value, visible=None, empty_rows_zero=False):
    q, k, v = (_heads(p(x), attn.num_heads) for p, x in ((attn.q_proj, query), (attn.k_proj, key),
                                                          (attn.v_proj, value)))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if visible is not None:
        scores = scores.masked_fill(~visible, -math.inf)
    return attn.out_proj((_softmax_rows(scores, empty_rows_zero) @ v).transpose(1, 2).flatten(2))


@torch.no_grad()
def _decode(model, features, captions, steps, bug=None):
    """The logits a decode_step with `bug` gives when `captions` are fed in `steps`, computed over the whole
    sequence at once with the keys each position then sees and the position it is then given."""
    T = captions.shape[1]
    zeros = bug == "own_key_excluded_zeros"
    bug = "own_key_excluded" if zeros else bug
    owner, first = _pieces(steps)
    positions = torch.arange(T) - first[owner] if bug == "positions_from_zero" else torch.arange(T)
    memory = model.feature_proj(features)
    if bug != "memory_without_regions":
        memory = memory + model.region_embed.weight[:features.shape[1]]
    x = model.word_embed(captions) + model.pos_encoding.pe[positions].to(features.dtype)
    visible = _visible(steps, None if bug == "positions_from_zero" or bug == "memory_without_regions" else bug)
    for layer in model.decoder_layers:
        h = layer.norm1(x)
        x = x + _mha(layer.self_attn, h, h, h, visible, zeros)
        h = layer.norm2(x)
        x = x + _mha(layer.cross_attn, h, memory, memory)
        x = x + layer.linear2(torch.relu(layer.linear1(layer.norm3(x))))
    return model.vocab_head(model.final_norm(x))


STEP_BUGS = {
    "positions_from_zero": "each call's words get the position vectors of positions 0, 1, ...: the words of a call "
                           "are at positions s .. s + n - 1, s being the number of words the cache has seen.",
    "own_key_excluded": CACHE_BUGS["own_key_excluded"],
    "own_key_excluded_zeros": CACHE_BUGS["own_key_excluded"],
    "no_causal_in_piece": CACHE_BUGS["no_causal_in_piece"],
    "cache_ignored": "the logits of a call do not depend on the earlier words: each layer's self-attention must "
                     "attend over the cached keys and values too.",
    "cache_not_extended": "the logits are right for the first call only: the cache returned must hold every word's "
                          "keys and values so far, the new ones appended.",
    "memory_without_regions": "the image memory lacks the region embeddings: it is the projected features plus "
                              "the embedding of each region's index, as in your forward.",
}


def _step_variants():
    def make(bug):
        class Buggy(torch.nn.Module):  # the stand-in's parameters under the adapter's names, with the bug's forward
            def __init__(self, **init):
                super().__init__()
                from starter.fast import CaptionerWeights
                self.model = CaptionerWeights(**init)

            def forward(self, features, captions, steps):
                return _decode(self.model, features, captions, steps, bug)
        return Buggy
    return {k: (m, lambda ns, k=k: make(k)) for k, m in STEP_BUGS.items()}


@dataclass(frozen=True, kw_only=True)
class StepCase(Row):
    """stepwise(decode_step)(features (B, R, D), captions (B, T), steps) on CaptionerWeights."""
    batch: int
    regions: int
    steps: tuple[int, ...]
    layers: int = 2
    d_model: int = 8
    heads: int = 2
    vocab: int = 9
    feature_dim: int = 5
    max_len: int = 12
    dtype: torch.dtype = torch.float32


def _step_spec(c: StepCase, g: torch.Generator) -> CaseSpec:
    T = sum(c.steps)
    return CaseSpec(
        name=c.name, target="stepwise(decode_step)", kind="module",
        init={"vocab_size": c.vocab, "feature_dim": c.feature_dim, "num_regions": c.regions, "d_model": c.d_model,
              "num_heads": c.heads, "num_layers": c.layers, "dim_feedforward": 2 * c.d_model, "max_len": c.max_len},
        args=["features", "captions"], const_args=[list(c.steps)],
        inputs={"features": randn(c.batch, c.regions, c.feature_dim, g=g, dtype=c.dtype),
                "captions": torch.randint(c.vocab, (c.batch, T), generator=g)},
        outputs=["logits"], variants=_step_variants(), public=c.public,
        hint=f"the caption fed in pieces of {list(c.steps)} words must give the logits your forward gives the "
             "whole caption.")


# ---- cached_greedy_decode on the toy model's cached step -------------------------------------------------


@torch.no_grad()
def _cached_greedy(model, features, max_len, start_idx=1, end_idx=2, null_idx=0, step=None, *, bug=None):
    B = features.shape[0]
    words = torch.full((B, 1), 1 if bug == "start_ignored" else start_idx, dtype=torch.long)
    cache, outs = None, []
    for _ in range(max_len):
        logits, cache = step(model, features, words, cache)
        words = logits[:, -1].argmax(-1, keepdim=True)
        outs.append(words[:, 0])
    return finished_captions(torch.stack(outs, 1), start_idx, end_idx, null_idx, bug)


# A cache not passed back, or a prefix fed again, is named by the check's adapter (starter.fast.with_toy_steps)
# before any caption is compared; what is left are the bugs of the captions' last part.
CACHED_GREEDY_BUGS = {k: GREEDY_BUGS[k] for k in ("no_null_after_end", "end_dropped", "includes_start", "start_ignored")}


def _cached_greedy_variants():
    def make(bug):
        def decode(model, features, max_len, start_idx=1, end_idx=2, null_idx=0, step=None):
            return _cached_greedy(model, features, max_len, start_idx, end_idx, null_idx, step, bug=bug)
        return with_toy_steps(decode)
    return {k: (m, lambda ns, k=k: make(k)) for k, m in CACHED_GREEDY_BUGS.items()}


@dataclass(frozen=True, kw_only=True)
class CachedGreedyCase(Row):
    batch: int
    regions: int
    feature_dim: int
    vocab: int
    max_len: int
    start_idx: int = 1
    end_idx: int = 2
    null_idx: int = 0
    want: str = "varied"  # as GreedyCase's: "varied", "ends", "all_early"


def _cached_greedy_spec(c: CachedGreedyCase, g: torch.Generator, ns: dict) -> CaseSpec:
    spec = CaseSpec(
        name=c.name, target="with_toy_steps(cached_greedy_decode)", kind="module",
        init=_decoding_toy(c.vocab, c.feature_dim, c.null_idx, c.start_idx), args=["features"],
        const_kwargs={"max_len": c.max_len, "start_idx": c.start_idx, "end_idx": c.end_idx, "null_idx": c.null_idx},
        inputs={"features": randn(c.batch, c.regions, c.feature_dim, g=g) * 3}, outputs=["tokens"],
        variants=_cached_greedy_variants(), public=c.public,
        hint="the first call feeds <START> with cache=None, each next one only the words just chosen with the cache "
             "the last call returned; <END> kept, null_idx after it.")

    def ok(exp):
        pos = [row.index(c.end_idx) if c.end_idx in row else None for row in exp["tokens"].tolist()]
        if c.want == "all_early":
            return all(p is not None and p < c.max_len // 2 for p in pos) and any(p for p in pos)
        if c.want == "ends":
            return pos[0] is not None and pos[0] >= 2
        return sum(p is not None for p in pos) >= 2 and None in pos and len(set(pos)) >= 3

    return _seeded(spec, ns, ok)


# ---- blockwise_attention -----------------------------------------------------------------------------------


def _blocks(q, k, v, block_size, causal=False, key_padding_mask=None, *, bug=None):
    """Attention in blocks of queries and keys with one deliberate deviation of the online softmax."""
    T_q, T_k = q.shape[-2], k.shape[-2]
    scale = 1.0 if bug == "no_scale" else 1 / math.sqrt(q.shape[-1])
    outs = []
    last = T_k - block_size + 1 if bug == "last_block_dropped" else T_k
    for i in range(0, T_q, block_size):
        qb = q[..., i:i + block_size, :]
        rows = torch.arange(i, i + qb.shape[-2])
        m = torch.full((*qb.shape[:-1], 1), -math.inf, dtype=q.dtype)
        total = torch.zeros(*qb.shape[:-1], 1, dtype=q.dtype)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=q.dtype)
        for j in range(0, max(last, 1), block_size):
            cols = torch.arange(j, min(j + block_size, T_k))
            s = qb @ k[..., j:j + block_size, :].transpose(-2, -1) * scale
            if causal:
                s = s.masked_fill(cols[None, :] > rows[:, None] - (1 if bug == "diagonal_excluded" else 0), -math.inf)
            if key_padding_mask is not None:
                pad = key_padding_mask[:, None, None, j:j + block_size]
                s = s.masked_fill(~pad if bug == "padding_inverted" else pad, -math.inf)
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            safe = new if bug == "unguarded" else new.masked_fill(new == -math.inf, 0.0)
            if bug == "no_running_max":
                w, factor = torch.exp(s), torch.ones_like(m)
            else:
                w, factor = torch.exp(s - safe), torch.exp(m - safe)
            if bug == "no_rescale":
                factor = torch.ones_like(factor)
            total = total * (1.0 if bug == "sum_not_rescaled" else factor) + w.sum(-1, keepdim=True)
            acc = acc * factor + w @ v[..., j:j + block_size, :]
            m = new
        outs.append(acc / total)
    return torch.cat(outs, -2)


BLOCK_BUGS = {
    "no_scale": "the scores are not divided by sqrt(d_k).",
    "no_running_max": "the exponentials are taken of the raw scores, which overflow when the scores are large: "
                      "subtract the running maximum before exponentiating (and rescale when it grows).",
    "no_rescale": "the running sums are not rescaled when a block raises the maximum: multiply both the sum and the "
                  "weighted sum by exp(m_old - m_new) before adding the new block.",
    "sum_not_rescaled": "the weighted sum is rescaled when the maximum grows but the sum of weights is not: rescale "
                        "both by exp(m_old - m_new).",
    "unguarded": "a query with no key in a block (padding at the start) gets NaN: while its running maximum is still "
                 "-inf, exp(-inf - (-inf)) is not a number; such a block must add nothing (shift by 0 there).",
    "diagonal_excluded": "with causal=True each query must also attend to its own key: query i sees keys 0 .. i.",
    "padding_inverted": "key_padding_mask is True at padding keys (which get no weight), not at the keys to keep.",
    "last_block_dropped": "the last, shorter block of keys is left out: when T is not a multiple of block_size the "
                          "last block holds the remaining keys.",
}


def _block_variants():
    return {k: (m, lambda ns, k=k: lambda *a, **kw: _blocks(*a, **kw, bug=k)) for k, m in BLOCK_BUGS.items()}


@dataclass(frozen=True, kw_only=True)
class BlockCase(Row):
    """blockwise_attention(q, k, v, block_size, causal, key_padding_mask)."""
    batch: int
    heads: int
    T_q: int
    block: int
    T_k: int | None = None
    d: int = 4
    d_v: int | None = None
    causal: bool = False
    padded: bool = False
    scale: float = 1.0  # of q and k: large scores where the running maximum matters
    pad_start: int = 0  # padding at the start of the first row (a first block with no key to attend to)
    dtype: torch.dtype = torch.float32
    atol: float = 1e-5


def _block_spec(c: BlockCase, g: torch.Generator) -> CaseSpec:
    T_k = c.T_k or c.T_q
    d_v = c.d_v or c.d
    inputs = {"q": randn(c.batch, c.heads, c.T_q, c.d, g=g, dtype=c.dtype) * c.scale,
              "k": randn(c.batch, c.heads, T_k, c.d, g=g, dtype=c.dtype) * c.scale,
              "v": randn(c.batch, c.heads, T_k, d_v, g=g, dtype=c.dtype)}
    kwargs = {}
    if c.padded:  # each row pads a random tail (its first key is never padding)
        keep = torch.randint(1, T_k + 1, (c.batch,), generator=g)
        keep[0] = T_k - 3
        pad = torch.arange(T_k)[None, :] >= keep[:, None]
        pad[0, :c.pad_start] = True
        inputs["pad"] = pad
        kwargs["key_padding_mask"] = "pad"
    def whole_blocks(T):  # a sequence padded to a whole number of blocks (a FlashAttention-style answer may pad)
        return -(-T // c.block) * c.block

    largest = max(c.batch * c.heads * max(whole_blocks(c.T_q), whole_blocks(T_k)) * max(c.d, d_v),
                  c.batch * c.heads * min(c.block, c.T_q) * min(c.block, T_k))
    return CaseSpec(
        name=c.name, target="blockwise_attention", args=["q", "k", "v"], const_args=[c.block],
        const_kwargs={"causal": c.causal}, kwargs=kwargs, inputs=inputs, outputs=["out"],
        variants=_block_variants(), public=c.public, atol=c.atol, rtol=1e-4,
        forbid=["torch.nn.functional.scaled_dot_product_attention", READY_MADE_ATTENTION, READY_MADE_SOFTMAX,
                f"{HELD_AT_MOST}{largest}"],
        hint=f"blocks of {c.block} queries x {c.block} keys; the result equals scaled dot-product attention"
             + (" with the causal mask" if c.causal else "") + (" with the padding keys blocked" if c.padded else "")
             + (". The scores here are in the hundreds: the exponential of a raw score overflows, so subtract the "
                "running maximum before exponentiating" if c.scale > 1 else "") + ".")


# ---- the table -------------------------------------------------------------------------------------------


def cases(ns: dict) -> list[CaseSpec]:
    ns["in_steps(attend_with_cache)"] = in_steps(ns["attend_with_cache"])
    ns["stepwise(decode_step)"] = stepwise(ns["decode_step"])
    ns["with_toy_steps(cached_greedy_decode)"] = with_toy_steps(ns["cached_greedy_decode"])
    g = torch.Generator().manual_seed(2041)
    out = [_cache_spec(c, g) for c in [
        CacheCase(name="cache/one_at_a_time", shape=(2, 5, 4), steps=(1, 1, 1, 1, 1), public=True),
        CacheCase(name="cache/prefill_then_steps", shape=(2, 3, 6, 8), steps=(3, 1, 1, 1), public=True),
        CacheCase(name="cache/heads_float64", shape=(2, 2, 5, 4), steps=(2, 1, 2), dtype=torch.float64),
        CacheCase(name="cache/uneven_pieces", shape=(3, 7, 4), steps=(1, 3, 2, 1)),
        CacheCase(name="cache/values_wider", shape=(2, 6, 4), steps=(2, 2, 2), d_v=7),
        CacheCase(name="cache/one_piece", shape=(2, 4, 6, 4), steps=(6,)),
    ]]
    out += [_step_spec(c, g) for c in [
        StepCase(name="step/one_word_at_a_time", batch=2, regions=3, steps=(1,) * 6, public=True),
        StepCase(name="step/prefill_then_steps", batch=2, regions=3, steps=(3, 1, 1, 1, 1), public=True),
        StepCase(name="step/one_call", batch=3, regions=4, steps=(5,)),
        StepCase(name="step/three_layers_uneven", batch=2, regions=3, steps=(2, 1, 3, 1), layers=3, heads=4),
        StepCase(name="step/one_region_float64", batch=2, regions=1, steps=(1, 2, 1, 2), dtype=torch.float64),
        StepCase(name="step/long_caption", batch=1, regions=2, steps=(4,) + (1,) * 26, max_len=40),
    ]]
    out += [_cached_greedy_spec(c, g, ns) for c in [
        CachedGreedyCase(name="cached_greedy/basic", batch=4, regions=3, feature_dim=5, vocab=8, max_len=7,
                         public=True),
        CachedGreedyCase(name="cached_greedy/one_image", batch=1, regions=2, feature_dim=4, vocab=9, max_len=6,
                         want="ends"),
        CachedGreedyCase(name="cached_greedy/all_end_early", batch=3, regions=3, feature_dim=4, vocab=6, max_len=12,
                         want="all_early", public=True),
        CachedGreedyCase(name="cached_greedy/other_special_tokens", batch=3, regions=2, feature_dim=6, vocab=9,
                         max_len=8, start_idx=4, end_idx=7, null_idx=5),
    ]]
    out += [_block_spec(c, g) for c in [
        BlockCase(name="blocks/basic", batch=1, heads=2, T_q=32, block=8, d_v=6, public=True),
        BlockCase(name="blocks/causal", batch=2, heads=1, T_q=24, block=8, causal=True, public=True),
        BlockCase(name="blocks/large_scores", batch=1, heads=1, T_q=20, block=8, scale=30.0, atol=1e-3, public=True),
        BlockCase(name="blocks/left_padding", batch=2, heads=1, T_q=20, block=8, padded=True, pad_start=9,
                  public=True),
        BlockCase(name="blocks/padding", batch=2, heads=2, T_q=24, block=8, padded=True),
        BlockCase(name="blocks/causal_uneven", batch=1, heads=2, T_q=29, block=8, causal=True),
        BlockCase(name="blocks/one_block", batch=2, heads=1, T_q=6, block=16),
        BlockCase(name="blocks/cross_lengths_float64", batch=2, heads=2, T_q=12, T_k=28, block=8, d_v=6,
                  padded=True, dtype=torch.float64, atol=1e-10),
        BlockCase(name="blocks/causal_padding_many_heads", batch=2, heads=4, T_q=24, block=8, causal=True,
                  padded=True),
        BlockCase(name="blocks/left_padding_heads", batch=2, heads=3, T_q=26, block=8, padded=True,
                  pad_start=11),
        BlockCase(name="blocks/large_scores_causal", batch=2, heads=1, T_q=27, block=8, causal=True, scale=30.0,
                  atol=1e-3),
    ]]
    return out
