"""Tests of the datasets (data/) and the dataset API (starter/data.py), on tiny generated files."""
from __future__ import annotations

import io
import json
import re
import shutil
import threading
import zipfile
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from data import coco_cs231n, coco_grid, shapes
from data.common import SPECIAL_TOKENS
from data.download import DownloadError, download, extract_zip_atomic, is_complete
from starter import build_coco_grid
from starter.data import DatasetError, Vocab, load_dataset

WORDS = ["a", "man", "dog", "riding", "on", "the", "beach", "with", "cat", "red"]


# ---------------------------------------------------------------------- CS231n-schema tiny files
def write_cs231n(folder: Path, n_train=6, n_val=4, per_image=3, T=17, urls="flickr"):
    """Tiny copies of the CS231n coco_captioning files: same keys, dtypes and special tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    itw = list(SPECIAL_TOKENS) + WORDS
    (folder / "coco2014_vocab.json").write_text(json.dumps(
        {"idx_to_word": itw, "word_to_idx": {w: i for i, w in enumerate(itw)}}))
    rng = np.random.default_rng(0)
    with h5py.File(folder / "coco2014_captions.h5", "w") as f:
        for split, n in (("train", n_train), ("val", n_val)):
            m = n * per_image
            caps = np.zeros((m, T), np.int32)
            for r in range(m):
                k = rng.integers(3, 8)
                caps[r, :k + 2] = [1, *rng.integers(4, len(itw), size=k), 2]
            f.create_dataset(f"{split}_captions", data=caps)
            f.create_dataset(f"{split}_image_idxs", data=np.repeat(np.arange(n, dtype=np.int32), per_image))
    for split, n in (("train", n_train), ("val", n_val)):
        with h5py.File(folder / f"{split}2014_vgg16_fc7_pca.h5", "w") as f:
            f.create_dataset("features", data=rng.standard_normal((n, 512)).astype(np.float32))
        if urls == "flickr":
            lines = [f"http://farm{i % 9}.staticflickr.com/1/{1000 + i}_abc_z.jpg" for i in range(n)]
        else:
            lines = [f"http://images.cocodataset.org/{split}2014/COCO_{split}2014_{100 + i:012d}.jpg"
                     for i in range(n)]
        (folder / f"{split}2014_urls.txt").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def cs231n(tmp_path):
    return write_cs231n(tmp_path / "coco_captioning")


def test_cs231n_loader(cs231n):
    ds = load_dataset(cs231n)
    assert ds.name == "coco-fc7" and ds.grid_shape == (1, 1) and ds.feature_dim == 512
    assert len(ds.vocab) == 4 + len(WORDS) and ds.vocab.end_idx == 2
    tr = ds.split("train")
    assert tr.captions.shape == (18, 17) and tr.captions.dtype == torch.int64
    assert tr.num_images == 6 and len(tr.references(2)) == 3
    with h5py.File(cs231n / "train2014_vgg16_fc7_pca.h5") as f:
        raw = f["features"][[1, 4]]
    feats = tr.features([1, 4])
    assert feats.shape == (2, 1, 512) and feats.dtype == torch.float32
    assert torch.allclose(feats[:, 0], torch.from_numpy(raw))
    caps, feats, idx = tr.sample_batch(5, generator=0)
    assert caps.shape == (5, 17) and feats.shape == (5, 1, 512) and idx.shape == (5,)
    assert "staticflickr" in tr.image_url(0)
    with pytest.raises(DatasetError, match="no image available"):
        tr.image(0)
    # the same through the name, in a data folder
    assert load_dataset("coco-fc7", data_dir=cs231n.parent).split("val").num_images == 4
    lazy = load_dataset(cs231n, preload=False).split("train")
    assert torch.equal(lazy.features([4, 1, 4]), load_dataset(cs231n).split("train").features([4, 1, 4]))


def test_cs231n_coco_urls_give_coco_ids(tmp_path):
    ds = load_dataset(write_cs231n(tmp_path / "coco_captioning", urls="coco"))
    assert ds.split("val").image_url(3) == \
        "http://images.cocodataset.org/val2014/COCO_val2014_000000000103.jpg"


# ---------------------------------------------------------------------------------- bad input
def test_missing_dataset_names_file_and_command(tmp_path, cs231n):
    with pytest.raises(DatasetError, match=r"coco2014_captions\.h5[\s\S]*python -m data\.coco_cs231n --dest"):
        load_dataset("coco-fc7", data_dir=tmp_path / "empty")
    (cs231n / "coco2014_vocab.json").unlink()
    with pytest.raises(DatasetError, match=r"coco2014_vocab\.json[\s\S]*python -m data\.coco_cs231n"):
        load_dataset(cs231n)
    with pytest.raises(DatasetError, match=r"coco_grid\.h5[\s\S]*python -m starter\.build_coco_grid"):
        load_dataset("coco-grid", data_dir=tmp_path)
    with pytest.raises(DatasetError, match=r"shapes_v1\.h5[\s\S]*python -m data\.shapes --out"):
        load_dataset("shapes", data_dir=tmp_path, build=False)
    with pytest.raises(DatasetError, match="unknown dataset"):
        load_dataset("cifar")


def test_truncated_hdf5(cs231n):
    p = cs231n / "val2014_vgg16_fc7_pca.h5"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="val2014_vgg16_fc7_pca.h5"):
        load_dataset(cs231n)


def _rewrite(path, key, value):
    with h5py.File(path, "a") as f:
        del f[key]
        if value is not None:
            f.create_dataset(key, data=value)


@pytest.mark.parametrize("case, pattern", [
    ("wrong_key", "missing key 'features'"),
    ("wrong_dtype", "dtype"),
    ("wrong_shape", r"\(M, T\)"),
    ("vocab_mismatch", "vocabulary does not match"),
    ("bad_image_idx", "image_idxs reach"),
    ("vocab_json", "word_to_idx does not match"),
])
def test_bad_cs231n_files(cs231n, case, pattern):
    caps = cs231n / "coco2014_captions.h5"
    feats = cs231n / "train2014_vgg16_fc7_pca.h5"
    if case == "wrong_key":
        with h5py.File(feats, "a") as f:
            f.move("features", "feats")
    elif case == "wrong_dtype":
        _rewrite(feats, "features", np.zeros((6, 512), np.int64))
    elif case == "wrong_shape":
        _rewrite(caps, "train_captions", np.ones(18, np.int32))
    elif case == "vocab_mismatch":
        with h5py.File(caps, "a") as f:
            f["train_captions"][0, 3] = 99
    elif case == "bad_image_idx":
        with h5py.File(caps, "a") as f:
            f["train_image_idxs"][0] = 6
    elif case == "vocab_json":
        v = json.loads((cs231n / "coco2014_vocab.json").read_text())
        v["word_to_idx"]["man"] = 7
        (cs231n / "coco2014_vocab.json").write_text(json.dumps(v))
    with pytest.raises(DatasetError, match=pattern):
        load_dataset(cs231n)


# ------------------------------------------------------------------------------ download logic
class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        srv = self.server
        srv.ranges.append(self.headers.get("Range"))
        data, start = srv.payload, 0
        rng = self.headers.get("Range")
        if rng and srv.support_range:
            start = int(re.match(r"bytes=(\d+)-", rng).group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if srv.cut is not None:  # drop the connection after `cut` bytes, once
            self.wfile.write(body[: srv.cut])
            srv.cut = None
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.payload, srv.cut, srv.support_range, srv.ranges = b"", None, True, []
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}/coco_captioning.zip"
    yield srv
    srv.shutdown()
    srv.server_close()


def test_download_resumes_after_truncation(server, tmp_path):
    server.payload = bytes(np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8))
    server.cut = 100_000
    dest = tmp_path / "f.zip"
    with pytest.raises(DownloadError, match="resume"):
        download(server.url, dest, chunk_size=8192, progress=False)
    assert not dest.exists()  # a partial download never gets the final name
    part = tmp_path / "f.zip.part"
    have = part.stat().st_size
    assert 0 < have < len(server.payload)
    download(server.url, dest, chunk_size=8192, progress=False)
    assert dest.read_bytes() == server.payload and not part.exists()
    assert server.ranges[-1] == f"bytes={have}-"  # resumed, not restarted
    # a finished file is reused without asking the server again
    n = len(server.ranges)
    download(server.url, dest, progress=False)
    assert len(server.ranges) == n


def test_download_without_range_support_and_size_check(server, tmp_path):
    server.payload = b"x" * 50_000
    server.support_range = False
    (tmp_path / "g.zip.part").write_bytes(b"garbage")
    download(server.url, tmp_path / "g.zip", progress=False)
    assert (tmp_path / "g.zip").read_bytes() == server.payload
    with pytest.raises(DownloadError, match="expected 123"):
        download(server.url, tmp_path / "h.zip", expected_size=123, progress=False)
    assert not (tmp_path / "h.zip").exists()


def test_download_file_url(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"abc" * 1000)
    out = download(src.as_uri(), tmp_path / "out" / "dst.bin", progress=False)
    assert out.read_bytes() == src.read_bytes()


def test_download_keeps_only_the_file_with_the_known_hash(server, tmp_path):
    """pooch checks the SHA-256: a wrong one removes the bytes and names both hashes; a right one after a
    resumed download passes; a finished file whose hash matches is reused without the network."""
    import hashlib

    server.payload = bytes(np.random.default_rng(1).integers(0, 256, 200_000, dtype=np.uint8))
    good = hashlib.sha256(server.payload).hexdigest()
    dest = tmp_path / "f.zip"
    with pytest.raises(DownloadError, match=f"corrupt or not the published file.*{good}"):
        download(server.url, dest, sha256="0" * 64, progress=False)
    assert not dest.exists() and not (tmp_path / "f.zip.part").exists() and list(tmp_path.iterdir()) == []
    server.cut = 50_000
    with pytest.raises(DownloadError, match="resume"):
        download(server.url, dest, sha256=good, chunk_size=8192, progress=False)
    download(server.url, dest, sha256=good, chunk_size=8192, progress=False)
    assert dest.read_bytes() == server.payload and server.ranges[-1].startswith("bytes=")
    n = len(server.ranges)
    download(server.url, dest, sha256=good, progress=False)
    assert len(server.ranges) == n
    dest.write_bytes(b"tampered")  # a file that is not the published one is fetched again
    download(server.url, dest, sha256=good, progress=False)
    assert dest.read_bytes() == server.payload and len(server.ranges) == n + 1


def test_coco_zips_are_fetched_with_their_published_hashes(server, tmp_path, monkeypatch):
    """download_coco hands each zip's size and SHA-256 to the download; a zip that is not the published
    one stops the build with an error naming it, and nothing is unzipped."""
    import hashlib

    for name, (url, size, sha256) in coco_grid.COCO_ZIPS.items():
        assert url.endswith(f"{'annotations_trainval2014' if name == 'annotations' else name}.zip")
        assert size > 0 and re.fullmatch(r"[0-9a-f]{64}", sha256), name
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("annotations/captions_val2014.json", "{}")
    server.payload = buf.getvalue()
    right = (server.url, len(server.payload), hashlib.sha256(server.payload).hexdigest())
    monkeypatch.setattr(coco_grid, "COCO_ZIPS", {"annotations": right})
    coco_grid.download_coco(tmp_path / "coco", splits=(), progress=False)
    assert (tmp_path / "coco" / "annotations" / "captions_val2014.json").is_file()
    monkeypatch.setattr(coco_grid, "COCO_ZIPS", {"annotations": right, "val2014": (*right[:2], "1" * 64)})
    with pytest.raises(DownloadError, match="coco_captioning.zip is corrupt"):
        coco_grid.download_coco(tmp_path / "coco", splits=("val2014",), progress=False)
    assert not (tmp_path / "coco" / "val2014").exists()


def _zip_folder(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p in sorted(folder.rglob("*")):
            z.write(p, Path(folder.name) / p.relative_to(folder))
    return buf.getvalue()


def test_extract_is_atomic_and_rejects_bad_zip(tmp_path, cs231n):
    payload = _zip_folder(cs231n)
    bad = tmp_path / "bad.zip"
    bad.write_bytes(payload[: len(payload) // 2])
    dest = tmp_path / "out" / "coco_captioning"
    with pytest.raises(DownloadError, match="bad.zip"):
        extract_zip_atomic(bad, dest, progress=False)
    assert not dest.exists() and not any((tmp_path / "out").glob(".*tmp*"))
    # a partial folder left by someone else is not trusted
    dest.mkdir(parents=True)
    (dest / "coco2014_vocab.json").write_text("{}")
    good = tmp_path / "good.zip"
    good.write_bytes(payload)
    extract_zip_atomic(good, dest, progress=False)
    assert is_complete(dest) and (dest / "coco2014_captions.h5").is_file()
    assert list((tmp_path / "out").glob("coco_captioning.incomplete-*"))


def test_fetch_cs231n_end_to_end(server, tmp_path, cs231n, capsys):
    import hashlib

    server.payload = _zip_folder(cs231n)
    server.cut = len(server.payload) // 3
    dest = tmp_path / "dl"
    with pytest.raises(DownloadError):
        coco_cs231n.fetch(dest, url=server.url, progress=False)
    assert not (dest / "coco_captioning").exists()
    with pytest.raises(DatasetError, match="python -m data.coco_cs231n"):
        load_dataset("coco-fc7", data_dir=dest)
    folder = coco_cs231n.fetch(dest, url=server.url, progress=False)
    assert not (dest / "coco_captioning.zip").exists()
    # no published hash: the download prints its own, and a later download can be held to it
    assert f"SHA-256 of coco_captioning.zip: {hashlib.sha256(server.payload).hexdigest()}" in capsys.readouterr().out
    assert load_dataset("coco-fc7", data_dir=dest).split("train").num_images == 6
    assert coco_cs231n.main(["--dest", str(dest), "--url", server.url]) == 0
    assert folder == dest / "coco_captioning"


def test_downloaded_folder_check_names_a_damaged_file(cs231n):
    folder = cs231n
    with h5py.File(folder / coco_cs231n.CAPTIONS_FILE, "r") as f:
        counts = (len(f["train_captions"]), len(f["val_captions"]))
    assert coco_cs231n.check_folder(folder).startswith(f"{counts[0]} training and {counts[1]} validation captions")
    (folder / coco_cs231n.FEATURE_FILES["val"]).write_bytes(b"truncated")
    with pytest.raises(DownloadError, match="val2014_vgg16_fc7_pca.h5: unreadable"):
        coco_cs231n.check_folder(folder)


def _starter_imports(nodes) -> list[str]:
    import ast
    found = []
    for node in nodes:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [n for n in names if n == "starter" or n.startswith("starter.")]
    return found


def test_the_data_package_never_imports_the_kit():
    """`starter` reads what `data` builds; `data` never imports it, not even inside a function: the COCO
    builder takes notebook 04's pieces as arguments, and the command that reads them from the notebook is the
    kit's (`starter.build_coco_grid`)."""
    import ast
    inside_functions = {}
    for path in sorted((Path(__file__).resolve().parent.parent / "data").glob("*.py")):
        tree = ast.parse(path.read_text())
        assert not _starter_imports(tree.body), f"{path.name} imports the kit when loaded"
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and _starter_imports(ast.walk(node)):
                inside_functions[f"{path.stem}.{node.name}"] = sorted(set(_starter_imports(ast.walk(node))))
    assert inside_functions == {}


# ---------------------------------------------------------------------------- COCO grid builder
def _coco_split(root: Path, split: str, ids, rng):
    img_dir = root / f"{split}2014"
    img_dir.mkdir(parents=True)
    images, anns = [], []
    for k, i in enumerate(ids):
        name = f"COCO_{split}2014_{i:012d}.jpg"
        arr = rng.integers(0, 256, (48 + 8 * k, 64, 3), dtype=np.uint8)
        Image.fromarray(arr).save(img_dir / name, quality=90)
        images.append({"id": i, "file_name": name, "height": arr.shape[0], "width": arr.shape[1]})
        for j, cap in enumerate(["A dog on the beach.", "A red dog riding a cat", f"the MAN with a zebra{i}"]):
            anns.append({"id": 10 * i + j, "image_id": i, "caption": cap})
    images.append({"id": 999, "file_name": "no_captions.jpg"})  # skipped: no captions
    ann = root / f"captions_{split}2014.json"
    ann.write_text(json.dumps({"images": images, "annotations": anns}))
    return ann, img_dir


@pytest.fixture
def coco_raw(tmp_path):
    rng = np.random.default_rng(0)
    tr = _coco_split(tmp_path / "coco", "train", [42, 7, 300, 5, 77], rng)
    va = _coco_split(tmp_path / "coco", "val", [9, 8], rng)
    return tr, va


def _solution_04():
    from grading import notebooks
    return notebooks.captioning_solution()


def _grid_build(out, coco_raw, **kw):
    (ta, ti), (va, vi) = coco_raw
    ns = _solution_04()
    torch.manual_seed(0)  # weights=None: random init, seeded for comparable runs
    return coco_grid.build(out, ta, ti, va, vi, build_vocab=ns["build_vocab"],
                           encode_captions=ns["encode_captions"], arch="resnet18", weights=None,
                           image_size=64, min_count=2, batch_size=2, num_workers=0, progress=False, **kw)


def test_grid_builder(tmp_path, coco_raw):
    out = _grid_build(tmp_path / "grid.h5", coco_raw)
    ds = load_dataset(out)
    assert ds.name == "coco-grid" and ds.grid_shape == (2, 2) and ds.feature_dim == 512
    tr = ds.split("train")
    assert tr.num_images == 5 and len(tr) == 15 and list(tr.image_ids) == [5, 7, 42, 77, 300]
    with h5py.File(out) as f:
        assert f["train/features"].dtype == np.float16 and f["train/features"].chunks == (1, 4, 512)
    # words seen at least min_count=2 times in training captions; "zebra<id>" occur once
    assert set(ds.vocab.idx_to_word[4:]) == set("a dog on the beach red riding cat man with".split())
    assert tr.references(0)[0] == "a dog on the beach"
    assert tr.references(0)[2] == "the man with a <UNK>"
    assert tr.image_url(2) == "http://images.cocodataset.org/train2014/COCO_train2014_000000000042.jpg"
    assert tr.image(2).shape == (48, 64, 3)  # the original file, read locally
    assert ds.split("val").features([0, 1]).shape == (2, 4, 512)
    assert not list(tmp_path.glob(".*partial*"))


def _grid_command(coco_raw, out, notebook):
    (ta, ti), (va, vi) = coco_raw
    torch.manual_seed(0)
    return build_coco_grid.main(["--train-annotations", str(ta), "--train-images", str(ti), "--val-annotations",
                           str(va), "--val-images", str(vi), "--out", str(out), "--arch", "resnet18",
                           "--weights", "none", "--image-size", "64", "--min-count", "2", "--num-workers", "0",
                           "--notebook", str(notebook)])


def test_grid_command_uses_the_notebooks_vocabulary_and_encoding(tmp_path, coco_raw, capsys):
    """The command reads build_vocab and encode_captions from a notebook 04: the solution's build the file;
    the student copy's unfinished ones stop it, saying so, before anything is written."""
    from grading import notebooks
    out = tmp_path / "grid.h5"
    assert _grid_command(coco_raw, out, notebooks.RELEASE / "04_captioning_data.ipynb") == 1
    err = capsys.readouterr().err
    assert not out.exists() and "not all of them pass their checks yet" in err
    assert _grid_command(coco_raw, out, notebooks.SOLUTIONS / "04_captioning_data.ipynb") == 0
    by_build = _grid_build(tmp_path / "by_build.h5", coco_raw)
    a, b = load_dataset(out), load_dataset(by_build)
    assert a.vocab.idx_to_word == b.vocab.idx_to_word
    with h5py.File(out) as f, h5py.File(by_build) as g:
        assert f["train/captions"].dtype == np.int32 and np.array_equal(f["train/captions"][()], g["train/captions"][()])


def test_grid_builder_rejects_pieces_that_return_the_wrong_thing(tmp_path, coco_raw):
    (ta, ti), (va, vi) = coco_raw
    ns = _solution_04()
    kw = dict(arch="resnet18", weights=None, image_size=64, num_workers=0, progress=False)
    with pytest.raises(coco_grid.BuildError, match="build_vocab must return"):
        coco_grid.build(tmp_path / "a.h5", ta, ti, va, vi, build_vocab=lambda c, m: ["a", "dog"],
                        encode_captions=ns["encode_captions"], **kw)
    with pytest.raises(coco_grid.BuildError, match=r"encode_captions must return an \(15, 18\)"):
        coco_grid.build(tmp_path / "b.h5", ta, ti, va, vi, build_vocab=ns["build_vocab"],
                        encode_captions=lambda c, w, n: [[1, 2]], **kw)
    assert not list(tmp_path.glob("*a.h5*")) and not list(tmp_path.glob("*b.h5*"))  # nothing written


def test_grid_builder_resumes_and_rejects_bad_input(tmp_path, coco_raw):
    (ta, ti), (va, vi) = coco_raw
    victim = ti / "COCO_train2014_000000000300.jpg"  # 5th by id: fails in the 3rd batch of 2
    good = victim.read_bytes()
    victim.write_bytes(b"not a jpeg")
    out = tmp_path / "grid.h5"
    with pytest.raises(coco_grid.BuildError, match="COCO_train2014_000000000300"):
        _grid_build(out, coco_raw)
    assert not out.exists()
    partial = tmp_path / ".grid.h5.partial"
    with h5py.File(partial) as f:
        assert list(f["train/done"][()]) == [1, 1, 1, 1, 0]
    victim.write_bytes(good)
    _grid_build(out, coco_raw)
    assert not partial.exists()
    fresh = _grid_build(tmp_path / "fresh.h5", coco_raw)
    a, b = load_dataset(out).split("train"), load_dataset(fresh).split("train")
    assert torch.equal(a.features(range(5)), b.features(range(5)))
    # bad input fails before anything is written
    victim.unlink()
    with pytest.raises(coco_grid.BuildError, match="missing"):
        _grid_build(tmp_path / "x.h5", coco_raw)
    ta.write_text("{not json")
    with pytest.raises(coco_grid.BuildError, match="not a COCO caption annotation"):
        _grid_build(tmp_path / "y.h5", coco_raw)
    assert not list(tmp_path.glob("*x.h5*")) and not list(tmp_path.glob("*y.h5*"))


# --------------------------------------------------------------------------- shapes dataset
TINY = dict(num_train=24, num_val=8, seed=3)


@pytest.fixture(scope="module")
def tiny_shapes(tmp_path_factory):
    return shapes.build(tmp_path_factory.mktemp("shapes") / "shapes_v1.h5", progress=False, **TINY)


def _all_arrays(path):
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
        out["attrs"] = dict(f.attrs)
    return out


def test_shapes_deterministic(tiny_shapes, tmp_path):
    again = shapes.build(tmp_path / "again.h5", progress=False, **TINY)
    a, b = _all_arrays(tiny_shapes), _all_arrays(again)
    assert a.keys() == b.keys()
    for k in a:
        if k == "attrs":
            assert {x: str(y) for x, y in a[k].items()} == {x: str(y) for x, y in b[k].items()}
        else:
            assert np.array_equal(a[k], b[k]), k
    other = shapes.generate_scenes(TINY["num_train"], TINY["num_val"], seed=4)
    assert other != shapes.generate_scenes(TINY["num_train"], TINY["num_val"], seed=3)


def test_shapes_content(tiny_shapes):
    ds = load_dataset(tiny_shapes)
    assert ds.name == "shapes" and ds.grid_shape == (7, 7) and ds.feature_dim == 64
    assert len(ds.vocab) < 40 and ds.max_length <= 16
    tr, va = ds.split("train"), ds.split("val")
    assert tr.num_images == 24 and len(tr) == 72 and va.num_images == 8
    assert tr.features([0]).shape == (1, 49, 64)
    with h5py.File(tiny_shapes) as f:
        sig_tr = set(f["train/signatures"].asstr()[()])
        sig_va = set(f["val/signatures"].asstr()[()])
    assert not sig_tr & sig_va  # val scenes are combinations never seen in training
    for split in (tr, va):
        for i in range(split.num_images):
            img = split.image(i)
            assert img.shape == (112, 112, 3) and img.dtype == np.uint8
            objs = split.objects(i)
            refs = split.references(i)
            assert len(refs) == 3 and 1 <= len(objs) <= 2
            for o in objs:
                x0, y0, x1, y1 = o["bbox"]
                k = 224 / 112 / 32  # thumbnail px -> grid cells
                assert o["cell"] == int((y0 + y1) / 2 * k) * 7 + int((x0 + x1) / 2 * k)
                assert o["cell"] // 7 in (1, 3, 5) and o["cell"] % 7 in (1, 3, 5)
                # the object is drawn: the thumbnail at its centre has the object's colour
                cy, cx = int((y0 + y1) / 2), int((x0 + x1) / 2)
                assert np.abs(img[cy, cx].astype(int) - shapes.COLOURS[o["colour"]]).max() < 40
                words = f"{o['size']} {o['colour']} {o['shape']}"
                assert all(words in r for r in refs)
            if len(objs) == 2:
                a, b = objs
                rel = "to the left of" if a["cell"] // 7 == b["cell"] // 7 else "above"
                assert refs[0] == f"a {a['size']} {a['colour']} {a['shape']} {rel} a {b['size']} {b['colour']} {b['shape']}"


def test_shapes_vocabulary_and_captions_are_what_notebook_04_makes_of_them(tiny_shapes):
    """The builder stores a written-out vocabulary and its own encoding (no word counting of its own,
    which would be notebook 04's build_vocab under another name): both equal what the solution's
    build_vocab and encode_captions make of the default build's captions and of this file's."""
    ns = _solution_04()
    scenes = shapes.generate_scenes(shapes.DEFAULTS["num_train"], shapes.DEFAULTS["num_val"],
                                    shapes.DEFAULTS["seed"])
    captions = [c for split in scenes.values() for o, r, _, _ in split for c in shapes.captions_for(o, r)]
    assert list(shapes.VOCABULARY) == ns["build_vocab"](captions, min_count=1)
    ds = load_dataset(tiny_shapes)
    assert ds.vocab.idx_to_word == list(shapes.VOCABULARY)
    index = {w: i for i, w in enumerate(shapes.VOCABULARY)}
    tiny = shapes.generate_scenes(TINY["num_train"], TINY["num_val"], TINY["seed"])
    with h5py.File(tiny_shapes) as f:
        for split in ("train", "val"):
            texts = [c for o, r, _, _ in tiny[split] for c in shapes.captions_for(o, r)]
            expected = ns["encode_captions"](texts, index, shapes.MAX_LEN).numpy()
            assert np.array_equal(f[f"{split}/captions"][()], expected), split
    with pytest.raises(KeyError):
        shapes.caption_indices(["a small pink circle"])


def test_shapes_build_failure_leaves_nothing(tmp_path, monkeypatch):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(shapes, "_backbone", broken)
    with pytest.raises(RuntimeError):
        shapes.build(tmp_path / "s.h5", progress=False, **TINY)
    assert list(tmp_path.iterdir()) == []


def test_load_shapes_builds_on_first_use(tmp_path, monkeypatch, tiny_shapes):
    calls = []

    def fake_build(path):
        calls.append(path)
        shutil.copy(tiny_shapes, path)

    monkeypatch.setattr(shapes, "build", fake_build)
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    assert load_dataset("shapes").split("train").num_images == 24
    assert load_dataset("shapes").name == "shapes" and calls == [tmp_path / "shapes_v1.h5"]


def test_corrupt_shapes_file_is_an_error(tmp_path, tiny_shapes):
    p = tmp_path / "shapes_v1.h5"
    p.write_bytes(tiny_shapes.read_bytes()[:5000])
    with pytest.raises(DatasetError, match="shapes_v1.h5"):
        load_dataset("shapes", data_dir=tmp_path)
    shutil.copy(tiny_shapes, p)
    with h5py.File(p, "a") as f:
        del f["vocab"]
        f.create_dataset("vocab", data=np.array(list(SPECIAL_TOKENS) + ["a"], dtype=object),
                         dtype=h5py.string_dtype())
    with pytest.raises(DatasetError, match="vocabulary does not match"):
        load_dataset(p)
    shutil.copy(tiny_shapes, p)
    with h5py.File(p, "a") as f:
        del f["val/features"]
        f.create_dataset("val/features", data=np.zeros((8, 49, 32), np.float16))
    with pytest.raises(DatasetError, match=r"val/features has shape \(8, 49, 32\)"):
        load_dataset(p)


# --------------------------------------------------------------------------------------- API
def test_vocab_decode():
    """Vocab decodes only: encoding captions is notebook 04's encode_captions."""
    v = Vocab(list(SPECIAL_TOKENS) + ["a", "red", "circle"])
    assert (v.null_idx, v.start_idx, v.end_idx, v.unk_idx) == (0, 1, 2, 3) and len(v) == 7
    assert not hasattr(v, "encode") and v.word_to_idx["circle"] == 6
    assert v.decode([1, 4, 5, 6, 2, 5, 0]) == "a red circle"
    assert v.decode(torch.tensor([1, 0, 4, 2])) == "a"
    assert v.decode(np.array([[1, 4, 2, 0], [1, 5, 6, 2]])) == ["a", "red circle"]
    assert v.decode(torch.tensor([[4, 5, 6]])) == ["a red circle"]
    with pytest.raises(ValueError):
        Vocab(["a", "b", "c", "d"])


def test_sampling_without_replacement_and_epochs(tiny_shapes):
    tr = load_dataset(tiny_shapes).split("train")

    def key(caps, idx):
        return [(int(i), tuple(c.tolist())) for c, i in zip(caps, idx)]

    everything = Counter(key(tr.captions, tr.image_idxs))
    assert max(everything.values()) == 1
    seen = []
    for _ in range(len(tr) // 8):  # one epoch of 72 captions in batches of 8
        caps, feats, idx = tr.sample_batch(8, generator=5)
        assert caps.dtype == torch.int64 and feats.shape == (8, 49, 64) and feats.dtype == torch.float32
        assert torch.equal(feats, tr.features(idx))
        seen += key(caps, idx)
    assert Counter(seen) == everything
    # the same seed gives the same stream; a torch.Generator works too
    a = load_dataset(tiny_shapes).split("train").sample_batch(16, generator=1)
    b = load_dataset(tiny_shapes).split("train").sample_batch(16, generator=1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    g = torch.Generator().manual_seed(0)
    rows = [key(*tr.sample_batch(10, generator=g)[::2]) for _ in range(7)]
    assert len(set(sum(rows, []))) == 70
    with pytest.raises(ValueError):
        tr.sample_batch(1000)


def test_iter_batches_covers_each_caption_once(tiny_shapes):
    ds = load_dataset(tiny_shapes, preload=False)
    va = ds.split("val")
    got = []
    for caps, feats, idx in va.iter_batches(5, shuffle=True, seed=1, device="cpu"):
        assert feats.shape[1:] == (49, 64) and caps.shape[1] == ds.max_length
        got += [(int(i), tuple(c.tolist())) for c, i in zip(caps, idx)]
    assert len(got) == len(va) == 24
    assert Counter(got) == Counter((int(i), tuple(c.tolist())) for c, i in zip(va.captions, va.image_idxs))
    assert sum(1 for _ in va.iter_batches(5, drop_last=True)) == va.num_batches(5, drop_last=True) == 4
    first = next(va.iter_batches(6, shuffle=False))[0]
    assert torch.equal(first, va.captions[:6])


def test_sample_batch_follows_the_generator_it_is_given(tiny_shapes):
    """An int seed or a torch.Generator object each have their own stream: switching to another and back
    to a seed restarts that seed's stream, and a second Generator (even one in the same state as the
    first) does not continue the first one's permutation."""
    tr = load_dataset(tiny_shapes).split("train")
    first = tr.sample_batch(8, generator=3)[0]
    tr.sample_batch(8, generator=4)
    assert torch.equal(tr.sample_batch(8, generator=3)[0], first)
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    a = tr.sample_batch(8, generator=g1)[0]
    b = tr.sample_batch(8, generator=g1)[0]  # the same generator: the next batch of its permutation
    c = tr.sample_batch(8, generator=g2)[0]  # another generator: its own permutation, from the start
    assert not torch.equal(a, b) and torch.equal(a, c)


def test_head_keeps_images_and_reads_only_its_rows(tiny_shapes):
    for preload in (True, False):
        tr = load_dataset(tiny_shapes, preload=preload).split("train")
        part = tr.head(3)
        assert part.num_images == 3 and set(part.image_idxs.tolist()) == {0, 1, 2}
        assert len(part) == int((tr.image_idxs < 3).sum())
        assert torch.equal(part.features([2, 0]), tr.features([2, 0]))
        assert np.array_equal(part.image(1), tr.image(1)) and part.objects(1) == tr.objects(1)
        assert part.features_file == tr.features_file
        with pytest.raises(IndexError, match=r"\[0, 3\)"):
            part.features([3])


def test_grid_builder_command_line(tmp_path, coco_raw, capsys):
    (ta, ti), (va, vi) = coco_raw
    out = tmp_path / "cli.h5"
    args = ["--train-annotations", str(ta), "--train-images", str(ti), "--val-annotations", str(va),
            "--val-images", str(vi), "--out", str(out), "--max-images", "3", "--arch", "resnet18",
            "--weights", "none", "--image-size", "32", "--min-count", "1", "--num-workers", "0",
            "--notebook", str(Path(__file__).resolve().parent.parent / "solutions" / "04_captioning_data.ipynb")]
    assert build_coco_grid.main(args) == 0
    ds = load_dataset(out)
    assert ds.split("train").num_images == 3 and ds.split("val").num_images == 1  # max-images / 4
    assert ds.grid_shape == (1, 1) and "zebra5" in ds.vocab.word_to_idx
    assert "wrote" in capsys.readouterr().out


def test_unseen_images_are_drawn_like_the_validation_split(tiny_shapes):
    """The images of the trained-model cases (data.shapes.unseen_images) follow the validation split's recipe:
    on that split's own random stream they are that split, features and captions; on another, new scenes."""
    features, captions = shapes.unseen_images(tiny_shapes, TINY["num_val"], stream=-98)  # [seed, 2]: val's stream
    with h5py.File(tiny_shapes) as f:
        stored, vocab = f["val/features"][()], [w.decode() for w in f["vocab"][()]]
        encoded = f["val/captions"][()]
    np.testing.assert_allclose(features.astype(np.float32), stored.astype(np.float32), atol=2e-3)
    assert [" ".join(vocab[i] for i in row if i > 3) for row in encoded] == [c for cs in captions for c in cs]
    other, _ = shapes.unseen_images(tiny_shapes, TINY["num_val"], stream=1)
    assert other.shape == stored.shape and not np.allclose(other.astype(np.float32), stored.astype(np.float32))


def _default_shapes() -> Path:
    path = shapes.default_path()
    if not path.exists():
        shapes.build(path, progress=False)
    return path


def test_the_hidden_scenes_stream_is_nowhere_student_code_can_read():
    """The trained-model cases' hidden scenes come from a random stream that only grading/ holds: student code
    can call unseen_images, so a stream it can find (in starter/ or data/, both mounted in the sandbox and
    published, dataset and references included) would give it the hidden scenes and their captions."""
    from grading.cases.captioning.training import HIDDEN_STREAM, PUBLIC_STREAM

    assert HIDDEN_STREAM.bit_length() > 100 and HIDDEN_STREAM != PUBLIC_STREAM, "too small to be kept from a search"
    stream = HIDDEN_STREAM + 100  # what unseen_images seeds with
    forms = [str(n).encode() for n in (HIDDEN_STREAM, stream)] + [f"{n:x}".encode() for n in (HIDDEN_STREAM, stream)]
    forms += [n.to_bytes(17, order).rstrip(b"\0") if order == "little" else n.to_bytes(17, order).lstrip(b"\0")
              for n in (HIDDEN_STREAM, stream) for order in ("little", "big")]
    root = Path(__file__).resolve().parent.parent
    _default_shapes()  # the dataset is under data/cache unless $COURSE_DATA_DIR says otherwise: read it too
    files = [p for folder in (root / "starter", root / "data", shapes.default_path().parent) for p in folder.rglob("*")
             if p.is_file()]
    assert any(p.suffix == ".h5" for p in files) and any(p.name == "shapes.py" for p in files)
    found = [(str(p), form) for p in files for form in forms if form.lower() in p.read_bytes().lower()]
    assert not found, found


def test_the_trained_model_cases_are_the_scenes_of_their_streams():
    """The public case's scenes are still unseen_images' stream 1 (what students can draw), the hidden cases'
    come from the grader's own stream, and none of them from the stream the hidden cases once used (2)."""
    from grading import notebooks
    from grading.cases.captioning.training import HIDDEN_STREAM, PUBLIC_STREAM
    from starter.checks import load_case

    path = _default_shapes()
    with h5py.File(path) as f:
        vocab = Vocab([w.decode() for w in f["vocab"][()]])
    dirs = [notebooks.PUBLIC_REFERENCES, notebooks.HIDDEN_REFERENCES]
    for name, stream in (("trained/new_scenes", PUBLIC_STREAM), ("trained/hidden_scenes_40", HIDDEN_STREAM)):
        case = load_case(name, dirs=dirs)
        features, captions = shapes.unseen_images(path, len(case.inputs["features"]), stream)
        np.testing.assert_allclose(features.astype(np.float32), case.inputs["features"].astype(np.float32), atol=2e-3,
                                   rtol=2e-3, err_msg=name)  # a float16 step: CPUs round the CNN differently
        assert [vocab.decode(refs) for refs in case.expected["captions"]] == captions, name
    hidden = load_case("trained/hidden_scenes_65", dirs=dirs).inputs["features"]
    for stream in (1, 2):
        old, _ = shapes.unseen_images(path, len(hidden), stream)
        assert not np.allclose(old.astype(np.float32), hidden.astype(np.float32)), stream
