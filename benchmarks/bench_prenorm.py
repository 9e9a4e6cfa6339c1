"""Pre-norm vs post-norm, with and without a learning-rate warm-up: the small experiment behind notebook 03's
question 6.

    python benchmarks/bench_prenorm.py [--layers 12] [--steps 300] [--lrs 1e-3 3e-3] [--warmup 100]

A stack of PyTorch's `nn.TransformerEncoderLayer` (d_model 64, 4 heads, no dropout; `norm_first=True` is
pre-norm, with a final LayerNorm; False is post-norm, the original Transformer's) learns to sort 12 digits
with Adam at a constant learning rate, or with a linear warm-up over the first `--warmup` steps. Same seed,
same batches for every variant. Prints the mean training loss of the last 20 steps (ln 10 = 2.30 is
guessing) for each.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def final_loss(norm_first: bool, layers: int, lr: float, steps: int, warmup: int, seed: int = 0, d: int = 64) -> float:
    torch.manual_seed(seed)
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True,
                                                             norm_first=norm_first), layers, enable_nested_tensor=False)
    model = nn.ModuleDict({"embed": nn.Embedding(10, d), "stack": stack, "head": nn.Linear(d, 10),
                           "final": nn.LayerNorm(d) if norm_first else nn.Identity()})
    position = nn.Parameter(torch.randn(12, d) * 0.1)
    opt = torch.optim.Adam([*model.parameters(), position], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    g = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 10, (32, 12), generator=g)
        logits = model["head"](model["final"](model["stack"](model["embed"](x) + position)))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), x.sort(dim=1).values.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return sum(losses[-20:]) / 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3])
    ap.add_argument("--warmup", type=int, default=100)
    args = ap.parse_args()
    print(f"{args.layers} layers, {args.steps} steps, sorting 12 digits; loss of the last 20 steps (guessing: 2.30)")
    for lr in args.lrs:
        for norm_first, name in ((True, "pre-norm "), (False, "post-norm")):
            for warmup in (0, args.warmup):
                start = time.perf_counter()
                loss = final_loss(norm_first, args.layers, lr, args.steps, warmup)
                print(f"lr {lr:g}  {name}  warm-up {warmup:3d}: {loss:.3f}   ({time.perf_counter() - start:.0f} s)",
                      flush=True)


if __name__ == "__main__":
    main()
