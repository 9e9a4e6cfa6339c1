"""Notebook 10's two savings, measured with the solution's code (the course's own figures, beside the students').

1. A KV cache: greedy decoding of 100 captions with notebook 10's `cached_greedy_decode`, once with its cached
   `decode_step` and once with a step that runs the whole prefix again at every word (as notebook 07's
   `greedy_decode` does), on a model the size of the course's, at the course's caption length and 2, 4 and 8 times
   it. Every caption runs its full length (an end word that never comes). Printed: time per caption (the median of
   `--repeats` runs), the ratio, and the word positions each runs; both decoders' captions are checked equal.
2. Attention in blocks: notebook 10's `blockwise_attention` (blocks of `--block`) against PyTorch's attention
   computed all at once (its "math" kernel, as notebook 01 does), one head of size 64, T up to 16,384, where the
   full float32 score matrix alone is 1 GiB. Printed: the most numbers any one tensor held during each call
   (`starter.fast.largest_tensor`), the time, and the largest difference between the two results.

    python benchmarks/bench_fast_attention.py [--device cuda] [--repeats 3] [--block 256] [--readme]

`--readme` writes the headline figures into README.md between their markers and the plot into
docs/fast_attention.png.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parent.parent
STEM = "10_efficient_attention"
MARKERS = ("<!-- fast attention: written by `python benchmarks/bench_fast_attention.py --readme`; do not edit by hand -->",
           "<!-- end of fast attention -->")
PLOT = ROOT / "docs" / "fast_attention.png"

from grading import notebooks
from grading.execute import replace_block
from starter.fast import CaptionerWeights, largest_tensor
from starter.layers import CAPTION_WORDS


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def decoding(ns, device, repeats, n_captions=100):
    """{length: (cached seconds per caption, uncached, cached positions per caption, uncached)}."""
    decode_step, cached_greedy = ns["decode_step"], ns["cached_greedy_decode"]

    def uncached(model, features, words, cache=None):
        prefix = words if cache is None else torch.cat([cache, words], 1)
        return decode_step(model, features, prefix, None)[0][:, -words.shape[1]:], prefix

    lengths = [CAPTION_WORDS * k for k in (1, 2, 4, 8)]
    torch.manual_seed(0)
    model = CaptionerWeights(vocab_size=31, feature_dim=64, num_regions=49, max_len=max(lengths) + 1).eval().to(device)
    images = torch.randn(n_captions, 49, 64, device=device)
    never = model.vocab_head.out_features
    out = {}
    for length in lengths:
        row = []
        captions = []
        for step in (decode_step, uncached):
            positions = []

            def counted(m, f, w, c=None, step=step, positions=positions):
                positions.append(w.numel() if step is decode_step else w.numel() + (0 if c is None else c.numel()))
                return step(m, f, w, c)

            cached_greedy(model, images[:2], 2, end_idx=never, step=step)  # warm-up
            times = []
            for _ in range(repeats):
                positions.clear()
                _sync(device)
                t0 = time.perf_counter()
                captions.append(cached_greedy(model, images, length, end_idx=never, step=counted))
                _sync(device)
                times.append((time.perf_counter() - t0) / n_captions)
            row.append((statistics.median(times), sum(positions) / n_captions))
        if not all(torch.equal(captions[0], c) for c in captions[1:]):
            raise AssertionError(f"{length} words: the cached and uncached decoders wrote different captions")
        out[length] = (row[0][0], row[1][0], row[0][1], row[1][1])
        print(f"{length:4d} words: {1e3 * row[1][0]:8.3f} ms per caption without the cache, {1e3 * row[0][0]:7.3f} ms "
              f"with it, {row[1][0] / row[0][0]:5.1f}x faster | word positions run {row[1][1]:6.0f} against "
              f"{row[0][1]:4.0f} ({row[1][1] / row[0][1]:5.1f}x); the same captions", flush=True)
    return out


def blocks(ns, device, block):
    """{T: (numbers held in blocks, all at once, seconds in blocks, all at once, largest difference)}."""
    blockwise = ns["blockwise_attention"]

    def plain(q, k, v):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v)

    warm = torch.randn(1, 1, 2 * block, 64, device=device)
    blockwise(warm, warm, warm, block), plain(warm, warm, warm)  # one-time costs, untimed
    out = {}
    for T in (1024, 2048, 4096, 8192, 16384):
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(1, 1, T, 64, generator=g).to(device) for _ in range(3))
        results = []
        for fn, args in ((blockwise, (q, k, v, block)), (plain, (q, k, v))):
            _sync(device)
            t0 = time.perf_counter()
            result, held = largest_tensor(fn, *args)
            _sync(device)
            results.append((result, held, time.perf_counter() - t0))
        (ours, held_b, sec_b), (full, held_p, sec_p) = results
        diff = (ours - full).abs().max().item()
        del full, ours
        out[T] = (held_b, held_p, sec_b, sec_p, diff)
        print(f"T = {T:6,d}: largest tensor held {held_b:11,d} numbers in blocks of {block}, {held_p:13,d} all at once "
              f"({held_p / held_b:5.0f}x; the full score matrix {4 * T * T / 2**20:7,.0f} MiB) | {sec_b:6.2f} s against "
              f"{sec_p:6.2f} s | largest difference {diff:.1e}", flush=True)
    return out


def plot(cache, held, block, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    lengths = list(cache)
    left.plot(lengths, [cache[L][1] / cache[L][0] for L in lengths], "o-", label="time")
    left.plot(lengths, [cache[L][3] / cache[L][2] for L in lengths], "s--", label="word positions run")
    left.set(xlabel="words per caption", ylabel="uncached / cached", title="KV cache: how many times less")
    left.legend()
    Ts = list(held)
    right.loglog(Ts, [held[T][0] for T in Ts], "o-", label=f"in blocks of {block}")
    right.loglog(Ts, [held[T][1] for T in Ts], "s-", label="all at once")
    right.set(xlabel="sequence length T", ylabel="numbers in the largest tensor", title="attention: memory held")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--readme", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    ns = notebooks.solution(STEM)
    print(f"notebook 10's solution on {device} ({torch.get_num_threads()} threads), 100 captions per length:")
    cache = decoding(ns, device, args.repeats)
    held = blocks(ns, device, args.block)
    if args.readme:
        first, fourth = CAPTION_WORDS, 4 * CAPTION_WORDS
        longest = max(held)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        text = (f"**Faster attention, measured** (notebook 10) by `python benchmarks/bench_fast_attention.py --readme` on "
                f"{date.today().isoformat()}, commit {commit} ({torch.get_num_threads()} CPU threads, "
                f"{platform.machine()}, {device.type}): greedy decoding of 100 captions with the cache of keys and "
                f"values took {cache[first][1] / cache[first][0]:.1f} times less time than without it at the course's "
                f"caption length ({first} words), {cache[fourth][1] / cache[fourth][0]:.1f} times less at {fourth} words and "
                f"{cache[max(cache)][1] / cache[max(cache)][0]:.1f} times less at {max(cache)}, with the same captions; "
                f"attention in blocks of {args.block} held at most {held[longest][0]:,} numbers in one tensor at "
                f"T = {longest:,}, where computing all scores at once held {held[longest][1]:,} (the score matrix, "
                f"{4 * longest * longest / 2**30:.0f} GiB), and the results differed by at most {held[longest][4]:.1e}. "
                f"The plot: [docs/fast_attention.png](docs/fast_attention.png).")
        replace_block(ROOT / "README.md", MARKERS, text, "fast attention figures")
        plot(cache, held, args.block, PLOT)
        print(f"wrote the figures into README.md and the plot into {PLOT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
