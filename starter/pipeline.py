"""Notebooks 04-05: the data pipeline, training step and evaluation: the adapters its checks use, and the
switch that uses your version of a piece once its public check passes.

Each graded piece of the pipeline is checked on stored cases like every other task. Its inputs and
outputs are words, files, optimisers and score dictionaries rather than tensors, so an adapter turns
the task into a tensor function the checks can compare:

    check("features/basic", with_cnn(extract_grid_features))      # grid features of a stand-in CNN
    check("vocab/basic", with_probe_words(build_vocab))           # where each word landed in the list
    check("encode/basic", with_long_output(encode_captions))      # the encoded (M, T) tensor
    check("dataset/basic", with_h5_file(CaptionFeatures))         # every item of a file the check writes
    check("collate/basic", with_items(collate_captions))          # a batch padded from its items
    check("schedule/basic", over_steps(lr_at_step))               # the learning rate at many steps
    check("optimizer/basic", with_param_groups(make_optimizer))   # each parameter's group, weights after steps
    check("step/adamw", with_optimizer(train_step))               # losses and weights after a few steps
    check("validation/basic", with_batches(validation_loss))      # the loss, and the mode it ran in
    check("fit/basic", with_loader(fit))                          # the history and weights after a short run
    check("evaluate/basic", with_split(evaluate_captions))        # the scores of stored captions

    vocab_fn = yours_if_it_passes("build_vocab", build_vocab, instead="the dataset's stored vocabulary")

The kit has no version of these pieces (nothing students get solves a graded task). Where a piece does
not pass yet, the notebook goes on with stored data instead (the dataset's vocabulary, encoded captions
and features) or skips what needs it (training, the scores), and says so in one line.
"""
from __future__ import annotations

import os
import tempfile
import textwrap
from typing import Any

import h5py
import numpy as np
import torch
from torch import nn

from data.efficientnet_lite import MEAN as IMAGENET_MEAN  # the statistics the kit's backbone was trained with
from data.efficientnet_lite import STD as IMAGENET_STD

from .compare import load_case, observe, verdict
from .layers import ToyCaptioner, with_model, with_sampler

__all__ = ["with_cnn", "TinyCNN", "IMAGENET_MEAN", "IMAGENET_STD", "with_probe_words", "with_long_output",
           "with_h5_file", "with_items", "over_steps", "ParameterKinds", "with_param_groups", "with_optimizer",
           "with_batches", "with_loader", "with_split",
           "yours_if_it_passes", "SCORE_NAMES", "PUBLIC_CASES"]

SCORE_NAMES = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "CIDEr", "exact_match")
END = 2  # <END>


def _named(adapter, fn):
    adapter.__name__ = adapter.__qualname__ = getattr(fn, "__name__", "function")
    return adapter


def _require(fn):
    if fn is None:
        raise TypeError("the function is None: run the cell that defines it first")


# ---- data preparation --------------------------------------------------------------------------------


class TinyCNN(nn.Module):
    """The stand-in CNN of the feature-extraction checks: two stride-2 convolutions with a BatchNorm
    between them (so train and eval mode give different maps), (B, 3, S, S) -> (B, 5, S/4, S/4). Its
    weights come from a fixed seed: every check sees the same network."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(404)
        self.conv1 = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.norm = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 5, 3, stride=2, padding=1)
        with torch.no_grad():
            for t in (*self.parameters(), self.norm.running_mean):
                t.copy_(torch.randn(t.shape, generator=g) * 0.5)
            self.norm.running_var.copy_(torch.rand(6, generator=g) + 0.5)
            self.norm.weight.add_(1.0)

    def forward(self, x):
        return self.conv2(torch.relu(self.norm(self.conv1(x))))


def with_cnn(extract):
    """``extract(cnn, images, size)`` on the stand-in CNN, handed over in train mode (as a freshly built
    torchvision model is): (B, R, C) features, which must not record gradients."""
    def features(images, size):
        _require(extract)
        out = extract(TinyCNN().train(), images.clone(), size=size)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            raise TypeError("extract_grid_features returned features that record gradients (requires_grad=True): "
                            "run the CNN under torch.no_grad(), nothing is trained here")
        return out
    return _named(features, extract)


def with_probe_words(build_vocab):
    """``build_vocab(captions, min_count) -> list of words`` as a tensor function: (size: the list's
    length, positions: the index of each `probe` word in the list, -1 where it is missing)."""
    def probe_words(captions, min_count, probe):
        _require(build_vocab)
        words = build_vocab(list(captions), min_count)
        if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
            raise TypeError(f"build_vocab must return a list of strings, got {type(words).__name__}")
        index = {}
        for i, w in enumerate(words):
            index.setdefault(w, i)
        return (torch.tensor(len(words), dtype=torch.long),
                torch.tensor([index.get(w, -1) for w in probe], dtype=torch.long))
    return _named(probe_words, build_vocab)


def with_long_output(encode_captions):
    """``encode_captions(captions, word_to_idx, max_len)`` with its result as a tensor (a NumPy array is
    converted, keeping its dtype, so an int32 answer is reported as the wrong dtype)."""
    def encoded(captions, word_to_idx, max_len):
        _require(encode_captions)
        out = encode_captions(list(captions), dict(word_to_idx), max_len)
        return out if isinstance(out, torch.Tensor) else torch.as_tensor(np.asarray(out))
    return _named(encoded, encode_captions)


def with_h5_file(dataset_class):
    """``dataset_class(path, key, captions, image_idxs)`` over an HDF5 file this adapter writes from
    `features`; returns every item as (features (M, R, D), captions (M, T) padded with -1, lengths (M,))."""
    def items(features, captions, image_idxs):
        _require(dataset_class)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "features.h5")
            with h5py.File(path, "w") as f:
                f.create_dataset("train/features", data=features.numpy().astype(np.float16),
                                 chunks=(1, *features.shape[1:]))
            data = dataset_class(path, "train/features", captions.clone(), image_idxs.clone())
            if len(data) != len(captions):
                raise ValueError(f"len(dataset) is {len(data)}, expected {len(captions)} (one item per caption)")
            feats, caps, lengths = [], torch.full(captions.shape, -1, dtype=torch.long), []
            for i in range(len(data)):
                item = data[i]
                if not (isinstance(item, tuple) and len(item) == 2):
                    raise TypeError("an item must be a tuple (features, caption)")
                f_i, c_i = item
                feats.append(f_i)
                n = min(len(c_i), captions.shape[1])
                caps[i, :n] = torch.as_tensor(c_i)[:n]
                lengths.append(len(c_i))
            del data  # close the student's file handle before the folder goes
            return torch.stack(feats), caps, torch.tensor(lengths, dtype=torch.long)
    return _named(items, dataset_class)


def with_items(collate):
    """``collate(batch, null_idx)`` on the items of a padded batch: item b is (features[b], its caption
    up to and including <END>)."""
    def collated(features, captions, lengths, null_idx):
        _require(collate)
        batch = [(features[b], captions[b, : int(lengths[b])]) for b in range(len(captions))]
        return collate(batch, null_idx=null_idx)
    return _named(collated, collate)


# ---- training ----------------------------------------------------------------------------------------
def over_steps(lr_at_step):
    """``lr_at_step(step, total_steps, warmup_steps, peak_lr)`` at every step of `steps` (float64)."""
    def schedule(steps, total_steps, warmup_steps, peak_lr):
        _require(lr_at_step)
        values = [lr_at_step(float(s) if s != int(s) else int(s), total_steps, warmup_steps, peak_lr)
                  for s in steps.tolist()]
        return torch.tensor([float(v) for v in values], dtype=torch.float64)
    return _named(schedule, lr_at_step)


def _on_model(run, model_class, fn):
    """A module class that holds a ``model_class(**init)`` as `.model` (so that the check loads the stored
    weights into it) and whose forward is `run(self, ...)`; named after `fn`."""
    class OnModel(nn.Module):
        def __init__(self, **init):
            super().__init__()
            self.model = model_class(**init)

        forward = run

    return _named(OnModel, fn)


def _toy_loss(model, features, captions):
    """The loss the training-step checks train with: cross-entropy of every position against the next
    word (padding included; any differentiable loss would do here)."""
    logits = model(features, captions[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), captions[:, 1:].reshape(-1))


class ParameterKinds(nn.Module):
    """A module with a parameter of every kind a captioning Transformer has: an embedding table, weight
    matrices, biases, and a LayerNorm's gain and shift. (The optimiser checks' model: it is never run.)"""

    def __init__(self, vocab_size=7, hidden=4):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab_size)


def with_param_groups(make_optimizer, model_class=ParameterKinds):
    """``make_optimizer(model, lr, weight_decay)`` on a ``model_class`` with the stored weights, then `steps`
    steps of the optimiser it returns with gradients drawn from `grad_seed`. Returns (per parameter, in
    ``model.parameters()`` order: the weight decay and learning rate of its group, -1 for both if no group
    holds it, and how many groups hold it;
    every parameter after the steps, flattened and concatenated)."""
    def run(self, lr, weight_decay, steps, grad_seed):
        _require(make_optimizer)
        opt = make_optimizer(self.model, lr, weight_decay)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"make_optimizer must return a torch.optim optimiser, got {type(opt).__name__}")
        params = list(self.model.parameters())
        groups = []
        for p in params:
            holding = [g for g in opt.param_groups if any(q is p for q in g["params"])]
            first = holding[0] if holding else {"weight_decay": -1.0, "lr": -1.0}  # -1: in no group
            groups.append([float(first.get("weight_decay", 0.0)), float(first["lr"]), float(len(holding))])
        g = torch.Generator().manual_seed(grad_seed)
        for _ in range(steps):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        return torch.tensor(groups, dtype=flat.dtype), flat

    return _on_model(run, model_class, make_optimizer)


def with_optimizer(train_step, model_class=ToyCaptioner):
    """``train_step(model, loss_fn, optimizer, features, captions, lr, grad_clip)`` called once per entry
    of `lrs` on a ``model_class`` with the stored weights; `optimizer`: "sgd", "adamw", or "sgd_two_groups"
    (the parameters split into two groups, each of which must get `lr`). Returns (the losses it returned,
    every parameter afterwards, flattened and concatenated)."""
    def run(self, features, captions, optimizer, lrs, grad_clip):
        _require(train_step)
        params = list(self.model.parameters())
        if optimizer == "sgd_two_groups":
            half = len(params) // 2
            opt = torch.optim.SGD([{"params": params[:half]}, {"params": params[half:]}], lr=1.0)
        else:
            opt = (torch.optim.SGD(params, lr=1.0) if optimizer == "sgd" else
                   torch.optim.AdamW(params, lr=1.0, weight_decay=0.01))
        losses = []
        for lr in lrs:
            loss = train_step(self.model, _toy_loss, opt, features, captions, lr, grad_clip)
            if not isinstance(loss, (float, int)) or isinstance(loss, bool):
                raise TypeError(f"train_step must return the loss as a Python float (loss.item()), "
                                f"got {type(loss).__name__}")
            losses.append(float(loss))
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        return torch.tensor(losses, dtype=flat.dtype), flat

    return _on_model(run, model_class, train_step)


class _Recorder(nn.Module):
    """Wraps a model and records, for each forward call, whether it ran in train mode and with gradients."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, []

    def forward(self, *args, **kwargs):
        self.calls.append((self.training, torch.is_grad_enabled()))
        return self.model(*args, **kwargs)


def with_batches(validation_loss, model_class=ToyCaptioner):
    """``validation_loss(model, loss_fn, batches)`` on a ``model_class`` with the stored weights, handed over
    in train mode (or eval mode: `handed_over_training` False), with `batches` cut from (features, captions)
    at `sizes`. Returns (the loss, the share of forward calls made in train mode, the share made with
    gradients on, 1.0 if the model is in train mode afterwards)."""
    def run(self, features, captions, sizes, handed_over_training=True):
        _require(validation_loss)
        model = _Recorder(self.model).train(handed_over_training)
        bounds = np.cumsum([0, *sizes])
        batches = [(features[a:b], captions[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        loss = validation_loss(model, _toy_loss, batches)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            loss = loss.item()
        if not isinstance(loss, (float, int)) or isinstance(loss, bool):
            raise TypeError(f"validation_loss must return a Python float, got {type(loss).__name__}")
        calls = model.calls or [(True, True)]
        share = [sum(c[k] for c in calls) / len(calls) for k in (0, 1)]
        return torch.tensor([float(loss), *share, float(model.training)], dtype=features.dtype)

    return _on_model(run, model_class, validation_loss)


class _EpochLoader:
    """A stand-in DataLoader for the training-loop checks: the same batches every epoch, in an order that
    turns by one batch per epoch (as a shuffling loader's order changes from epoch to epoch)."""

    def __init__(self, batches):
        self.batches, self.epochs = batches, 0

    def __iter__(self):
        k = self.epochs % len(self.batches)
        self.epochs += 1
        return iter(self.batches[k:] + self.batches[:k])

    def __len__(self):
        return len(self.batches)


class _FixedPlan:
    """A stand-in TrainingPlan: yields (step, lr) for the stored rates, steps from `start` on (a resumed run's
    part), no clock and no progress bar."""

    def __init__(self, lrs, start=0):
        self.lrs, self.start = list(lrs), int(start)

    def __iter__(self):
        return iter(enumerate(self.lrs, start=self.start))

    def __len__(self):
        return len(self.lrs)

    def show(self, **values):
        pass


def _marking_step(model, loss_fn, optimizer, features, captions, lr):
    """The stand-in training step of the loop's checks. It does not train (no gradient, no optimiser): it
    returns the batch's loss and moves every weight by an amount that depends on the batch and on `lr`, so
    that the weights afterwards tell which batches the loop handed over, in which order, at which rates."""
    with torch.no_grad():
        loss = float(loss_fn(model, features, captions))
        mark = lr * (features.double().mean() + captions.double().mean() / 100)
        for p in model.parameters():
            p.mul_(0.9).add_(mark.to(p.dtype))
    return loss


def _weights_probe(model, loss_fn, batches):
    """The stand-in validation loss of the loop's checks: a number that depends on the weights at the time
    of the call (so the history shows after which step the loop measured) and on the batches it was given."""
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters())
                     + sum(f.double().sum() + c.double().sum() / 100 for f, c in batches))


def with_loader(fit, model_class=ToyCaptioner):
    """``fit(model, loss_fn, optimizer, loader, plan, config)`` (a `starter.training.FitConfig`) on a
    ``model_class`` with the stored weights: the loader's batches are cut from the first rows of (features,
    captions) at `sizes`, the validation batch is the remaining rows, the plan yields `lrs` from step `start` on;
    stand-ins for the
    step and the validation loss that only mark the weights and read them (so the check tests your loop
    alone). Returns (the history's steps, losses, rates, validation steps and losses, and every parameter
    afterwards)."""
    from .training import HISTORY_KEYS, FitConfig

    def run(self, features, captions, sizes, lrs, val_every, start=0):
        _require(fit)
        bounds = np.cumsum([0, *sizes])
        loader = _EpochLoader([(features[a:b], captions[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])
        val_batches = [(features[bounds[-1]:], captions[bounds[-1]:])]
        params = list(self.model.parameters())
        opt = torch.optim.SGD(params, lr=1.0)

        config = FitConfig(step_fn=_marking_step, val_fn=_weights_probe, val_batches=val_batches, val_every=val_every,
                           device=torch.device("cpu"))
        history = fit(self.model, _toy_loss, opt, loader, _FixedPlan(lrs, start), config)
        if not isinstance(history, dict) or not all(k in history for k in HISTORY_KEYS):
            raise TypeError(f"fit must return the history: a dict with the keys {', '.join(HISTORY_KEYS)}")
        dtype = features.dtype
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        return (torch.tensor([int(s) for s in history["step"]], dtype=torch.long),
                torch.tensor([float(x) for x in history["loss"]], dtype=dtype),
                torch.tensor([float(x) for x in history["lr"]], dtype=dtype),
                torch.tensor([int(s) for s in history["val_step"]], dtype=torch.long),
                torch.tensor([float(x) for x in history["val_loss"]], dtype=dtype), flat)

    return _on_model(run, model_class, fit)


# ---- evaluation --------------------------------------------------------------------------------------
class _StoredSplit:
    """A stand-in split for the evaluation checks: image i's "features" are its index (N, 1, 1), and its
    references are stored strings."""

    def __init__(self, references):
        self.references_ = [list(r) for r in references]
        self.num_images = len(self.references_)

    def features(self, idx):
        idx = torch.as_tensor(np.atleast_1d(np.asarray(idx, dtype=np.int64)))
        if idx.numel() and (idx.min() < 0 or idx.max() >= self.num_images):
            raise IndexError(f"image index out of range [0, {self.num_images})")
        return idx.to(torch.float32).reshape(-1, 1, 1)

    def references(self, image_idx):
        return list(self.references_[int(image_idx)])


class _StoredWords:
    """A stand-in vocabulary: `idx_to_word` and `word_to_idx` only (no decode: turning indices into
    words is part of the task)."""

    null_idx, start_idx, end_idx, unk_idx = 0, 1, 2, 3

    def __init__(self, idx_to_word):
        self.idx_to_word = list(idx_to_word)
        self.word_to_idx = {w: i for i, w in enumerate(self.idx_to_word)}

    def __len__(self):
        return len(self.idx_to_word)


class _Probe(nn.Module):
    """The stand-in model of the evaluation checks: no weights, one dropout layer (so its mode shows)."""

    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.5)
        self.anchor = nn.Parameter(torch.zeros(1))  # so that next(model.parameters()) gives a device


def _stored_decoder(tokens):
    """A decode function that returns the stored tokens of the images it is given. Used in train mode
    it returns empty captions, and with gradients on it returns every word as word 4, so that an
    evaluation which forgets `model.eval()` or `torch.no_grad()` scores differently (and each
    differently from the other)."""
    def decode(model, features, max_len, **_):
        rows = tokens[features.reshape(len(features), -1)[:, 0].long().cpu()][:, :max_len]
        if model.training:
            return torch.full_like(rows, END)
        if torch.is_grad_enabled():
            return rows.masked_fill(rows > 3, 4)
        return rows.clone()
    return decode


def with_split(evaluate):
    """``evaluate(model, decode_fn, split, vocab, max_len, batch_size)`` on stored decoder outputs and
    references; returns the scores of SCORE_NAMES as a float32 tensor."""
    def scores(tokens, references, idx_to_word, max_len, batch_size):
        _require(evaluate)
        model = _Probe().train()
        out = evaluate(model, _stored_decoder(tokens), _StoredSplit(references), _StoredWords(idx_to_word),
                       max_len=max_len, batch_size=batch_size)
        if isinstance(out, tuple) and len(out) == 2:
            out = out[0]
        if not isinstance(out, dict):
            raise TypeError(f"evaluate_captions must return (scores dict, generated captions), got "
                            f"{type(out).__name__}")
        missing = [k for k in SCORE_NAMES if k not in out]
        if missing:
            raise KeyError(f"the scores have no {', '.join(missing)}")
        return torch.tensor([float(out[k]) for k in SCORE_NAMES], dtype=torch.float32)
    return _named(scores, evaluate)


# ---- your version, once it passes ---------------------------------------------------------------------


# the public case and adapter of each piece
PUBLIC_CASES = {
    "extract_grid_features": ("features/basic", with_cnn),
    "build_vocab": ("vocab/basic", with_probe_words),
    "encode_captions": ("encode/basic", with_long_output),
    "CaptionFeatures": ("dataset/basic", with_h5_file),
    "collate_captions": ("collate/basic", with_items),
    "lr_at_step": ("schedule/basic", over_steps),
    "make_optimizer": ("optimizer/basic", with_param_groups),
    "train_step": ("step/adamw", with_optimizer),
    "validation_loss": ("validation/basic", with_batches),
    "fit": ("fit/basic", with_loader),
    "evaluate_captions": ("evaluate/basic", with_split),
    "greedy_decode": ("greedy/basic", with_model),
    "sample_decode": ("sample/basic", with_sampler),
    # the model and its loss (notebook 05), as notebook 06 takes them over
    "CaptioningTransformer": ("captioner/basic", lambda model_class: model_class),
    "caption_loss": ("loss/basic", lambda loss: loss),
    "teacher_forcing_loss": ("teacher/basic", with_model),
}


def yours_if_it_passes(name: str, yours, instead: str, case: tuple | None = None):
    """`yours` if it passes its public check (`case`, (case name, adapter), or PUBLIC_CASES[name]), else None;
    prints one line saying which, and (`instead`) what the notebook does without it, so that an unfinished piece
    never stops the rest of the notebook."""
    if yours is None:  # not defined, or its notebook could not be loaded (a line said why)
        print(f"{name}: not available; {instead}")
        return None
    case_name, adapter = case or PUBLIC_CASES[name]
    loaded = load_case(case_name)
    message = verdict(loaded, observe(loaded, adapter(yours)))
    if message is None:
        print(f"using your {name}")
        return yours
    first = textwrap.shorten(message.splitlines()[0], 160, placeholder=" …")  # whole words: the full message is the check's
    print(f"{name}: yours does not pass {case_name} yet ({first}); {instead}")
    return None


class CaptionData:
    """The captions of a dataset as your data pieces of notebook 04 make them, or as the dataset stores them.

    `CaptionData.of(ds, pieces)` takes your `build_vocab`, `encode_captions`, `CaptionFeatures` and
    `collate_captions` (a dict by name; None for one that could not be loaded) and uses each that passes its public
    check, one line each: the vocabulary and the encoded captions of both splits come from your `build_vocab` and
    `encode_captions` when both pass (else the dataset's stored ones: the two go together), and `loader` batches them
    with your `CaptionFeatures` and `collate_captions` when both pass (else the stored batches, padded to the
    dataset's caption length)."""

    def __init__(self, vocab, encoded: dict, dataset_class=None, collate=None):
        self.vocab, self.encoded = vocab, encoded  # split name -> (M, T) encoded captions
        both = dataset_class is not None and collate is not None  # the two go together, or the stored batches
        self.dataset_class: Any = dataset_class if both else None
        self.collate: Any = collate if both else None

    @classmethod
    def of(cls, ds, pieces: dict) -> CaptionData:
        from .data import Vocab

        stored = "the dataset's stored vocabulary and encoded captions are used (the two go together)"
        vocab_fn = yours_if_it_passes("build_vocab", pieces.get("build_vocab"), instead=stored)
        encode = yours_if_it_passes("encode_captions", pieces.get("encode_captions"), instead=stored)
        splits = {name: ds.split(name) for name in ("train", "val")}
        if vocab_fn is not None and encode is not None:
            vocab = Vocab(vocab_fn(splits["train"].texts(), min_count=1))
            encoded = {n: encode(s.texts(), vocab.word_to_idx, ds.max_length) for n, s in splits.items()}
        else:
            vocab, encoded = ds.vocab, {n: s.captions for n, s in splits.items()}
        stored = "the loaders give the stored batches, padded to the dataset's caption length (StoredBatches)"
        dataset_class = yours_if_it_passes("CaptionFeatures", pieces.get("CaptionFeatures"), instead=stored)
        collate = yours_if_it_passes("collate_captions", pieces.get("collate_captions"), instead=stored)
        return cls(vocab, encoded, dataset_class, collate)

    def loader(self, split, batch_size: int, shuffle: bool, seed: int = 0):
        """Batches of (features, captions) of `split`'s captions as encoded here: a DataLoader over your Dataset and
        collate function, or the stored batches; `shuffle` draws a new order each epoch from a generator seeded
        with `seed` (and drops a last, smaller batch)."""
        from torch.utils.data import DataLoader

        from .data import StoredBatches

        if self.dataset_class is None:
            return StoredBatches(split, self.encoded[split.name], batch_size, shuffle, drop_last=shuffle, seed=seed)
        data = self.dataset_class(*split.features_file, self.encoded[split.name], split.image_idxs)
        return DataLoader(data, batch_size=batch_size, shuffle=shuffle, collate_fn=self.collate, drop_last=shuffle,
                          generator=torch.Generator().manual_seed(seed))
