# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 06 · Training the captioner
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/06_training.ipynb)
#
# Notebook 05 built the model and its loss. Here you write the script that trains it, and run it:
#
# - the learning-rate schedule `lr_at_step`, one optimisation step `train_step`, the validation loss `validation_loss` and the loop `fit` around them;
# - what a checkpoint must hold for a stopped run to go on exactly (`checkpoint_state`, `restore`).
#
# Then your model is trained on `shapes` and saved. Notebook 07 writes captions with it and grades it on new scenes.
#
# Given: the script's command line, log and files (`starter/scripts.py`; a `TrainingPlan` of `starter.training` gives your loop its steps and a progress bar with the time left) and the plots. The kit has no version of your pieces: while one does not pass its public check yet, the notebook says so in one line and skips what needs it (training).
#
# **What you need from notebooks 04 and 05.** Section 1 loads your `build_vocab`, `encode_captions`, `CaptionFeatures` and `collate_captions` from your `04_captioning_data.ipynb`, and your `CaptioningTransformer`, `caption_loss`, `teacher_forcing_loss` and `make_optimizer` from your `05_captioning_model.ipynb` (their set-up and answer cells only: no plots, no test cells), found next to this notebook (on Colab: also in `My Drive/Colab Notebooks`). A data piece that does not pass its public check yet is replaced by the dataset's stored data (vocabulary, encoded captions, batches), with one line saying so; without a working model, loss and optimiser, nothing is trained. The graded checks of this notebook run on stand-ins and do not use notebooks 04 and 05.
#
# **How to work.** Fill in the cells marked `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line) and run the test cell below each one: it prints `✓ … passed` or one line naming the likely bug. The graded version of each test cell also runs hidden cases. Don't edit or delete test cells.

# %% nbgrader={"grade": false, "grade_id": "code_02", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["colab"]
# Run this cell first. On Google Colab it installs the course kit (only what Colab lacks, once per runtime)
# and, with USE_DRIVE, keeps your notebooks and checkpoints in one Google Drive folder. Locally it installs
# nothing (install the kit as the README says); everywhere it makes unfinished tasks show as one line, not a traceback.
USE_DRIVE = True                  # Colab: work in My Drive/COURSE_DIR (Colab asks once for access to Drive)
COURSE_DIR = "attention-course"   # the course folder in your Google Drive
import os, subprocess, sys
if "google.colab" in sys.modules:
    KIT = "/content/attention-transformers"
    if not os.path.isdir(os.path.join(KIT, "starter")):
        COURSE_REPO = os.environ.get("COURSE_REPO", "https://github.com/attention-course-kit/attention-transformers.git")
        print("installing the course kit (about 30 s, once per runtime) ...")
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", COURSE_REPO, KIT], check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", KIT], check=True)
    sys.path.insert(0, KIT)  # importable now, without restarting the runtime
from starter.runtime import start_notebook
COURSE_FOLDER = start_notebook(use_drive=USE_DRIVE, course_dir=COURSE_DIR)

# %% nbgrader={"grade": false, "grade_id": "code_03", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["setup"]
import math
import os
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from starter.checks import check
from starter.data import load_dataset
from starter.layers import get_layers
from starter.notebook_loader import load_or_none
from starter.pipeline import CaptionData, yours_if_it_passes
from starter.plotting import plot_losses
from starter.runtime import checkpoint_file
from starter.scripts import load_script, read_checkpoint, read_log, run_command, script_if_it_passes
from starter.training import (GRADING, TrainConfig, TrainingPieces, count_parameters, load_checkpoint,
                              overfit_small_batch, pick_device, seed_everything)

torch.manual_seed(0)

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_from04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · The data, and your pieces from notebooks 04 and 05
#
# The dataset is chosen here, in one line (`shapes` by default; COCO in section 3): `shapes` is built on first use, and a COCO dataset that is not on disk is an error naming the command that fetches it. Then your pieces of notebooks 04 and 05 are loaded and each one this notebook calls runs its public check (`caption_loss` runs inside `teacher_forcing_loss`); the line printed for each says whether yours is used.

# %% nbgrader={"grade": false, "grade_id": "code_data05", "locked": true, "schema_version": 3, "solution": false, "task": false}
DATASET = "shapes"   # or "coco-fc7" (CS231n features: python -m data.coco_cs231n), "coco-grid" (python -m starter.build_coco_grid)

ds = load_dataset(DATASET)
train_split, val_split = ds.split("train"), ds.split("val")
print(ds)

# %% nbgrader={"grade": false, "grade_id": "code_from04", "locked": true, "schema_version": 3, "solution": false, "task": false}
mine = {**load_or_none("04_captioning_data.ipynb", ["build_vocab", "encode_captions", "CaptionFeatures", "collate_captions"]),
        **load_or_none("05_captioning_model.ipynb", ["CaptioningTransformer", "caption_loss", "teacher_forcing_loss",
                                                     "make_optimizer"])}   # None for each piece of a notebook that can't be loaded
CaptioningTransformer, teacher_forcing_loss = mine["CaptioningTransformer"], mine["teacher_forcing_loss"]

data = CaptionData.of(ds, mine)   # your vocabulary, encoding, Dataset and collate function, each once it passes
vocab, encoded, make_loader = data.vocab, data.encoded, data.loader   # make_loader(split, batch_size, shuffle, seed=0)
print(vocab)

untrained = "the model stays untrained and nothing is saved (the cells that need a trained model say so)"
model_ready = (yours_if_it_passes("CaptioningTransformer", CaptioningTransformer, instead=untrained) is not None
               and yours_if_it_passes("teacher_forcing_loss", teacher_forcing_loss, instead=untrained) is not None)
make_optimizer = yours_if_it_passes("make_optimizer", mine["make_optimizer"], instead=untrained)

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_layers", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The model uses a decoder layer and a positional encoding with the interfaces of notebooks 02–03, as in notebook 05: yours (`LAYERS = "mine"`, loaded from your notebooks 02 and 03, which must pass their public checks) or PyTorch's (`LAYERS = "torch"`). Either way the rest of the notebook is the same. The training script, a program of its own, does not read `LAYERS`: it uses your layers when notebooks 02 and 03 pass their checks, else PyTorch's, and prints which.

# %% nbgrader={"grade": false, "grade_id": "code_layers", "locked": true, "schema_version": 3, "solution": false, "task": false}
LAYERS = "mine"   # or "torch": PyTorch-backed layers with the same interface (starter/layers.py)

if model_ready:
    get_layers(LAYERS, verbose=True)   # stops here, with one line, if your layers are not ready


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_14", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2 · Training
#
# A training script has five parts: the **learning-rate schedule**, the **optimiser**, the **training step** (one minibatch: forward, loss, backward, update), the **validation loss** (how the model does on data it does not train on) and the **loop** around them, and around all of it a **driver**: the settings of the run, checkpoints and a log. The optimiser is your `make_optimizer` of notebook 05; you write the schedule, the step and the validation loss here, in the notebook, then the loop and the driver in the file `train_captioner.py`. The loop draws batches, calls your step with your optimiser and your schedule's learning rate, and measures the validation loss every so often; a `TrainingPlan` of the kit hands it the steps and shows a progress bar. The script runs on the GPU when there is one, and it is seeded, so a run repeats on the same machine.
#
# ### Task 1 · `lr_at_step(step, total_steps, warmup_steps, peak_lr)`
#
# Transformers are trained with a **warm-up**: the first updates of Adam are large and noisy (its running averages of the gradient have seen little), and a small learning rate at the start keeps them from wrecking the freshly initialised attention. Notebook 03 chose pre-norm because it needs little or no warm-up: in notebook 03's measurement, post-norm needed a warm-up to learn at the higher of its two learning rates and none at the lower, and pre-norm learned at both without one, though at the higher rate a warm-up still helped it; here a short warm-up (50 of 700 steps on `shapes`) only protects those first Adam steps. After it, a **cosine decay** lowers the rate smoothly so the last steps fine-tune. Return the learning rate at `step` (0-based; it may be fractional):
#
# - warm-up, `step < warmup_steps`: $\eta = \eta_{peak} \cdot \min\left(1, \frac{step + 1}{warmup\_steps}\right)$ (the first step already moves, and step `warmup_steps - 1` is at the peak);
# - then, with $p = \min\left(1, \frac{step - warmup\_steps}{\max(1,\ total\_steps - warmup\_steps)}\right)$: $\eta = \eta_{peak}\left(0.1 + 0.45\,(1 + \cos \pi p)\right)$, from the peak down to 10 % of it at `total_steps`, and flat after that.
#
# PyTorch's `torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at_step(s, total_steps, warmup_steps, peak_lr) / peak_lr)`, stepped once per training step, applies the same rates on whole steps. Here you write the function itself, because a run on a time budget (`time_limit`) evaluates it at fractional steps.

# %% nbgrader={"grade": false, "grade_id": "lr_at_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def lr_at_step(step, total_steps, warmup_steps, peak_lr):
    """Learning rate at `step` (0-based, may be fractional): linear warm-up, then cosine decay to 10% of the peak.

    Returns:
        a Python float.
    """
    ### BEGIN SOLUTION
    if step < warmup_steps:
        return peak_lr * min(1.0, (step + 1) / warmup_steps)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_lr_at_step", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import over_steps
check("schedule/basic", over_steps(lr_at_step))
### BEGIN HIDDEN TESTS
check("schedule/long_warmup", over_steps(lr_at_step))
check("schedule/fractional_steps", over_steps(lr_at_step))
check("schedule/past_the_end", over_steps(lr_at_step))
check("schedule/no_warmup", over_steps(lr_at_step))
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "code_sched_plot", "locked": true, "schema_version": 3, "solution": false, "task": false}
schedule = yours_if_it_passes("lr_at_step", lr_at_step, instead="no plot until it passes")
if schedule is not None:
    steps = list(range(700))
    plt.figure(figsize=(6, 2.5))
    plt.plot(steps, [schedule(s, 700, 50, 2e-3) for s in steps])
    plt.xlabel("step"); plt.ylabel("learning rate"); plt.title("warm-up (50 steps), then cosine decay to 10 %")
    plt.tight_layout(); plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_step_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2 · `train_step(model, loss_fn, optimizer, features, captions, lr, grad_clip=1.0)`
#
# One optimisation step on one batch, at this step's learning rate `lr` (the optimiser keeps its rate in each of `optimizer.param_groups`, a list of dicts with an `"lr"` entry). The loss is `loss_fn(model, features, captions)` (your `teacher_forcing_loss` of notebook 05 in this notebook); return it as a Python float, as it was before the update. The model trains in training mode (dropout on). With `grad_clip` not `None`, the gradients' total norm is at most `grad_clip` when the update is made (`torch.nn.utils.clip_grad_norm_` rescales them), so that one unlucky batch cannot throw the weights far; with `None`, nothing is clipped.
#
# Two facts of PyTorch that the check catches when they are forgotten: `backward()` **adds** each gradient to the parameter's `.grad` rather than overwriting it, and clipping sees only the gradients that exist when it is called.

# %% nbgrader={"grade": false, "grade_id": "train_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def train_step(model, loss_fn, optimizer, features, captions, lr, grad_clip=1.0):
    """One training step on one batch; returns the loss (a float, before the update).

    Args:
        model: the model; loss_fn(model, features, captions) -> scalar loss tensor.
        optimizer: a torch.optim optimiser over the model's parameters.
        features: (B, R, D) float; captions: (B, T) int64.
        lr: the learning rate of this step; grad_clip: max gradient norm, or None for no clipping.
    """
    ### BEGIN SOLUTION
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    optimizer.zero_grad()
    loss = loss_fn(model, features, captions)
    loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_train_step", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_optimizer
check("step/adamw", with_optimizer(train_step))
### BEGIN HIDDEN TESTS
check("step/sgd", with_optimizer(train_step))
check("step/sgd_clipped", with_optimizer(train_step))
check("step/no_clipping", with_optimizer(train_step))
check("step/adamw_changing_lr", with_optimizer(train_step))
check("step/two_param_groups", with_optimizer(train_step))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_val_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 3 · `validation_loss(model, loss_fn, batches)`
#
# The mean of `loss_fn(model, features, captions)` over `batches` (a list of `(features, captions)` pairs), as a Python float, measured the way the model will be used:
#
# - in **eval mode**: dropout off, so the number does not depend on random masks;
# - without gradients: nothing is learned from validation data, and no graph is kept in memory;
# - and the model leaves in the mode it came in, because the loop calls this in the middle of training: a model left in eval mode would train on without dropout.
#
# Average the batches' losses (each batch counts once).

# %% nbgrader={"grade": false, "grade_id": "validation_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def validation_loss(model, loss_fn, batches):
    """Mean loss over batches [(features, captions), ...], in eval mode without gradients; a float.
    The model's train/eval mode is the same afterwards as before."""
    ### BEGIN SOLUTION
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [loss_fn(model, features, captions).item() for features, captions in batches]
    model.train(was_training)
    return sum(losses) / len(losses)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_validation_loss", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_batches
check("validation/basic", with_batches(validation_loss))
### BEGIN HIDDEN TESTS
check("validation/uneven_batches", with_batches(validation_loss))
check("validation/one_batch", with_batches(validation_loss))
check("validation/handed_over_in_eval_mode", with_batches(validation_loss))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_fit_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### The training script, `train_captioner.py`
#
# Training runs in a script, as it does wherever deep learning is done: a file you start from a terminal (`python train_captioner.py --steps 700`) or from a notebook (`!python …`), with its settings on the command line. It writes a **checkpoint** it can go on from and a **log** of every step. A run that dies (a closed laptop, a Colab runtime that times out) goes on with `--resume` and ends exactly where it would have ended without the interruption.
#
# The script is written by the cells of this section: the first (`%%writefile train_captioner.py`) starts the file with your loop `fit` (Task 4), the second (`%%writefile -a`, *append*) adds what a checkpoint holds (Task 5) and the given `main`. Run both whenever you change either (the first starts the file over). The script takes everything that is not its own work from an `Experiment` (`starter/scripts.py`): the dataset, your pieces of notebooks 04 to 06 (loaded from your **saved** notebooks, as notebooks 07 and 08 load them: save this notebook before you run the script), the device, a plan of steps and the training batches.
#
# ### Task 4 · the training loop: `fit(model, loss_fn, optimizer, loader, plan, config)`
#
# `plan` (a `starter.training.TrainingPlan`) decides the steps: iterating over it gives `(step, lr)` pairs, `step` the 0-based number of the step in the whole run (a resumed run's plan starts later) and `lr` its learning rate. It may end early when a time budget binds: follow the plan, not a count. `config` (a `starter.training.FitConfig`) holds the rest: `step_fn` (one training step, with `train_step`'s arguments), `val_fn` and `val_batches` (the validation loss, with `validation_loss`'s arguments, and the fixed batches it measures), `val_every` and `device` (where the model is).
#
# What `fit` must do:
#
# - each step trains on the **next** batch `(features, captions)` of `loader`, on `config.device`. `loader` gives one epoch per pass, as a shuffling `DataLoader` does (each pass draws a new order): when it runs out, the next epoch begins and training goes on;
# - it returns `history`, a dict of five lists. `"step"`, `"loss"` and `"lr"` get one entry per step: the number of steps done counted from the start of the run (`step + 1`: a resumed plan's first entry is not 1), the loss the step returned, its rate;
# - `"val_step"` and `"val_loss"` record the validation loss with the number of steps done when it was measured: after each step that brings the count to a multiple of `config.val_every`, and after the last step if that one was not measured, so that the curve ends where training ended. The validation batches are only measured, never trained on.

# %% nbgrader={"grade": false, "grade_id": "fit", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%writefile train_captioner.py
"""Train the captioning Transformer of notebooks 04-05 with the pieces of notebook 06; a run stopped at any point goes on with --resume.

    python train_captioner.py                           # shapes: 700 steps into runs/captioning_transformer.pt
    python train_captioner.py --stop-at 300             # ... stopped at step 300, then
    python train_captioner.py --resume                  # ... the rest: the weights of 700 steps in one run
"""
import torch

from starter.scripts import run_script, train_main


def fit(model, loss_fn, optimizer, loader, plan, config):
    """Train `model` for the steps of `plan` on batches from `loader`, epoch after epoch.

    Args:
        model, loss_fn, optimizer: as for train_step.
        loader: an iterable of (features (B, R, D), captions (B, T)) batches, one epoch per pass (a DataLoader).
        plan: yields (step, lr) pairs: the 0-based step and its learning rate.
        config: a FitConfig with
            step_fn(model, loss_fn, optimizer, features, captions, lr) -> loss (float): one training step;
            val_fn(model, loss_fn, batches) -> float: the validation loss;
            val_batches: list of (features, captions), already on `device`;
            val_every: validate every this many steps;
            device: where the model is; training batches are moved there.
    Returns:
        history: {"step": [...], "loss": [...], "lr": [...], "val_step": [...], "val_loss": [...]}.
    """
    history = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": []}
    ### BEGIN SOLUTION
    batches = iter(loader)
    for step, lr in plan:
        batch = next(batches, None)
        if batch is None:  # the end of an epoch: the next one begins
            batches = iter(loader)
            batch = next(batches)
        features, captions = (t.to(config.device) for t in batch)
        history["step"].append(step + 1)
        history["loss"].append(config.step_fn(model, loss_fn, optimizer, features, captions, lr))
        history["lr"].append(lr)
        if (step + 1) % config.val_every == 0:
            history["val_step"].append(step + 1)
            history["val_loss"].append(config.val_fn(model, loss_fn, config.val_batches))
    if history["step"] and history["val_step"][-1:] != history["step"][-1:]:
        history["val_step"].append(history["step"][-1])
        history["val_loss"].append(config.val_fn(model, loss_fn, config.val_batches))
    ### END SOLUTION
    return history


# %% nbgrader={"grade": true, "grade_id": "test_fit", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_loader
from starter.scripts import load_script
fit = load_script("train_captioner.py", "fit")   # the file the cell above wrote, as a module, without running it
check("fit/basic", with_loader(fit))
### BEGIN HIDDEN TESTS
check("fit/whole_epochs", with_loader(fit))
check("fit/validate_once", with_loader(fit))
check("fit/every_step", with_loader(fit))
check("fit/resumed_plan", with_loader(fit))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_fit_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# *How this check works:* `with_loader(fit)` runs your loop on a tiny stand-in model with a stand-in loader (its order changes each epoch), a plan of stored rates, and a step and a validation that do not train but mark and read the weights. It compares the history and the weights with the stored ones: your loop alone is tested, whatever your `train_step` does.
#
# ### Task 5 · what a checkpoint holds: `checkpoint_state(optimizer, step)` and `restore(saved, model, optimizer)`
#
# The rest of the script is given: its `main` calls `train_main` (`starter/scripts.py`, a page to read). It reads the command line (`python train_captioner.py --help` lists the options; the defaults are the `shapes` settings), makes the model and the optimiser, and trains in rounds of `--save-every` steps with your `fit`. After each round it appends the round's rows to the log (the checkpoint's path with `.csv`) and saves a checkpoint. `--stop-at N` ends the run at the first checkpoint at or after step N, as a closed laptop would; `--resume` goes on from the checkpoint, with the options of the run it continues.
#
# What `train_main` cannot know is what a run carries from one step to the next. That is yours:
#
# - `checkpoint_state(optimizer, step)` returns a dict that goes into the checkpoint (as its `"extra"`) after `step` steps, beside what `save_checkpoint` stores itself: the model's weights (`"state_dict"`), its configuration and its vocabulary. The script adds two entries of its own to that dict: the dataset's name and the run's identity (`"run"`: a new one for each run, kept when a run is resumed; the grader uses it to see two students hand in one run). Keep tensors, numbers, strings, lists, dicts and state dicts in it: the checkpoint is read back with `torch.load(weights_only=True)`, which refuses other objects.
# - `restore(saved, model, optimizer)` gets that checkpoint as `read_checkpoint` returns it and a `model` and `optimizer` made afresh, as for a new run: freshly initialised weights, an optimiser with no state, and torch's random generator just seeded with `--seed` by `experiment.new_model`. It puts the run back where the checkpoint left it and returns the number of steps done. `train_main` then keeps the log's rows up to that step (a run killed after logging and before saving leaves rows beyond it) and goes on from there.
#
# The test: a run stopped and resumed, on the same machine, ends with **exactly** the weights and the log of a run that never stopped. Ask what a training step depends on besides the weights and the batch, including on a GPU (`torch.cuda` has a random generator of its own).

# %% nbgrader={"grade": false, "grade_id": "train_script", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%writefile -a train_captioner.py


def checkpoint_state(optimizer, step):
    """What the checkpoint holds besides the model's weights, its configuration and vocabulary, after `step` steps:
    a dict of tensors, numbers, strings, lists, dicts and state dicts."""
    ### BEGIN SOLUTION
    state = {"step": step, "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    return state
    ### END SOLUTION


def restore(saved, model, optimizer):
    """Put the run back where checkpoint `saved` (read_checkpoint's dict, "extra" being checkpoint_state's dict)
    left it, into the freshly made `model` and `optimizer`; returns the number of steps done."""
    ### BEGIN SOLUTION
    state = saved["extra"]
    model.load_state_dict(saved["state_dict"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng"])
    return state["step"]
    ### END SOLUTION


def main(argv=None, experiment=None):
    """The script (given): its command line, rounds of fit, the log and a checkpoint after each round."""
    train_main(argv, experiment, fit=fit, checkpoint_state=checkpoint_state, restore=restore)


if __name__ == "__main__":
    run_script(main)

# %% nbgrader={"grade": true, "grade_id": "test_train_script", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.scripts import load_script, with_train_script
train_script = load_script("train_captioner.py")   # the whole file, as a module, without running main
check("train_script/one_run", with_train_script(train_script))
check("train_script/resume", with_train_script(train_script))
### BEGIN HIDDEN TESTS
check("train_script/interrupted", with_train_script(train_script))
check("train_script/resume_twice", with_train_script(train_script))
check("train_script/resume_after_crash", with_train_script(train_script))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_script_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
# *How this check works:* `with_train_script(train_script)` calls your script's `main` with command lines and a stand-in experiment: a tiny model, a few rows of data, a made-up schedule, and a step that does not train but moves the weights by the batch, the rate, a drift kept in the optimiser's state and a random draw. A resume that loses any of these ends with other weights. It compares the final checkpoint's weights, the log and how each command line ended with the stored ones.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_step_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Settings.** The script's defaults are the `shapes` settings: a small model (2 layers, $d_{model} = 64$, 4 heads, about 0.145 M parameters) trains 700 steps; the script prints a line every 100 steps and the training cell prints how long the run took on your machine. It trains without dropout: 700 steps of 64 captions see each of the 9000 training captions about 5 times, too few to overfit (the validation loss ends near its lowest: see the curve below). The COCO settings, with far more parameters per caption, keep it (`CONFIGS` below, and section 3). When nbgrader runs this notebook, `GRADING` is True and nothing trains (the overfit check and the script's runs are skipped): the graded tests don't depend on training at all, and notebook 07's trained-model cell measures the checkpoint you hand in.
#
# **Sanity check first: overfit one small batch.** Before a long run, train a fresh model on one batch of 8 captions, as at the end of notebook 05, but now with your `train_step`: a correct step drives the loss close to zero. If it stalls while notebook 05's memorisation passed, look at the step (the learning rate it sets, the gradients it clears, the loss it returns).

# %% nbgrader={"grade": false, "grade_id": "code_15", "locked": true, "schema_version": 3, "solution": false, "task": false}
CONFIGS = {
    # model: the model's constructor arguments; train: a run's settings (starter.training.TrainConfig, whose defaults
    # give the rest: grad_clip=1.0, seed=0); the script trains with them, as its options
    "shapes": dict(model=dict(d_model=64, num_heads=4, num_layers=2, dim_feedforward=256, dropout=0.0),
                   train=TrainConfig(steps=700, batch_size=64, lr=2e-3, warmup=50, weight_decay=0.01)),
    # COCO, for a Colab GPU (section 3): sized for a T4; times and scores are whatever your run prints
    "coco-fc7": dict(model=dict(d_model=256, num_heads=8, num_layers=3, dim_feedforward=1024, dropout=0.2),
                     train=TrainConfig(steps=15000, batch_size=256, lr=5e-4, warmup=500, weight_decay=0.01)),
    "coco-grid": dict(model=dict(d_model=256, num_heads=8, num_layers=3, dim_feedforward=1024, dropout=0.2),
                      train=TrainConfig(steps=15000, batch_size=128, lr=5e-4, warmup=500, weight_decay=0.01)),
}
config = CONFIGS.get(DATASET, CONFIGS["coco-grid"])
train_config = config["train"]
batch_size = train_config.batch_size
train_loader = make_loader(train_split, batch_size, shuffle=True)   # your Dataset and collate function
val_loader = make_loader(val_split, batch_size, shuffle=False)

RUN_DIR = Path("runs")   # where checkpoints go, in the course folder (notebooks 07 to 09 look there)
if GRADING:  # never the checkpoint handed in
    RUN_DIR = Path(tempfile.mkdtemp())
CHECKPOINT = RUN_DIR / Path(checkpoint_file(DATASET)).name  # the graded shapes model, or its COCO twin

device = pick_device()
model_config = dict(vocab_size=len(vocab), feature_dim=ds.feature_dim, num_regions=ds.num_regions,
                    max_len=ds.max_length, layers=LAYERS, **config["model"])


def new_model(model_class=None):
    """A freshly initialised model of this configuration (seed 0): the models this notebook trains itself."""
    seed_everything(0)
    return (model_class or CaptioningTransformer)(**model_config).to(device)


if model_ready:
    print(f"{count_parameters(new_model()):,} parameters")
fit = load_script("train_captioner.py", "fit")
pieces = TrainingPieces(fit=yours_if_it_passes("fit", fit, instead=untrained),
                        train_step=yours_if_it_passes("train_step", train_step, instead=untrained),
                        lr_at_step=yours_if_it_passes("lr_at_step", lr_at_step, instead=untrained),
                        validation_loss=yours_if_it_passes("validation_loss", validation_loss, instead=untrained),
                        make_optimizer=make_optimizer)   # notebook 05's, checked in section 1
train_script = script_if_it_passes("train_script", load_script("train_captioner.py"), instead=untrained)  # Task 5
can_train = model_ready and not pieces.missing() and train_script is not None

# %% nbgrader={"grade": false, "grade_id": "code_16", "locked": true, "schema_version": 3, "solution": false, "task": false}
if GRADING:  # nbgrader is running the notebook: no grade depends on training
    print("grading run: no overfit check")
elif model_ready and pieces.train_step is not None:
    overfit = overfit_small_batch(new_model(), teacher_forcing_loss, train_loader, pieces.train_step, batch_size=8,
                                  steps=150)
else:
    print("no overfit check: it trains your model with your train_step")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_resume_demo", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Resume, tried.** Before the real run, the cell below tries the script on a small run (`--steps 20 --warmup 5 --batch-size 32 --dropout 0.1`, into `runs/resume_check/`) twice: once in one go, and once stopped at step 10 (`--stop-at 10`) and resumed. It prints whether the two checkpoints hold exactly the same weights. Save this notebook first: the script loads your pieces from the saved file. Each run starts a new Python, which loads the data and your notebooks again before it trains.

# %% nbgrader={"grade": false, "grade_id": "code_resume_demo", "locked": true, "schema_version": 3, "solution": false, "task": false}
if GRADING:
    print("grading run: the scripts do not run")
elif can_train:
    small = "--steps 20 --warmup 5 --batch-size 32 --save-every 5 --dropout 0.1"   # dropout: the random state matters
    ok = (run_command(f"train_captioner.py {small} --checkpoint runs/resume_check/one_go.pt")
          and run_command(f"train_captioner.py {small} --stop-at 10 --checkpoint runs/resume_check/resumed.pt")
          and run_command(f"train_captioner.py {small} --checkpoint runs/resume_check/resumed.pt --resume"))
    if ok:
        one_go, resumed = (read_checkpoint(f"runs/resume_check/{name}.pt") for name in ("one_go", "resumed"))
        same = all(torch.equal(one_go["state_dict"][k], resumed["state_dict"][k]) for k in one_go["state_dict"])
        print(f"20 steps in one go and 10 + 10 resumed: the same weights: {same}")
else:
    print("the scripts need the model and loss of notebook 05, the training pieces above and the whole training script, "
          "which are not all there yet")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_resume", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 9 (2 points).** The resume check above trains with `--dropout 0.1` and prints whether the resumed run ends with the weights of the run in one go. (a) Suppose your `restore` put back everything but the state of torch's random generator. Would the two runs still end with the same weights with `--dropout 0.1`? With `--dropout 0`, the `shapes` default? Explain from what draws random numbers while the script trains (the order of the batches comes from `train_batches`, drawn from the seed and the epoch's number alone). (b) The learning rate of every step is fixed by the schedule, whatever happened before. Why does the optimiser's state still matter for an exact resume? You can answer without running anything: the line above only shows what a correct script prints.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_resume", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) With `--dropout 0.1`, no: `new_model` seeds the generator with `--seed`, so without its saved state the resumed steps draw the dropout masks that the first steps drew again, other masks than the run in one go drew for those steps, and the gradients and weights differ. With `--dropout 0`, yes: nothing else in training draws from torch's generator (the batches come from their own generator, seeded by the seed and the epoch; the model's forward pass and AdamW's update draw nothing), so the lost state is never used and the weights come out the same. That is why the check's stand-in step draws a random number: a script that forgets the state must fail even where a real run would not show it. (b) AdamW keeps, for every parameter, running averages of the gradient and of its square, and a count of steps for their bias correction; each update divides by the square root of the second average. Started afresh after a resume, the averages are those of step 1, not of the steps done, so the updates, and then the weights, differ even at the same learning rates.
#
# **Rubric.** 1 point (a): not the same with dropout (the masks are drawn again from the seed), the same without (nothing else draws from the generator). 1 point (b): Adam's moment estimates (and step count) are state the updates depend on; lost, the updates differ. Half a point for "the optimiser has momentum" without saying why the update changes.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_17", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now the real run, with the script's defaults: your loader, training loop, schedule, optimiser, training step and validation loss (the cell prints how long it took on your machine). The validation loss is measured every 100 steps on 4 fixed batches of validation captions, the same every time, so that the curve moves only with the model; notebook 07 scores every validation image. Re-running the cell starts over with the same seed. The script saves `runs/captioning_transformer.pt` with the model's configuration and **your vocabulary**, and `runs/captioning_transformer.csv`, its log; notebooks 07 to 09 load the checkpoint from there. A COCO run saves `runs/captioning_transformer_coco-grid.pt` (or `_coco-fc7`) with `--checkpoint`, and never overwrites the graded one. Interrupted (*Kernel → Interrupt*, or a runtime that died), the run goes on from its last checkpoint when you add `--resume` to the command.

# %% nbgrader={"grade": false, "grade_id": "code_18", "locked": true, "schema_version": 3, "solution": false, "task": false}
model = history = None
if GRADING:  # the trained-model cell measures the checkpoint handed in, not one trained here
    print("grading run: not trained")
elif can_train:
    t0 = time.perf_counter()
    size = config["model"]
    options = (f"--data {DATASET} --checkpoint {CHECKPOINT} --steps {train_config.steps} --batch-size {batch_size} "
               f"--lr {train_config.lr} --warmup {train_config.warmup} --d-model {size['d_model']} "
               f"--heads {size['num_heads']} --layers {size['num_layers']} --dropout {size['dropout']}")
    if run_command(f"train_captioner.py {options}"):
        history = read_log(CHECKPOINT.with_suffix(".csv"))
        print(f"training on {device}: {history['step'][-1]} steps in {time.perf_counter() - t0:.0f} s (the script, "
              f"start-up included)\nsaved {CHECKPOINT}")
        model, info = load_checkpoint(CHECKPOINT, CaptioningTransformer, device=device)
        print(f"final validation loss {history['val_loss'][-1]:.3f} (the last of {len(history['val_loss'])} measurements)")
else:
    print("not trained: the model and loss of notebook 05 and the training pieces above do not all pass yet, or "
          "the training script is not finished")

# %% nbgrader={"grade": false, "grade_id": "code_19", "locked": true, "schema_version": 3, "solution": false, "task": false}
if history is not None:
    plot_losses(history, title=f"training on {DATASET}")
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_20", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The loss is per real word, in nats: $\log V$ for a model that guesses uniformly (printed below). It cannot reach zero on `shapes`: each image has its three phrasings among its captions, and a caption is fully determined by the image once its phrasing is chosen, so the model must guess which phrasing it is writing, $\ln 3 \approx 1.10$ nats per caption. Spread over the words of a caption, that is the floor printed below, next to your final validation loss.

# %% nbgrader={"grade": false, "grade_id": "code_loss_floor", "locked": true, "schema_version": 3, "solution": false, "task": false}
targets = encoded["train"][:, 1:]
words_per_caption = float((targets != vocab.null_idx).sum(1).float().mean())   # real target words, <END> included
print(f"uniform guess: log V = log {len(vocab)} = {math.log(len(vocab)):.2f} nats per word")
if DATASET == "shapes" and history is not None:
    print(f"phrasing floor: ln 3 / {words_per_caption:.1f} words per caption = {math.log(3) / words_per_caption:.3f} nats per word; "
          f"your final validation loss: {history['val_loss'][-1]:.3f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_31", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3 · COCO on a GPU
#
# The same notebook trains on COCO: change `DATASET` in section 1 and run everything on a GPU (on Colab: *Runtime → Change runtime type → GPU*; `pick_device` finds it). Get the data first:
#
# - `"coco-fc7"`: the CS231n files (one 512-d fc7 vector per image, so $R = 1$ and cross-attention has a single region to look at), `python -m data.coco_cs231n` (about 1 GB download);
# - `"coco-grid"`: $7 \times 7$ grid features built from the official COCO images, `python -m starter.build_coco_grid` (downloads images and runs a CNN: build it once on a GPU, see its `--help`).
#
# The configurations in `CONFIGS` above are sized for a Colab T4 GPU: `coco-fc7` and `coco-grid` both train a 3-layer model with $d_{model} = 256$ and 8 heads for 15 000 steps (batches of 256 and 128 captions). This kit was not run on COCO (its builders had no COCO data): your runs print your time (here) and your scores (notebook 07).
#
# For comparison, papers' own figures on their COCO test splits: *Show, Attend and Tell* (Xu et al., 2015), an LSTM decoder with attention over a CNN grid, reports BLEU-4 0.243 (soft attention) and 0.250 (hard attention); the Meshed-Memory Transformer (Cornia et al., CVPR 2020), a Transformer over detected object regions trained further on CIDEr itself, reports BLEU-4 0.391 and CIDEr 1.312. Notebook 07 evaluates the COCO model (set its `DATASET` to the same name); with one vector per image, CS231n's fc7 files come without usable image links, so no images are shown for `coco-fc7`.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("06_training", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - A training script: a **warm-up then cosine** learning-rate schedule, **AdamW** with weight decay on the matrices only (your optimiser of notebook 05), a **step** (rate, `zero_grad`, loss, `backward`, clipping, update), a **validation loss** on data the model does not train on (in eval mode, without gradients), the **loop** that calls them, and a **checkpoint** that holds all a run carries from one step to the next (the weights, the optimiser's state, the step, the random state), so that a stopped run goes on exactly.
# - Overfit a small batch before a long run.
#
# Next, **07 · Generating captions, and measuring them** has your trained model write captions, measures them on held-out images, and grades the model on new scenes.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
