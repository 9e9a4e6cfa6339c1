"""python -m grading.cases.captioning: the trained-model cases' shares of a checkpoint."""
from __future__ import annotations

from collections.abc import Sequence

from grading.cases.captioning.training import trained_shares


def main(argv: Sequence[str] | None = None) -> int:
    """python -m grading.cases.captioning [CHECKPOINT ...] [--kit-sampler]: the trained-model cases' shares."""
    import argparse
    import tempfile
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m grading.cases.captioning", description=(
        "Print the share of the trained-model cases' images (public and hidden) that each checkpoint captions "
        "exactly right: the figures behind their marks. Notebook 05's model is the one its solution saves "
        "(python -m grading execute 05 writes build/executed/runs/captioning_transformer.pt)."))
    parser.add_argument("checkpoints", nargs="*", type=Path)
    parser.add_argument("--kit-sampler", action="store_true",
                        help="also train the notebook's model on the kit's sampler (700 steps, seed 0) and measure it")
    args = parser.parse_args(argv)
    runs = [(str(p), p) for p in args.checkpoints]
    with tempfile.TemporaryDirectory() as tmp:
        if args.kit_sampler:
            from grading import notebooks

            runs.append(("the kit's sampler, 700 steps, seed 0",
                         notebooks.trained_checkpoint(Path(tmp) / "captioning_transformer.pt")))
        for label, path in runs:
            shares = trained_shares(path)
            public = [v for k, v in shares.items() if k == "trained/new_scenes"]
            hidden = sorted({v for k, v in shares.items() if k != "trained/new_scenes"})
            print(f"{label}: public scenes {', '.join(f'{v:.0%}' for v in public)}, "
                  f"hidden scenes {', '.join(f'{v:.0%}' for v in hidden)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
