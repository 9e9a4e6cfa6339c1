"""Cases of notebook 04's model: `CaptioningTransformer.forward`, `caption_loss` and `teacher_forcing_loss`,
with their known bugs."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grading.cases.captioning.common import _captions, _toy, _variants
from grading.references import CaseSpec, Row, randn, with_forward
from starter.layers import with_attention, with_model

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
    "no_causal_mask": ("causal mask missing: pass every layer a causal tgt_mask (notebook 01's causal_mask(T), True on and "
                       "below the diagonal), or each word sees the word it must predict.", dict(mask="none")),
    "mask_plus_one": ("causal mask off by one: it lets position t see word t+1; position t may attend to 0..t "
                      "(.tril(), diagonal 0).", dict(mask="plus_one")),
    "mask_strict": ("causal mask wrong: a row of it allows no key at all (the first word's, when position t may not "
                    "attend to itself; the last word's, when the mask is inverted), and a softmax over no key is NaN. "
                    "Position t attends to 0..t, itself included, and tgt_mask is True where attention is ALLOWED.",
                    dict(mask="strict")),
    "mask_inverted": ("causal mask inverted: our tgt_mask is True where attention is ALLOWED (the lower triangle).",
                      dict(mask="inverted")),
    "mask_upper": ("causal mask is the upper triangle: tgt_mask is True where attention is ALLOWED, i.e. on and "
                   "below the diagonal.", dict(mask="upper")),
    "no_projection": ("features not projected: the memory tokens are the projected features (d_model wide) plus the region embeddings.",
                      dict(project=False)),
    "no_region_embedding": ("region position embedding missing: each memory token also carries the embedding of its "
                            "region's index, or the model can't tell where a region is.", dict(region=False)),
    "no_positional_encoding": ("positional encoding missing: x = pos_encoding(word_embed(captions)).",
                               dict(pos=False)),
    "no_final_norm": ("final LayerNorm missing: logits = vocab_head(final_norm(x)) after the pre-norm stack.",
                      dict(final_norm=False)),
    "scaled_embedding": ("word embeddings multiplied by sqrt(d_model): this model uses them as they are.",
                         dict(scale=True)),
    "log_softmax": ("forward returns (log-)probabilities: return the raw logits of vocab_head, the loss applies "
                    "the softmax.", dict(softmax=True)),
}


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
    "no_shift": "inputs and targets are the same words: position t must predict word t+1, so the inputs leave "
                "out the last word and the targets the first (the table of the text).",
    "swapped": "inputs and targets swapped: the inputs start at <START>, the targets one word later.",
    "targets_not_shifted": "targets not shifted: the targets are one word ahead of the inputs.",
    "padding_counted": "the loss counts the padding: return caption_loss(logits, targets, null_idx) (make "
                       "caption_loss pass its check first).",
}


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
        hint="the memory (projected features plus region embeddings), the words (embeddings plus positions), the "
             "layers under a causal mask, the final LayerNorm and the vocabulary head, as the task lists them.")


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
        hint="the model run on every word but the last, its logits scored by your caption_loss against every word "
             "but the first (the table of the text), null_idx ignored.")
