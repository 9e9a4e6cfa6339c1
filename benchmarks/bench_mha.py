"""Reference MultiHeadAttention (notebook 03's solution) against torch.nn.MultiheadAttention.

Forward + backward on CPU, both layers measured in the same run with the same inputs and weights
(warm-up, then interleaved repeats, median). The goal is a ratio <= 1.2.

    python benchmarks/bench_mha.py [--batch 32 --seq 64 --embed 256 --heads 8 --repeats 30 --threads N]

Two PyTorch baselines are reported:
- `need_weights=True, average_attn_weights=False`: returns per-head weights like ours (the comparison
  that the goal refers to);
- `need_weights=False`: PyTorch's fused attention kernel, which returns no weights at all (for context).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent

from grading import notebooks

SOLUTION = notebooks.SOLUTIONS / "03_multi_head_attention.ipynb"


def reference_class():
    return notebooks.execute_definitions(SOLUTION)["MultiHeadAttention"]


def copy_weights(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--embed", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: PyTorch's)")
    p.add_argument("--causal", action="store_true", help="also pass a causal mask")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, T, E, H = args.batch, args.seq, args.embed, args.heads

    ours = reference_class()(E, H, dropout=0.0).train()
    theirs = nn.MultiheadAttention(E, H, dropout=0.0, batch_first=True).train()
    copy_weights(ours, theirs)
    x = torch.randn(B, T, E, requires_grad=True)
    grad_out = torch.randn(B, T, E)
    mask = torch.ones(T, T, dtype=torch.bool).tril() if args.causal else None

    def run_ours():
        out, _ = ours(x, x, x, attn_mask=mask)
        out.backward(grad_out)

    def run_torch_weights():
        out, _ = theirs(x, x, x, attn_mask=None if mask is None else ~mask, need_weights=True,
                        average_attn_weights=False)
        out.backward(grad_out)

    def run_torch_fused():
        out, _ = theirs(x, x, x, attn_mask=None if mask is None else ~mask, need_weights=False)
        out.backward(grad_out)

    # same numbers first (forward), so the comparison is meaningful
    with torch.no_grad():
        a = ours(x, x, x, attn_mask=mask)
        b = theirs(x, x, x, attn_mask=None if mask is None else ~mask, need_weights=True, average_attn_weights=False)
    assert torch.allclose(a[0], b[0], atol=1e-4) and torch.allclose(a[1], b[1], atol=1e-5), "outputs differ"

    runs = {"ours": run_ours, "torch (per-head weights)": run_torch_weights, "torch (need_weights=False)": run_torch_fused}
    times = {k: [] for k in runs}
    for fn in runs.values():
        for _ in range(args.warmup):
            fn()
    for _ in range(args.repeats):  # interleaved, so drifts in machine load hit all three alike
        for name, fn in runs.items():
            x.grad = None
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}

    print(f"MultiHeadAttention forward+backward, CPU, B={B} T={T} E={E} H={H}"
          f"{' causal' if mask is not None else ''}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} (torch {torch.__version__})")
    for name, ms in med.items():
        print(f"  {name:<28} {ms:8.2f} ms")
    ratio = med["ours"] / med["torch (per-head weights)"]
    print(f"  ratio ours / torch (per-head weights): {ratio:.2f}x  (goal <= 1.2x)")
    print(f"  ratio ours / torch (need_weights=False): {med['ours'] / med['torch (need_weights=False)']:.2f}x")
    return 0 if ratio <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
