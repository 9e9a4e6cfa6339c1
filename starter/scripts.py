"""The two scripts, notebook 06's `train_captioner.py` and notebook 07's `evaluate_captioner.py`: what they use
besides your code.

A script gets everything that is not its own work from an `Experiment`: the dataset, your pieces of notebooks
04-07 (the data pipeline, the model, its loss, the optimiser; for training the schedule, the step and the
validation loss; for evaluation greedy decoding, the evaluation and notebook 08's beam search when it passes), the
device, a plan of steps, and the training batches from any step on:

    exp = Experiment.open("shapes", device="auto")      # loads your notebooks 04-06 from the course folder
    model = exp.new_model(dict(d_model=64, num_heads=4, num_layers=2, dim_feedforward=256, dropout=0.0), seed=0)
    optimizer = exp.make_optimizer(model, 2e-3, 0.01)
    plan = exp.plan(700, warmup=50, peak_lr=2e-3, start=0, stop=100)       # steps 0..99 of a 700-step run
    batches = exp.train_batches(64, seed=0, start=0)   # the batch of step s, whatever step you start from

A script's `main(argv=None, experiment=None)` opens one itself when `experiment` is None; the checks pass a
small stand-in with the same interface (a toy model, toy data and stand-in pieces), so that they test the
script alone, in a second. Checkpoints: `save_checkpoint` (starter.training) writes one, `read_checkpoint`
reads one back as the dict that was saved, or raises a `CheckpointError` that says in one line what is wrong.

    train = load_script("train_captioner.py")           # the file as a module, without running its main
    fit = load_script("train_captioner.py", "fit")     # one of its functions (None, with a line, if missing)
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import io
import json
import math
import sys
import tempfile
import types
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .runtime import (
    DATA_NOTEBOOK,
    DECODING_NOTEBOOK,
    GENERATION_NOTEBOOK,
    MODEL_NOTEBOOK,
    RUN_TAG,
    TRAINING_NOTEBOOK,
    OneLineError,
)
from .training import FitConfig, TrainingPlan, pick_device, save_checkpoint, seed_everything

__all__ = ["load_script", "Experiment", "EpochBatches", "CheckpointError", "read_checkpoint", "save_checkpoint",
           "FitConfig", "read_log", "run_command", "run_script", "train_main", "evaluate_main", "train_arguments",
           "eval_arguments", "script_if_it_passes", "with_train_script", "with_eval_script", "LOG_COLUMNS"]

LOG_COLUMNS = ("step", "loss", "lr", "val_loss")  # the training log's header: one row per step


END_INDEX = 2  # <END>


class ScriptError(OneLineError, RuntimeError):
    """A script file that can't be found or run."""


def load_script(path: str | Path, name: str | None = None):
    """The module that the script at `path` defines, run afresh (its `if __name__ == "__main__":` part does not
    run), or its object `name`; None, with one line saying why, when the file is missing, does not run, or
    lacks `name`. An unfinished part (`raise NotImplementedError()`) counts as missing."""
    path = Path(path)
    what = f"{path.name}'s {name}" if name else path.name
    if not path.is_file():
        print(f"{what}: not available, {path} does not exist yet (run the cell that writes it)")
        return None
    module = types.ModuleType(path.stem)
    module.__file__ = str(path.resolve())
    try:
        code = compile(path.read_text(encoding="utf-8"), str(path), "exec")
        exec(code, module.__dict__)
    except NotImplementedError:  # an unfinished part; what the file defined before it is there
        if name is not None and name in module.__dict__:
            return module.__dict__[name]
        print(f"{what}: not available, {path.name} is not finished yet (it raises NotImplementedError)")
        return None
    except Exception as exc:  # a script that does not even import: say where, in one line
        print(f"{what}: not available, {path.name} raised {type(exc).__name__}: {exc}")
        return None
    if name is None:
        return module
    found = getattr(module, name, None)
    if found is None:
        print(f"{what}: not available, {path.name} defines no {name}")
    return found


# ---- checkpoints ----------------------------------------------------------------------------------------


class CheckpointError(OneLineError, RuntimeError):
    """A checkpoint that is missing or is not one: the message names the file and what is wrong with it."""


def read_checkpoint(path: str | Path) -> dict:
    """The dict `save_checkpoint` wrote at `path`: "state_dict" (the weights), "config" (the model's constructor
    arguments), "vocab" (its words), "extra" (the keyword arguments given to save_checkpoint) and a few more.
    Raises CheckpointError for a missing file or one that is not such a checkpoint; the file is left as it is."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, another format, not a torch file at all
        raise CheckpointError(f"{path} is not a readable checkpoint: {_why_unreadable(exc)}") from None
    if not isinstance(payload, dict) or not {"state_dict", "config", "vocab"} <= set(payload):
        raise CheckpointError(f"{path} is not a checkpoint of save_checkpoint (it has no weights, config and vocab)")
    payload.setdefault("extra", {})
    return payload


def _why_unreadable(exc: Exception) -> str:
    """Why torch.load refused a file, in words a student can act on (torch's own message runs to many lines)."""
    if "Unsupported global" in str(exc):
        return "it holds Python objects besides tensors and plain values (saved by another program?)"
    return "it is damaged or is not a checkpoint (cut short by an interrupted save or copy, or another kind of file)"


def read_log(path: str | Path) -> dict:
    """A training log (CSV with the columns LOG_COLUMNS, one row per step) as a history: {"step", "loss", "lr",
    "val_step", "val_loss"}, lists as `fit` returns them (`starter.plotting.plot_losses` draws it)."""
    history: dict = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": []}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            step = int(float(row["step"]))
            history["step"].append(step)
            history["loss"].append(float(row["loss"]))
            history["lr"].append(float(row["lr"]))
            if (row.get("val_loss") or "").strip():
                history["val_step"].append(step)
                history["val_loss"].append(float(row["val_loss"]))
    return history


def run_command(command: str) -> bool:
    """Run `python COMMAND` (e.g. "train_captioner.py --steps 20") with this notebook's Python, as the cell line
    `!python COMMAND` runs it: its output (errors and progress bars included) shows as it comes. Returns True if
    it exited with status 0."""
    import codecs
    import os
    import shlex
    import subprocess

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two reads
    with subprocess.Popen([sys.executable, *shlex.split(command)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT) as proc:
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 4096):  # as it comes: a progress bar redraws with \r
            sys.stdout.write(decoder.decode(chunk))
            sys.stdout.flush()
    return proc.returncode == 0


# ---- the scripts' command lines and their runs (given: what is not the idea of Task 5 or 8) --------------------


def _at_least(low, kind, below=None):
    """An argparse type: a number of `kind` at least `low` (and below `below`)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < low or (below is not None and value >= below):
            raise argparse.ArgumentTypeError(f"{text} is not {'at least' if below is None else 'in'} "
                                             f"{low if below is None else f'[{low}, {below})'}")
        return value
    return parse


def train_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """train_captioner.py's options (`python train_captioner.py --help`): the defaults are the `shapes` settings.
    A value out of range or an unknown option ends the script with argparse's usage and one error line."""
    p = argparse.ArgumentParser(prog="train_captioner.py", description="Train the captioning Transformer.")
    p.add_argument("--data", default="shapes", help="the dataset (starter.data.load_dataset's names)")
    p.add_argument("--checkpoint", type=Path, default=Path("runs/captioning_transformer.pt"),
                   help="the checkpoint; the log is the same path with .csv")
    p.add_argument("--steps", type=_at_least(1, int), default=700, help="the run's number of steps")
    p.add_argument("--batch-size", type=_at_least(1, int), default=64, help="captions per batch")
    p.add_argument("--lr", type=_at_least(0.0, float), default=2e-3, help="the peak learning rate")
    p.add_argument("--warmup", type=_at_least(0, int), default=50, help="the schedule's warm-up steps")
    p.add_argument("--weight-decay", type=_at_least(0.0, float), default=0.01)
    p.add_argument("--d-model", type=_at_least(1, int), default=64)
    p.add_argument("--heads", type=_at_least(1, int), default=4)
    p.add_argument("--layers", type=_at_least(1, int), default=2)
    p.add_argument("--dropout", type=_at_least(0.0, float, below=1.0), default=0.0)
    p.add_argument("--save-every", type=_at_least(1, int), default=100,
                   help="steps between two checkpoints (and validations)")
    p.add_argument("--stop-at", type=_at_least(1, int), default=None,
                   help="end after the first checkpoint at or after this step (the schedule stays that of --steps)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the weights and of the batches' order")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    p.add_argument("--resume", action="store_true", help="go on from the checkpoint instead of starting over")
    args = p.parse_args(argv)
    if not args.lr > 0:
        p.error(f"argument --lr: {args.lr} is not above 0")
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    return args


def eval_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """evaluate_captioner.py's options (`python evaluate_captioner.py --help`)."""
    p = argparse.ArgumentParser(prog="evaluate_captioner.py", description="Evaluate a captioning checkpoint.")
    p.add_argument("checkpoint", type=Path, nargs="?", default=Path("runs/captioning_transformer.pt"))
    p.add_argument("--split", choices=["train", "val"], default="val")
    p.add_argument("--images", type=_at_least(1, int), default=None, help="the first this many images (default all)")
    p.add_argument("--beam", type=_at_least(1, int), default=None, help="beam search of this width (default greedy)")
    p.add_argument("--out", type=Path, default=None, help="the metrics file (default: the checkpoint's path, .json)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    return p.parse_args(argv)


def _log_rows(history: dict) -> list[list]:
    measured = dict(zip(history["val_step"], history["val_loss"]))
    return [[step, loss, lr, measured.get(step, "")]
            for step, loss, lr in zip(history["step"], history["loss"], history["lr"])]


def run_identity(saved: dict | None = None) -> str:
    """The identity a training run writes into each of its checkpoints (their "extra" "run"): a resumed run keeps the
    one of the checkpoint it resumes (`saved`), a new run draws a new one. Two runs never share one, even with the
    same code, seed and steps (and so the same weights), so two students' checkpoints of one run are one file
    handed in twice, or a run resumed from another's (grading.intake flags them)."""
    kept = ((saved or {}).get("extra") or {}).get("run")
    if isinstance(kept, str) and kept.startswith(RUN_TAG):
        return kept
    return RUN_TAG + uuid.uuid4().hex


def train_main(argv, experiment, *, fit, checkpoint_state, restore) -> None:
    """train_captioner.py's run, around your `fit`, `checkpoint_state` and `restore`: read the options; make the
    model (`experiment.new_model`, which seeds torch's generator with --seed) and the optimiser; with --resume,
    read the checkpoint and `restore(saved, model, optimizer)` into them, keeping the log's rows up to the step it
    returns; then train in rounds that end at the multiples of --save-every (and at --steps), each a call of `fit`
    with the whole run's schedule and batches from the round's first step on. After each round it appends the
    round's rows to the log and saves the checkpoint with `checkpoint_state(optimizer, steps_done)` beside the
    weights, and the run's identity (`run_identity`). Errors end it with one line, `train_captioner.py: error: ...`,
    and exit status 1."""
    args = train_arguments(argv)
    exp = experiment or Experiment.open(args.data, device=args.device)
    size = dict(d_model=args.d_model, num_heads=args.heads, num_layers=args.layers,
                dim_feedforward=4 * args.d_model, dropout=args.dropout)
    model = exp.new_model(size, seed=args.seed)
    optimizer = exp.make_optimizer(model, args.lr, args.weight_decay)
    log_path = args.checkpoint.with_suffix(".csv")
    done, rows, run = 0, [], run_identity()
    if args.resume:
        try:
            saved = read_checkpoint(args.checkpoint)
            run = run_identity(saved)
            done = int(restore(saved, model, optimizer))
        except CheckpointError as exc:
            sys.exit(f"train_captioner.py: error: {exc}")
        except KeyError as exc:
            sys.exit(f"train_captioner.py: error: {args.checkpoint} has no {exc} to resume from: it was not saved "
                     "by this script's checkpoint_state")
        if log_path.is_file():  # a run killed after logging and before saving left rows beyond the checkpoint
            with open(log_path, newline="", encoding="utf-8") as f:
                rows = [row for row in list(csv.reader(f))[1:] if row and float(row[0]) <= done]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([list(LOG_COLUMNS), *rows])
    config = FitConfig(step_fn=exp.train_step, val_fn=exp.validation_loss, val_batches=exp.val_batches(args.batch_size),
                       val_every=args.save_every, device=exp.device)
    while done < args.steps:
        stop = min(args.steps, (done // args.save_every + 1) * args.save_every)
        history = fit(model, exp.loss_fn, optimizer, exp.train_batches(args.batch_size, args.seed, start=done),
                      exp.plan(args.steps, args.warmup, args.lr, start=done, stop=stop), config)
        with open(log_path, "a", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(_log_rows(history))
        done = stop
        save_checkpoint(args.checkpoint, model, exp.model_config(size), exp.vocab,
                        **{**checkpoint_state(optimizer, done), "dataset": args.data, "run": run})
        print(f"step {done}/{args.steps}: loss {history['loss'][-1]:.4f}, validation loss "
              f"{history['val_loss'][-1]:.4f}; saved {args.checkpoint}", flush=True)
        if args.stop_at is not None and args.stop_at <= done < args.steps:
            print(f"stopped at step {done} (--stop-at {args.stop_at}): --resume goes on from here")
            return


def evaluate_main(argv, experiment, *, evaluate_checkpoint) -> None:
    """evaluate_captioner.py's run, around your `evaluate_checkpoint`: read the options and the checkpoint, open
    the experiment of the dataset it names, score the split with `evaluate_checkpoint(saved, experiment, split,
    beam)`, write the metrics file (scores, image count, captions; on shapes the count of each kind of mistake)
    and print the scores. Errors end it with one line and exit status 1, and no file is written."""
    from .metrics import format_scores, shapes_error
    args = eval_arguments(argv)
    try:
        saved = read_checkpoint(args.checkpoint)
    except CheckpointError as exc:
        sys.exit(f"evaluate_captioner.py: error: {exc}")
    dataset = saved["extra"].get("dataset", "shapes")
    exp = experiment or Experiment.open(dataset, device=args.device, evaluating=True, beam=args.beam is not None)
    split = exp.split(args.split, args.images)
    scores, captions = evaluate_checkpoint(saved, exp, split, args.beam)
    decoder = "greedy" if args.beam is None else f"beam search, width {args.beam}"
    result = {"checkpoint": str(args.checkpoint), "dataset": dataset, "split": args.split, "decoder": decoder,
              "images": len(captions), "scores": scores, "captions": list(captions)}
    if dataset == "shapes":
        result["mistakes"] = dict(Counter(shapes_error(c, split.references(i)) for i, c in enumerate(captions)))
    out = args.out or args.checkpoint.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(format_scores(scores))
    print(f"{decoder}, {len(captions)} {'validation' if args.split == 'val' else 'training'} images; wrote {out}")


# ---- the training batches, from any step on ----------------------------------------------------------------


class EpochBatches:
    """Training batches epoch after epoch, as a shuffling DataLoader gives them, starting at any step: the batch
    of step s is batch s % n of epoch s // n (n = len(self), whole batches only), and each epoch's order is drawn
    from the seed and the epoch's number alone. So a run resumed at step s gets the batches a run that never
    stopped got. Iterating gives the rest of the current epoch, the next iteration the next epoch (as `fit`
    expects of a loader); `fetch(rows)` turns a batch's row indices into (features, captions)."""

    def __init__(self, rows: int, batch_size: int, seed: int, fetch, start: int = 0):
        if batch_size < 1 or rows < batch_size:
            raise ValueError(f"a batch of {batch_size} needs at least that many rows, there are {rows}")
        self.rows, self.batch_size, self.seed, self.fetch = rows, batch_size, seed, fetch
        self.epoch, self.skip = divmod(int(start), len(self))

    def __len__(self) -> int:
        return self.rows // self.batch_size

    def order(self, epoch: int) -> torch.Tensor:
        """The rows of `epoch` in the order its batches take them."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.rows, generator=generator)

    def __iter__(self):
        epoch, skip = self.epoch, self.skip
        self.epoch, self.skip = epoch + 1, 0  # the next iteration is the next epoch
        order = self.order(epoch)
        for b in range(skip, len(self)):
            yield self.fetch(order[b * self.batch_size:(b + 1) * self.batch_size])


# ---- the experiment: data, your pieces, the device ------------------------------------------------------------


@dataclass
class Experiment:
    """What a script of notebooks 06 and 07 needs that is not its own work. `Experiment.open(data)` makes one from the
    dataset and your notebooks; the checks make a small stand-in with the same attributes and methods."""

    data: str
    device: torch.device
    dataset: Any  # starter.data.CaptionDataset
    vocab: Any  # a Vocab: yours (notebook 04's build_vocab) or the dataset's stored one
    encoded: dict  # split name -> (M, T) encoded captions, with that vocabulary
    pieces: dict  # name -> your function (None where it does not pass its public check)
    layers: str = "mine"  # the decoder layers: yours of notebooks 02-03 ("mine") or PyTorch's ("torch")
    dataset_class: Any = None  # your CaptionFeatures and collate_captions, or None (stored batches then)
    collate: Any = None

    # your pieces, as the scripts call them
    @property
    def loss_fn(self):
        return self.pieces["teacher_forcing_loss"]

    @property
    def lr_at_step(self):
        return self.pieces["lr_at_step"]

    @property
    def train_step(self):
        return self.pieces["train_step"]

    @property
    def validation_loss(self):
        return self.pieces["validation_loss"]

    @property
    def evaluate_captions(self):
        self._need("evaluate_captions")
        return self.pieces["evaluate_captions"]

    def make_optimizer(self, model, lr, weight_decay):
        return self.pieces["make_optimizer"](model, lr, weight_decay)

    def vocab_of(self, checkpoint: dict):
        """The vocabulary a `read_checkpoint` dict was trained with."""
        from .data import Vocab
        return Vocab(checkpoint["vocab"])

    @property
    def max_len(self) -> int:
        """Words a decoder may write: the dataset's caption length without <START>."""
        return self.dataset.max_length - 1

    @classmethod
    def open(cls, data: str = "shapes", device: str = "auto", folder: str | Path | None = None,
             evaluating: bool = False, beam: bool = False) -> Experiment:
        """The dataset `data` and your pieces, loaded from your saved notebooks in the course folder (or `folder`):
        04 and 05 always, then 06 for training, or with `evaluating` 07 (and 08 with `beam`, for beam search). Prints one line per piece: yours, or what is used
        without it; a piece that training needs and does not pass its public check stops the script when it is
        needed. The model's decoder layers are yours (notebooks 02-03) when they pass their checks, else
        PyTorch's, as notebook 06's LAYERS = "torch" (one line says which)."""
        with contextlib.redirect_stdout(io.StringIO()) as said:
            made = cls._open(data, device, folder, evaluating, beam)
        lines = said.getvalue().splitlines()
        yours = [ln.removeprefix("using your ") for ln in lines if ln.startswith("using your ")]
        for line in lines:  # what is not yours, and why, a line each; yours in one line
            if not line.startswith("using your ") and " from " not in line.split(":")[0]:
                print(line)
        if yours:
            print(f"using your {', '.join(yours)} (from your saved notebooks)")
        return made

    @classmethod
    def _open(cls, data, device, folder, evaluating, beam):
        from .data import load_dataset
        from .layers import LayerLoadError, get_layers
        from .notebook_loader import load_or_none
        from .pipeline import CaptionData, yours_if_it_passes

        device = pick_device() if device == "auto" else _available(device)
        ds = load_dataset(data)
        wanted = {DATA_NOTEBOOK: ["build_vocab", "encode_captions", "CaptionFeatures", "collate_captions"],
                  MODEL_NOTEBOOK: ["CaptioningTransformer", "teacher_forcing_loss", "make_optimizer"]}
        if evaluating:
            wanted[GENERATION_NOTEBOOK] = ["greedy_decode", "evaluate_captions"]
            if beam:
                wanted[DECODING_NOTEBOOK] = ["beam_search"]
        else:
            wanted[TRAINING_NOTEBOOK] = ["lr_at_step", "train_step", "validation_loss"]
        found = {name: fn for notebook, names in wanted.items() for name, fn in load_or_none(notebook, names, folder).items()}
        captions = CaptionData.of(ds, found)
        missing = "the scripts cannot train or evaluate without it"
        pieces = dict.fromkeys(("lr_at_step", "train_step", "validation_loss", "greedy_decode", "evaluate_captions",
                                "beam_search"))  # what this script does not load stays None
        pieces.update({name: yours_if_it_passes(name, fn, instead=missing) if name in _CHECKED else fn
                       for name, fn in found.items()})
        try:
            get_layers("mine", folder)
            layers = "mine"
            print("using your layers (notebooks 02-03)")
        except LayerLoadError as exc:
            layers = "torch"
            print(f"layers: PyTorch's, as yours do not load yet ({exc})")
        return cls(data=data, device=device, dataset=ds, vocab=captions.vocab, encoded=captions.encoded, pieces=pieces,
                   layers=layers,
                   dataset_class=captions.dataset_class, collate=captions.collate)

    def _need(self, *names: str) -> None:
        missing = [n for n in names if not callable(self.pieces.get(n))]
        if missing:
            raise ScriptError(f"{', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not pass {'its' if len(missing) == 1 else 'their'} public "
                              "check yet (the lines above say why): the script stops here")

    def model_config(self, size: dict) -> dict:
        """The model's constructor arguments: the dataset's sizes with `size` (d_model, num_heads, num_layers,
        dim_feedforward, dropout)."""
        return dict(vocab_size=len(self.vocab), feature_dim=self.dataset.feature_dim,
                    num_regions=self.dataset.num_regions, max_len=self.dataset.max_length, layers=self.layers, **size)

    def new_model(self, size: dict, seed: int):
        """A freshly initialised CaptioningTransformer (yours) of `size`, on the device; `seed` seeds its weights."""
        self._need("CaptioningTransformer", "teacher_forcing_loss")
        seed_everything(seed)
        return self.pieces["CaptioningTransformer"](**self.model_config(size)).to(self.device)

    def model_from(self, checkpoint: dict):
        """The model a `read_checkpoint` dict holds, in eval mode on the device."""
        self._need("CaptioningTransformer")
        model = self.pieces["CaptioningTransformer"](**checkpoint["config"])
        try:
            model.load_state_dict(checkpoint["state_dict"])
        except RuntimeError as exc:
            raise CheckpointError(f"the checkpoint's weights do not fit your CaptioningTransformer: "
                                  f"{str(exc).splitlines()[0]}") from None
        return model.to(self.device).eval()

    def plan(self, steps: int, warmup: int, peak_lr: float, start: int = 0, stop: int | None = None,
             progress: bool | None = None) -> TrainingPlan:
        """Steps `start` to `stop` - 1 of a run of `steps` steps, each with your schedule's learning rate; a progress
        bar in a terminal (`progress` None), none when the output goes to a notebook through `run_command`, where
        the script's line per round is its progress."""
        self._need("lr_at_step")
        progress = sys.stderr.isatty() if progress is None else progress
        return TrainingPlan(steps, self.lr_at_step, warmup, peak_lr, start=start, stop=stop, progress=progress)

    def train_batches(self, batch_size: int, seed: int, start: int = 0) -> EpochBatches:
        """The training batches from step `start` on (EpochBatches), through your CaptionFeatures and
        collate_captions when they pass their checks (else the stored batches)."""
        split = self.dataset.split("train")
        captions = torch.as_tensor(self.encoded["train"], dtype=torch.long)
        if self.dataset_class is not None:
            items = self.dataset_class(*split.features_file, captions, split.image_idxs)

            def fetch(rows):
                return self.collate([items[int(i)] for i in rows])
        else:
            def fetch(rows):
                return split.features(split.image_idxs[rows]), captions[rows]
        return EpochBatches(len(captions), batch_size, seed, fetch, start)

    def val_batches(self, batch_size: int, count: int = 4) -> list:
        """`count` fixed batches of validation captions (the first ones), on the device."""
        split = self.dataset.split("val")
        captions = torch.as_tensor(self.encoded["val"], dtype=torch.long)
        out = []
        for b in range(min(count, len(captions) // batch_size)):
            rows = torch.arange(b * batch_size, (b + 1) * batch_size)
            out.append((split.features(split.image_idxs[rows]).to(self.device), captions[rows].to(self.device)))
        return out

    def split(self, name: str, images: int | None = None):
        """Split `name` ("train" or "val"), or its first `images` images."""
        split = self.dataset.split(name)
        return split if images is None or images >= split.num_images else split.head(images)

    def decoder(self, beam: int | None = None):
        """decode(model, features, max_len): your greedy_decode, or with `beam` your beam_search of notebook 08
        with that beam width."""
        if beam is None:
            self._need("greedy_decode")
            return self.pieces["greedy_decode"]
        self._need("beam_search")
        beam_search = self.pieces["beam_search"]

        def decode(model, features, max_len):  # notebook 08's order: beam_search(model, features, beam_width, max_len)
            return beam_search(model, features, beam, max_len)
        return decode


def _available(name: str) -> torch.device:
    """The device `name` ("cpu", "cuda", "mps"), or a one-line error when this machine has none."""
    there = {"cpu": True, "cuda": torch.cuda.is_available(),
             "mps": getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()}
    if not there.get(name, False):
        raise ScriptError(f"--device {name}: this machine has no {name.upper()} device that PyTorch can use "
                          "(--device auto takes a GPU when there is one, else the CPU)")
    return torch.device(name)


_CHECKED = ("CaptioningTransformer", "teacher_forcing_loss", "make_optimizer", "lr_at_step", "train_step",
            "validation_loss", "greedy_decode", "evaluate_captions")  # the pieces with a public case of their own


# ---- the checks' stand-in experiment ---------------------------------------------------------------------------


def _toy_loss(model, features, captions):
    from .pipeline import _toy_loss as loss
    return loss(model, features, captions)


def _drifting_step(model, loss_fn, optimizer, features, captions, lr, grad_clip=1.0):
    """The stand-in training step of the script checks. It does not train: it returns the batch's loss and moves
    every weight by a drift kept in the optimiser's state (so that a resume that loses the optimiser's state
    drifts otherwise) plus a draw of torch's random generator (so that one that loses the random state does too)
    and the batch and rate (so that the weights tell which batches came at which rates)."""
    with torch.no_grad():
        loss = float(loss_fn(model, features, captions))
        push = lr * (features.double().mean() + captions.double().mean() / 100) + 1e-3 * torch.rand((), dtype=torch.float64)
        for p in model.parameters():
            state = optimizer.state[p]
            drift = state.get("drift")
            drift = push.to(p.dtype).expand_as(p).clone() if drift is None else 0.5 * drift + push.to(p.dtype)
            state["drift"] = drift
            p.mul_(0.9).add_(drift)
    return loss


def _weights_probe(model, loss_fn, batches):
    from .pipeline import _weights_probe as probe
    return probe(model, loss_fn, batches)


def _stand_in_schedule(step, total_steps, warmup_steps, peak_lr):
    """A made-up schedule (not the task's): a rate that tells the step and the run's length apart."""
    return peak_lr * (1 + 0.5 * math.sin(step + 1)) * (1 + warmup_steps) / (total_steps + warmup_steps)


class _StandInVocab(list):
    @property
    def idx_to_word(self):
        return list(self)


@dataclass
class StandInExperiment:
    """The checks' Experiment: the toy model of a case with its stored weights, its rows as the data, and
    stand-in pieces that mark the weights instead of training them."""

    model: nn.Module  # the toy model with the case's stored weights: every new_model is a copy of it
    features: torch.Tensor
    captions: torch.Tensor
    val_rows: int
    data: str = "stand-in"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    vocab: list = field(default_factory=lambda: _StandInVocab(f"w{i}" for i in range(9)))
    decoders: dict = field(default_factory=dict)  # beam width (None: greedy) -> decode function
    stop_at: int | None = None  # the next run is killed in its training step of this number (1-based)
    max_len: int = 6

    loss_fn = staticmethod(_toy_loss)
    lr_at_step = staticmethod(_stand_in_schedule)
    validation_loss = staticmethod(_weights_probe)

    def train_step(self, model, loss_fn, optimizer, features, captions, lr, grad_clip=1.0):
        if self.stop_at is not None:
            self.stop_at -= 1
            if self.stop_at == 0:
                self.stop_at = None
                raise KeyboardInterrupt  # a run killed in the middle of a step (Ctrl+C, a runtime gone)
        return _drifting_step(model, loss_fn, optimizer, features, captions, lr, grad_clip)

    def model_config(self, size: dict) -> dict:
        return {"toy": True, **size}

    def new_model(self, size: dict, seed: int):
        seed_everything(int(seed))  # as Experiment.new_model does: a run that does not restore the random state starts over
        return copy.deepcopy(self.model).train()

    def model_from(self, checkpoint: dict):
        model = copy.deepcopy(self.model)
        try:
            model.load_state_dict(checkpoint["state_dict"])
        except RuntimeError as exc:
            raise CheckpointError(f"the checkpoint's weights do not fit the model: {str(exc).splitlines()[0]}") from None
        return model.eval()

    def make_optimizer(self, model, lr, weight_decay):
        return torch.optim.SGD(model.parameters(), lr=lr)

    def plan(self, steps, warmup, peak_lr, start=0, stop=None, progress=True):
        return TrainingPlan(steps, self.lr_at_step, warmup, peak_lr, start=start, stop=stop, progress=False)

    def train_batches(self, batch_size, seed, start=0):
        rows = len(self.captions) - self.val_rows

        def fetch(idx):
            return self.features[idx], self.captions[idx]
        return EpochBatches(rows, batch_size, seed, fetch, start)

    def val_batches(self, batch_size, count=4):
        return [(self.features[-self.val_rows:], self.captions[-self.val_rows:])]

    def split(self, name, images=None):
        from .pipeline import _StoredSplit
        refs = self.references if images is None else self.references[:images]
        return _StoredSplit(refs)

    references: list = field(default_factory=list)

    def vocab_of(self, checkpoint: dict):
        from .pipeline import _StoredWords
        return _StoredWords(checkpoint["vocab"])

    @staticmethod
    def evaluate_captions(model, decode_fn, split, vocab, max_len, batch_size=250):
        """A stand-in for your evaluate_captions (not it): numbers that tell which model, decoder, images,
        vocabulary and max_len it was given, and the captions as strings of indices."""
        with torch.no_grad():
            tokens = decode_fn(model.eval(), split.features(list(range(split.num_images))), max_len).double()
        n = split.num_images
        scores = {"BLEU-1": float(tokens.mean()), "BLEU-2": float((tokens == END_INDEX).double().mean()),
                  "BLEU-3": float(tokens[:, 0].sum()), "BLEU-4": float(len(vocab)), "CIDEr": float(tokens.shape[1]),
                  "exact_match": float(n)}
        return scores, [" ".join(str(int(t)) for t in row) for row in tokens]

    def decoder(self, beam=None):
        if beam not in self.decoders:
            raise ScriptError(f"the stand-in has no decoder with beam {beam}")
        return self.decoders[beam]


# ---- the adapters of the script checks -------------------------------------------------------------------------


@contextlib.contextmanager
def _captured():
    """Standard output and error of what runs inside, as two StringIOs."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def _call_main(main, argv: list[str], experiment) -> tuple[int, str]:
    """main(argv, experiment=...) as a command line runs it: (exit status, what it wrote on stderr). An
    exception other than SystemExit is the script crashing (status 1, with a traceback)."""
    with _captured() as (_, err):
        try:
            main(list(argv), experiment=experiment)
            status = 0
        except SystemExit as exc:
            code = exc.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            if isinstance(code, str):
                print(code, file=sys.stderr)
        except NotImplementedError:
            raise
        except OneLineError as exc:  # what run_script, at the end of the file, makes of it on a command line
            status = 1
            print(f"{getattr(main, '__module__', None) or 'script'}.py: error: {exc}", file=sys.stderr)
        except Exception as exc:
            first = (str(exc).splitlines() or [""])[0][:200]
            raise RuntimeError(f"main({argv}) raised {type(exc).__name__}: {first} (the given main stops with one "
                               "line for the errors it expects: this one came from a function of yours)") from None
    return status, err.getvalue()


def _one_clear_line(err: str) -> bool:
    """What a script wrote on stderr ends with one line "NAME: error: what is wrong" (argparse's usage lines may
    come before it) and holds no traceback; or it is empty (a run that succeeded)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return not lines or (": error: " in lines[-1] and not any("Traceback" in ln for ln in lines))


def _main_of(script):
    if script is None:  # load_script said why in a line: the file is not written, or not finished
        raise NotImplementedError("the script")
    main = getattr(script, "main", None)
    if not callable(main):
        raise TypeError("the script defines no main(argv=None, experiment=None)")
    return main


def _file_state(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _log_tensor(path: Path, dtype) -> torch.Tensor:
    if not path.is_file():
        return torch.zeros(0, len(LOG_COLUMNS), dtype=dtype)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        if tuple(h.strip() for h in header) != LOG_COLUMNS:
            raise ValueError(f"the log's header is {header}, not {list(LOG_COLUMNS)}")
        rows = [[float(v) if v.strip() else math.nan for v in row] for row in reader if row]
    return torch.tensor(rows, dtype=dtype).reshape(-1, len(LOG_COLUMNS))


def with_train_script(script, model_class=None):
    """``script.main(argv, experiment=...)`` of train_captioner.py, run as `runs` command lines one after the other
    in a fresh folder, on a StandInExperiment of the case's toy model and rows. Returns the checkpoint's weights,
    the log, and for each command line [exit status is not 0, at most two lines on stderr and no traceback, files
    untouched when it failed]."""
    from .layers import ToyCaptioner
    from .pipeline import _on_model

    def run(self, features, captions, runs, val_rows):
        main = _main_of(script)
        dtype = features.dtype
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint, log = Path(tmp) / "runs" / "model.pt", Path(tmp) / "runs" / "model.csv"
            experiment = StandInExperiment(self.model, features, captions, int(val_rows))
            torch.manual_seed(0)
            exits = []
            for argv in runs:
                if argv[:1] == ["<stop at step>"]:  # the next run is killed in this step
                    experiment.stop_at = int(argv[1])
                    continue
                if argv == ["<crash after log>"]:  # a run killed after writing its log, before saving: one row too many
                    with open(log, "a", encoding="utf-8") as f:
                        f.write("999,1.0,0.1,\n")
                    continue
                before = (_file_state(checkpoint), _file_state(log))
                try:
                    status, err = _call_main(main, [*argv, "--checkpoint", str(checkpoint), "--device", "cpu"],
                                             experiment)
                except KeyboardInterrupt:  # the killed run: what it saved before stays
                    exits.append([1.0, 1.0, 1.0])
                    continue
                exits.append([float(status != 0), float(_one_clear_line(err))])
                if status != 0:
                    exits[-1].append(float((_file_state(checkpoint), _file_state(log)) == before))
                else:
                    exits[-1].append(1.0)
            try:
                saved = read_checkpoint(checkpoint)
            except CheckpointError:  # none, or the damaged one a case left there
                saved = None
            weights = (torch.cat([v.reshape(-1).to(dtype) for v in saved["state_dict"].values()]) if saved
                       else torch.zeros(0, dtype=dtype))
            return weights, _log_tensor(log, dtype), torch.tensor(exits, dtype=dtype).reshape(-1, 3)

    return _on_model(run, model_class or ToyCaptioner, getattr(script, "main", None))


def with_eval_script(script, model_class=None):
    """``script.main(argv, experiment=...)`` of evaluate_captioner.py on a checkpoint of the case's toy model
    (its stored weights, `perturb` added), with stored decoders (greedy, and a beam of width 3) and references.
    Returns the metrics JSON's scores (SCORE_NAMES, then the number of images), and for each command line
    [exit status is not 0, at most two lines on stderr and no traceback, files as before when it failed]."""
    from .layers import ToyCaptioner
    from .pipeline import SCORE_NAMES, _on_model, _stored_decoder

    def run(self, greedy_tokens, beam_tokens, references, idx_to_word, runs, perturb=0.0):
        main = _main_of(script)
        dtype = torch.float32
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint, metrics = Path(tmp) / "model.pt", Path(tmp) / "metrics.json"
            model = copy.deepcopy(self.model)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(perturb)
            save_checkpoint(checkpoint, model, {"toy": True}, list(idx_to_word), step=3, dataset="stand-in")
            weight_sum = float(sum(p.detach().double().sum() for p in model.parameters()))

            def decoder(tokens):
                stored = _stored_decoder(tokens)

                def decode(model, features, max_len, **kw):
                    loaded = float(sum(p.detach().double().sum() for p in model.parameters()))
                    rows = stored(model, features, max_len)
                    return rows if abs(loaded - weight_sum) < 1e-6 else torch.full_like(rows, END_INDEX)
                return decode

            experiment = StandInExperiment(self.model, torch.zeros(0), torch.zeros(0, dtype=torch.long), 0,
                                           vocab=_StandInVocab(idx_to_word),
                                           decoders={None: decoder(greedy_tokens), 3: decoder(beam_tokens)},
                                           references=[list(r) for r in references], max_len=greedy_tokens.shape[1])
            exits = []
            for argv in runs:
                before = (_file_state(checkpoint), _file_state(metrics))
                status, err = _call_main(main, [str(checkpoint), *argv, "--out", str(metrics), "--device", "cpu"],
                                         experiment)
                exits.append([float(status != 0), float(_one_clear_line(err)),
                              float(status == 0 or (_file_state(checkpoint), _file_state(metrics)) == before)])
            scores = torch.full((len(SCORE_NAMES) + 1,), -1.0, dtype=dtype)  # -1: not in the file
            if metrics.is_file():
                try:
                    written = json.loads(metrics.read_text(encoding="utf-8"))
                except ValueError:
                    raise ValueError(f"{metrics.name} is not JSON") from None
                got = written.get("scores", {}) if isinstance(written, dict) else {}
                scores = torch.tensor([float(got.get(k, -1.0)) for k in SCORE_NAMES]
                                      + [float(written.get("images", -1.0)) if isinstance(written, dict) else -1.0],
                                      dtype=dtype)
            return scores, torch.tensor(exits, dtype=dtype).reshape(-1, 3)

    return _on_model(run, model_class or ToyCaptioner, getattr(script, "main", None))


def script_if_it_passes(name: str, script, instead: str):
    """Notebook 06's or 07's script `name` ("train_script" or "eval_script", a module of `load_script`) if it passes its
    public check, else None, with one line saying which (as starter.pipeline.yours_if_it_passes)."""
    from .pipeline import yours_if_it_passes
    case = {"train_script": ("train_script/resume", with_train_script),
            "eval_script": ("eval_script/greedy", with_eval_script)}[name]
    return yours_if_it_passes(name, script, instead, case=case)


def run_script(main) -> None:
    """What a script's `if __name__ == "__main__":` calls: main(), with an error of the kit (a piece that does not
    pass its check, a checkpoint that does not fit) as one line and exit status 1 instead of a traceback."""
    try:
        main()
    except OneLineError as exc:
        sys.exit(f"{Path(sys.argv[0]).name}: error: {exc}")
