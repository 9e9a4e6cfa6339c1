"""Pieces shared by the dataset builders: special tokens, tokenising, vocabularies, the data folder,
atomic output files, and the HDF5 layout ("course format") that `starter.data` reads.

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
import re
from collections import Counter
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ("<NULL>", "<START>", "<END>", "<UNK>")
NULL, START, END, UNK = 0, 1, 2, 3
FORMAT_NAME = "attention-course-captions"
FORMAT_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent


def default_data_dir() -> Path:
    """Folder for downloaded and built datasets.

    `$COURSE_DATA_DIR` if set; else `data/cache/` of the repository checkout when running from one;
    else `~/.cache/attention-course`.
    """
    env = os.environ.get("COURSE_DATA_DIR")
    if env:
        return Path(env).expanduser()
    if (REPO_ROOT / "pyproject.toml").exists() and (REPO_ROOT / "data" / "__init__.py").exists():
        return REPO_ROOT / "data" / "cache"
    return Path.home() / ".cache" / "attention-course"


_WORD = re.compile(r"[a-z0-9]+")


def tokenize(sentence: str) -> list[str]:
    """Lower-case words, punctuation dropped: "A dog, running." -> ["a", "dog", "running"]."""
    return _WORD.findall(sentence.lower())


def build_vocab(sentences, min_count: int = 1) -> list[str]:
    """idx_to_word: the four special tokens, then words seen >= min_count times (most frequent first,
    ties alphabetical, so the result is deterministic)."""
    counts = Counter(w for s in sentences for w in tokenize(s))
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return list(SPECIAL_TOKENS) + [w for w in words if w not in SPECIAL_TOKENS]


def encode_captions(sentences, word_to_idx: dict, max_len: int) -> np.ndarray:
    """(M, max_len) int32 array of <START> words <END> <NULL>...; words beyond max_len-2 are cut,
    unknown words become <UNK>."""
    out = np.full((len(sentences), max_len), NULL, dtype=np.int32)
    for i, s in enumerate(sentences):
        ids = [word_to_idx.get(w, UNK) for w in tokenize(s)][: max_len - 2]
        out[i, : len(ids) + 2] = [START, *ids, END]
    return out


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
