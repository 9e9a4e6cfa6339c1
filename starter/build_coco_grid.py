"""The command that builds the COCO grid features with *your* notebook 04's vocabulary and encoding.

    python -m starter.build_coco_grid --coco-dir DIR --download --out DIR/coco_grid.h5 --max-images 20000
    python -m starter.build_coco_grid --train-annotations captions_train2014.json --train-images train2014/ \
        --val-annotations captions_val2014.json --val-images val2014/ --out coco_grid.h5

It reads `build_vocab` and `encode_captions` from notebook 04 (in the course folder, or `--notebook PATH`),
each once it passes its public check, and hands them to `data.coco_grid.build`, which does the rest (see
there: the CNN, the regions, resuming). The builder is in `data`, which never imports the kit; reading a
notebook is the kit's, so the command is here.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from data import coco_grid
from data.common import COCO_GRID_FILE, default_data_dir

from .notebook_loader import NotebookLoadError, load_definitions
from .pipeline import yours_if_it_passes
from .runtime import DATA_NOTEBOOK


def notebook_pieces(notebook=None) -> dict | None:
    """build_vocab and encode_captions from notebook 04 (`notebook`, else the course folder's), each once
    it passes its public check; None, after saying why on stderr, if that notebook does not have them yet.
    """
    names = ["build_vocab", "encode_captions"]
    try:
        if notebook is None:
            found = load_definitions(DATA_NOTEBOOK, names)
        else:
            found = load_definitions(Path(notebook).name, names, folder=Path(notebook).resolve().parent)
    except NotebookLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    pieces = {n: yours_if_it_passes(n, found[n], instead="finish it in notebook 04 first") for n in names}
    if any(p is None for p in pieces.values()):
        print("error: the dataset's vocabulary and captions are made by your notebook 04's build_vocab and "
              "encode_captions, and not all of them pass their checks yet", file=sys.stderr)
        return None
    return pieces


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Build COCO grid features (HDF5) for captioning.")
    p.add_argument("--coco-dir", type=Path, help="folder with annotations/, train2014/, val2014/")
    p.add_argument("--download", action="store_true", help="download COCO 2014 into --coco-dir first")
    p.add_argument("--train-annotations", type=Path)
    p.add_argument("--train-images", type=Path)
    p.add_argument("--val-annotations", type=Path)
    p.add_argument("--val-images", type=Path)
    p.add_argument("--out", type=Path, default=default_data_dir() / COCO_GRID_FILE)
    p.add_argument("--max-images", type=int, default=None, help="training images (first by id)")
    p.add_argument("--max-val-images", type=int, default=None, help="default: max-images / 4")
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--weights", default="DEFAULT", help="torchvision weights name, or 'none'")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--min-count", type=int, default=5)
    p.add_argument("--max-words", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--device", default=None)
    p.add_argument("--notebook", type=Path, default=None,
                   help="the notebook 04 whose build_vocab and encode_captions make the vocabulary and "
                        "the encoded captions (default: yours, in the course folder)")
    a = p.parse_args(argv)
    if a.coco_dir:
        if a.download:
            coco_grid.download_coco(a.coco_dir)
        a.train_annotations = a.train_annotations or a.coco_dir / "annotations" / "captions_train2014.json"
        a.val_annotations = a.val_annotations or a.coco_dir / "annotations" / "captions_val2014.json"
        a.train_images = a.train_images or a.coco_dir / "train2014"
        a.val_images = a.val_images or a.coco_dir / "val2014"
    if not all((a.train_annotations, a.train_images, a.val_annotations, a.val_images)):
        p.error("give --coco-dir, or all of --train-annotations --train-images --val-annotations --val-images")
    weights = None if a.weights.lower() == "none" else a.weights
    t = time.time()
    pieces = notebook_pieces(a.notebook)
    if pieces is None:
        return 1
    try:
        out = coco_grid.build(a.out, a.train_annotations, a.train_images, a.val_annotations, a.val_images, **pieces,
                    max_images=a.max_images, max_val_images=a.max_val_images, arch=a.arch, weights=weights,
                    image_size=a.image_size, min_count=a.min_count, max_words=a.max_words,
                    batch_size=a.batch_size, num_workers=a.num_workers, device=a.device)
    except coco_grid.BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.time() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
