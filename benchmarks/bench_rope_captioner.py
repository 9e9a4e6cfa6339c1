"""Rotary positions in the captioner, measured: the experiment notebook 10's section 5 cites.

The solution's captioner (notebooks 02-07, the solutions' own layers) trained on `shapes` as notebook 06 trains it
(its settings, seed 0, the same batches), twice: with notebook 02's sinusoidal table added to the word embeddings
(the course's model), and with rotary positions instead: no table, and each decoder layer's self-attention rotates
its queries and keys per head with notebook 02's `apply_rope` (position t of the caption rotated by t). Printed side
by side: the last validation loss and the greedy exact match on the 500 validation images.

    python benchmarks/bench_rope_captioner.py [--steps 700]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from torch import nn

from grading import notebooks
from starter.data import load_dataset
from starter.layers import layers_from
from starter.training import seed_everything, train


class Rotated(nn.Module):
    """A query or key projection followed by RoPE on each head: (B, T, E) -> (B, T, E), heads of E // num_heads
    columns side by side, as notebook 03's split_heads cuts them."""

    def __init__(self, projection: nn.Linear, num_heads: int, apply_rope):
        super().__init__()
        self.projection, self.num_heads, self.apply_rope = projection, num_heads, apply_rope

    def forward(self, x):
        heads = self.projection(x).unflatten(-1, (self.num_heads, -1)).transpose(1, 2)  # (B, h, T, d_k)
        return self.apply_rope(heads).transpose(1, 2).flatten(2)


def run(positions: str, steps: int) -> dict:
    ns = notebooks.captioning_solution()
    apply_rope = notebooks.solution("02_positional_encoding")["apply_rope"]
    cfg = notebooks.shapes_config()
    ds = load_dataset("shapes")
    seed_everything(0)
    config = dict(vocab_size=len(ds.vocab), feature_dim=ds.feature_dim, num_regions=ds.num_regions,
                  max_len=ds.max_length, layers="mine", **cfg["model"])
    with layers_from(notebooks.SOLUTIONS):
        model = ns["CaptioningTransformer"](**config)
    if positions == "rope":
        model.pos_encoding.pe.zero_()  # no table: positions enter through the rotations only
        for layer in model.decoder_layers:
            attn = layer.self_attn
            attn.q_proj = Rotated(attn.q_proj, attn.num_heads, apply_rope)
            attn.k_proj = Rotated(attn.k_proj, attn.num_heads, apply_rope)
    t0 = time.perf_counter()
    history = train(model, ns["teacher_forcing_loss"], ds.split("train"),
                    replace(cfg["train"], time_limit=None, steps=steps), notebooks.solution_training(ns),
                    val_data=ds.split("val"), progress=False)
    seconds = time.perf_counter() - t0
    scores, _ = ns["evaluate_captions"](model, ns["greedy_decode"], ds.split("val"), ds.vocab, max_len=ds.max_length - 1)
    return {"val_loss": history["val_loss"][-1], "exact_match": scores["exact_match"], "seconds": seconds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=700)
    args = ap.parse_args(argv)
    results = {}
    for positions in ("sinusoidal", "rope"):
        results[positions] = r = run(positions, args.steps)
        print(f"{positions:10}: {args.steps} steps in {r['seconds']:5.1f} s | last validation loss {r['val_loss']:.3f} | "
              f"greedy exact match {r['exact_match']:.1%} of the 500 validation images", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
