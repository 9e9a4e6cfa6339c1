"""Cases of notebook 05: the learning-rate schedule, the optimiser, the training step, the validation loss, the
training loop, the evaluation script, and the trained model handed in, with their known bugs."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from grading.cases.captioning.common import (
    SPECIALS,
    _captions,
    _random_lengths,
    _text_captions,
    _toy,
    _toy_batch,
    _variants,
    _words,
)
from grading.references import CaseSpec, Row
from grading.trained_model import TRAINED_TARGET
from starter.pipeline import (
    over_steps,
    with_batches,
    with_loader,
    with_optimizer,
    with_param_groups,
    with_split,
)


@dataclass(frozen=True, kw_only=True)
class TrainedCase(Row):
    """The model notebook 05 trained and saved, captioning `images` new scenes of `shapes` (drawn from random
    stream `stream`, see data.shapes.unseen_images): at least `share` of its greedy captions must be one of
    their image's three references, word for word."""
    images: int
    stream: int
    share: float


PUBLIC_STREAM = 1
# The hidden scenes' random stream. Student code can call data.shapes.unseen_images (data/ is published), so a
# stream it can name would give it the hidden scenes and their captions; this one lives only here (grading/ is
# neither mounted nor published) and is too large to search for: 128 random bits. (The hidden scenes do not
# enter the sandbox either: the grader measures the checkpoint on them itself, grading.trained_model.)
HIDDEN_STREAM = 223817195532500176294206531246373579868


def trained_cases() -> list[CaseSpec]:
    """The trained-model outcome. The references are the scenes' own captions (no solution runs); the images
    are new scenes of the held-out validation combinations. Three hidden thresholds on the same 100 images give
    partial credit. What notebook 05's model (700 steps, seed 0) gets right depends a little on the machine (84-90 %
    seen): `python -m grading execute 05`, then `python -m grading.cases.captioning
    build/executed/runs/captioning_transformer.pt [--kit-sampler]` prints its shares (the README gives those of the
    run of its figures); over seeds the notebook's gets 81-89 % of the validation captions right: hence a top mark
    of 65 %."""
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
            hint="the model saved at runs/captioning_transformer.pt, decoded with your greedy_decode" if c.public
            else "your checkpoint's weights in the kit's CaptioningTransformer, decoded by the kit's greedy decoding"))
    return out


def trained_shares(checkpoint) -> dict[str, float]:
    """The share of each stored trained-model case's images (public and hidden) that the model saved at
    `checkpoint` captions exactly right, as the grader measures the hidden ones (grading.trained_model: the
    kit's model class and greedy decoding) and counted as the check counts."""
    from grading import notebooks, trained_model
    from starter.compare import case_groups, load_case, observe, share_exactly_right

    stem = f"{notebooks.TRAINED_MODEL_CELL[0]}.h5"
    names = []
    for folder in (notebooks.PUBLIC_REFERENCES, notebooks.HIDDEN_REFERENCES):
        with h5py.File(folder / stem, "r") as f:
            names += [n for n, g in case_groups(f) if str(g.attrs["target"]) == TRAINED_TARGET]
    trained_model.read_measurable(Path(checkpoint))
    captioner = trained_model.kit_captioner(Path(checkpoint))
    shares = {}
    for name in names:
        case = load_case(name, dirs=[notebooks.PUBLIC_REFERENCES, notebooks.HIDDEN_REFERENCES])
        obs = observe(case, captioner)
        if obs.error:
            raise RuntimeError(f"{name}: {obs.error}")
        shares[name] = share_exactly_right(case.const_args[0], obs.outputs["captions"], case.expected["captions"])
    return shares


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
        if kind == "by_name":  # "weight" in the name decays: the LayerNorm gain is named weight too
            named = list(model.named_parameters())
            return torch.optim.AdamW([{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": weight_decay},
                                      {"params": [p for n, p in named if not n.endswith("weight")], "weight_decay": 0.0}],
                                     lr=lr)
        if kind == "group_decay_unset":  # the matrices' group without its own weight_decay: AdamW's default
            return torch.optim.AdamW([{"params": decay}, {"params": none, "weight_decay": 0.0}], lr=lr)
        if kind == "paper_betas":  # the Transformer paper's Adam settings; eps alone barely moves three steps
            return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                      {"params": none, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98), eps=1e-9)
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
    "by_name": "the LayerNorm gain is decayed: it is named `weight` like the weight matrices, but it is 1-D; choose "
               "the groups by dimension (p.dim() >= 2 decays), not by name.",
    "group_decay_unset": "the matrices' group has AdamW's default weight decay 0.01, not `weight_decay`: give that "
                         "group its own \"weight_decay\" entry.",
    "adam": "torch.optim.Adam adds the weight decay to the gradient, where Adam's scaling changes it; AdamW shrinks "
            "the weights directly (decoupled weight decay): use torch.optim.AdamW.",
    "paper_betas": "the groups are right, but the weights after the steps are those AdamW gives with betas=(0.9, 0.98) "
                   "(the Transformer paper's Adam settings): set only lr and the weight decay, and keep AdamW's "
                   "defaults for betas and eps (0.9, 0.999 and 1e-8).",
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
    "no_zero_grad": "gradients accumulate across steps: each step's update uses the sum of every gradient so far, not its own.",
    "zero_grad_after_backward": "the gradients are cleared after they are computed and before the update, so "
                                "nothing is learned.",
    # clipping after step() changes nothing (the next step clears the gradients): one bug, one message
    "no_clipping": "the update uses unclipped gradients: their total norm must be at most grad_clip when the "
                   "update is made (clipping after the update changes nothing).",
    "lr_ignored": "the learning rate `lr` is not used: the update is made at the optimiser's own rate.",
    "lr_set_after_step": "the learning rate is set after the update, so each step uses the previous step's rate.",
    "lr_first_group_only": "the learning rate is set in the first parameter group only (this optimizer has two): every "
                           "group trains at the step's rate.",
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
    "train_mode": "the model is in train mode while evaluating (dropout on): captions are written in eval mode.",
    "grad_enabled": "the evaluation runs with gradients on: nothing is learned from it, so no graph is needed.",
    "last_batch_dropped": "the last, smaller batch of images is skipped: every image is captioned, also when the "
                          "batch size does not divide their number.",
    "one_reference": "captions are scored against one reference only: each is scored against all the references of its image.",
    "end_kept": "the <END> token is part of the caption text: stop before it.",
    "no_stop_at_end": "words after <END> are kept: stop at the first <END>.",
    "exact_first_reference": "exact match is too low: a caption counts when its words, as `tokenize` splits them "
                             "(case and punctuation aside), equal those of any one of its image's references.",
    "exact_percent": "exact_match is a percentage: return the fraction (between 0 and 1).",
    "unk_dropped": "<UNK> is left out of the captions: skip only <NULL> and <START> (the model did say a word, one "
                   "the vocabulary does not have), and stop at <END>.",
}


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
EVAL_WORDS = SPECIALS + ["a", "red", "blue", "circle", "square", "left", "right", "of", "the", "big"]


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
        hint="one AdamW with two parameter groups, every parameter in exactly one: those of 2 or more dimensions "
             "decayed by weight_decay, the others not at all; the learning rate lr, AdamW's other settings (betas, "
             "eps, amsgrad) at their defaults.")


def _step_spec(c: StepCase, g: torch.Generator) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="with_optimizer(train_step)", kind="module", init=_toy(9, 4, hidden=8, max_len=16),
        args=["features", "captions"], const_kwargs={"optimizer": c.optimizer, "lrs": c.lrs, "grad_clip": c.grad_clip},
        inputs=_toy_batch(c.lengths, g), outputs=["losses", "parameters"], atol=1e-5, rtol=1e-4,
        variants=_variants(STEP_BUGS, _step_bug, with_optimizer), public=c.public,
        hint="what the text lists, in its order: the rate of every parameter group, training mode, gradients "
             "cleared, the loss and its gradients, the norm clipped to grad_clip, the update; the loss as a float.")


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
        hint="eval mode and no gradients; every image decoded, batch by batch; each caption's words up to its <END>, "
             "<NULL> and <START> left out; scored against all its references; exact_match a fraction of the images.")


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
    "train_mode": "the validation loss is measured in train mode (dropout on): it is measured in eval mode.",
    "grad_enabled": "the validation loss is computed with gradients on: nothing is learned from it, so no graph is needed.",
    "mode_not_restored": "the model stays in eval mode afterwards, so training would go on without dropout: it "
                         "leaves in the mode it came in.",
    "train_after": "the model is put in train mode afterwards, though it came in eval mode: it leaves in the "
                   "mode it came in.",
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
            hint="[loss, share of calls in train mode, share with gradients, in train mode afterwards]: eval mode "
                 "and no gradients while measuring, the batches' losses averaged, the model's mode as it came in."))
    return out


# ---- fit(model, loss_fn, optimizer, loader, plan, config) ------------------------------------------------


def _fit_bug(kind):
    def fit(model, loss_fn, optimizer, loader, plan, config):
        val_batches, val_every, step_fn, val_fn, device = (config.val_batches, config.val_every, config.step_fn,
                                                            config.val_fn, config.device)
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
            done = len(history["step"]) + 1 if kind == "counts_steps_of_this_call" else step + 1
            history["step"].append(done)
            history["loss"].append(loss)
            history["lr"].append(lr)
            due = step % val_every == 0 if kind == "validates_after_first_step" else (step + 1) % val_every == 0
            if due:
                validate(done, features, captions, lr)
        if kind != "no_final_validation" and history["step"] and history["val_step"][-1:] != history["step"][-1:]:
            validate(history["step"][-1], features, captions, lr)
        return history
    return fit


FIT_BUGS = {
    "one_epoch": "training stops when the loader runs out: a new epoch begins then, and training goes on "
                 "until the plan ends.",
    "first_batch_only": "every step trains on the loader's first batch, as if each step began a new epoch: each step "
                        "takes the next batch of the epoch under way.",
    "first_epoch_reused": "every epoch repeats the first epoch's batches in the same order: each epoch is a new pass "
                          "over the loader, so that a shuffling loader draws a new order.",
    "lr_of_first_step": "every step uses the first step's learning rate: pass each step's lr from the plan to "
                        "config.step_fn.",
    "validates_on_training_batch": "the validation loss is measured on the training batch: measure it on "
                                   "config.val_batches.",
    "trains_on_validation": "the model also trains on the validation batches, so the validation loss no longer "
                            "measures held-out data: config.val_batches only go to config.val_fn, never to config.step_fn.",
    "validates_after_first_step": "the validation loss is measured after steps 1, 1 + config.val_every, ...: measure it "
                                  "after every config.val_every steps, when (step + 1) % config.val_every == 0.",
    "no_final_validation": "there is no validation after the last step: when the run does not end on a multiple "
                           "of config.val_every, measure once more at the end.",
    "val_step_zero_based": "val_step records the 0-based index of the step: record the number of steps done "
                           "(step + 1), as history['step'] does.",
    "counts_steps_of_this_call": "history['step'] counts the steps of this call from 1: record step + 1, the run's "
                                 "own count (a resumed run's plan starts at a later step, and so must the log's rows).",
}


@dataclass(frozen=True, kw_only=True)
class FitCase(Row):
    """fit(...) on the toy model for `steps` steps over a stand-in loader whose order changes each epoch."""
    sizes: list[int]  # the batch sizes of one epoch
    val_rows: int  # captions in the validation batches
    steps: int
    val_every: int
    start: int = 0  # the plan's first step (a resumed run's part)


def fit_cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(1212)
    out = []
    for c in [
        FitCase(name="fit/basic", sizes=[2, 2, 2], val_rows=3, steps=7, val_every=3, public=True),
        FitCase(name="fit/whole_epochs", sizes=[3, 2], val_rows=2, steps=6, val_every=2),
        FitCase(name="fit/validate_once", sizes=[2, 3, 1], val_rows=3, steps=4, val_every=10),
        FitCase(name="fit/every_step", sizes=[4, 2], val_rows=2, steps=3, val_every=1),
        FitCase(name="fit/resumed_plan", sizes=[2, 2], val_rows=2, steps=5, val_every=3, start=4),
    ]:
        lengths = _random_lengths(sum(c.sizes) + c.val_rows, g)
        lrs = [round(float(x), 4) for x in 0.05 + 0.4 * torch.rand(c.steps, generator=g)]
        out.append(CaseSpec(
            name=c.name, target="with_loader(fit)", kind="module", init=_toy(9, 4, hidden=8, max_len=16),
            args=["features", "captions"],
            const_kwargs={"sizes": c.sizes, "lrs": lrs, "val_every": c.val_every, **({"start": c.start} if c.start else {})},
            inputs=_toy_batch(lengths, g),
            outputs=["steps", "losses", "lrs", "val_steps", "val_losses", "parameters"], atol=1e-5, rtol=1e-4,
            variants=_variants(FIT_BUGS, _fit_bug, with_loader), public=c.public,
            hint="one step per (step, lr) of the plan, on the next batch (the loader started again when it runs "
                 "out); every loss recorded; a validation every config.val_every steps and after the last step.",
            forbid=["starter.training.train"]))
    return out


# ---- the training script: train_captioner.py's main(argv, experiment) ---------------------------------------


def _train_script_bug(kind):
    """A train_captioner.py whose checkpoint_state and restore have the known bug `kind` (None: none), around the
    given main (starter.scripts.train_main) and a correct loop (`_fit_bug(None)`), as a module-like namespace."""
    from types import SimpleNamespace

    from starter.scripts import train_main

    fit = _fit_bug(None)

    def checkpoint_state(optimizer, step):
        state = {"step": step, "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}
        if kind == "optimizer_not_kept":
            del state["optimizer"]
        if kind == "objects_saved":
            state["optimizer"] = optimizer
        return state

    def restore(saved, model, optimizer):
        state = saved["extra"]
        if kind != "weights_not_loaded":
            model.load_state_dict(saved["state_dict"])
        if "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
        if kind != "rng_not_restored":
            torch.set_rng_state(state["rng"])
        return 0 if kind == "step_not_returned" else state["step"]

    def main(argv=None, experiment=None):
        train_main(argv, experiment, fit=fit, checkpoint_state=checkpoint_state, restore=restore)

    return SimpleNamespace(main=main, fit=fit, checkpoint_state=checkpoint_state, restore=restore)


# the messages say what went wrong and which part of a run's state it points to, never the lines that keep it
TRAIN_SCRIPT_BUGS = {
    "optimizer_not_kept": "after --resume the weights differ from those of a run that never stopped, as they do "
                          "when the optimiser starts afresh: its own state (momentum, Adam's running averages) is "
                          "part of where a run is, in the checkpoint and back in the optimiser.",
    "rng_not_restored": "after --resume the weights differ from those of a run that never stopped, as they do when "
                        "the random draws (dropout's) start again from the seed that new_model set: the state of "
                        "torch's random generator is part of where a run is.",
    "weights_not_loaded": "after --resume the model goes on from freshly made weights: restore puts the "
                          "checkpoint's weights into the model too.",
    "step_not_returned": "after --resume the run starts over at step 0 (schedule, batches and log begin again): "
                         "restore returns the number of steps the checkpoint's run had done.",
    "objects_saved": "the checkpoint cannot be read back: torch.load(weights_only=True) "
                     "refuses Python objects, so a checkpoint holds tensors, numbers and state dicts, not the "
                     "optimiser object itself.",
}


# every option a case passes besides --checkpoint and --device
_SMALL = ["--batch-size", "2", "--lr", "0.3", "--warmup", "2", "--weight-decay", "0.05", "--d-model", "8",
          "--heads", "2", "--layers", "1", "--dropout", "0.1", "--seed", "3"]


@dataclass(frozen=True, kw_only=True)
class TrainScriptCase(Row):
    """main(argv, experiment) of train_captioner.py run with each of `runs` in turn, on a stand-in experiment of
    `rows` rows of toy data (`val_rows` of them for validation)."""
    runs: list[list[str]]
    rows: int = 9
    val_rows: int = 2


def train_script_cases(ns) -> list[CaseSpec]:
    from starter.scripts import with_train_script

    g = torch.Generator().manual_seed(4545)

    def steps(n, *more, every=2):
        return ["--steps", str(n), "--save-every", str(every), *_SMALL, *more]

    out = []
    for c in [
        TrainScriptCase(name="train_script/one_run", runs=[steps(5)], public=True),
        TrainScriptCase(name="train_script/resume", runs=[steps(7, "--stop-at", "3"), steps(7, "--resume")],
                        public=True),
        TrainScriptCase(name="train_script/resume_twice", runs=[steps(8, "--stop-at", "2", every=3),
                                                                steps(8, "--resume", "--stop-at", "4", every=3),
                                                                steps(8, "--resume", every=3)], rows=8),
        TrainScriptCase(name="train_script/interrupted", runs=[["<stop at step>", "5"], steps(7),
                                                               steps(7, "--resume")]),
        TrainScriptCase(name="train_script/resume_after_crash", runs=[steps(6, "--stop-at", "4"),
                                                                      ["<crash after log>"], steps(6, "--resume")]),
    ]:
        inputs = _toy_batch(_random_lengths(c.rows, g), g)
        out.append(CaseSpec(
            name=c.name, target="with_train_script(train_script)", kind="module", init=_toy(9, 4, hidden=8, max_len=16),
            args=["features", "captions"], const_kwargs={"runs": c.runs, "val_rows": c.val_rows}, inputs=inputs,
            outputs=["weights", "log", "exits"], atol=1e-6, rtol=1e-5,
            variants=_variants(TRAIN_SCRIPT_BUGS, _train_script_bug, with_train_script), public=c.public,
            hint="the checkpoint's weights after the last command line, the log (step, loss, lr, val_loss) and each "
                 "command line's end ([failed, a last line 'train_captioner.py: error: ...' and no traceback, files "
                 "untouched when it failed]): a resumed run must end exactly as one that never stopped."))
    return out


# ---- the evaluation script: evaluate_captioner.py's main(argv, experiment) ----------------------------------


def _eval_script_bug(kind):
    """An evaluate_captioner.py whose evaluate_checkpoint has the known bug `kind`, around the given main."""
    from types import SimpleNamespace

    from starter.scripts import evaluate_main

    def evaluate_checkpoint(saved, experiment, split, beam=None):
        model = experiment.model_from(saved)
        if kind == "untrained_model":
            with torch.no_grad():
                for param in model.parameters():
                    param.zero_()
        decoder = experiment.decoder(None if kind == "beam_ignored" else beam)
        return experiment.evaluate_captions(model, decoder, split, experiment.vocab_of(saved),
                                            max_len=experiment.max_len)

    def main(argv=None, experiment=None):
        evaluate_main(argv, experiment, evaluate_checkpoint=evaluate_checkpoint)

    return SimpleNamespace(main=main, evaluate_checkpoint=evaluate_checkpoint)


EVAL_SCRIPT_BUGS = {
    "beam_ignored": "--beam K gives greedy's captions: the decoder is the one the beam width asks for.",
    "untrained_model": "the scores are not those of the checkpoint's weights: the model evaluated is the one the "
                       "checkpoint holds.",
}


@dataclass(frozen=True, kw_only=True)
class EvalScriptCase(Row):
    """main(argv, experiment) of evaluate_captioner.py on a checkpoint of the toy model, run with each of `runs`."""
    runs: list[list[str]]
    images: int = 6


def eval_script_cases(ns) -> list[CaseSpec]:
    from starter.scripts import with_eval_script

    g = torch.Generator().manual_seed(4646)
    idx_to_word = [*SPECIALS, "a", "red", "circle", "left", "of"]
    out = []
    for c in [
        EvalScriptCase(name="eval_script/greedy", runs=[[]], public=True),
        EvalScriptCase(name="eval_script/beam", runs=[["--beam", "3"]]),
    ]:
        tokens = [_captions(_random_lengths(c.images, g), 7, len(idx_to_word), g)[:, 1:] for _ in range(2)]
        references = [_text_captions(g, 2, idx_to_word[4:]) for _ in range(c.images)]
        out.append(CaseSpec(
            name=c.name, target="with_eval_script(eval_script)", kind="module", init=_toy(9, 4, hidden=8, max_len=16),
            args=["greedy_tokens", "beam_tokens"], inputs={"greedy_tokens": tokens[0], "beam_tokens": tokens[1]},
            const_kwargs={"references": references, "idx_to_word": idx_to_word, "runs": c.runs},
            outputs=["scores", "exits"], atol=1e-5,
            variants=_variants(EVAL_SCRIPT_BUGS, _eval_script_bug, with_eval_script), public=c.public,
            hint="scores: the metrics file's [BLEU-1, BLEU-2, BLEU-3, BLEU-4, CIDEr, exact_match, images] (-1 where the "
                 "file has none); exits: each command line's end ([failed, a last line naming the error and no "
                 "traceback, files untouched when it failed])."))
    return out
