"""The kit's side of notebook 04's data pipeline: the Dataset and collate function, seeded loaders in the
training loop, the fallback to the kit's version of an unfinished piece, and clear errors on bad files."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from starter.data import DatasetError, FeatureCaptions, pad_collate
from starter.layers import ToyCaptioner
from starter.pipeline import KIT_VERSIONS, yours_or_kit
from starter.training import train


def _file(tmp_path, n=6, r=3, d=4):
    path = tmp_path / "feats.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train/features", data=np.arange(n * r * d, dtype=np.float16).reshape(n, r, d))
    return path


def _captions(m=10, t=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    caps = torch.zeros((m, t), dtype=torch.long)
    for i in range(m):
        n = int(torch.randint(1, t - 1, (1,), generator=g))
        caps[i, 0], caps[i, 1:n + 1], caps[i, n + 1] = 1, torch.randint(4, 9, (n,), generator=g), 2
    return caps


def test_dataset_items_and_collate(tmp_path):
    caps, idxs = _captions(), torch.arange(10) % 6
    data = FeatureCaptions(_file(tmp_path), "train/features", caps, idxs)
    feats, cap = data[3]
    assert feats.dtype == torch.float32 and feats.shape == (3, 4)
    assert torch.equal(feats, torch.arange(72, dtype=torch.float32).reshape(6, 3, 4)[3])
    assert cap[-1] == 2 and len(cap) == int((caps[3] == 2).nonzero()[0]) + 1
    f, c = pad_collate([data[i] for i in range(4)], null_idx=0)
    assert f.shape == (4, 3, 4) and c.shape == (4, max(len(data[i][1]) for i in range(4)))


def test_same_seed_same_batches_in_the_training_loop(tmp_path):
    """A DataLoader's generator is re-seeded by train(): two runs with one seed see the same batches and end
    with the same weights; another seed sees other batches."""
    data = FeatureCaptions(_file(tmp_path), "train/features", _captions(), torch.arange(10) % 6)
    loader = DataLoader(data, batch_size=3, shuffle=True, collate_fn=pad_collate, drop_last=True,
                        generator=torch.Generator().manual_seed(123))
    runs = []
    for seed in (0, 0, 1):
        batches = []

        def loss_fn(model, features, captions, batches=batches):
            batches.append(captions.clone())
            logits = model(features, captions[:, :-1])
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), captions[:, 1:].reshape(-1))

        torch.manual_seed(0)
        model = ToyCaptioner(9, 4, hidden=8, max_len=16)
        train(model, loss_fn, loader, steps=7, warmup=2, seed=seed, progress=False)  # 7 steps: over two epochs
        runs.append((batches, torch.cat([p.detach().reshape(-1) for p in model.parameters()])))
    (b0, w0), (b1, w1), (b2, _) = runs
    assert all(torch.equal(x, y) for x, y in zip(b0, b1)) and torch.equal(w0, w1)
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(b0, b2))


def test_unfinished_piece_falls_back_to_the_kits_version(capsys):
    def build_vocab(captions, min_count=1):
        raise NotImplementedError()

    fn = yours_or_kit("build_vocab", build_vocab)
    out = capsys.readouterr().out
    assert fn is not build_vocab and fn(["a b", "b"])[:6] == ["<NULL>", "<START>", "<END>", "<UNK>", "b", "a"]
    assert out.count("\n") == 1 and "using the kit's build_vocab" in out and "vocab/basic" in out


def test_handing_in_the_kits_version_is_refused(capsys):
    """The kit's versions exist so that an unfinished notebook still runs; an answer that calls one (looked up
    when called, as `data.common.build_vocab(...)`) is refused by its check. (The kit's versions are compared
    with the stored answers in test_references_nb04.)"""
    import data.common
    import starter.data
    import starter.metrics
    import starter.pipeline
    import starter.training

    delegates = {
        "extract_grid_features": lambda *a, **k: starter.pipeline._kit_extract(*a, **k),
        "build_vocab": lambda captions, min_count=1: data.common.build_vocab(captions, min_count),
        "encode_captions": lambda c, w, n: torch.from_numpy(data.common.encode_captions(c, w, n)).long(),
        "CaptionFeatures": type("Mine", (starter.data.FeatureCaptions,), {
            "__getitem__": lambda self, i: starter.data.FeatureCaptions.__getitem__(self, i)}),
        "collate_captions": lambda batch, null_idx=0: starter.data.pad_collate(batch, null_idx),
        "lr_at_step": lambda *a: starter.training.warmup_cosine(*a),
        "train_step": lambda *a: starter.training.default_step(*a),
        "validation_loss": lambda *a: starter.training.mean_loss(*a),
        "fit": lambda *a: starter.training.default_fit(*a),
        "evaluate_captions": lambda *a, **k: starter.metrics.evaluate_captioner(*a, **k)[:2],
    }
    assert set(delegates) == set(KIT_VERSIONS)
    for name, answer in delegates.items():
        yours_or_kit(name, answer)
        out = capsys.readouterr().out
        assert "ready-made version" in out and "using the kit's" in out, (name, out)


@pytest.mark.parametrize("problem", ["missing", "not_hdf5", "wrong_key", "too_few_images"])
def test_bad_feature_files_give_one_line_naming_the_file(tmp_path, problem):
    path = _file(tmp_path)
    key, idxs = "train/features", torch.arange(10) % 6
    if problem == "missing":
        path = tmp_path / "nothing.h5"
    elif problem == "not_hdf5":
        path.write_bytes(b"not an hdf5 file" * 10)
    elif problem == "wrong_key":
        key = "val/features"
    else:
        idxs = torch.arange(10)
    with pytest.raises(DatasetError) as err:
        FeatureCaptions(path, key, _captions(), idxs)[0]
    assert str(path) in str(err.value) and len(str(err.value).splitlines()) <= 2


def test_a_caption_without_end_is_an_error_naming_its_row(tmp_path):
    caps = _captions()
    caps[4] = 0  # an empty caption
    with pytest.raises(DatasetError, match="caption row 4 has no <END>"):
        FeatureCaptions(_file(tmp_path), "train/features", caps, torch.arange(10) % 6)


def test_bad_input_cases_fail_a_pipeline_that_does_not_check_its_input(hidden_references):
    """The bad-input cases of notebook 04 (images that are not RGB, a caption without <END>): an answer that
    computes without looking fails them with a message asking for a clear ValueError."""
    from starter import pipeline as P
    from starter.checks import CheckFailed, check

    def extract(cnn, images, size=224):  # the recipe, without the shape check
        x = torch.as_tensor(images).permute(0, 3, 1, 2).float() / 255
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
        x = (x - torch.tensor(P.IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(P.IMAGENET_STD).view(1, 3, 1, 1)
        with torch.no_grad():
            return cnn.eval()(x).flatten(2).transpose(1, 2)

    class Items(torch.utils.data.Dataset):  # the item rule, without the <END> check
        def __init__(self, path, key, captions, image_idxs):
            self.features = h5py.File(path, "r")[key]
            self.captions, self.image_idxs = captions, image_idxs

        def __len__(self):
            return len(self.captions)

        def __getitem__(self, i):
            caption = self.captions[i]
            return (torch.from_numpy(self.features[int(self.image_idxs[i])]).float(),
                    caption[: int((caption == 2).nonzero()[0]) + 1])

    check("features/basic", P.with_cnn(extract))  # the recipe itself is right
    check("dataset/basic", P.with_h5_file(Items))
    for name, answer in (("features/rgba_images", P.with_cnn(extract)),
                         ("features/grayscale_images", P.with_cnn(extract)),
                         ("dataset/caption_without_end", P.with_h5_file(Items))):
        with pytest.raises(CheckFailed, match="expected a clear ValueError") as err:
            check(name, answer)
        assert "\n" not in str(err.value)


def test_a_loop_that_returns_no_history_is_a_clear_error():
    model = ToyCaptioner(9, 4, hidden=8, max_len=16)
    loader = [(torch.randn(2, 3, 4), _captions(2))]

    def loss_fn(model, features, captions):
        return model(features, captions[:, :-1]).square().mean()

    with pytest.raises(TypeError, match="must return a dict of lists"):
        train(model, loss_fn, loader, steps=2, warmup=1, progress=False, fit_fn=lambda *a: None)


def test_readme_points_table_matches_the_notebooks():
    import json
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    table = {m.group(1): (int(m.group(2)), m.group(3)) for m in
             re.finditer(r"^\| (0\d) \| (\d+) \| (.*) \|$", (root / "README.md").read_text(), flags=re.M)}
    for path in sorted((root / "solutions").glob("0*.ipynb")):
        cells = [c["metadata"].get("nbgrader", {}) for c in json.loads(path.read_text())["cells"]]
        graded = [(m["grade_id"].removeprefix("test_"), m["points"]) for m in cells if m.get("grade") and "points" in m]
        total, text = table[path.name[:2]]
        assert total == sum(p for _, p in graded), path.name
        assert re.findall(r"(\w+) (\d+)", text) == [(g, str(p)) for g, p in graded], path.name
