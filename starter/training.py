"""Training utilities for the captioning notebooks: device, seeding, the training loop, checkpoints,
and the overfit-a-small-batch sanity check.

    from starter.training import pick_device, seed_everything, train, TrainConfig, TrainingPieces, save_checkpoint
    device = pick_device()                        # cuda if there is a GPU, else (Apple) mps, else cpu
    pieces = TrainingPieces(fit=fit, train_step=train_step, lr_at_step=lr_at_step,   # notebook 06's, yours
                            validation_loss=validation_loss, make_optimizer=make_optimizer)
    history = train(model, loss_fn, ds.split("train"), TrainConfig(steps=800), pieces, device=device)
    save_checkpoint("runs/captioning_transformer.pt", model, config, ds.vocab, history=history)
    model, info = load_checkpoint("runs/captioning_transformer.pt", CaptioningTransformer)

``loss_fn(model, features, captions) -> scalar tensor`` is whatever computes the training loss of one
batch (in notebook 06, your ``teacher_forcing_loss`` of notebook 05). ``GRADING`` is True while nbgrader runs the
notebook (``NBGRADER_EXECUTION`` set): notebooks use it to skip training, which no grade depends on.
"""
from __future__ import annotations

import copy
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from .runtime import GRADING_ENV, OneLineError, missing_checkpoint

__all__ = ["GRADING", "pick_device", "seed_everything", "train", "TrainConfig", "TrainingPieces", "FitConfig",
           "TrainingPlan", "save_checkpoint", "load_checkpoint",
           "overfit_small_batch", "count_parameters"]

GRADING = bool(os.environ.get(GRADING_ENV))


def _device_name(device) -> str:
    """Human-readable name of a torch device, e.g. "cuda (NVIDIA T4)" or "cpu (CPU, 2 threads)"."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = "Apple GPU"
    elif device.type == "cpu":
        name = f"CPU, {torch.get_num_threads()} threads"
    else:
        return str(device)
    return f"{device} ({name})"


def pick_device(verbose: bool = True) -> torch.device:
    """The GPU when there is one (CUDA, else Apple's MPS), else the CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        device = torch.device("mps")
    else:
        device = torch.device("cpu")
    if verbose:
        print(f"device: {_device_name(device)}")
    return device


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and PyTorch (all devices). Runs are repeatable on one machine; GPU kernels
    and other PyTorch versions may still differ in the last digits."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


_clock = time.perf_counter  # the clock of the time budget (tests replace it by a fake, deterministic one)


def _as_pair(batch, device):
    """(features, captions) on `device` from a DataLoader batch (features, captions) or from
    Split.sample_batch's (captions, features, image_idxs)."""
    if len(batch) == 3:
        captions, features, _ = batch
    else:
        features, captions = batch
    return features.to(device), captions.to(device)


class _SplitBatches:
    """A Split as a loader: one endless, seeded stream of (features, captions) batches from `sample_batch`
    (a new shuffle each epoch). Iterating it again continues the same stream."""

    def __init__(self, split, batch_size: int, seed: int):
        self.split, self.batch_size, self.generator = split, batch_size, torch.Generator().manual_seed(seed)

    def __iter__(self):
        while True:
            yield _as_pair(self.split.sample_batch(self.batch_size, generator=self.generator), "cpu")


def _loader_for(source, batch_size: int, seed: int):
    """An iterable of (features, captions) batches, seeded: the same `seed` gives the same batches on every
    call (a DataLoader's own generator is re-seeded; a Split is wrapped as a seeded stream)."""
    if hasattr(source, "sample_batch"):
        return _SplitBatches(source, batch_size, seed)
    if getattr(source, "generator", None) is not None:
        source.generator.manual_seed(seed)
    return source


def _fixed_batches(source, batch_size: int, count: int, device) -> list:
    """`count` fixed (features, captions) batches for the validation loss: the first batches of a
    DataLoader (make it unshuffled), or batches drawn with a fixed seed from a Split."""
    if hasattr(source, "sample_batch"):
        gen = torch.Generator().manual_seed(12345)
        return [_as_pair(source.sample_batch(min(batch_size, len(source)), generator=gen), device)
                for _ in range(count)]
    out = []
    for batch in source:
        out.append(_as_pair(batch, device))
        if len(out) == count:
            break
    return out


HISTORY_KEYS = ("step", "loss", "lr", "val_step", "val_loss")  # what a training loop records


class TrainingPlan:
    """The steps of one training run, each with its learning rate, kept to a time budget; shows a progress bar.

        plan = TrainingPlan(steps=700, lr_fn=lr_at_step, warmup=50, peak_lr=2e-3, time_limit=180)
        for step, lr in plan:         # step = 0, 1, 2, ... (0-based); lr = the schedule's rate for this step
            ...                       # one training step at rate lr

    Time budget: `time_limit` (seconds) shortens the run instead of cutting it off. The schedule follows
    the run's progress = max(steps done / `steps`, time used / `time_limit`), and the plan ends when
    progress reaches 1 (after the step in which the budget runs out). On a machine too slow for `steps`
    steps in time, warm-up and cosine decay are thus compressed into the steps that fit and still run to
    their end. The first step doesn't set the pace (it carries one-off start-up costs such as CUDA
    initialisation): time used counts from its end, as a fraction of the budget left then. As long as the
    machine keeps pace, nothing changes: the same steps and rates as without `time_limit`.

    A part of a run: `start` and `stop` (0-based, `stop` excluded) give only the steps start, ..., stop - 1 of
    the run's `steps`, at the rates of the whole run's schedule (a script that trains in rounds, or resumes).

    After the loop: `done` (steps taken), `shortened` (True if the budget ended the run early), `seconds`.
    `show(**values)` puts values (a loss, say) next to the bar.
    """

    def __init__(self, steps: int, lr_fn, warmup: int, peak_lr: float, time_limit: float | None = None,
                 progress: bool = True, start: int = 0, stop: int | None = None):
        if time_limit is not None and not time_limit > 0:
            raise ValueError(f"time_limit must be a positive number of seconds or None, not {time_limit}")
        if steps < 1:
            raise ValueError(f"steps must be at least 1, not {steps}")
        stop = steps if stop is None else stop
        if not 0 <= start <= stop <= steps:
            raise ValueError(f"the steps {start} to {stop} are not within the run's {steps} steps")
        if time_limit is not None and (start, stop) != (0, steps):
            raise ValueError("a time budget is for a whole run, not for a part of it")
        self.steps, self.lr_fn, self.warmup, self.peak_lr = steps, lr_fn, warmup, peak_lr
        self.start, self.stop = start, stop
        self.time_limit, self.progress = time_limit, progress
        self.done, self.shortened, self.seconds = 0, False, 0.0
        self._values: dict = {}
        self._bar = None

    def __len__(self) -> int:
        return self.stop - self.start

    def show(self, **values) -> None:
        self._values.update({k: f"{v:.3f}" if isinstance(v, float) else v for k, v in values.items()})
        if self._bar is not None:
            self._bar.set_postfix(self._values, refresh=False)

    def __iter__(self):
        from tqdm.auto import tqdm

        steps, time_limit = self.steps, self.time_limit
        self._bar = bar = tqdm(total=self.stop, initial=self.start, desc="training", disable=not self.progress,
                               mininterval=1.0)
        t0 = _clock()
        startup = 0.0  # seconds taken by the first step
        try:
            for step in range(self.start, self.stop):  # `step` steps are done
                # the schedule's step: `step` itself, or, when time used is ahead of it, that fraction of `steps`
                sched_step = step
                if time_limit is not None and step >= 1:
                    elapsed = _clock() - t0
                    if step == 1:
                        startup = elapsed
                    time_used = (elapsed - startup) / (time_limit - startup) if time_limit > startup else 1.0
                    sched_step = max(step, steps * min(1.0, time_used))  # max() keeps the int `step` on a tie
                lr = float(self.lr_fn(sched_step, steps, self.warmup, self.peak_lr))
                yield step, lr
                self.done += 1
                bar.update(1)
                if time_limit is not None and _clock() - t0 >= time_limit:
                    break
        finally:
            self.seconds = _clock() - t0
            self.shortened = self.done < self.stop - self.start
            if self.shortened and self.done:  # a complete schedule: show a full bar (not a red, short one)
                bar.total = self.done
                widget = getattr(bar, "container", None)  # tqdm.notebook's widgets: (label, bar, text)
                if widget is not None:
                    widget.children[1].max = self.done
                bar.set_description("training (time budget)", refresh=False)
            bar.close()
            self._bar = None


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one training run: what `train` takes besides the model, the data and your pieces."""

    steps: int  # optimiser steps (fewer if `time_limit` binds)
    batch_size: int = 64  # captions per batch when the data is a Split (a DataLoader brings its own)
    lr: float = 2e-3  # the learning rate at the end of the warm-up, the schedule's peak
    weight_decay: float = 0.01
    warmup: int = 50  # steps of linear warm-up
    grad_clip: float | None = 1.0  # the largest gradient norm a step applies (None: no clipping)
    seed: int = 0  # seeds the model's randomness and the order of the batches
    val_every: int | None = None  # steps between two validations (None: 10 times per run)
    val_batches: int = 4  # fixed validation batches, the same at every validation
    time_limit: float | None = None  # seconds: a slower machine trains fewer steps, the whole schedule in them


@dataclass(frozen=True)
class TrainingPieces:
    """Your training functions (notebook 05's `make_optimizer`, notebook 06's others), which `train` runs (the kit
    has no version of them). A piece may be None
    (not written yet, or not passing its check): `missing()` names those, and `train` refuses to start."""

    fit: Callable
    train_step: Callable
    lr_at_step: Callable
    validation_loss: Callable
    make_optimizer: Callable

    def missing(self) -> list[str]:
        """The names of the pieces that are not functions."""
        return [f.name for f in fields(self) if not callable(getattr(self, f.name))]


@dataclass(frozen=True)
class FitConfig:
    """What your `fit` needs besides the model, the loss, the optimiser, the loader and the plan."""

    step_fn: Callable  # step_fn(model, loss_fn, optimizer, features, captions, lr) -> loss (float): one step
    val_fn: Callable  # val_fn(model, loss_fn, val_batches) -> validation loss (float)
    val_batches: list  # fixed (features, captions) batches, already on `device`
    val_every: int  # validate after step + 1 = val_every, 2 * val_every, ...
    device: torch.device  # where the model is: move each training batch there


def train(model, loss_fn, data, config: TrainConfig, pieces: TrainingPieces, *, val_data=None, device=None,
          progress: bool = True, history: dict | None = None) -> dict:
    """Train `model` on minibatches of `data` for `config.steps` steps, or fewer if `config.time_limit` binds.

    `data`: a Split (batches from ``split.sample_batch``, a new shuffle each epoch) or a DataLoader of
    (features, captions) batches (`config.batch_size` is then the loader's); either way seeded by
    `config.seed`, so the same seed gives the same batches. `pieces` are your functions of notebooks 05-06:
    the optimiser is ``make_optimizer(model, lr, weight_decay)``, the loop is ``fit(model, loss_fn, optimizer,
    loader, plan, FitConfig(...))`` over a `TrainingPlan` (the steps, their learning rates ``lr_at_step(step,
    steps, warmup, lr)``, the time budget and the progress bar). Each step is ``train_step(model, loss_fn,
    optimizer, features, captions, lr, grad_clip)``. Every `config.val_every` steps (default: 10 times per run)
    and after the last step, ``validation_loss(model, loss_fn, batches)`` on `config.val_batches` fixed
    batches of `val_data` (a Split, or an unshuffled DataLoader) is recorded.
    The time budget is `TrainingPlan`'s: a machine too slow for `steps` steps in `time_limit` seconds
    trains fewer, with the whole schedule compressed into them.

    `progress`: show a progress bar and print one summary line (device, steps, seconds, and whether the
    time budget shortened the run). Returns the history dict: "step", "loss", "lr", "val_step",
    "val_loss", "seconds", "steps_done", "planned_steps", "device", "time_limit", "shortened" (True when
    the time budget shortened the run), "summary" (that line). Pass it back in as `history` to continue
    a run's curve: steps and seconds add up.
    """
    missing = pieces.missing()
    if missing:
        raise TypeError(f"train needs your training pieces as functions: {', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not (TrainingPieces(fit=fit, train_step=train_step, "
                        "lr_at_step=lr_at_step, validation_loss=validation_loss, make_optimizer=make_optimizer))")
    steps, time_limit, grad_clip = config.steps, config.time_limit, config.grad_clip
    step_fn, val_fn = pieces.train_step, pieces.validation_loss
    device = torch.device(device) if device is not None else next(model.parameters()).device
    plan = TrainingPlan(steps, pieces.lr_at_step, config.warmup, config.lr, time_limit=time_limit, progress=progress)
    seed_everything(config.seed)
    model.to(device).train()
    opt = pieces.make_optimizer(model, config.lr, config.weight_decay)
    fixed_val = [] if val_data is None else _fixed_batches(val_data, config.batch_size, config.val_batches, device)

    def step(model, loss_fn, optimizer, features, captions, lr):
        loss = float(step_fn(model, loss_fn, optimizer, features, captions, lr, grad_clip))
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {plan.done}: lower the learning rate or check the "
                                     "loss for divisions by zero")
        if plan.done % 10 == 0:
            plan.show(loss=loss)
        return loss  # a float: the step waited for the GPU, so the plan's clock sees the real time

    def validate(model, loss_fn, batches):
        if not batches:
            return float("nan")
        value = float(val_fn(model, loss_fn, batches))
        plan.show(val=value)
        return value

    run = pieces.fit(model, loss_fn, opt, _loader_for(data, config.batch_size, config.seed), plan,
                     FitConfig(step_fn=step, val_fn=validate, val_batches=fixed_val,
                               val_every=config.val_every or max(1, steps // 10), device=device))
    model.eval()
    if not (isinstance(run, dict) and all(isinstance(run.get(k), list) for k in HISTORY_KEYS)):
        raise TypeError(f"the training loop must return a dict of lists with the keys {', '.join(HISTORY_KEYS)}")
    if not fixed_val:  # no validation set: nothing was measured
        run["val_step"], run["val_loss"] = [], []
    hist = history if history is not None else {key: [] for key in HISTORY_KEYS}
    offset = hist.get("steps_done", 0)
    for key in ("step", "val_step"):
        hist[key] += [offset + int(s) for s in run[key]]
    for key in ("loss", "lr", "val_loss"):
        hist[key] += [float(v) for v in run[key]]
    done = plan.done
    hist["seconds"] = hist.get("seconds", 0.0) + plan.seconds
    hist["steps_done"] = offset + done
    hist["planned_steps"] = hist.get("planned_steps", offset) + steps
    hist["device"] = _device_name(device)
    hist["time_limit"] = time_limit
    hist["shortened"] = bool(hist.get("shortened", False) or plan.shortened)
    took = f"{plan.seconds:.1f} s" if plan.seconds < 10 else f"{plan.seconds:.0f} s"
    if plan.shortened:
        summary = (f"training on {hist['device']}: {done} of {steps} steps in {took} (time budget {time_limit:g} s: "
                   "the learning-rate schedule was compressed to fit and completed)")
    else:
        summary = f"training on {hist['device']}: {done} steps in {took}"
    hist["summary"] = summary
    if progress:
        print(summary)
    return hist


# ------------------------------------------------------------------------------------ checkpoints
def save_checkpoint(path, model, config: dict, vocab, **extra) -> Path:
    """Save weights, the model's constructor arguments (`config`), the vocabulary and any extra
    (e.g. history=..., scores=...) to `path` (folders are created). Written to a temporary file first,
    so an interrupted save never leaves a truncated checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    words = list(getattr(vocab, "idx_to_word", vocab))
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    payload = {"format": "attention-course-checkpoint/1", "model_class": type(model).__name__,
               "config": dict(config), "state_dict": state, "vocab": words, "extra": extra,
               "torch": str(torch.__version__)}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


class CheckpointNotFound(OneLineError, FileNotFoundError):
    """No checkpoint where one was expected; the message says how to get one."""


def load_checkpoint(path, model_class, device="cpu"):
    """Rebuild ``model_class(**config)`` from a checkpoint of `save_checkpoint` and load its weights.

    Returns (model in eval mode on `device`, info) with info = {"config", "vocab" (a Vocab), "extra",
    "model_class"}. A missing file raises FileNotFoundError naming the path; weights that don't fit the
    class (changed layer names or sizes) raise a RuntimeError that says so.
    """
    from .data import Vocab

    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFound(missing_checkpoint(path))
    payload = torch.load(path, map_location="cpu", weights_only=True)
    model = model_class(**payload["config"])
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise RuntimeError(f"{path.name} does not fit {model_class.__name__}(**{payload['config']}): {first} "
                           "(keep the layers declared in the given __init__)") from None
    model.to(device).eval()
    info = {"config": payload["config"], "vocab": Vocab(payload["vocab"]), "extra": payload.get("extra", {}),
            "model_class": payload.get("model_class")}
    return model, info


# ------------------------------------------------------------------------------- sanity check
def overfit_small_batch(model, loss_fn, split, step_fn, batch_size: int = 8, steps: int = 150, lr: float = 3e-3,
                        target: float = 0.1, device=None, seed: int = 0) -> dict:
    """Train a copy of `model` (dropout off) on ONE fixed batch with Adam and ``step_fn`` (your `train_step`,
    at the constant rate `lr`); a correct model and loss drive the loss close to zero. Prints one line and
    returns {"losses", "passed", "seconds"}; the model is untouched.

    If the loss stalls, the model cannot even memorise one batch: typically a forward pass that ignores the
    image or the words, or a loss that compares the wrong positions. Passing is no proof: a causal mask that
    lets a word see its own target, or a loss averaged over padding, overfits one batch just as well.
    `split`: a Split, or a DataLoader (the first `batch_size` captions of its first batch).
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    seed_everything(seed)
    probe = copy.deepcopy(model).to(device)
    for m in probe.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    probe.train()
    if hasattr(split, "sample_batch"):
        features, captions = _as_pair(split.sample_batch(batch_size, generator=torch.Generator().manual_seed(seed)),
                                      device)
    else:  # a DataLoader: the first `batch_size` captions of its first batch
        features, captions = (t[:batch_size] for t in _fixed_batches(split, batch_size, 1, device)[0])
    opt = torch.optim.Adam(probe.parameters(), lr=lr)
    losses = []
    t0 = _clock()
    for _ in range(steps):
        losses.append(float(step_fn(probe, loss_fn, opt, features, captions, lr, 1.0)))
    seconds = _clock() - t0
    passed = bool(np.isfinite(losses[-1]) and losses[-1] < target)
    verdict = "✓ passed" if passed else f"✗ did not get below {target}"
    print(f"overfit {batch_size} captions for {steps} steps: loss {losses[0]:.3f} -> {losses[-1]:.4f} "
          f"({seconds:.1f} s) {verdict}")
    return {"losses": losses, "passed": passed, "seconds": seconds}
