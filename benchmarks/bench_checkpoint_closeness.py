"""How close two students' trained models are, honest or copied: can the weights tell a near copy from independent work?

Notebook 06 trains with a fixed seed, so independent students' models are close by design. Trained here on `shapes`
as notebook 06 trains (its settings, seed 0):
  - `course`: the solutions' own layers (what a student whose notebooks 02-05 match the solutions trains);
  - `course, again`: the same, a second time (a second student with the same code);
  - `course, N thread(s)`: the same code with another number of threads (another machine: sums in another order);
  - `torch layers`: the same model built with PyTorch's layers (`layers="torch"`): a student whose code computes the
    same functions in another order of floating-point operations;
and, from `course`'s weights, the copies a student could hand in as their own: the weights plus noise of 1e-4 and
1e-3 of each tensor's spread, and the weights trained 20 steps more (fine-tuned from a classmate's). Printed: each
model's relative distance to `course` in what it predicts (`probe`: ||P - P_course|| / ||P_course|| over the
log-probabilities of 200 validation captions) and in its weights (||W - W_course|| / ||W_course||, where the layouts
match), and its greedy exact match.

    python benchmarks/bench_checkpoint_closeness.py [--steps 700]
"""
from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import replace

import torch

from grading import notebooks
from starter.data import load_dataset
from starter.layers import layers_from
from starter.training import seed_everything, train


def flat(model) -> torch.Tensor:
    """Every parameter in one vector (models of one layout only)."""
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def probe(model, ds) -> torch.Tensor:
    """The model's log-probabilities of the next word on 200 validation captions, teacher-forced: a comparison that
    holds for models whose parameters are laid out differently (PyTorch's layers fuse the projections)."""
    captions, features, _ = ds.split("val")._batch(torch.arange(200), None)  # the first 200 captions, their images
    model.eval()
    with torch.no_grad():
        return torch.log_softmax(model(features, captions[:, :-1]).double(), dim=-1).flatten()


def trained(layers: str, steps: int):
    ns = notebooks.captioning_solution()
    cfg, ds = notebooks.shapes_config(), load_dataset("shapes")
    seed_everything(0)
    config = dict(vocab_size=len(ds.vocab), feature_dim=ds.feature_dim, num_regions=ds.num_regions,
                  max_len=ds.max_length, layers=layers, **cfg["model"])
    with layers_from(notebooks.SOLUTIONS):
        model = ns["CaptioningTransformer"](**config)
    train(model, ns["teacher_forcing_loss"], ds.split("train"), replace(cfg["train"], time_limit=None, steps=steps),
          notebooks.solution_training(ns), val_data=None, progress=False)
    return model, ns, cfg, ds


def exact_match(model, ns, ds) -> float:
    scores, _ = ns["evaluate_captions"](model, ns["greedy_decode"], ds.split("val"), ds.vocab, max_len=ds.max_length - 1)
    return scores["exact_match"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=700)
    args = ap.parse_args(argv)
    course, ns, cfg, ds = trained("mine", args.steps)
    models = {"course, again": trained("mine", args.steps)[0]}
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)  # another machine: the same code, its sums in another order
    models[f"course, {torch.get_num_threads()} thread(s)"] = trained("mine", args.steps)[0]
    torch.set_num_threads(threads)
    models["torch layers"] = trained("torch", args.steps)[0]
    generator = torch.Generator().manual_seed(1)
    for scale in (1e-4, 1e-3):
        noisy = copy.deepcopy(course)
        with torch.no_grad():
            for p in noisy.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * p.std().nan_to_num(0.0) * scale)
        models[f"copy + noise {scale:g}"] = noisy
    tuned = copy.deepcopy(course)
    seed_everything(1)
    train(tuned, ns["teacher_forcing_loss"], ds.split("train"), replace(cfg["train"], time_limit=None, steps=20, seed=1),
          notebooks.solution_training(ns), val_data=None, progress=False)
    models["copy, 20 steps more"] = tuned
    base, weights = probe(course, ds), flat(course)
    print(f"{'model':22s} {'predictions':>12s} {'weights':>10s}  exact match")
    print(f"{'course':22s} {0:12.2e} {0:10.2e}  {exact_match(course, ns, ds):.1%}")
    for name, model in models.items():
        predicted = float((probe(model, ds) - base).norm() / base.norm())
        w = flat(model)
        apart = float((w - weights).norm() / weights.norm()) if w.shape == weights.shape else float("nan")
        print(f"{name:22s} {predicted:12.2e} {apart:10.2e}  {exact_match(model, ns, ds):.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
