"""Dataset access for the captioning notebooks: one API over three sources.

    from starter.data import load_dataset
    ds = load_dataset("shapes")      # offline default, built on first use (about 1-2 min on a CPU)
    ds = load_dataset("coco-fc7")    # CS231n coco_captioning files:  python -m data.coco_cs231n
    ds = load_dataset("coco-grid")   # 7x7 grid features from COCO:    python -m starter.build_coco_grid
    ds = load_dataset("path/to/file.h5" or "path/to/coco_captioning")

    train = ds.split("train")
    captions, features, image_idxs = train.sample_batch(64, generator=0)   # (B,T) (B,R,D) (B,)
    for captions, features, image_idxs in train.iter_batches(64, device="cuda"): ...
    ds.vocab.decode(captions[0])  -> "a small red circle in the top left"

Shapes: captions (B, T) int64 with <START> ... <END> <NULL>...; features (B, R, D) float32 where
R = grid_h * grid_w regions (49 for a 7x7 grid, 1 for fc7) and D = ds.feature_dim.

Datasets live in `ds_dir = data.common.default_data_dir()` ($COURSE_DATA_DIR, else data/cache/ in a
checkout, else ~/.cache/attention-course). Every problem with a file raises `DatasetError` naming the
file; a missing dataset names the command that gets it. No dataset is ever swapped for another.
"""
from __future__ import annotations

import io
import json
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from data import coco_cs231n, shapes
from data.common import COCO_GRID_FILE, FORMAT_NAME, SPECIAL_TOKENS, coco_grid_command, default_data_dir

__all__ = ["DatasetError", "Vocab", "Split", "CaptionDataset", "StoredBatches", "load_dataset",
           "write_caption_file", "default_data_dir"]

COCO_URL = "http://images.cocodataset.org/{folder}/COCO_{folder}_{id:012d}.jpg"
PRELOAD_BYTES = 2 * 1024**3  # features smaller than this are read into memory once


class DatasetError(Exception):
    """A dataset file is missing, truncated or inconsistent. The message names the file."""


# ----------------------------------------------------------------------------------- vocabulary
class Vocab:
    """Word <-> index mapping with the four special tokens <NULL>=0, <START>=1, <END>=2, <UNK>=3."""

    null_idx, start_idx, end_idx, unk_idx = 0, 1, 2, 3

    def __init__(self, idx_to_word):
        self.idx_to_word = [str(w) for w in idx_to_word]
        self.word_to_idx = {w: i for i, w in enumerate(self.idx_to_word)}
        if tuple(self.idx_to_word[:4]) != SPECIAL_TOKENS:
            raise ValueError(f"vocabulary must start with {SPECIAL_TOKENS}, got {self.idx_to_word[:4]}")

    def __len__(self):
        return len(self.idx_to_word)

    def __repr__(self):
        return f"Vocab({len(self)} words: {' '.join(self.idx_to_word[4:14])} ...)"

    def decode(self, ids):
        """Indices -> sentence, skipping <NULL>/<START> and stopping at <END>.

        ids: a 1-D list/array/tensor -> str; a 2-D batch (B, T) -> list of B strings.
        """
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        arr = np.asarray(ids)
        if arr.ndim == 2:
            return [self.decode(row) for row in arr]
        if arr.ndim != 1:
            raise ValueError(f"decode expects a 1-D or 2-D sequence of indices, got shape {arr.shape}")
        words = []
        for i in arr.tolist():
            if i == self.end_idx:
                break
            if i in (self.null_idx, self.start_idx):
                continue
            words.append(self.idx_to_word[i] if 0 <= i < len(self) else "<UNK>")
        return " ".join(words)


# ---------------------------------------------------------------------------- where images come from
# One class per source, so that `Split` only holds captions and features. Each answers `url(i)`, `image(i)`
# and `objects(i)` for image row i, raising DatasetError (with the reason) where the source cannot.
class ImageSource:
    """No images: only captions and features (and perhaps the images' ids)."""

    def __init__(self, image_ids=None):
        # COCO image ids (or a generated image's number), when known
        self.image_ids = None if image_ids is None else np.asarray(image_ids, dtype=np.int64)

    def url(self, i: int) -> str | None:
        return None

    def image(self, i: int) -> np.ndarray:
        raise DatasetError("the dataset holds no images and no image URLs")

    def objects(self, i: int) -> list[dict]:
        raise DatasetError("no object annotations (only 'shapes' has them)")


class StoredImages(ImageSource):
    """Images stored in the dataset file, with the objects drawn in each (`shapes`)."""

    def __init__(self, images, image_ids=None, objects: dict | None = None):
        super().__init__(image_ids)
        self.images, self._objects = images, objects

    def image(self, i: int) -> np.ndarray:
        return np.asarray(self.images[i])

    def objects(self, i: int) -> list[dict]:
        if self._objects is None:
            return super().objects(i)
        o = self._objects
        return [{"colour": o["colour"][k], "shape": o["shape"][k], "size": o["size"][k],
                 "cell": int(o["cell"][k]), "bbox": tuple(float(v) for v in o["bbox"][k])}
                for k in np.nonzero(o["image_idx"] == i)[0]]


class CocoImages(ImageSource):
    """COCO images (`coco-grid`, and CS231n files whose URLs carry COCO ids): the local file the grid
    builder read when it is still there, else a download from images.cocodataset.org."""

    def __init__(self, folder: str, image_ids, file_names=None, image_root=None):
        super().__init__(image_ids)
        self.folder, self.file_names, self.image_root = folder, file_names, image_root

    def url(self, i: int) -> str:
        if self.file_names is not None:
            return f"http://images.cocodataset.org/{self.folder}/{self.file_names[i]}"
        return COCO_URL.format(folder=self.folder, id=int(self.image_ids[i]))

    def image(self, i: int) -> np.ndarray:
        from PIL import Image

        if self.file_names is not None and self.image_root:
            local = Path(self.image_root) / self.file_names[i]
            if local.is_file():
                return np.asarray(Image.open(local).convert("RGB"))
        url = self.url(i)
        try:
            with urllib.request.urlopen(url, timeout=20) as r:
                return np.asarray(Image.open(io.BytesIO(r.read())).convert("RGB"))
        except Exception as e:  # network errors of many kinds
            raise DatasetError(f"could not fetch it from {url}: {e}") from e


class ListedUrls(ImageSource):
    """Only a URL per image (the CS231n files' Flickr list, many of them dead) and no COCO id."""

    def __init__(self, urls: list[str]):
        super().__init__()
        self.urls = urls

    def url(self, i: int) -> str | None:
        return self.urls[i] if i < len(self.urls) else None

    def image(self, i: int) -> np.ndarray:
        raise DatasetError(f"no image available: the CS231n files hold no COCO image ids, only a Flickr URL "
                           f"({self.url(i) or 'none listed'}), many of which are dead. Use "
                           f"load_dataset('coco-grid') or 'shapes' to see images.")


# ----------------------------------------------------------------------------------------- split
@dataclass
class _Permutation:
    """Where `Split.sample_batch` stands: the generator it was given (or the seed it made one from),
    the current permutation of caption rows and how far into it the batches have gone."""

    source: object  # the int seed, or the torch.Generator itself (compared by identity)
    generator: torch.Generator
    order: torch.Tensor
    cursor: int = 0


class Split:
    """One split (train or val) of a captioning dataset.

    captions: (M, T) int64 tensor; image_idxs: (M,) int64 tensor, row of each caption's image;
    features: (N, R, D) or (N, D) array, in memory or an h5py dataset read on demand, from `path`
    under `features_key`; num_images: N; images: where the pictures come from (an ImageSource).
    """

    def __init__(self, dataset, name: str, captions, image_idxs, features, path, features_key: str = "features",
                 images: ImageSource | None = None):
        self.dataset, self.name, self._path, self._features_key = dataset, name, path, features_key
        self.captions = torch.from_numpy(np.asarray(captions, dtype=np.int64))
        self.image_idxs = torch.from_numpy(np.asarray(image_idxs, dtype=np.int64))
        self._features = features
        self.num_images = int(features.shape[0])
        self.images = images or ImageSource()
        self._by_image: tuple[np.ndarray, np.ndarray] | None = None
        self._permutation: _Permutation | None = None

    @property
    def image_ids(self) -> np.ndarray | None:
        return self.images.image_ids

    def __len__(self):
        return len(self.captions)

    def __repr__(self):
        return (f"Split({self.name!r}: {len(self)} captions of {self.num_images} images, "
                f"features ({self.num_images}, {self.dataset.num_regions}, {self.dataset.feature_dim}))")

    # ---- features
    def features(self, idx) -> torch.Tensor:
        """Features of images `idx` (int, list, array or tensor of N indices) as (N, R, D) float32."""
        idx = np.atleast_1d(np.asarray(idx.cpu() if isinstance(idx, torch.Tensor) else idx, dtype=np.int64))
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_images):
            raise IndexError(f"image index out of range [0, {self.num_images}) in {self.name}")
        if isinstance(self._features, np.ndarray):
            out = self._features[idx]
        else:  # h5py wants increasing unique indices
            uniq, inverse = np.unique(idx, return_inverse=True)
            try:
                out = self._features[uniq][inverse]
            except OSError as e:
                raise DatasetError(f"cannot read features from {self._path}: {e} (file truncated "
                                   f"or corrupt?)") from e
        out = out.reshape(len(idx), self.dataset.num_regions, self.dataset.feature_dim)
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))

    def _batch(self, rows, device):
        rows = torch.as_tensor(rows, dtype=torch.long)
        caps, img = self.captions[rows], self.image_idxs[rows]
        feats = self.features(img)
        if device is not None:
            caps, feats, img = caps.to(device), feats.to(device), img.to(device)
        return caps, feats, img

    # ---- the raw material of data preparation (notebook 04, section 2)
    @property
    def features_file(self) -> tuple[str, str]:
        """(path of the HDF5 file holding this split's features, key of the (N, R, D) or (N, D) dataset)."""
        return str(self._path), self._features_key

    def head(self, num_images: int) -> Split:
        """This split restricted to its first `num_images` images and their captions (e.g. to evaluate on
        a part of it)."""
        n = max(0, min(int(num_images), self.num_images))
        rows = (self.image_idxs < n).numpy()
        feats = self._features[:n] if isinstance(self._features, np.ndarray) else _FirstRows(self._features, n)
        return Split(self.dataset, self.name, self.captions.numpy()[rows], self.image_idxs.numpy()[rows], feats,
                     self._path, self._features_key, self.images)

    def texts(self) -> list[str]:
        """Every caption of the split as a string (decoded from the stored indices), in row order."""
        return [self.dataset.vocab.decode(row) for row in self.captions.numpy()]

    # ---- minibatches
    def sample_batch(self, batch_size: int, generator=None, device=None):
        """A minibatch of `batch_size` distinct captions: (captions (B, T) int64, features
        (B, R, D) float32, image_idxs (B,) int64).

        Successive calls walk through a random permutation of all captions, so no caption repeats
        within an epoch (unlike CS231n's sampling with replacement); a new permutation starts when
        fewer than `batch_size` captions are left. `generator`: an int seed (calls with the same seed
        continue one sequence of batches; another seed starts its own), a torch.Generator (calls with
        the same generator object continue), or None (seed 0).
        """
        if not 0 < batch_size <= len(self):
            raise ValueError(f"batch_size must be in 1..{len(self)} for split {self.name!r}")
        source = 0 if generator is None else generator if isinstance(generator, torch.Generator) else int(generator)
        p = self._permutation
        if p is None or not (p.source is source if isinstance(source, torch.Generator) else p.source == source):
            gen = source if isinstance(source, torch.Generator) else torch.Generator().manual_seed(source)
            p = self._permutation = _Permutation(source, gen, torch.randperm(len(self), generator=gen))
        if p.cursor + batch_size > len(p.order):
            p.order, p.cursor = torch.randperm(len(self), generator=p.generator), 0
        rows = p.order[p.cursor: p.cursor + batch_size]
        p.cursor += batch_size
        return self._batch(rows, device)

    def iter_batches(self, batch_size: int, shuffle: bool = True, seed: int = 0, device=None,
                     drop_last: bool = False):
        """Yield (captions (B, T), features (B, R, D), image_idxs (B,)) covering every caption
        exactly once (the last batch may be smaller unless drop_last)."""
        order = (torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))
                 if shuffle else torch.arange(len(self)))
        for i in range(0, len(self), batch_size):
            rows = order[i: i + batch_size]
            if drop_last and len(rows) < batch_size:
                break
            yield self._batch(rows, device)

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        return len(self) // batch_size if drop_last else -(-len(self) // batch_size)

    # ---- references and images
    def caption_rows(self, image_idx: int) -> np.ndarray:
        """Rows of `captions` that belong to image `image_idx`."""
        if self._by_image is None:
            order = np.argsort(self.image_idxs.numpy(), kind="stable")
            starts = np.searchsorted(self.image_idxs.numpy()[order], np.arange(self.num_images + 1))
            self._by_image = (order, starts)
        order, starts = self._by_image
        return order[starts[image_idx]: starts[image_idx + 1]]

    def references(self, image_idx: int) -> list[str]:
        """All ground-truth captions of image `image_idx` as strings (for BLEU / CIDEr)."""
        return [self.dataset.vocab.decode(self.captions[r]) for r in self.caption_rows(int(image_idx))]

    def _image_row(self, image_idx) -> int:
        i = int(image_idx)
        if not 0 <= i < self.num_images:
            raise IndexError(f"image index {i} out of range [0, {self.num_images})")
        return i

    def image_url(self, image_idx: int) -> str | None:
        """URL of the image: images.cocodataset.org when the COCO id is known, else the URL listed
        with the dataset (Flickr for CS231n, often dead), else None."""
        return self.images.url(self._image_row(image_idx))

    def image(self, image_idx: int) -> np.ndarray:
        """The image as an (H, W, 3) uint8 array for display: the stored thumbnail (shapes), else the
        local COCO file the grid builder read, else a download from images.cocodataset.org. Raises
        DatasetError with the reason when no image is available (CS231n's fc7 files mostly list only
        Flickr URLs)."""
        i = self._image_row(image_idx)
        try:
            return self.images.image(i)
        except DatasetError as e:
            raise DatasetError(f"{self.dataset.name} {self.name} image {i}: {e}") from e.__cause__

    def objects(self, image_idx: int) -> list[dict]:
        """Objects of a generated (shapes) image: dicts with "colour", "shape", "size" (words),
        "cell" (index row*W+col of the feature-grid cell holding the object's centre) and "bbox"
        (x0, y0, x1, y1) in pixels of `image(image_idx)`."""
        i = self._image_row(image_idx)
        try:
            return self.images.objects(i)
        except DatasetError as e:
            raise DatasetError(f"{self.dataset.name}: {e}") from None


class _FirstRows:
    """The first `n` rows of a feature array, read on demand (`Split.head` of an h5py dataset)."""

    def __init__(self, features, n: int):
        self._features, self.shape = features, (n, *features.shape[1:])

    def __getitem__(self, idx):
        return self._features[idx]


# --------------------------------------------------------------------------------------- dataset
class CaptionDataset:
    """A captioning dataset: `vocab`, `split(name)`, `grid_shape` (H, W), `feature_dim` D,
    `num_regions` R = H*W, `name`, `path`."""

    def __init__(self, name, path, vocab, grid_shape, feature_dim, files=()):
        self.name, self.path, self.vocab = name, Path(path), vocab
        self.grid_shape = (int(grid_shape[0]), int(grid_shape[1]))
        self.feature_dim = int(feature_dim)
        self.num_regions = self.grid_shape[0] * self.grid_shape[1]
        self.splits: dict[str, Split] = {}
        self._files = list(files)

    def split(self, name: str) -> Split:
        if name not in self.splits:
            raise KeyError(f"{self.name} has splits {sorted(self.splits)}, not {name!r}")
        return self.splits[name]

    @property
    def max_length(self) -> int:
        """T, the caption length including <START>/<END> and padding."""
        return next(iter(self.splits.values())).captions.shape[1]

    def close(self):
        for f in self._files:
            try:
                f.close()
            except Exception:
                pass

    def __repr__(self):
        lines = [f"CaptionDataset {self.name!r} ({self.path}): vocab {len(self.vocab)}, grid "
                 f"{self.grid_shape[0]}x{self.grid_shape[1]}, feature_dim {self.feature_dim}, "
                 f"captions of length {self.max_length}"]
        lines += [f"  {s!r}" for s in self.splits.values()]
        return "\n".join(lines)


# ------------------------------------------------------------------------- stored batches
class StoredBatches:
    """Batches of a split's captions (`captions`: (M, T), row i a caption of image ``split.image_idxs[i]``,
    e.g. the split's stored ones) with their images' features, as a DataLoader of notebooks 04-06 yields them:
    (features (B, R, D) float32, captions (B, T) int64, every row padded to T). What notebook 06 trains on
    while your `CaptionFeatures` or `collate_captions` does not pass yet. Each iteration is one epoch over
    every caption (`shuffle`: a new order each epoch, drawn with `generator`, which `train` seeds as it
    seeds a DataLoader's; `drop_last` as DataLoader's)."""

    def __init__(self, split: Split, captions, batch_size: int, shuffle: bool, drop_last: bool = False,
                 seed: int = 0):
        self.split, self.batch_size, self.shuffle, self.drop_last = split, batch_size, shuffle, drop_last
        self.captions = torch.as_tensor(captions, dtype=torch.long)
        if self.captions.ndim != 2 or len(self.captions) != len(split):
            raise ValueError(f"captions must be ({len(split)}, T), one row per caption of the {split.name} split, "
                             f"got {tuple(self.captions.shape)}")
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self):
        return self.split.num_batches(self.batch_size, self.drop_last)

    def __iter__(self):
        n = len(self.captions)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            rows = order[start: start + self.batch_size]
            yield self.split.features(self.split.image_idxs[rows]), self.captions[rows]


def write_caption_file(path, name: str, vocab, grid_shape, splits: dict, description: str = "") -> Path:
    """Write a course-format HDF5 file that `load_dataset(path)` reads: `vocab` (a Vocab or idx_to_word
    list) and, for each split name ("train" and "val"), (features (N, R, D), captions (M, T) int,
    image_idxs (M,) int). Features are stored as float16, one chunk per image. Written to a temporary
    file and renamed when complete, so a failed write leaves nothing under `path`."""
    from data.common import atomic_output, write_header

    path = Path(path)
    words = list(getattr(vocab, "idx_to_word", vocab))
    dims = {np.asarray(f).shape[1:] for f, _, _ in splits.values()}
    if len(dims) != 1 or len(next(iter(dims))) != 2:
        raise ValueError(f"features must be (N, R, D) with the same R, D in every split, got {sorted(dims)}")
    regions, dim = next(iter(dims))
    if regions != grid_shape[0] * grid_shape[1]:
        raise ValueError(f"features have {regions} regions but the grid is {grid_shape[0]}x{grid_shape[1]}")
    with atomic_output(path) as tmp, h5py.File(tmp, "w") as f:
        write_header(f, name, grid_shape, dim, words, description)
        for split, (features, captions, image_idxs) in splits.items():
            features = np.asarray(features, dtype=np.float16)
            g = f.create_group(split)
            g.create_dataset("features", data=features, chunks=(1, regions, dim) if len(features) else None)
            g.create_dataset("captions", data=np.asarray(captions, dtype=np.int32))
            g.create_dataset("image_idxs", data=np.asarray(image_idxs, dtype=np.int32))
    return path


# ----------------------------------------------------------------------------------- validation
def _check(cond, path, problem):
    if not cond:
        raise DatasetError(f"{path}: {problem}")


def _check_captions(path, split, caps, idxs, num_images, vocab_size):
    _check(caps.ndim == 2 and caps.shape[1] >= 2, path, f"{split} captions must be (M, T), got {caps.shape}")
    _check(np.issubdtype(caps.dtype, np.integer), path, f"{split} captions must be integers, got {caps.dtype}")
    _check(idxs.shape == (caps.shape[0],), path,
           f"{split} image_idxs shape {idxs.shape} does not match captions {caps.shape}")
    _check(np.issubdtype(idxs.dtype, np.integer), path, f"{split} image_idxs must be integers")
    if caps.size:
        _check(caps.min() >= 0 and caps.max() < vocab_size, path,
               f"{split} captions use word ids up to {caps.max()} but the vocabulary has {vocab_size} "
               f"words (vocabulary does not match the captions)")
        _check((caps[:, 0] == Vocab.start_idx).all(), path, f"{split} captions do not all start with <START>")
        _check(idxs.min() >= 0 and idxs.max() < num_images, path,
               f"{split} image_idxs reach {idxs.max()} but there are {num_images} images")


def _open_h5(path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: cannot open as HDF5 ({e}); the file is truncated or corrupt. "
                           f"Delete it and build or download it again.") from e


def _read(f, key, path):
    if key not in f:
        raise DatasetError(f"{path}: missing key {key!r} (has {sorted(f.keys())})")
    try:
        return f[key][()]
    except OSError as e:
        raise DatasetError(f"{path}: cannot read {key!r} ({e}); truncated or corrupt file") from e


def _features_source(f, key, path, preload):
    d = f[key]
    try:
        d[-1:] if d.shape[0] else None  # the last row reads only if the file is not truncated
    except OSError as e:
        raise DatasetError(f"{path}: cannot read {key!r} ({e}); truncated or corrupt file") from e
    if preload is None:
        preload = d.size * d.dtype.itemsize <= PRELOAD_BYTES
    return _read(f, key, path) if preload else d


def _strings(arr):
    return [x.decode() if isinstance(x, bytes) else str(x) for x in arr]


# ---------------------------------------------------------------------------------------- loaders
def _load_course_h5(path: Path, name=None, preload=None) -> CaptionDataset:
    f = _open_h5(path)
    try:
        _check(f.attrs.get("format") == FORMAT_NAME, path,
               f"not a course-format dataset (attribute format={f.attrs.get('format')!r})")
        vocab = Vocab(_strings(_read(f, "vocab", path)))
        gh, gw, dim = (int(f.attrs[k]) for k in ("grid_h", "grid_w", "feature_dim"))
        ds = CaptionDataset(name or str(f.attrs.get("name", path.stem)), path, vocab, (gh, gw), dim, [f])
        coco_folder = f.attrs.get("coco_folders", None)
        for split in ("train", "val"):
            _check(split in f, path, f"missing group {split!r}")
            g = f[split]
            feats_key = f"{split}/features"
            _check("features" in g, path, f"missing key {feats_key!r}")
            fd = g["features"]
            _check(fd.ndim == 3 and fd.shape[1:] == (gh * gw, dim), path,
                   f"{feats_key} has shape {fd.shape}, expected (N, {gh * gw}, {dim})")
            _check(fd.dtype in (np.float16, np.float32), path, f"{feats_key} has dtype {fd.dtype}, expected float16/32")
            caps, idxs = _read(f, f"{split}/captions", path), _read(f, f"{split}/image_idxs", path)
            n = fd.shape[0]
            _check_captions(path, split, caps, idxs, n, len(vocab))
            ids = _read(f, f"{split}/image_ids", path) if "image_ids" in g else None
            _check(ids is None or len(ids) == n, path, f"{split}/image_ids length != {n}")
            images = ImageSource(ids)
            if "images" in g:  # shapes: the pictures themselves, and the objects drawn in them
                im = g["images"]
                _check(im.ndim == 4 and im.shape[0] == n and im.shape[3] == 3 and im.dtype == np.uint8,
                       path, f"{split}/images has shape {im.shape} {im.dtype}, expected ({n}, H, W, 3) uint8")
                objects = None
                if "objects" in g:
                    objects = {k: _read(f, f"{split}/objects/{k}", path)
                               for k in ("image_idx", "cell", "bbox", "colour", "shape", "size")}
                    for k in ("colour", "shape", "size"):
                        objects[k] = _strings(objects[k])
                images = StoredImages(_read(f, f"{split}/images", path), ids, objects)
            elif coco_folder is not None and ids is not None:  # coco-grid: COCO's own images
                images = CocoImages(dict(zip(("train", "val"), _strings(coco_folder)))[split], ids,
                                    _strings(_read(f, f"{split}/file_names", path)) if "file_names" in g else None,
                                    g.attrs.get("image_root", None))
            ds.splits[split] = Split(ds, split, caps, idxs, _features_source(f, feats_key, path, preload), path,
                                     feats_key, images)
        return ds
    except BaseException:
        f.close()
        raise


def _load_cs231n(folder: Path, preload=None) -> CaptionDataset:
    cmd = coco_cs231n.command(folder.parent)
    for fname in (coco_cs231n.CAPTIONS_FILE, coco_cs231n.VOCAB_FILE, *coco_cs231n.FEATURE_FILES.values()):
        if not (folder / fname).is_file():
            raise DatasetError(f"missing file {folder / fname}. Get the CS231n COCO captioning files with:\n"
                               f"    {cmd}")
    vpath = folder / coco_cs231n.VOCAB_FILE
    try:
        vj = json.loads(vpath.read_text())
        itw, wti = vj["idx_to_word"], vj["word_to_idx"]
        vocab = Vocab(itw)
    except (ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"{vpath}: not a valid vocabulary ({type(e).__name__}: {e}); expected JSON with "
                           f"'idx_to_word' (list starting with {SPECIAL_TOKENS}) and 'word_to_idx'") from e
    _check(isinstance(wti, dict) and all(wti.get(w) == i for i, w in enumerate(itw)) and len(wti) == len(itw),
           vpath, "word_to_idx does not match idx_to_word")
    cpath = folder / coco_cs231n.CAPTIONS_FILE
    files = []
    cf = _open_h5(cpath)
    files.append(cf)
    try:
        feats, dims = {}, set()
        for split, fname in coco_cs231n.FEATURE_FILES.items():
            fpath = folder / fname
            ff = _open_h5(fpath)
            files.append(ff)
            _check("features" in ff, fpath, f"missing key 'features' (has {sorted(ff.keys())})")
            d = ff["features"]
            _check(d.ndim == 2, fpath, f"features must be (N, D), got shape {d.shape}")
            _check(d.dtype in (np.float32, np.float16), fpath, f"features dtype {d.dtype}, expected float32")
            feats[split] = (fpath, _features_source(ff, "features", fpath, preload), d.shape[0])
            dims.add(d.shape[1])
        _check(len(dims) == 1, folder, f"train and val feature dimensions differ: {sorted(dims)}")
        ds = CaptionDataset("coco-fc7", folder, vocab, (1, 1), dims.pop(), files)
        for split in ("train", "val"):
            caps = _read(cf, f"{split}_captions", cpath)
            idxs = _read(cf, f"{split}_image_idxs", cpath)
            fpath, fsrc, n = feats[split]
            _check_captions(cpath, split, caps, idxs, n, len(vocab))
            images: ImageSource = ImageSource()
            upath = folder / coco_cs231n.URL_FILES[split]
            if upath.is_file():
                urls = upath.read_text().split()
                m = [re.search(r"COCO_(train|val)2014_(\d+)", u) for u in urls]
                if urls and all(m):  # COCO's own file names: the image id is known
                    images = CocoImages(f"{split}2014", [int(x.group(2)) for x in m if x is not None])
                else:
                    images = ListedUrls(urls)
            ds.splits[split] = Split(ds, split, caps, idxs, fsrc, fpath, images=images)
        return ds
    except BaseException:
        for f in files:
            f.close()
        raise


def load_dataset(name_or_path="shapes", data_dir=None, build: bool = True, preload=None) -> CaptionDataset:
    """Open a captioning dataset by name ("shapes", "coco-fc7", "coco-grid") or path.

    A path may be a course-format .h5 file (shapes, coco-grid) or a CS231n `coco_captioning` folder.
    `data_dir` overrides the data folder (default `default_data_dir()`). "shapes" is built there on
    first use (progress bar) unless build=False. `preload`: read features into memory (default: when
    they take <= 2 GB). Raises DatasetError naming the missing file and the command that gets it.
    """
    root = Path(data_dir) if data_dir else default_data_dir()
    key = str(name_or_path)
    if key == "shapes":
        path = root / shapes.FILE_NAME
        if not path.exists():
            if not build:
                raise DatasetError(f"missing file {path}. Build it with:\n    {shapes.command(path)}")
            shapes.build(path)
        return _load_course_h5(path, "shapes", preload)
    if key == "coco-fc7":
        return _load_cs231n(root / coco_cs231n.FOLDER, preload)
    if key == "coco-grid":
        path = root / COCO_GRID_FILE
        if not path.exists():
            raise DatasetError(f"missing file {path}. Build COCO grid features (on Colab or a machine with "
                               f"internet) with:\n    {coco_grid_command(root)}")
        return _load_course_h5(path, "coco-grid", preload)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return _load_cs231n(path, preload)
    if path.is_file():
        return _load_course_h5(path, None, preload)
    if path.suffix in (".h5", ".hdf5") or path.name == coco_cs231n.FOLDER:
        raise DatasetError(f"missing file {path}")
    raise DatasetError(f"unknown dataset {key!r}: use 'shapes', 'coco-fc7', 'coco-grid' or an existing path")
