"""Download COCO captioning data as CS231n ships it (`coco_captioning.zip`).

    python -m data.coco_cs231n --dest DIR      # -> DIR/coco_captioning/

Resumable (run the command again after an interruption), with a progress bar; the zip's size is
checked against the server's before unzipping, the zip is CRC-tested, the folder appears under its
final name only once complete, and every file in it is then opened and its arrays checked
(`check_folder`). CS231n publishes no hash of the zip (and this kit was built without access to it),
so no SHA-256 is checked by default; each download prints the zip's SHA-256, and `--sha256 HASH` (or
`fetch(..., sha256=)`) makes pooch refuse any other file, e.g. on a class's lab machines once one
download was checked. Then `load_dataset("coco-fc7")` (or `load_dataset("DIR/coco_captioning")`)
reads it. Needs about 1 GB of disk during download.

Layout of the folder (read by `starter.data`)::

    coco2014_captions.h5        train_captions (400135, 17) int32, train_image_idxs (400135,) int32,
                                val_captions (195954, 17) int32, val_image_idxs (195954,) int32
    train2014_vgg16_fc7_pca.h5  features (82783, 512) float32
    val2014_vgg16_fc7_pca.h5    features (40504, 512) float32
    coco2014_vocab.json         {"idx_to_word": [...1004], "word_to_idx": {...}}, <NULL>=0 <START>=1
                                <END>=2 <UNK>=3
    train2014_urls.txt, val2014_urls.txt   one (Flickr) URL per image, many dead
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pooch import file_hash

from data.common import default_data_dir
from data.download import DownloadError, download, extract_zip_atomic, is_complete

URL = "https://cs231n.stanford.edu/coco_captioning.zip"
FOLDER = "coco_captioning"
CAPTIONS_FILE = "coco2014_captions.h5"
VOCAB_FILE = "coco2014_vocab.json"
FEATURE_FILES = {"train": "train2014_vgg16_fc7_pca.h5", "val": "val2014_vgg16_fc7_pca.h5"}
URL_FILES = {"train": "train2014_urls.txt", "val": "val2014_urls.txt"}


def command(dest=None) -> str:
    """The shell command that downloads the CS231n files into `dest`/coco_captioning."""
    return f"python -m data.coco_cs231n --dest {dest or default_data_dir()}"


def fetch(dest=None, url: str = URL, keep_zip: bool = False, expected_size: int | None = None,
          progress: bool = True, sha256: str | None = None) -> Path:
    """Download and unzip into `dest`/coco_captioning (default: the course data folder); return it."""
    dest = Path(dest) if dest else default_data_dir()
    folder = dest / FOLDER
    if is_complete(folder):
        return folder
    zip_path = download(url, dest / "coco_captioning.zip", sha256=sha256, expected_size=expected_size,
                        progress=progress)
    if sha256 is None:
        print(f"SHA-256 of {zip_path.name}: {file_hash(str(zip_path))} (give it as --sha256 to check later downloads)")
    extract_zip_atomic(zip_path, folder, progress=progress)
    if not keep_zip:
        zip_path.unlink()
    return folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dest", type=Path, default=None,
                   help=f"parent folder (default {default_data_dir()})")
    p.add_argument("--url", default=URL)
    p.add_argument("--expected-size", type=int, default=None, help="bytes, if known")
    p.add_argument("--sha256", default=None, help="SHA-256 the zip must have, if known")
    p.add_argument("--keep-zip", action="store_true")
    a = p.parse_args(argv)
    try:
        folder = fetch(a.dest, a.url, a.keep_zip, a.expected_size, sha256=a.sha256)
    except DownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        summary = check_folder(folder)
    except DownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"ready: {folder}\n{summary}")
    return 0


def check_folder(folder) -> str:
    """Open every file of the folder and check the arrays `starter.data` reads (a DownloadError naming the
    file if one is missing or unreadable); returns a one-line summary. (`data` never imports `starter`.)"""
    import json

    import h5py

    folder = Path(folder)
    wanted = {CAPTIONS_FILE: ["train_captions", "train_image_idxs", "val_captions", "val_image_idxs"],
              **{name: ["features"] for name in FEATURE_FILES.values()}}
    sizes = {}
    for name, keys in wanted.items():
        try:
            with h5py.File(folder / name, "r") as f:
                for key in keys:
                    sizes[f"{name}:{key}"] = f[key].shape
        except (OSError, KeyError) as exc:
            raise DownloadError(f"{folder / name}: unreadable or incomplete ({exc}); run {command(folder.parent)} "
                                "again") from None
    try:
        words = json.loads((folder / VOCAB_FILE).read_text())["idx_to_word"]
    except (OSError, ValueError, KeyError) as exc:
        raise DownloadError(f"{folder / VOCAB_FILE}: unreadable ({exc})") from None
    return (f"{sizes[CAPTIONS_FILE + ':train_captions'][0]} training and {sizes[CAPTIONS_FILE + ':val_captions'][0]} "
            f"validation captions, {len(words)} words, features {sizes[FEATURE_FILES['train'] + ':features']}")


if __name__ == "__main__":
    sys.exit(main())
