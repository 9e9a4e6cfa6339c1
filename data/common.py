"""Pieces shared by the dataset builders: special tokens, the data folder, atomic output files, and the
HDF5 layout ("course format") that `starter.data` reads.

Course format (one HDF5 file, written by `data.shapes` and `data.coco_grid`)::

    /                      attrs: format="attention-course-captions", format_version=1, name,
                           grid_h, grid_w, feature_dim, description
    /vocab                 (V,) utf-8 strings, idx_to_word; entries 0-3 are SPECIAL_TOKENS
    /<split>/captions      (M, T) int32, <START> w1 ... <END> <NULL> ...
    /<split>/image_idxs    (M,)   int32, row of the caption's image in this split
    /<split>/features      (N, grid_h*grid_w, feature_dim) float16, chunks of one image
    /<split>/image_ids     (N,)   int64, COCO image id (or the generated image's number)
    optional: /<split>/file_names (N,) str, /<split>/images (N, S, S, 3) uint8,
              /<split>/objects/{image_idx, cell, bbox, colour, shape, size}
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ("<NULL>", "<START>", "<END>", "<UNK>")
NULL, START, END, UNK = 0, 1, 2, 3
FORMAT_NAME = "attention-course-captions"
FORMAT_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent


# The COCO grid file and the command that builds it (`starter.build_coco_grid`, which reads the student's
# notebook 04), here so that the reader (`starter.data`) can name both.
COCO_GRID_FILE = "coco_grid.h5"


def coco_grid_command(root=None) -> str:
    root = Path(root) if root else default_data_dir()
    return (f"python -m starter.build_coco_grid --coco-dir {root / 'coco'} --download "
            f"--out {root / COCO_GRID_FILE} --max-images 20000")


DATA_ENV = "COURSE_DATA_DIR"  # the environment variable naming the data folder


def default_data_dir() -> Path:
    """Folder for downloaded and built datasets.

    `$COURSE_DATA_DIR` if set; else `data/cache/` of the repository checkout when running from one;
    else `~/.cache/attention-course`.
    """
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    if (REPO_ROOT / "pyproject.toml").exists() and (REPO_ROOT / "data" / "__init__.py").exists():
        return REPO_ROOT / "data" / "cache"
    return Path.home() / ".cache" / "attention-course"


@contextlib.contextmanager
def atomic_output(path: Path):
    """Yield a temporary path beside `path`; rename it to `path` only if the block succeeds.

    A failed or interrupted build leaves no file under the final name (the temporary one is removed).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_header(f, name: str, grid_shape, feature_dim: int, vocab: list[str], description: str):
    """Root attributes and /vocab of a course-format file (`f` is an open, writable h5py.File)."""
    import h5py

    f.attrs["format"] = FORMAT_NAME
    f.attrs["format_version"] = FORMAT_VERSION
    f.attrs["name"] = name
    f.attrs["grid_h"], f.attrs["grid_w"] = int(grid_shape[0]), int(grid_shape[1])
    f.attrs["feature_dim"] = int(feature_dim)
    f.attrs["description"] = description
    f.create_dataset("vocab", data=np.array(vocab, dtype=object), dtype=h5py.string_dtype())
