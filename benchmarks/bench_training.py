"""Train notebook 04's reference model on the default dataset and print training time and val scores.

    python benchmarks/bench_training.py [--layers torch|mine] [--steps N] [--threads N]

Uses the solution notebook's definitions and its "shapes" configuration (the CONFIGS cell).
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from grading import notebooks as nbs  # noqa: E402
from starter.data import load_dataset  # noqa: E402
from starter.metrics import evaluate_captioner, format_scores  # noqa: E402
from starter.training import seed_everything, train  # noqa: E402

NOTEBOOK = nbs.SOLUTIONS / "04_captioning_transformer.ipynb"


def shapes_config() -> dict:
    """The "shapes" entry of the notebook's CONFIGS dict, read from the source (not re-typed here)."""
    for cell in nbs.read(NOTEBOOK).cells:
        if cell.cell_type == "code" and cell.source.startswith("CONFIGS = {"):
            tree = ast.parse(cell.source.split("\nconfig = ")[0])
            expr = ast.Expression(tree.body[0].value)
            return eval(compile(expr, "CONFIGS", "eval"), {"__builtins__": {}, "dict": dict})["shapes"]  # noqa: S307
    raise SystemExit("CONFIGS cell not found in the solution notebook")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="torch", choices=["torch", "mine"])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.layers == "mine":
        os.environ.setdefault("COURSE_NOTEBOOKS_DIR", str(nbs.SOLUTIONS))
    ns = nbs.execute_definitions(NOTEBOOK)
    cfg = shapes_config()
    targs = dict(cfg["train"])
    if args.steps:
        targs.update(steps=args.steps, time_limit=None)
    ds = load_dataset("shapes")
    seed_everything(0)
    model = ns["CaptioningTransformer"](vocab_size=len(ds.vocab), feature_dim=ds.feature_dim,
                                        num_regions=ds.num_regions, max_len=ds.max_length, layers=args.layers,
                                        **cfg["model"])
    print(f"shapes, layers={args.layers}, {torch.get_num_threads()} threads, {targs}")
    hist = train(model, ns["teacher_forcing_loss"], ds.split("train"), val_split=ds.split("val"), seed=0,
                 progress=False, **targs)
    print(f"training: {hist['steps_done']} steps in {hist['seconds']:.1f} s "
          f"({hist['seconds'] / hist['steps_done'] * 1000:.0f} ms/step), final val loss {hist['val_loss'][-1]:.3f}")
    t0 = time.perf_counter()
    scores, _, _ = evaluate_captioner(model, ns["greedy_decode"], ds.split("val"), ds.vocab, max_len=ds.max_length - 1)
    print(f"val (all {ds.split('val').num_images} images, greedy, {time.perf_counter() - t0:.1f} s): {format_scores(scores)}")


if __name__ == "__main__":
    main()
