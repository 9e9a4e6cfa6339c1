"""Data benchmarks: shapes build time and size, minibatch throughput from HDF5, grid builder speed.

    python benchmarks/bench_data.py [--quick]

Prints (stdout):
- build time and size on disk of the default shapes dataset (built into a temporary folder, full size
  unless --quick), and the time to open it,
- minibatches/s at batch 64 with `sample_batch`, features preloaded in memory and read lazily from HDF5,
- images/s of the COCO grid builder on CPU (ResNet-50 with random weights -- the speed does not depend
  on the weights -- at 224 px, on generated JPEGs).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from data import coco_grid, shapes
from starter.data import load_dataset


def bench_shapes(tmp: Path, quick: bool):
    sizes = dict(num_train=300, num_val=50) if quick else {}
    t = time.perf_counter()
    path = shapes.build(tmp / "shapes_v1.h5", progress=False, **sizes)
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    ds = load_dataset(path)
    open_s = time.perf_counter() - t
    tr = ds.split("train")
    print(f"shapes build: {build_s:.1f} s for {tr.num_images} + {ds.split('val').num_images} images "
          f"({'quick' if quick else 'full default size'}), {path.stat().st_size / 1e6:.1f} MB on disk, "
          f"open {open_s:.2f} s")
    return path


def bench_batches(path: Path, batch=64, seconds=3.0):
    for preload in (True, False):
        tr = load_dataset(path, preload=preload).split("train")
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds:
            tr.sample_batch(batch, generator=0)
            n += 1
        rate = n / (time.perf_counter() - t)
        print(f"sample_batch({batch}) {'preloaded' if preload else 'lazy HDF5 '}: {rate:8.1f} batches/s "
              f"({rate * batch:,.0f} captions/s)")


def bench_grid(tmp: Path, n=48, arch="resnet50"):
    rng = np.random.default_rng(0)
    for split, count in (("train2014", n), ("val2014", 2)):
        d = tmp / "coco" / split
        d.mkdir(parents=True)
        images, anns = [], []
        for i in range(count):
            name = f"COCO_{split}_{i + 1:012d}.jpg"
            Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(d / name)
            images.append({"id": i + 1, "file_name": name})
            anns.append({"id": i, "image_id": i + 1, "caption": "a photo of something"})
        (tmp / "coco" / f"{split}.json").write_text(json.dumps({"images": images, "annotations": anns}))
    c = tmp / "coco"
    t = time.perf_counter()
    coco_grid.build(tmp / "grid.h5", c / "train2014.json", c / "train2014", c / "val2014.json", c / "val2014",
                    arch=arch, weights=None, num_workers=1, batch_size=16, device="cpu", progress=False)
    s = time.perf_counter() - t
    print(f"grid builder ({arch}, 224 px, CPU, {torch.get_num_threads()} threads): {(n + 2) / s:.1f} images/s "
          f"({n + 2} 640x480 JPEGs in {s:.1f} s, incl. model set-up)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="small shapes build and fewer grid images")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        path = bench_shapes(tmp, a.quick)
        bench_batches(path)
        bench_grid(tmp, n=16 if a.quick else 48)


if __name__ == "__main__":
    main()
