"""What notebook 10 (a KV cache and attention in blocks) gives: a stand-in captioner with weights only, the
adapters its test cells wrap the answers in, and the measurement of the largest tensor a computation holds.

    from starter.fast import CaptionerWeights, stepwise, in_steps, with_captioner, largest_tensor

``CaptionerWeights`` declares the layers of notebook 05's ``CaptioningTransformer`` built with your own layers
(``layers="mine"``: the names of notebooks 02 and 03) and nothing else: nothing in it has a forward, so it solves
nothing; the checks load stored weights into it and run your ``decode_step`` and ``cached_greedy_decode`` on it.
"""
from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .compare import ReadOnlyModule, largest_held
from .layers import ToyCaptioner, with_model

__all__ = ["CaptionerWeights", "with_captioner", "stepwise", "in_steps", "toy_step", "with_toy_steps", "largest_tensor"]


class _AttentionWeights(nn.Module):
    """The layers of notebook 03's ``MultiHeadAttention``, under its names, with no forward."""

    def __init__(self, embed_dim, num_heads, dropout=0.0):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, *args, **kwargs):
        raise TypeError(_WEIGHTS_ONLY)


class _DecoderLayerWeights(nn.Module):
    """The layers of notebook 03's ``TransformerDecoderLayer``, under its names, with no forward."""

    def __init__(self, d_model, num_heads, dim_feedforward, dropout=0.1):
        super().__init__()
        self.self_attn = _AttentionWeights(d_model, num_heads, dropout)
        self.cross_attn = _AttentionWeights(d_model, num_heads, dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, *args, **kwargs):
        raise TypeError(_WEIGHTS_ONLY)


class _PositionTable(nn.Module):
    """A position table under the names of notebook 02's ``PositionalEncoding`` (``pe``, (max_len, d_model), a
    buffer; ``max_len``; ``dropout``), with no forward. Its rows are fixed random vectors, not the sinusoids: any
    table of one vector per position serves the checks."""

    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.dropout = nn.Dropout(dropout)
        table = torch.randn(max_len, d_model, generator=torch.Generator().manual_seed(max_len * 1000 + d_model))
        self.register_buffer("pe", table * 0.5, persistent=False)

    def forward(self, *args, **kwargs):
        raise TypeError(_WEIGHTS_ONLY)


_WEIGHTS_ONLY = ("this stand-in holds weights only: compute with its layers' weights (the nn.Linear and nn.LayerNorm "
                 "modules), not by calling a decoder layer, an attention module or the position table")


class CaptionerWeights(nn.Module):
    """The layers of notebook 05's ``CaptioningTransformer`` built with your own layers (``layers="mine"``), under the
    same names and shapes, with no forward anywhere: ``feature_proj``, ``region_embed``, ``word_embed``,
    ``pos_encoding`` (its buffer ``pe`` holds one vector per position), ``decoder_layers`` (each with ``self_attn``
    and ``cross_attn``, each of those with ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` and ``num_heads``;
    ``linear1``, ``linear2``, ``norm1``, ``norm2``, ``norm3``), ``final_norm`` and ``vocab_head``."""

    def __init__(self, vocab_size, feature_dim, num_regions, d_model=64, num_heads=4, num_layers=2,
                 dim_feedforward=256, max_len=32, dropout=0.1):
        super().__init__()
        self.feature_proj = nn.Linear(feature_dim, d_model)
        self.region_embed = nn.Embedding(num_regions, d_model)
        self.word_embed = nn.Embedding(vocab_size, d_model)
        self.pos_encoding = _PositionTable(d_model, max_len, dropout)
        self.decoder_layers = nn.ModuleList(
            [_DecoderLayerWeights(d_model, num_heads, dim_feedforward, dropout) for _ in range(num_layers)])
        self.final_norm = nn.LayerNorm(d_model)
        self.vocab_head = nn.Linear(d_model, vocab_size)

    def forward(self, *args, **kwargs):
        raise TypeError(_WEIGHTS_ONLY)


def toy_step(model, features, words, cache=None):
    """The decoding step of the stand-in ``starter.layers.ToyCaptioner``, with a cache: (logits (B, n, V) of the
    n new `words` (B, n), the cache after them). Its cache is what that model needs of the earlier words (the
    running sum of their context vectors and how many there were), not keys and values: it is not a Transformer.
    The logits equal those its forward gives the same positions of the whole sequence."""
    n = words.shape[1]
    total, count = (0, 0) if cache is None else cache
    context = model.context(words).cumsum(1) + (total[:, None] if count else 0)
    seen = torch.arange(count + 1, count + n + 1, device=words.device, dtype=features.dtype)[:, None]
    h = (model.token(words) + context / seen + model.position.weight[count:count + n]
         + model.image(features.mean(1))[:, None])
    logits = model.out(torch.tanh(h))
    if model.unsaid:
        logits = logits.index_fill(-1, torch.tensor(model.unsaid, device=logits.device), -1e4)
    return logits, (context[:, -1], count + n)


def with_toy_steps(decode_fn):
    """``decode_fn(model, features, max_len, ..., step=...)`` on a ``ToyCaptioner`` whose cached step is `toy_step`:
    ``check("cached_greedy/...", with_toy_steps(cached_greedy_decode))`` checks the decoding loop on its own,
    whatever your decode_step does."""
    fn = decode_fn

    def on_toy(model, features, **kwargs):
        if fn is None:
            raise TypeError("cached_greedy_decode is None: run the cell that defines it first")
        returned = []  # the cache the last call returned

        def step(m, f, words, cache=None):
            if words.shape[1] != 1:
                raise ValueError(f"step was fed {words.shape[1]} words per caption: with a cache, each call feeds "
                                 "one word per caption, <START> first, then only the word just chosen")
            if returned and (not isinstance(cache, (tuple, list)) or len(cache) != 2 or cache[1] != returned[-1][1]):
                raise ValueError("each call of step must get the cache the call before returned (the first call "
                                 "cache=None)")
            if not returned and cache is not None:
                raise ValueError("the first call of step gets cache=None")
            logits, new = toy_step(m, f, words, cache)
            returned.append(new)
            return logits, new

        return fn(model, features, step=step, **kwargs)

    on_toy.__name__ = getattr(decode_fn, "__name__", "cached_greedy_decode")
    return with_model(on_toy, ToyCaptioner)


def with_captioner(fn_of_model):
    """``with_model`` on a `CaptionerWeights`."""
    return with_model(fn_of_model, CaptionerWeights)


def stepwise(decode_step):
    """``decode_step(model, features, words, cache)`` as a module class over `CaptionerWeights`, for the checks: its
    forward(features (B, R, D), captions (B, T), steps) feeds the captions in consecutive pieces of ``steps[i]``
    words each (the first call with ``cache=None``, each next one with the cache the last returned) and returns
    the logits of every piece side by side, (B, T, V), in eval mode without gradients."""
    fn = decode_step

    class Stepwise(with_model(fn, CaptionerWeights)):
        def forward(self, features, captions, steps):
            if fn is None:
                raise TypeError("decode_step is None: run the cell that defines it first")
            if sum(steps) != captions.shape[1]:
                raise ValueError(f"the steps {steps} do not cover the {captions.shape[1]} words")
            pieces, cache, start, embedded = [], None, 0, []
            count = self.model.word_embed.register_forward_hook(lambda m, args, out: embedded.append(args[0].numel()))
            try:
                with torch.no_grad():
                    for n in steps:
                        logits, cache = fn(self.model, features, captions[:, start:start + n], cache)
                        pieces.append(logits)
                        start += n
            finally:
                count.remove()
            if sum(embedded) > captions.numel():
                raise ValueError(f"decode_step ran {sum(embedded)} word positions through the word embeddings for "
                                 f"{captions.numel()} words fed once each: with a cache, each call runs only its new "
                                 "words (the cache keeps what later words need of the earlier ones)")
            return torch.cat(pieces, dim=1)

    Stepwise.__name__ = Stepwise.__qualname__ = getattr(decode_step, "__name__", "decode_step")
    return Stepwise


def in_steps(attend_with_cache):
    """``attend_with_cache(q, k, v, cache)`` as a function of (q, k, v, steps), for the checks: the sequence's
    queries, keys and values go in in consecutive pieces of ``steps[i]`` positions (the first with
    ``cache=None``, each next one with the cache the last call returned); returns (the outputs of every piece
    side by side, the keys and the values of the last cache)."""
    fn = attend_with_cache

    def attend(q, k, v, steps):
        if fn is None:
            raise TypeError("attend_with_cache is None: run the cell that defines it first")
        if sum(steps) != q.shape[-2]:
            raise ValueError(f"the steps {steps} do not cover the {q.shape[-2]} positions")
        outs, cache, start = [], None, 0
        for n in steps:
            piece = slice(start, start + n)
            out, cache = fn(q[..., piece, :], k[..., piece, :], v[..., piece, :], cache)
            outs.append(out)
            start += n
        if not (isinstance(cache, (tuple, list)) and len(cache) == 2):
            raise TypeError(f"the cache must be a pair (keys, values), got {type(cache).__name__}")
        return torch.cat(outs, dim=-2), cache[0], cache[1]

    attend.__name__ = getattr(attend_with_cache, "__name__", "attend_with_cache")
    return attend


class _Largest(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.numbers = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.numbers = max(self.numbers, largest_held(out))
        return out


def largest_tensor(fn, *args, **kwargs):
    """(fn(*args, **kwargs), the most numbers any one tensor made during the call held): the storage of every
    operation's result, so a view counts what it shares and the inputs count only if copied. On any device."""
    mode = _Largest()
    with mode:
        result = fn(*args, **kwargs)
    return result, mode.numbers


if __name__ in sys.modules:
    sys.modules[__name__].__class__ = ReadOnlyModule
