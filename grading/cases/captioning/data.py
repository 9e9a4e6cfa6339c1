"""Cases of notebook 04's data pipeline: `extract_grid_features`, `build_vocab`, `encode_captions`, the `Dataset` and
the `collate` function, with their known bugs."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import h5py
import torch
import torch.nn.functional as F

from grading.cases.captioning.common import SPECIALS, _captions, _variants, _words
from grading.references import CaseSpec, Row, randn
from starter.pipeline import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    with_cnn,
    with_h5_file,
    with_items,
    with_long_output,
    with_probe_words,
)


def _vocab_bug(kind):
    def build(captions, min_count=1):
        seen = [w for c in captions for w in _words(c, kind)]
        counts = Counter(seen)
        keep = (lambda n: n > min_count) if kind == "strictly_more" else (
            (lambda n: True) if kind == "min_count_ignored" else (lambda n: n >= min_count))
        words = [w for w, n in counts.items() if keep(n)]  # Counter keeps first-seen order
        if kind == "first_seen_order":
            ordered = words
        elif kind == "alphabetical":
            ordered = sorted(words)
        elif kind == "ties_first_seen":
            ordered = sorted(words, key=lambda w: -counts[w])  # stable: ties in first-seen order
        elif kind == "least_frequent_first":
            ordered = sorted(words, key=lambda w: (counts[w], w))
        else:
            ordered = sorted(words, key=lambda w: (-counts[w], w))
        if kind == "no_specials":
            return ordered
        if kind == "specials_last":
            return ordered + SPECIALS
        return SPECIALS + ordered
    return build


VOCAB_BUGS = {
    "no_specials": "the special tokens are missing: the list starts with <NULL>, <START>, <END>, <UNK> (indices 0-3).",
    "specials_last": "the special tokens must come first (indices 0-3), before the words.",
    "strictly_more": "words seen exactly min_count times are missing: keep a word seen AT LEAST min_count times (>=).",
    "min_count_ignored": "rare words are kept: drop the words seen fewer than min_count times.",
    "first_seen_order": "words are in the order they first appear: sort them, most frequent first.",
    "alphabetical": "words are in alphabetical order: sort by count first (most frequent first), alphabetically only "
                    "among words with the same count.",
    "ties_first_seen": "words with the same count are in first-seen order: break ties alphabetically "
                       "(key=lambda w: (-counts[w], w)).",
    "least_frequent_first": "the least frequent words come first: sort by decreasing count.",
    "no_lowercase": "words are not lower-cased ('Red' and 'red' are counted apart): tokenise with tokenize().",
    "split_on_spaces": "punctuation stays attached to words ('circle,' is not 'circle'): tokenise with tokenize().",
}


def _encode_bug(kind):
    def encode(captions, word_to_idx, max_len):
        out = torch.zeros((len(captions), max_len), dtype=torch.long)
        for i, c in enumerate(captions):
            words = _words(c, "split_on_spaces" if kind == "split_on_spaces" else None)
            if kind == "unknown_dropped":
                ids = [word_to_idx[w] for w in words if w in word_to_idx]
            else:
                ids = [word_to_idx.get(w, 0 if kind == "unknown_as_null" else 3) for w in words]
            if kind == "end_cut":
                row = ([1] + ids + [2])[:max_len]
            elif kind == "one_word_short":
                row = [1] + ids[: max_len - 3] + [2]
            elif kind == "no_start":
                row = ids[: max_len - 1] + [2]
            elif kind == "no_end":
                row = [1] + ids[: max_len - 1]
            else:
                row = [1] + ids[: max_len - 2] + [2]
            out[i, : len(row)] = torch.tensor(row)
        return out
    return encode


ENCODE_BUGS = {
    "unknown_dropped": "words missing from the vocabulary are dropped: encode each as <UNK> (index 3).",
    "unknown_as_null": "words missing from the vocabulary become <NULL>: encode them as <UNK> (index 3).",
    "end_cut": "a caption longer than max_len - 2 words loses its <END>: keep the first max_len - 2 words, then <END>.",
    "one_word_short": "a long caption keeps one word too few: max_len - 2 words fit between <START> and <END>.",
    "no_start": "the rows don't begin with <START> (index 1).",
    "no_end": "<END> (index 2) is missing after the last word.",
    "split_on_spaces": "punctuation stays attached to words ('circle,' is not 'circle'): tokenise with tokenize().",
}


def _dataset_bug(kind):
    class Buggy(torch.utils.data.Dataset):
        def __init__(self, path, key, captions, image_idxs):
            with h5py.File(path, "r") as f:
                self.features = torch.from_numpy(f[key][()])
            self.captions, self.image_idxs = captions, image_idxs

        def __len__(self):
            return len(self.captions)

        def __getitem__(self, i):
            row = i if kind == "caption_row_as_image" else int(self.image_idxs[i])
            feats = self.features[row].float()
            cap = self.captions[i]
            end = int((cap == 2).nonzero()[0]) if (cap == 2).any() else len(cap) - 1
            if kind == "padding_kept":
                return feats, cap
            if kind == "end_dropped":
                return feats, cap[:end]
            return feats, cap[:end + 1]
    return Buggy


DATASET_BUGS = {
    "caption_row_as_image": "item i has the features of image i, not of its caption's image: use image_idxs[i].",
    "padding_kept": "the caption keeps its padding: cut it after its <END> (padding is added per batch).",
    "end_dropped": "the caption stops before <END>: keep <END>, the model must learn to stop.",
}


def _collate_bug(kind):
    def collate(batch, null_idx=0):
        feats = torch.stack([f for f, _ in batch])
        longest = max(len(c) for _, c in batch)
        pad = 0 if kind == "hardcoded_null" else null_idx
        caps = torch.full((len(batch), longest), pad, dtype=torch.long)
        for b, (_, c) in enumerate(batch):
            if kind == "pad_left":
                caps[b, longest - len(c):] = c
            else:
                caps[b, : len(c)] = c
        return feats, caps
    return collate


COLLATE_BUGS = {
    "hardcoded_null": "padding uses index 0: pad with the null_idx argument.",
    "pad_left": "padding is added before the caption: pad at the end, so every caption starts with <START>.",
}


@dataclass(frozen=True, kw_only=True)
class VocabCase(Row):
    """build_vocab(captions, min_count), seen through where each probe word lands."""
    captions: list[str]
    min_count: int = 1


@dataclass(frozen=True, kw_only=True)
class EncodeCase(Row):
    """encode_captions(captions, word_to_idx, max_len) over a fixed small vocabulary."""
    captions: list[str]
    max_len: int


@dataclass(frozen=True, kw_only=True)
class DatasetCase(Row):
    """CaptionFeatures(path, key, captions, image_idxs)[i] for every i, over features (N, R, D) stored in a file."""
    images: int  # N
    regions: int  # R
    feature_dim: int  # D
    lengths: list[int]  # words of each caption
    length: int  # T, with padding


@dataclass(frozen=True, kw_only=True)
class CollateCase(Row):
    """collate_captions(batch of (features (R, D), caption) items, null_idx)."""
    lengths: list[int]  # words of each caption
    regions: int  # R
    feature_dim: int  # D
    null_idx: int = 0


ENCODE_WORDS = SPECIALS + ["a", "red", "circle", "left", "blue", "square", "of", "the"]


def _vocab_spec(c: VocabCase) -> CaseSpec:
    # every word any tokenisation (right or buggy) could make of the captions
    probe = SPECIALS + sorted({w for cap in c.captions for w in _words(cap)}
                              | {w.lower() for cap in c.captions for w in re.findall(r"[A-Za-z0-9]+", cap)}
                              | {w for cap in c.captions for w in cap.lower().split()}
                              | {w for cap in c.captions for w in re.findall(r"[A-Za-z0-9]+", cap)})
    return CaseSpec(
        name=c.name, target="with_probe_words(build_vocab)", args=[], inputs={},
        const_kwargs={"captions": c.captions, "min_count": c.min_count, "probe": probe},
        outputs=["size", "positions"], variants=_variants(VOCAB_BUGS, _vocab_bug, with_probe_words),
        public=c.public, hint="SPECIAL_TOKENS + the words with count >= min_count, sorted by (-count, word).")


def _encode_spec(c: EncodeCase) -> CaseSpec:
    return CaseSpec(
        name=c.name, target="with_long_output(encode_captions)", args=[], inputs={},
        const_kwargs={"captions": c.captions, "word_to_idx": {w: i for i, w in enumerate(ENCODE_WORDS)},
                      "max_len": c.max_len}, outputs=["captions"],
        variants=_variants(ENCODE_BUGS, _encode_bug, with_long_output), public=c.public,
        hint="<START>, the first max_len - 2 words (unknown -> <UNK>), <END>, then <NULL>.")


def _dataset_spec(c: DatasetCase, g: torch.Generator) -> CaseSpec:
    caps = _captions(c.lengths, c.length, 12, g)
    idxs = torch.randint(c.images, (len(c.lengths),), generator=g)
    idxs[0] = c.images - 1  # rows differ from their image index
    return CaseSpec(
        name=c.name, target="with_h5_file(CaptionFeatures)", args=["features", "captions", "image_idxs"],
        inputs={"features": randn(c.images, c.regions, c.feature_dim, g=g).half().float(), "captions": caps,
                "image_idxs": idxs},
        outputs=["item_features", "item_captions", "item_lengths"],
        variants=_variants(DATASET_BUGS, _dataset_bug, with_h5_file), public=c.public,
        hint="item i: (features of image image_idxs[i] as float32, captions[i] up to and including <END>).")


def _collate_spec(c: CollateCase, g: torch.Generator) -> CaseSpec:
    caps = _captions(c.lengths, max(c.lengths) + 4, 12, g, null=c.null_idx, specials=(0, 1, 2, 3, c.null_idx))
    return CaseSpec(
        name=c.name, target="with_items(collate_captions)", args=["features", "captions", "lengths"],
        const_kwargs={"null_idx": c.null_idx},
        inputs={"features": randn(len(c.lengths), c.regions, c.feature_dim, g=g), "captions": caps,
                "lengths": torch.tensor([n + 2 for n in c.lengths])},
        outputs=["features", "captions"], variants=_variants(COLLATE_BUGS, _collate_bug, with_items),
        public=c.public, hint="torch.stack the features; pad the captions at the end with null_idx to the "
                              "longest caption of the batch.")


# ---- extract_grid_features(cnn, images, size) on the stand-in CNN ---------------------------------------


def _extract_bug(kind):
    def extract(cnn, images, size=224):
        if kind != "train_mode":
            cnn.eval()
        with torch.no_grad():
            x = torch.as_tensor(images)
            B, H, W, _ = x.shape
            x = x.reshape(B, 3, H, W).float() if kind == "reshape_not_permute" else x.permute(0, 3, 1, 2).float()
            if kind != "not_scaled":
                x = x / 255
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=kind != "no_antialias")
            if kind != "not_normalised":
                x = (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
            fmap = cnn(x)
            if kind == "column_by_column":
                return fmap.transpose(2, 3).flatten(2).transpose(1, 2)
            return fmap.flatten(2).transpose(1, 2)
    return extract


EXTRACT_BUGS = {
    "train_mode": "the CNN runs in train mode (BatchNorm uses the batch's statistics): features are extracted in eval mode.",
    "reshape_not_permute": "the images were reshaped to (B, 3, H, W), which scrambles the pixels: the channel axis is moved, not reshaped.",
    "not_scaled": "the pixels were not scaled to [0, 1]: divide the uint8 values by 255 before normalising.",
    "not_normalised": "the images are not normalised: subtract IMAGENET_MEAN and divide by IMAGENET_STD per channel.",
    "no_antialias": "the resize skips pixels when it shrinks: a bilinear resize with antialiasing averages every pixel it covers.",
    "column_by_column": "the regions are flattened column by column: region r of the (h, w) map is row r // w, "
                        "column r % w (row by row).",
}


@dataclass(frozen=True, kw_only=True)
class FeatureCase(Row):
    """extract_grid_features(cnn, images (B, H, W, 3) uint8, size) on the stand-in CNN."""
    images: tuple[int, ...]  # the shape of images; not (B, H, W, 3): a case of bad input (a ValueError)
    size: int


def feature_cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(4)
    out = []
    for c in [
        FeatureCase(name="features/basic", images=(2, 16, 16, 3), size=16, public=True),
        FeatureCase(name="features/resize", images=(2, 20, 20, 3), size=12),
        FeatureCase(name="features/rectangular", images=(3, 24, 16, 3), size=16),
        FeatureCase(name="features/one_image", images=(1, 8, 8, 3), size=8),
    ]:
        out.append(CaseSpec(
            name=c.name, target="with_cnn(extract_grid_features)", args=["images"], const_kwargs={"size": c.size},
            inputs={"images": torch.randint(0, 256, c.images, generator=g, dtype=torch.uint8)},
            outputs=["features"], atol=1e-4, rtol=1e-4, variants=_variants(EXTRACT_BUGS, _extract_bug, with_cnn),
            public=c.public, hint="eval mode without gradients; channels first, values in [0, 1], resized (bilinear, "
                                  "antialiased), normalised per channel; the regions row by row, (B, h*w, C)."))
    for c in [
        FeatureCase(name="features/rgba_images", images=(2, 16, 16, 4), size=16),
        FeatureCase(name="features/grayscale_images", images=(2, 16, 16), size=16),
    ]:
        out.append(CaseSpec(
            name=c.name, target="with_cnn(extract_grid_features)", args=["images"], const_kwargs={"size": c.size},
            inputs={"images": torch.randint(0, 256, c.images, generator=g, dtype=torch.uint8)}, outputs=["features"],
            public=c.public,
            properties=[["raises", "ValueError", f"naming the shape of images {c.images}, not (B, H, W, 3)"]]))
    return out
