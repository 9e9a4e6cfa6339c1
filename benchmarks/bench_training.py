"""Train notebook 05's reference model on the default dataset and print training time and val scores.

    python benchmarks/bench_training.py [--layers torch|mine] [--steps N] [--threads N] [--seed S] [--lr LR] [--dropout P]
                                        [--label-smoothing EPS] [--data split stored yours]
                                        [--batch-size B] [--ff F]

Uses the solution notebook's definitions and its "shapes" configuration (the CONFIGS cell). `--data`
names the data paths to train with, one after the other in this run, same seed:
- split: the dataset's in-memory sampler (``Split.sample_batch``);
- stored: the stored captions in ``StoredBatches``, what notebook 05 trains on while a student's Dataset or
  collate function does not pass (every caption padded to the dataset's length);
- yours: notebooks 04-05's pipeline as the solutions write it (build_vocab, encode_captions, CaptionFeatures,
  collate_captions in a DataLoader), as the notebook runs it.
Each trains with the solution's training pieces (fit, train_step, lr_at_step, validation_loss) and is
scored with its evaluate_captions.
`--label-smoothing EPS` trains on PyTorch's cross-entropy with label smoothing instead of the notebook's
loss (the target word gets 1 - EPS of the probability, the rest is spread over the vocabulary; <NULL>
targets ignored): compare its val scores with a run without it (its val loss is the smoothed one).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import torch
from torch.utils.data import DataLoader

from grading import notebooks as nbs
from starter.data import StoredBatches, Vocab, load_dataset
from starter.metrics import format_scores
from starter.runtime import NOTEBOOKS_ENV
from starter.training import seed_everything, train


def smoothed_loss(eps: float, null_idx: int):
    """Teacher forcing with PyTorch's label-smoothed cross-entropy, padding ignored."""
    def loss(model, features, captions):
        logits = model(features, captions[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), captions[:, 1:].flatten(),
                                                 ignore_index=null_idx, label_smoothing=eps)
    return loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="torch", choices=["torch", "mine"])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the notebook's)")
    ap.add_argument("--dropout", type=float, default=None, help="the model's dropout (default: the notebook's)")
    ap.add_argument("--batch-size", type=int, default=None, help="captions per step (default: the notebook's)")
    ap.add_argument("--ff", type=int, default=None, help="the model's dim_feedforward (default: the notebook's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the model, the batches and dropout (the notebook: 0)")
    ap.add_argument("--label-smoothing", type=float, default=0.0, help="train with label smoothing EPS (default 0)")
    ap.add_argument("--data", nargs="+", default=["split", "stored", "yours"], choices=["split", "stored", "yours"])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.layers == "mine":
        os.environ.setdefault(NOTEBOOKS_ENV, str(nbs.SOLUTIONS))
    ns = nbs.captioning_solution()
    cfg = nbs.shapes_config()
    config = replace(cfg["train"], seed=args.seed, steps=args.steps or cfg["train"].steps,
                     lr=args.lr or cfg["train"].lr, batch_size=args.batch_size or cfg["train"].batch_size)
    if args.dropout is not None:
        cfg["model"]["dropout"] = args.dropout
    if args.ff:
        cfg["model"]["dim_feedforward"] = args.ff
    ds = load_dataset("shapes")
    train_split, val_split = ds.split("train"), ds.split("val")
    batch_size = config.batch_size
    print(f"shapes, layers={args.layers}, {torch.get_num_threads()} threads, {config}")
    base = None
    for data in args.data:
        vocab = ds.vocab
        if data == "split":
            source, val = train_split, val_split
        elif data == "stored":
            source = StoredBatches(train_split, train_split.captions, batch_size, shuffle=True, drop_last=True,
                                   seed=args.seed)
            val = StoredBatches(val_split, val_split.captions, batch_size, shuffle=False)
        else:
            vocab = Vocab(ns["build_vocab"](train_split.texts()))
            caps = {name: ns["encode_captions"](split.texts(), vocab.word_to_idx, ds.max_length)
                    for name, split in (("train", train_split), ("val", val_split))}

            def loader(split, name, shuffle, caps=caps):
                return DataLoader(ns["CaptionFeatures"](*split.features_file, caps[name], split.image_idxs),
                                  batch_size=batch_size, shuffle=shuffle, collate_fn=ns["collate_captions"],
                                  drop_last=shuffle, generator=torch.Generator().manual_seed(args.seed))
            source, val = loader(train_split, "train", True), loader(val_split, "val", False)
        seed_everything(args.seed)
        model = ns["CaptioningTransformer"](vocab_size=len(vocab), feature_dim=ds.feature_dim,
                                            num_regions=ds.num_regions, max_len=ds.max_length, layers=args.layers,
                                            **cfg["model"])
        loss_fn = ns["teacher_forcing_loss"] if not args.label_smoothing else smoothed_loss(args.label_smoothing,
                                                                                               vocab.null_idx)
        hist = train(model, loss_fn, source, config, nbs.solution_training(ns), val_data=val, progress=False)
        base = base or hist["seconds"]
        scores, _ = ns["evaluate_captions"](model, ns["greedy_decode"], val_split, vocab, max_len=ds.max_length - 1)
        print(f"{data:>5}: {hist['steps_done']} steps in {hist['seconds']:5.1f} s ({hist['seconds'] / base:.2f}x the "
              f"first), {hist['seconds'] / hist['steps_done'] * 1000:.0f} ms/step, val loss {hist['val_loss'][-1]:.3f}"
              f" | all {val_split.num_images} val images, greedy: {format_scores(scores)}, "
              f"exact match {scores['exact_match']:.1%}")

if __name__ == "__main__":
    main()
