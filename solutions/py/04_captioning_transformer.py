# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 04 · The captioning Transformer: training and evaluation
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/04_captioning_transformer.ipynb)
#
# Notebooks 01–03 built the parts: attention, positional encoding, multi-head attention and the decoder block. Here you stack them into a model that **writes a caption for an image**, train it, and measure how good its captions are.
#
# You will write the whole pipeline of a deep-learning experiment, not only the model:
#
# - **data preparation**: `extract_grid_features` turns images into the grid features the model reads; `build_vocab` and `encode_captions` turn caption text into index tensors; `CaptionFeatures` (a PyTorch `Dataset`) and `collate_captions` feed them to a `DataLoader`;
# - **the model and its loss**: `CaptioningTransformer.forward`, `caption_loss`, `teacher_forcing_loss`;
# - **the training script**: the learning-rate schedule `lr_at_step`, one optimisation step `train_step` and the validation loss `validation_loss`;
# - **generation and the evaluation script**: `greedy_decode`, `evaluate_captions` and `beam_search`.
#
# Given: the loop that calls your training step and validation loss (`starter.training.train`: batches from your `DataLoader`, device moves, a progress bar with the time left, a time budget used only while grading), the metric implementations (BLEU, CIDEr, ROUGE-L from `pycocoevalcap`, in `starter/metrics.py`) and the plots. Each piece of the pipeline you write is then **used**: the model trains on your vocabulary, your `Dataset` and `collate_captions`, with your schedule and training step, and is scored by your evaluation function. The kit has no version of these pieces: while one does not pass its public check yet, the notebook says so in one line and goes on without it, with the data the dataset file stores (its vocabulary, encoded captions and features) where that can stand in, and otherwise skipping what needs the piece (training, the scores).
#
# **How to work.** Fill in the cells marked `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line) and run the test cell below each one: it prints `✓ … passed` or one line naming the likely bug. The graded version of each test cell also runs hidden cases. Don't edit or delete test cells, and keep the layers declared in the given part of `__init__` as they are: the checks load stored weights into them by name. The checks never use your layers from notebooks 02–03 (they build the model with PyTorch's layers), so your grade here does not depend on those notebooks.

# %% nbgrader={"grade": false, "grade_id": "code_02", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["colab"]
# Run this cell first. On Google Colab it installs the course kit (only what Colab lacks, once per runtime)
# and, with USE_DRIVE, keeps your notebooks and checkpoints in one Google Drive folder. Locally it installs
# nothing (`python3 kit.py setup` did); everywhere it makes unfinished tasks show as one line, not a traceback.
USE_DRIVE = True                  # Colab: work in My Drive/COURSE_DIR (Colab asks once for access to Drive)
COURSE_DIR = "attention-course"   # the course folder in your Google Drive
import os, subprocess, sys
if "google.colab" in sys.modules:
    KIT = "/content/attention-transformers"
    if not os.path.isdir(os.path.join(KIT, "starter")):
        COURSE_REPO = os.environ.get("COURSE_REPO", "https://github.com/attention-course-kit/attention-transformers.git")
        print("installing the course kit (about 30 s, once per runtime) ...")
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", COURSE_REPO, KIT], check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", KIT], check=True)
    sys.path.insert(0, KIT)  # importable now, without restarting the runtime
from starter.runtime import start_notebook
COURSE_FOLDER = start_notebook(use_drive=USE_DRIVE, course_dir=COURSE_DIR)

# %% nbgrader={"grade": false, "grade_id": "code_03", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["setup"]
import math
import os
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

import h5py
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from starter.checks import check
from starter.data import StoredBatches, Vocab, load_dataset
from starter.layers import get_layers, with_attention, with_model
from starter.metrics import caption_scores, format_scores
from starter.pipeline import yours_if_it_passes
from starter.plotting import plot_losses, show_attention, show_captions
from starter.runtime import checkpoint_file
from starter.training import (GRADING, count_parameters, load_checkpoint, overfit_small_batch, pick_device,
                              save_checkpoint, seed_everything, train)

torch.manual_seed(0)

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · From one image vector to attention over regions
#
# The classic captioning model of the lecture is an encoder–decoder: a CNN encodes the image, and an RNN decoder writes the caption word by word. In its simplest form the CNN's output is squeezed into **one vector** that initialises the decoder, and every word has to be produced from that single summary. That is the same bottleneck that attention removed in translation.
#
# *Show, Attend and Tell* (Xu et al., 2015) keeps the CNN's **spatial grid** instead: the last convolutional layer gives an $H \times W$ grid of feature vectors $z_{i,j}$, one per image region. At every decoding step the decoder computes alignment scores between its current state and each $z_{i,j}$, turns them into weights with a softmax, and takes the weighted sum as **a new context vector for this step**. When it writes "circle" it can look at the circle; when it writes "left" it can look at where the circle is.
#
# A Transformer decoder does exactly this with cross-attention, and replaces the RNN by masked self-attention over the words written so far:
#
# - **memory** (the encoder side): the $R = H \cdot W$ grid features, each projected to $d_{model}$ by a linear layer, plus a learned embedding of the region's index so that the model knows *where* each region is (cross-attention ignores the order of its memory: permute the regions and every word's output stays the same, so without this embedding the grid would be a bag of regions);
# - **target** (the decoder side): the caption so far, word embeddings plus positional encoding;
# - **decoder stack**: $L$ pre-norm decoder blocks from notebook 03 (causal self-attention, cross-attention to the memory, feed-forward), a final LayerNorm, and a linear **vocabulary head** that gives a score (logit) for every word of the vocabulary at every position.
#
# The CNN is not trained here: its features were computed once and stored (HDF5), which is what makes training on a laptop possible.
#
# ### The data
#
# The default dataset, `shapes`, is generated: scenes of one or two coloured shapes on a grid, captioned in several phrasings ("a small red circle in the top left", "in the top left there is a small red circle"), with $7 \times 7$ grid features of a pretrained EfficientNet and the small images kept for display. It trains on a CPU in minutes and its captions can be checked by eye. COCO (section 9) uses the same interface. The dataset is chosen here, in one line: a dataset that is not on disk is an error naming the command that fetches it.

# %% nbgrader={"grade": false, "grade_id": "code_05", "locked": true, "schema_version": 3, "solution": false, "task": false}
DATASET = "shapes"   # or "coco-fc7" (CS231n features: python -m data.coco_cs231n), "coco-grid" (python -m data.coco_grid)

ds = load_dataset(DATASET)
train_split, val_split = ds.split("train"), ds.split("val")
vocab = ds.vocab
print(ds)
captions, features, image_idxs = train_split.sample_batch(3, generator=0)
print("captions", tuple(captions.shape), captions.dtype, "| features", tuple(features.shape), features.dtype)
print("first caption as indices:", captions[0].tolist())
print("decoded:", vocab.decode(captions[0]))
print("special tokens: <NULL> =", vocab.null_idx, " <START> =", vocab.start_idx, " <END> =", vocab.end_idx)

# %% nbgrader={"grade": false, "grade_id": "code_06", "locked": true, "schema_version": 3, "solution": false, "task": false}
if DATASET == "shapes" or DATASET == "coco-grid":
    idx = image_idxs.tolist()
    show_captions([train_split.image(i) for i in idx], [vocab.decode(c) for c in captions],
                  [train_split.references(i) for i in idx], title="training images, one caption each (bold) and all their captions")
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_prep_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2 · Preparing the data
#
# The dataset file holds CNN features and captions as rows of word indices, but a dataset starts life as images and text. Before any training, both become tensors, and you write each step:
#
# 0. **features**: a pretrained CNN, run once over every image, gives a grid of region vectors per image (this is what the file stores, so that training never runs the CNN);
# 1. a **vocabulary**: the list of words the model knows, built from the *training* captions only (the validation captions must not leak into any choice made before evaluation);
# 2. **encoding**: each caption becomes `<START> w1 ... wn <END>`, as indices into the vocabulary;
# 3. **batching**: a `Dataset` pairs each caption with the features of its image, and a `DataLoader` draws shuffled minibatches, padding each one to its longest caption.
#
# Four special tokens have fixed indices: `<NULL>` = 0 (padding), `<START>` = 1, `<END>` = 2, `<UNK>` = 3 (a word that is not in the vocabulary). Words are found by one rule, `tokenize` below: lower-case the caption, then take every maximal run of letters `a`–`z` and digits `0`–`9`; everything else (spaces, punctuation, apostrophes) separates words, so `"A dog's ball."` gives `["a", "dog", "s", "ball"]`.
#
# Here the text of each caption is read back from the dataset file (`split.texts()`); for your own images it would come from the annotation files.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_feat_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 1 · `extract_grid_features(cnn, images, size=224)`
#
# The memory tokens of the model are the cells of a CNN's last feature map. Computing them is a fixed recipe, and each step matters:
#
# 1. `images` is a batch of RGB images, `(B, H, W, 3)` uint8 (a NumPy array or a tensor). Anything else (a grayscale batch `(B, H, W)`, RGBA `(B, H, W, 4)`, one image without its batch axis) would fail deep inside the CNN or, worse, be misread without an error: raise a `ValueError` that names the shape you got. Convert it to the layout of PyTorch's convolutions, `(B, 3, H, W)` (a `permute`, **not** a `reshape`, which would scramble the pixels), as floats in $[0, 1]$ (divide by 255);
# 2. resize to `size` × `size` with `F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)` (the network was trained at a fixed resolution; `antialias` averages instead of skipping pixels when shrinking);
# 3. normalise each channel with the ImageNet statistics the network was trained with, `(x - IMAGENET_MEAN) / IMAGENET_STD` (given below, one value per channel);
# 4. run the CNN in **eval mode** (`cnn.eval()`: BatchNorm then uses its stored statistics, not the batch's) and without gradients (`torch.no_grad()`), on the CNN's device;
# 5. the map is `(B, C, h, w)`: flatten it to `(B, h·w, C)`, **row by row** (region `r` is row `r // w`, column `r % w`, the order the model's region embedding assumes), as a float32 tensor on the CPU.

# %% nbgrader={"grade": false, "grade_id": "code_feat_2", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["setup"]
IMAGENET_MEAN = (0.485, 0.456, 0.406)   # per channel (R, G, B), of ImageNet's training images
IMAGENET_STD = (0.229, 0.224, 0.225)


# %% nbgrader={"grade": false, "grade_id": "extract_grid_features", "locked": false, "schema_version": 3, "solution": true, "task": false}
def extract_grid_features(cnn, images, size=224):
    """Grid features of a batch of images.

    Args:
        cnn: a module mapping (B, 3, size, size) normalised images to a (B, C, h, w) feature map.
        images: (B, H, W, 3) uint8 RGB images, NumPy array or tensor.
        size: the side the images are resized to.
    Returns:
        (B, h*w, C) float32 tensor on the CPU, regions row by row.
    """
    ### BEGIN SOLUTION
    if np.ndim(images) != 4 or np.shape(images)[-1] != 3:
        raise ValueError(f"images must be a (B, H, W, 3) batch of RGB images, got shape {tuple(np.shape(images))}")
    cnn.eval()
    device = next(cnn.parameters()).device
    with torch.no_grad():
        x = torch.as_tensor(images).permute(0, 3, 1, 2).float() / 255
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
        mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        fmap = cnn(((x - mean) / std).to(device))               # (B, C, h, w)
        return fmap.flatten(2).transpose(1, 2).float().cpu()    # (B, h*w, C)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_extract_grid_features", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_cnn
check("features/basic", with_cnn(extract_grid_features))
### BEGIN HIDDEN TESTS
check("features/resize", with_cnn(extract_grid_features))
check("features/rectangular", with_cnn(extract_grid_features))
check("features/one_image", with_cnn(extract_grid_features))
check("features/rgba_images", with_cnn(extract_grid_features))
check("features/grayscale_images", with_cnn(extract_grid_features))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_feat_3", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Your extraction on the real network. `shapes` was built with EfficientNet-Lite0 (ImageNet weights), cut after block 10, on its 112-pixel images: a $7 \times 7$ map of 112 channels per image, reduced to 64 channels by a PCA stored in the file. Run your function with that network on validation images, apply the stored PCA, and compare with the features in the file (which are stored as float16, so they agree to about three digits). The check above used a tiny stand-in network; this is the full-size one.

# %% nbgrader={"grade": false, "grade_id": "code_feat_4", "locked": true, "schema_version": 3, "solution": false, "task": false}
if DATASET == "shapes":
    some = list(range(20 if GRADING else 200))
    stored = val_split.features(some).numpy()
    extract = yours_if_it_passes("extract_grid_features", extract_grid_features,
                                 instead="the features stored in the file are used below")
    mine = stored
    if extract is not None:
        from data.shapes import GridBackbone, project
        cnn = GridBackbone()   # on the CPU: a few seconds for 200 small images
        images = np.stack([val_split.image(i) for i in some])          # (N, 112, 112, 3) uint8
        t0 = time.perf_counter()
        raw = extract(cnn, images, size=112)                            # (N, 49, 112)
        mine = project(raw.numpy(), ds.path)                            # (N, 49, 64), the stored PCA
        print(f"{len(some)} images -> features {tuple(raw.shape)} in {time.perf_counter() - t0:.1f} s; after the PCA "
              f"{mine.shape}; largest difference to the stored features {abs(mine - stored).max():.3f} "
              f"(their typical size {abs(stored).mean():.2f})")
else:
    print("this step runs on the shapes images (COCO grid features are built by python -m data.coco_grid)")

# %% nbgrader={"grade": false, "grade_id": "code_prep_2", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["setup"]
SPECIAL_TOKENS = ["<NULL>", "<START>", "<END>", "<UNK>"]

def tokenize(caption):
    """"A dog's ball." -> ["a", "dog", "s", "ball"]: lower case, maximal runs of letters a-z and digits 0-9."""
    return re.findall(r"[a-z0-9]+", caption.lower())


# %% nbgrader={"grade": false, "grade_id": "code_prep_2b", "locked": true, "schema_version": 3, "solution": false, "task": false}
texts = {"train": train_split.texts(), "val": val_split.texts()}
print(f"{len(texts['train'])} training captions, e.g. {texts['train'][0]!r} -> {tokenize(texts['train'][0])}")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_prep_3", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2 · `build_vocab(captions, min_count=1)`
#
# Count how often each word occurs in `captions` (a list of strings, tokenised with `tokenize`) and return the vocabulary as a list of strings, `idx_to_word`:
#
# - the four special tokens first, in the order of `SPECIAL_TOKENS` (so they get indices 0–3);
# - then every word that occurs **at least** `min_count` times, the **most frequent first**, ties broken **alphabetically**, each word once.
#
# Rare words are left out on purpose: a word seen once or twice gives the model almost nothing to learn from, and it will be encoded as `<UNK>`. The order makes the vocabulary deterministic (the same captions give the same indices on every machine). `collections.Counter` does the counting; `sorted` with a `key` does the ordering.

# %% nbgrader={"grade": false, "grade_id": "build_vocab", "locked": false, "schema_version": 3, "solution": true, "task": false}
def build_vocab(captions, min_count=1):
    """The vocabulary of `captions`.

    Args:
        captions: list of M caption strings.
        min_count: keep the words that occur at least this many times.
    Returns:
        idx_to_word: list of strings: SPECIAL_TOKENS, then the kept words, most frequent first,
        ties in alphabetical order.
    """
    ### BEGIN SOLUTION
    counts = Counter(word for caption in captions for word in tokenize(caption))
    kept = [word for word, n in counts.items() if n >= min_count]
    return SPECIAL_TOKENS + sorted(kept, key=lambda word: (-counts[word], word))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_build_vocab", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_probe_words
check("vocab/basic", with_probe_words(build_vocab))
### BEGIN HIDDEN TESTS
check("vocab/min_count", with_probe_words(build_vocab))
check("vocab/punctuation_and_case", with_probe_words(build_vocab))
check("vocab/ties", with_probe_words(build_vocab))
check("vocab/single_caption", with_probe_words(build_vocab))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_prep_4", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 3 · `encode_captions(captions, word_to_idx, max_len)`
#
# Return an `(M, max_len)` **int64 tensor**: row $i$ is caption $i$ as `<START>`, its words' indices (a word missing from `word_to_idx` becomes `<UNK>`), `<END>`, then `<NULL>` up to `max_len`. A caption with more than `max_len - 2` words keeps its first `max_len - 2` words, so that `<END>` is always there: a caption cut without its `<END>` would teach the model never to stop. Tokenise with `tokenize`, as `build_vocab` did, or the words won't match.

# %% nbgrader={"grade": false, "grade_id": "encode_captions", "locked": false, "schema_version": 3, "solution": true, "task": false}
def encode_captions(captions, word_to_idx, max_len):
    """Encode caption strings as padded rows of indices.

    Args:
        captions: list of M caption strings.
        word_to_idx: dict word -> index, with the special tokens at 0-3.
        max_len: T, the length of every row (<START> and <END> included).
    Returns:
        (M, T) int64 tensor: <START> w1 ... wn <END> <NULL> ...
    """
    ### BEGIN SOLUTION
    null, start, end, unk = (word_to_idx[t] for t in SPECIAL_TOKENS)
    out = torch.full((len(captions), max_len), null, dtype=torch.long)
    for i, caption in enumerate(captions):
        ids = [word_to_idx.get(word, unk) for word in tokenize(caption)][: max_len - 2]
        out[i, : len(ids) + 2] = torch.tensor([start, *ids, end])
    return out
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_encode_captions", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_long_output
check("encode/basic", with_long_output(encode_captions))
### BEGIN HIDDEN TESTS
check("encode/unknown_words", with_long_output(encode_captions))
check("encode/too_long", with_long_output(encode_captions))
check("encode/punctuation_and_case", with_long_output(encode_captions))
check("encode/exact_fit", with_long_output(encode_captions))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_prep_5", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Your vocabulary and encoding, used: the model of this notebook is trained on the vocabulary you build from the training captions, and on your encoding of both splits.

# %% nbgrader={"grade": false, "grade_id": "code_prep_6", "locked": true, "schema_version": 3, "solution": false, "task": false}
stored = "the dataset's stored vocabulary and encoded captions are used (the two go together)"
vocab_fn = yours_if_it_passes("build_vocab", build_vocab, instead=stored)
encode = yours_if_it_passes("encode_captions", encode_captions, instead=stored)
if vocab_fn is not None and encode is not None:
    vocab = Vocab(vocab_fn(texts["train"], min_count=1))
    encoded = {name: encode(texts[name], vocab.word_to_idx, ds.max_length) for name in texts}
else:
    vocab, encoded = ds.vocab, {name: ds.split(name).captions for name in texts}
print(vocab)
print(f"{texts['train'][0]!r} -> {encoded['train'][0].tolist()}")
print("captions:", {name: tuple(e.shape) for name, e in encoded.items()})

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_prep_write", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Your features and your encoded captions together make a dataset file: written in the kit's format (`write_caption_file`: float16 features, one HDF5 chunk per image, written to a temporary file and renamed when complete, so an interrupted write leaves nothing behind), it is read back by the same `load_dataset` as the kit's own files. Here, with the images above split into a small training and validation part:

# %% nbgrader={"grade": false, "grade_id": "code_prep_write", "locked": true, "schema_version": 3, "solution": false, "task": false}
if DATASET == "shapes":
    from starter.data import write_caption_file
    rows = [r for i in some for r in val_split.caption_rows(i)]          # the captions of those images
    caps = encoded["val"][rows]
    img = val_split.image_idxs[rows]
    half = len(some) // 2
    parts = {"train": (mine[:half], caps[img < half], img[img < half]),
             "val": (mine[half:], caps[img >= half], img[img >= half] - half)}
    path = write_caption_file(Path(tempfile.mkdtemp()) / "my_shapes.h5", "my-shapes", vocab, ds.grid_shape, parts)
    print(load_dataset(path))


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_prep_7", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 4 · a `Dataset`: `CaptionFeatures`
#
# PyTorch separates *what one example is* (a `torch.utils.data.Dataset`: `__len__` and `__getitem__`) from *how examples are batched and shuffled* (a `DataLoader`). Here one example is one caption with the features of its image. The features stay in the HDF5 file on disk: `path` and `key` name the `(N, R, D)` array (`split.features_file` gives them), caption row `i` belongs to image `image_idxs[i]`.
#
# Write `__getitem__(i)`, returning a tuple `(features, caption)`:
#
# - `features`: row `image_idxs[i]` of the array as a `(R, D)` **float32** tensor (the file stores float16 to halve its size);
# - `caption`: row `i` of `captions` **up to and including its `<END>`**, padding removed, a 1-D int64 tensor. A row without `<END>` (an empty or damaged caption) has no right length: raise a `ValueError` that names the row `i`. Padding is added back per batch, to the longest caption of that batch, which is shorter than `max_len` for most batches.
#
# Open the file on first use, not in `__init__`: a `DataLoader` with `num_workers > 0` copies the dataset into each worker process, and an open HDF5 file cannot be copied, so each worker must open its own. Keep the opened array, `h5py.File(path, "r")[key]`, in `self.features` (`None` until then) and read rows from it: looking the array up by its key again for every item costs more than reading the row itself, and a training step reads 64 items.

# %% nbgrader={"grade": false, "grade_id": "CaptionFeatures", "locked": false, "schema_version": 3, "solution": true, "task": false}
class CaptionFeatures(Dataset):
    """(features, caption) pairs: caption row i with the features of its image.

    Args:
        path, key: the HDF5 file and the key of its (N, R, D) feature array.
        captions: (M, T) int64 tensor, <START> ... <END> <NULL> ...
        image_idxs: (M,) int64 tensor, the image (row of the feature array) of each caption.
    Item i: (features (R, D) float32, caption (L_i,) int64 up to and including <END>).
    """

    def __init__(self, path, key, captions, image_idxs):
        self.path, self.key = path, key
        self.captions, self.image_idxs = captions, image_idxs
        self.features = None   # the (N, R, D) HDF5 array, opened on first use by the process that reads

    def __len__(self):
        return len(self.captions)

    def __getitem__(self, i):
        ### BEGIN SOLUTION
        if self.features is None:
            self.features = h5py.File(self.path, "r")[self.key]
        features = torch.from_numpy(self.features[int(self.image_idxs[i])]).float()
        caption = self.captions[i]
        ends = (caption == 2).nonzero()
        if len(ends) == 0:
            raise ValueError(f"caption row {i} has no <END>: is it encoded with encode_captions?")
        return features, caption[: int(ends[0]) + 1]   # up to and including <END>
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_caption_features", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_h5_file
check("dataset/basic", with_h5_file(CaptionFeatures))
### BEGIN HIDDEN TESTS
check("dataset/shared_images", with_h5_file(CaptionFeatures))
check("dataset/full_length", with_h5_file(CaptionFeatures))
check("dataset/one_region", with_h5_file(CaptionFeatures))
check("dataset/caption_without_end", with_h5_file(CaptionFeatures))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_prep_8", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 5 · `collate_captions(batch, null_idx=0)`
#
# A `DataLoader` gathers `batch_size` items and hands the list to its `collate_fn`. Stack the features into `(B, R, D)` and pad the captions with `null_idx` **at the end** to the length of the longest caption of the batch: `(B, L_max)` int64. (`torch.nn.utils.rnn.pad_sequence` can do the padding; a loop is fine too.)

# %% nbgrader={"grade": false, "grade_id": "collate_captions", "locked": false, "schema_version": 3, "solution": true, "task": false}
def collate_captions(batch, null_idx=0):
    """[(features (R, D), caption (L_b,)), ...] -> (features (B, R, D), captions (B, max L_b) padded with null_idx)."""
    ### BEGIN SOLUTION
    features = torch.stack([f for f, _ in batch])
    longest = max(len(c) for _, c in batch)
    captions = torch.full((len(batch), longest), null_idx, dtype=torch.long)
    for b, (_, caption) in enumerate(batch):
        captions[b, : len(caption)] = caption
    return features, captions
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_collate_captions", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_items
check("collate/basic", with_items(collate_captions))
### BEGIN HIDDEN TESTS
check("collate/other_null_idx", with_items(collate_captions))
check("collate/equal_lengths", with_items(collate_captions))
check("collate/one_item", with_items(collate_captions))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_prep_9", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The loaders. `shuffle=True` draws a new order every epoch from the loader's `generator`: seeded, the same seed gives the same batches (the training loop re-seeds it at the start of each run, so a re-run repeats). The validation loader keeps its order, so the validation loss is always measured on the same captions.

# %% nbgrader={"grade": false, "grade_id": "code_prep_10", "locked": true, "schema_version": 3, "solution": false, "task": false}
stored = "the loaders give the stored batches, padded to the dataset's caption length (StoredBatches)"
FeatureDataset = yours_if_it_passes("CaptionFeatures", CaptionFeatures, instead=stored)
collate = yours_if_it_passes("collate_captions", collate_captions, instead=stored)

def make_loader(split, batch_size, shuffle, seed=0):
    """Batches of (features, captions) of `split`'s captions as encoded above."""
    if FeatureDataset is None or collate is None:
        return StoredBatches(split, encoded[split.name], batch_size, shuffle, drop_last=shuffle, seed=seed)
    data = FeatureDataset(*split.features_file, encoded[split.name], split.image_idxs)
    return DataLoader(data, batch_size=batch_size, shuffle=shuffle, collate_fn=collate, drop_last=shuffle,
                      generator=torch.Generator().manual_seed(seed))

first = [next(iter(make_loader(train_split, 4, shuffle=True)))[1] for _ in range(2)]
print(f"a batch of 4: captions {tuple(first[0].shape)}\n{first[0]}")
print("same seed, same batch:", torch.equal(first[0], first[1]))

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_07", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3 · Your layers, or PyTorch's
#
# The model uses a decoder layer and a positional encoding with the interfaces of notebooks 02–03. By default it uses **yours**: the next cell loads `TransformerDecoderLayer` from your `03_multi_head_attention.ipynb` and `PositionalEncoding` from your `02_positional_encoding.ipynb`, found in the course folder (the folder of this notebook; on Colab, the Google Drive folder that the first cell set up, and also `My Drive/Colab Notebooks`, where *Save a copy in Drive* puts a notebook opened from its badge: the newest copy you worked on is used), prints which files it used, and runs their public checks. It never falls back to the kit's blank copies. If those notebooks are not finished, or a check fails, it stops with a one-line message; then either fix that notebook or switch to `LAYERS = "torch"`: PyTorch's `nn.TransformerDecoderLayer` (pre-norm, same masks convention as yours once converted) and a *learned* positional encoding, one trained vector per position, the alternative to the sinusoidal one discussed in notebook 02. Either way the rest of the notebook is the same. The graded checks always build the model with `layers="torch"`, so they do not depend on notebooks 02–03.

# %% nbgrader={"grade": false, "grade_id": "code_08", "locked": true, "schema_version": 3, "solution": false, "task": false}
LAYERS = "mine"   # or "torch": PyTorch-backed layers with the same interface (starter/layers.py)

DecoderLayer, PositionalEncoding = get_layers(LAYERS, verbose=True)


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_09", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4 · The model
#
# `CaptioningTransformer(vocab_size, feature_dim, num_regions, ...)` declares, in its given `__init__`:
#
# | name | what | shape |
# |---|---|---|
# | `feature_proj` | `nn.Linear(feature_dim, d_model)`: a grid feature becomes a memory token | $(B, R, D) \to (B, R, d)$ |
# | `region_embed` | `nn.Embedding(num_regions, d_model)`: a learned vector per region index $0 \ldots R-1$, added to the projected features | $(R, d)$ |
# | `word_embed` | `nn.Embedding(vocab_size, d_model)` | $(B, T) \to (B, T, d)$ |
# | `pos_encoding` | `PositionalEncoding(d_model, max_len, dropout)`: adds the position vectors of positions $0 \ldots T-1$, then dropout | $(B, T, d) \to (B, T, d)$ |
# | `decoder_layers` | `nn.ModuleList` of `num_layers` pre-norm decoder layers | |
# | `final_norm` | `nn.LayerNorm(d_model)`, needed after a pre-norm stack | |
# | `vocab_head` | `nn.Linear(d_model, vocab_size)` | $(B, T, d) \to (B, T, V)$ |
#
# ### Task 6 · `CaptioningTransformer.forward(features, captions, return_attention=False)`
#
# 1. memory = `feature_proj(features)` + the region embeddings of regions $0 \ldots R-1$ (use `self.region_embed.weight[:R]`, which broadcasts over the batch);
# 2. x = `pos_encoding(word_embed(captions))` (the word embeddings are used as they are, not multiplied by $\sqrt{d_{model}}$);
# 3. the **causal mask**, bool `(T, T)`, True = may attend: position $t$ sees positions $0 \ldots t$, itself included, and nothing later. This is what makes training with whole captions honest: without it the word at position $t$ could read the word it is supposed to predict;
# 4. each decoder layer: `x, self_w, cross_w = layer(x, memory, tgt_mask=mask)`;
# 5. logits = `vocab_head(final_norm(x))`: raw scores, no softmax (the loss applies it).
#
# Return the logits `(B, T, V)`; with `return_attention=True` return `(logits, {"self": [...], "cross": [...]})`, the per-layer weight lists, `(B, h, T, T)` and `(B, h, T, R)` per layer (notebook 05 draws them).
#
# No padding mask is needed for the words: padding only ever comes *after* a caption's last real word, and the causal mask already hides later positions from every real word. Padded positions still get (meaningless) outputs; the loss ignores them. Make the mask on the device of the inputs (`device=captions.device`) so that the model runs on a GPU too.

# %% nbgrader={"grade": false, "grade_id": "CaptioningTransformer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class CaptioningTransformer(nn.Module):
    """Transformer decoder over image grid features.

    Args:
        vocab_size: V, number of words (with <NULL>, <START>, <END>, <UNK>).
        feature_dim: D, size of one grid feature vector.
        num_regions: R, number of grid regions (H * W; 1 for a single fc7 vector).
        d_model, num_heads, num_layers, dim_feedforward, dropout: sizes of the decoder stack.
        max_len: longest caption the positional encoding supports.
        layers: "torch" (PyTorch-backed layers) or "mine" (yours from notebooks 02-03).
    """

    def __init__(self, vocab_size, feature_dim, num_regions, d_model=64, num_heads=4, num_layers=2,
                 dim_feedforward=256, max_len=32, dropout=0.1, layers="torch"):
        super().__init__()
        DecoderLayer, PositionalEncoding = get_layers(layers)
        self.feature_proj = nn.Linear(feature_dim, d_model)              # grid feature -> memory token
        self.region_embed = nn.Embedding(num_regions, d_model)           # where each region is
        self.word_embed = nn.Embedding(vocab_size, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len=max_len, dropout=dropout)
        self.decoder_layers = nn.ModuleList(
            [DecoderLayer(d_model, num_heads, dim_feedforward, dropout) for _ in range(num_layers)])
        self.final_norm = nn.LayerNorm(d_model)
        self.vocab_head = nn.Linear(d_model, vocab_size)

    def forward(self, features, captions, return_attention=False):
        """
        Args:
            features: (B, R, D) float grid features.
            captions: (B, T) int64 word indices (the model's input words).
            return_attention: also return the attention weights of every layer.
        Returns:
            logits (B, T, V); with return_attention=True, (logits, {"self": [(B, h, T, T)] * L,
            "cross": [(B, h, T, R)] * L}).
        """
        ### BEGIN SOLUTION
        R, T = features.shape[1], captions.shape[1]
        memory = self.feature_proj(features) + self.region_embed.weight[:R]
        x = self.pos_encoding(self.word_embed(captions))
        mask = torch.ones(T, T, dtype=torch.bool, device=captions.device).tril()
        attention = {"self": [], "cross": []}
        for layer in self.decoder_layers:
            x, self_w, cross_w = layer(x, memory, tgt_mask=mask)
            attention["self"].append(self_w)
            attention["cross"].append(cross_w)
        logits = self.vocab_head(self.final_norm(x))
        return (logits, attention) if return_attention else logits
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_captioning_transformer", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("captioner/basic", CaptioningTransformer)
### BEGIN HIDDEN TESTS
check("captioner/square", CaptioningTransformer)
check("captioner/one_region", CaptioningTransformer)
check("captioner/three_layers_float64", CaptioningTransformer)
check("captioner/grad", CaptioningTransformer)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_captioning_attention", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("captioner/attention", with_attention(CaptioningTransformer))
### BEGIN HIDDEN TESTS
check("captioner/attention_one_layer", with_attention(CaptioningTransformer))
check("captioner/attention_three_layers", with_attention(CaptioningTransformer))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_10", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Cross-check against PyTorch.** With `layers="torch"` your model's decoder layers are `nn.TransformerDecoderLayer`s, so the same computation can be assembled from PyTorch's `nn.TransformerDecoder` (which applies the final LayerNorm itself) by copying the weights; the causal mask is inverted to PyTorch's True = blocked:

# %% nbgrader={"grade": false, "grade_id": "code_11", "locked": true, "schema_version": 3, "solution": false, "task": false}
model = CaptioningTransformer(len(vocab), ds.feature_dim, ds.num_regions, layers="torch").eval()
stack = nn.TransformerDecoder(nn.TransformerDecoderLayer(64, 4, 256, batch_first=True, norm_first=True),
                              num_layers=2, norm=nn.LayerNorm(64)).eval()
for mine, theirs in zip(model.decoder_layers, stack.layers):
    theirs.load_state_dict(mine.state_dict())
stack.norm.load_state_dict(model.final_norm.state_dict())
with torch.no_grad():
    T = captions.shape[1]
    memory = model.feature_proj(features) + model.region_embed.weight
    x = model.pos_encoding(model.word_embed(captions))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = model.vocab_head(stack(x, memory, tgt_mask=~causal))
    logits, att = model(features, captions, return_attention=True)
print("logits", tuple(logits.shape), "| matches nn.TransformerDecoder:", torch.allclose(logits, expected, atol=1e-5))
print("self-attention per layer", [tuple(w.shape) for w in att["self"]], "| cross", [tuple(w.shape) for w in att["cross"]])

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_12", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5 · The loss, and why it must ignore padding
#
# The captions of a batch have different lengths, so they are padded with `<NULL>` (index 0) to a common length $T$. The model outputs a distribution over the vocabulary at every position; the loss is the cross-entropy of the correct next word, **averaged over the real words only**:
#
# $$\mathcal{L} = -\frac{1}{N}\sum_{(b,t)\,:\,y_{b,t} \neq \texttt{<NULL>}} \log p_\theta(y_{b,t} \mid \ldots), \qquad N = \#\{(b,t) : y_{b,t} \neq \texttt{<NULL>}\}.$$
#
# Why not average over every position? Padding positions have a trivial target: after `<END>` the answer is always `<NULL>`. Including them (i) rewards the model for predicting `<NULL>` after `<NULL>`, which it learns in a few steps and which says nothing about captions; (ii) dilutes the gradient of the real words by the share of padding (measured just below on your batches), as if the learning rate were lowered by a different factor for every batch; (iii) makes the loss depend on how much the batch was padded, so numbers are not comparable across batches or datasets. Dividing by the number of real words (not by the batch size, and not per caption) gives each real word the same weight.

# %% nbgrader={"grade": false, "grade_id": "code_pad_share", "locked": true, "schema_version": 3, "solution": false, "task": false}
# how much of a batch is padding: target positions (captions[:, 1:]) that hold <NULL>
padded = [caps[:, 1:] for _, (_, caps) in zip(range(20), make_loader(train_split, 64, shuffle=True))]
share = sum(int((t == vocab.null_idx).sum()) for t in padded) / sum(t.numel() for t in padded)
full = float((encoded["train"][:, 1:] == vocab.null_idx).float().mean())
padding = "each batch padded to its longest caption" if collate is not None else "the stored batches, full length"
print(f"{DATASET}: {share:.0%} of the target positions of 20 batches of 64 are padding ({padding}); "
      f"{full:.0%} if every caption were padded to T = {encoded['train'].shape[1]}")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_12b", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 7 · `caption_loss(logits, targets, null_idx=0)`
#
# `logits` `(B, T, V)`, `targets` `(B, T)` int64; return a scalar. Either compute $-\log\mathrm{softmax}$ at the targets yourself (`F.log_softmax` then `gather`) and average over the non-`null_idx` positions, or use `F.cross_entropy` with the right arguments (it wants the classes on axis 1, or flattened `(B*T, V)` logits; look up `ignore_index`). Use `null_idx`, not a hard-coded 0.

# %% nbgrader={"grade": false, "grade_id": "caption_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def caption_loss(logits, targets, null_idx=0):
    """Mean cross-entropy over the positions whose target is not `null_idx`.

    Args:
        logits: (B, T, V) unnormalised scores.
        targets: (B, T) int64 word indices; `null_idx` marks padding.
        null_idx: index of the padding token.
    Returns:
        scalar tensor.
    """
    ### BEGIN SOLUTION
    log_probs = F.log_softmax(logits, dim=-1)
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)   # (B, T)
    real = (targets != null_idx).to(nll.dtype)
    return (nll * real).sum() / real.sum()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_caption_loss", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("loss/basic", caption_loss)
### BEGIN HIDDEN TESTS
check("loss/other_null_idx", caption_loss)
check("loss/uneven_lengths", caption_loss)
check("loss/no_padding_float64", caption_loss)
check("loss/large_vocab", caption_loss)
check("loss/grad", caption_loss)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_13", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6 · Teacher forcing
#
# At training time we know the whole caption, so we don't let the model generate: we feed it the **true** previous words and ask, at every position at once, for the next one. This is **teacher forcing**. A caption `<START> a red circle <END> <NULL>` gives
#
# | position | 0 | 1 | 2 | 3 | 4 |
# |---|---|---|---|---|---|
# | input `captions[:, :-1]` | `<START>` | a | red | circle | `<END>` |
# | target `captions[:, 1:]` | a | red | circle | `<END>` | `<NULL>` |
#
# so the output at position $t$ is trained to predict word $t+1$, having seen words $0 \ldots t$ (the causal mask guarantees it sees no more). One forward pass trains all positions in parallel, which is why Transformers train much faster than RNNs. The price: during training the model always sees correct previous words, while at generation time it sees its own, possibly wrong, words (*exposure bias*).
#
# ### Task 8 · `teacher_forcing_loss(model, features, captions, null_idx=0)`
#
# Split the captions into inputs and targets as in the table, run the model, and return your `caption_loss`. The training loop below calls this function for every batch.

# %% nbgrader={"grade": false, "grade_id": "teacher_forcing_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def teacher_forcing_loss(model, features, captions, null_idx=0):
    """Loss of one batch with teacher forcing.

    Args:
        model: maps (features (B, R, D), words (B, T-1)) to logits (B, T-1, V).
        features: (B, R, D); captions: (B, T) int64, <START> ... <END> <NULL>...
    Returns:
        scalar tensor: caption_loss of the predictions of words 1..T-1.
    """
    ### BEGIN SOLUTION
    inputs, targets = captions[:, :-1], captions[:, 1:]
    return caption_loss(model(features, inputs), targets, null_idx)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_teacher_forcing_loss", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("teacher/basic", with_model(teacher_forcing_loss))
### BEGIN HIDDEN TESTS
check("teacher/other_null_idx", with_model(teacher_forcing_loss))
check("teacher/long_captions", with_model(teacher_forcing_loss))
check("teacher/grad", with_model(teacher_forcing_loss))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_14", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7 · Training
#
# A training script has four parts: the **learning-rate schedule**, the **training step** (one minibatch: forward, loss, backward, update), the **validation loss** (how the model does on data it does not train on) and the **loop** around them. You write all four. The loop draws batches from your `DataLoader`, calls your step with your schedule's learning rate, and measures the validation loss every so often; a `TrainingPlan` of the kit hands it the steps and shows a progress bar with the time left (and, only while the notebook is graded, keeps the run to a time budget). It runs on the GPU when there is one (`pick_device`), and it is seeded, so a run repeats on the same machine.
#
# ### Task 9 · `lr_at_step(step, total_steps, warmup_steps, peak_lr)`
#
# Transformers are trained with a **warm-up**: the first updates of Adam are large and noisy (its running averages of the gradient have seen little), and a small learning rate at the start keeps them from wrecking the freshly initialised attention. Notebook 03 chose pre-norm because it needs little or no warm-up, unlike post-norm, which needs a long one to train at all; here a short warm-up (50 of 700 steps on `shapes`) only protects those first Adam steps. After it, a **cosine decay** lowers the rate smoothly so the last steps fine-tune. Return the learning rate at `step` (0-based; it may be fractional):
#
# - warm-up, `step < warmup_steps`: $\eta = \eta_{peak} \cdot \min\left(1, \frac{step + 1}{warmup\_steps}\right)$ (the first step already moves, and step `warmup_steps - 1` is at the peak);
# - then, with $p = \min\left(1, \frac{step - warmup\_steps}{\max(1,\ total\_steps - warmup\_steps)}\right)$: $\eta = \eta_{peak}\left(0.1 + 0.45\,(1 + \cos \pi p)\right)$, from the peak down to 10 % of it at `total_steps`, and flat after that.
#
# PyTorch's `torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at_step(s, total_steps, warmup_steps, peak_lr) / peak_lr)`, stepped once per training step, applies the same rates on whole steps. Here you write the function itself, because a run on a time budget (while grading) evaluates it at fractional steps.

# %% nbgrader={"grade": false, "grade_id": "lr_at_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def lr_at_step(step, total_steps, warmup_steps, peak_lr):
    """Learning rate at `step` (0-based, may be fractional): linear warm-up, then cosine decay to 10% of the peak.

    Returns:
        a Python float.
    """
    ### BEGIN SOLUTION
    if step < warmup_steps:
        return peak_lr * min(1.0, (step + 1) / warmup_steps)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_lr_at_step", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import over_steps
check("schedule/basic", over_steps(lr_at_step))
### BEGIN HIDDEN TESTS
check("schedule/long_warmup", over_steps(lr_at_step))
check("schedule/fractional_steps", over_steps(lr_at_step))
check("schedule/past_the_end", over_steps(lr_at_step))
check("schedule/no_warmup", over_steps(lr_at_step))
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "code_sched_plot", "locked": true, "schema_version": 3, "solution": false, "task": false}
schedule = yours_if_it_passes("lr_at_step", lr_at_step, instead="no plot until it passes")
if schedule is not None:
    steps = list(range(700))
    plt.figure(figsize=(6, 2.5))
    plt.plot(steps, [schedule(s, 700, 50, 2e-3) for s in steps])
    plt.xlabel("step"); plt.ylabel("learning rate"); plt.title("warm-up (50 steps), then cosine decay to 10 %")
    plt.tight_layout(); plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_step_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 10 · `train_step(model, loss_fn, optimizer, features, captions, lr, grad_clip=1.0)`
#
# One optimisation step, in this order:
#
# 1. set the learning rate `lr` in every parameter group of the optimiser (`optimizer.param_groups`: a list of dicts with an `"lr"` entry), and put the model in training mode (`model.train()`: dropout on);
# 2. clear the gradients of the previous step (`optimizer.zero_grad()`): PyTorch **adds** each backward pass's gradients to `.grad`, so without it every step would use the sum of all gradients so far;
# 3. `loss = loss_fn(model, features, captions)` (your `teacher_forcing_loss` in this notebook), then `loss.backward()`;
# 4. if `grad_clip` is not `None`, rescale the gradients so that their total norm is at most `grad_clip` (`torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)`): one unlucky batch then cannot throw the weights far. This must come **after** `backward` (there is nothing to clip before) and **before** the update;
# 5. `optimizer.step()`, and return the loss as a Python float (`loss.item()`), for the progress bar and the loss curve.

# %% nbgrader={"grade": false, "grade_id": "train_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def train_step(model, loss_fn, optimizer, features, captions, lr, grad_clip=1.0):
    """One training step on one batch; returns the loss (a float, before the update).

    Args:
        model: the model; loss_fn(model, features, captions) -> scalar loss tensor.
        optimizer: a torch.optim optimiser over the model's parameters.
        features: (B, R, D) float; captions: (B, T) int64.
        lr: the learning rate of this step; grad_clip: max gradient norm, or None for no clipping.
    """
    ### BEGIN SOLUTION
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    optimizer.zero_grad()
    loss = loss_fn(model, features, captions)
    loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_train_step", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_optimizer
check("step/adamw", with_optimizer(train_step))
### BEGIN HIDDEN TESTS
check("step/sgd", with_optimizer(train_step))
check("step/sgd_clipped", with_optimizer(train_step))
check("step/no_clipping", with_optimizer(train_step))
check("step/adamw_changing_lr", with_optimizer(train_step))
check("step/two_param_groups", with_optimizer(train_step))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_val_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 11 · `validation_loss(model, loss_fn, batches)`
#
# The mean of `loss_fn(model, features, captions)` over `batches` (a list of `(features, captions)` pairs), as a Python float, measured the way the model will be used:
#
# - in **eval mode** (`model.eval()`): dropout off, so the number does not depend on random masks;
# - without gradients (`torch.no_grad()`): nothing is learned from validation data, and no graph is kept in memory;
# - and then put the model back in the mode it was in (`model.training` tells you), because the loop calls this in the middle of training: a model left in eval mode would train on without dropout.
#
# Average the batches' losses (each batch counts once).

# %% nbgrader={"grade": false, "grade_id": "validation_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def validation_loss(model, loss_fn, batches):
    """Mean loss over batches [(features, captions), ...], in eval mode without gradients; a float.
    The model's train/eval mode is the same afterwards as before."""
    ### BEGIN SOLUTION
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [loss_fn(model, features, captions).item() for features, captions in batches]
    model.train(was_training)
    return sum(losses) / len(losses)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_validation_loss", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_batches
check("validation/basic", with_batches(validation_loss))
### BEGIN HIDDEN TESTS
check("validation/uneven_batches", with_batches(validation_loss))
check("validation/one_batch", with_batches(validation_loss))
check("validation/handed_over_in_eval_mode", with_batches(validation_loss))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_fit_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 12 · the training loop: `fit(model, loss_fn, optimizer, loader, plan, val_batches, val_every, step_fn, val_fn, device)`
#
# The loop puts the pieces together. `plan` is a `starter.training.TrainingPlan`: iterating over it gives `(step, lr)` pairs, `step` = 0, 1, 2, … (0-based) with the learning rate your schedule gives that step, until the run is over (it may end early when a time budget binds, as it does while grading, so loop over the plan rather than over a step count). For each `(step, lr)`:
#
# 1. take the **next batch** `(features, captions)` from `loader`. A `DataLoader` runs out at the end of an epoch: then start the next epoch with a new `iter(loader)` (a shuffling loader draws a new order for it) and carry on. Keep one iterator between steps: `next(iter(loader))` every step would start a new epoch each time;
# 2. move the batch to `device` (`.to(device)`: the model is there, on the GPU when there is one);
# 3. `loss = step_fn(model, loss_fn, optimizer, features, captions, lr)`: your `train_step`, with `grad_clip` already set by the kit's `train`, which calls your `fit`;
# 4. record the step in `history`: `history["step"]` the number of steps done (`step + 1`), `history["loss"]` the loss, `history["lr"]` the rate;
# 5. every `val_every` steps (when `(step + 1) % val_every == 0`) append `step + 1` to `history["val_step"]` and `val_fn(model, loss_fn, val_batches)` (your `validation_loss`) to `history["val_loss"]`. The validation batches are only measured, never trained on: the validation loss is useful only as long as the model has not seen them.
#
# After the loop, if the last step did not end with a validation, measure once more, so the curve ends where training ended. Return `history`, a dict of five lists with the keys `"step"`, `"loss"`, `"lr"`, `"val_step"`, `"val_loss"`.

# %% nbgrader={"grade": false, "grade_id": "fit", "locked": false, "schema_version": 3, "solution": true, "task": false}
def fit(model, loss_fn, optimizer, loader, plan, val_batches, val_every, step_fn, val_fn, device):
    """Train `model` for the steps of `plan` on batches from `loader`, epoch after epoch.

    Args:
        model, loss_fn, optimizer: as for train_step.
        loader: an iterable of (features (B, R, D), captions (B, T)) batches, one epoch per pass (a DataLoader).
        plan: yields (step, lr) pairs: step 0, 1, 2, ... and its learning rate.
        val_batches: list of (features, captions) on `device`; val_every: validate every this many steps.
        step_fn(model, loss_fn, optimizer, features, captions, lr) -> loss (float); val_fn(model, loss_fn, batches) -> float.
        device: where the model is; batches are moved there.
    Returns:
        history: {"step": [...], "loss": [...], "lr": [...], "val_step": [...], "val_loss": [...]}.
    """
    history = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": []}
    ### BEGIN SOLUTION
    batches = iter(loader)
    for step, lr in plan:
        try:
            features, captions = next(batches)
        except StopIteration:  # the end of an epoch: start the next one
            batches = iter(loader)
            features, captions = next(batches)
        loss = step_fn(model, loss_fn, optimizer, features.to(device), captions.to(device), lr)
        history["step"].append(step + 1)
        history["loss"].append(loss)
        history["lr"].append(lr)
        if (step + 1) % val_every == 0:
            history["val_step"].append(step + 1)
            history["val_loss"].append(val_fn(model, loss_fn, val_batches))
    if history["step"] and (not history["val_step"] or history["val_step"][-1] != history["step"][-1]):
        history["val_step"].append(history["step"][-1])
        history["val_loss"].append(val_fn(model, loss_fn, val_batches))
    ### END SOLUTION
    return history


# %% nbgrader={"grade": true, "grade_id": "test_fit", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_loader
check("fit/basic", with_loader(fit))
### BEGIN HIDDEN TESTS
check("fit/whole_epochs", with_loader(fit))
check("fit/validate_once", with_loader(fit))
check("fit/every_step", with_loader(fit))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_fit_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# *How this check works:* `with_loader(fit)` runs your loop for a few steps on a tiny stand-in model with stored weights, with a stand-in loader (three or so batches per epoch, in an order that changes each epoch, as a shuffling loader's does) and a stand-in plan of stored learning rates, and with stand-ins for the step and the validation loss that do not train: the step returns the batch's loss and moves every weight by an amount that depends on the batch and the rate, the validation reads the weights. It compares the history and the weights afterwards with the stored ones, so it tests your loop alone (which batches, in which order, at which rates, validated when), whatever your `train_step` does.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_step_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Settings.** One configuration per dataset. On `shapes`, a small model (2 layers, $d_{model} = 64$, 4 heads, about 0.15 M parameters) trains 700 steps in about 15 s on a 2-core CPU. It trains without dropout: 700 steps of 64 captions see each of the 9000 training captions about 5 times, too few to overfit (the validation loss still falls at the end, see the curve below), so dropout would only slow learning down (measured with `benchmarks/bench_training.py`: with dropout 0.1 the same 700 steps score lower, and each step takes about 1.4 times as long). The COCO configurations, with far more parameters per caption, keep it. The run takes all 700 steps on any machine: a slower one takes longer (the progress bar shows the time left) but trains the same steps with the same learning rates, so the trained-model mark does not depend on the machine. When nbgrader runs this notebook, `GRADING` is True and training is cut to 30 steps within 10 seconds (`time_limit`, with the warm-up and cosine decay compressed to fit): the graded tests don't depend on training at all, and the trained-model cell measures the checkpoint you hand in.
#
# **Sanity check first: overfit one small batch.** Before a long run, train a copy of the model on one batch of 8 captions: a correct model and loss drive its loss close to zero within a few seconds. If it stalls, the model cannot even memorise 8 captions, typically because the forward pass ignores the words or the image, or the loss compares the wrong positions; a long run would only waste time. It does not catch every bug: a model whose mask lets each word see its own target overfits one batch just as well, and so does a loss averaged over padding.

# %% nbgrader={"grade": false, "grade_id": "code_15", "locked": true, "schema_version": 3, "solution": false, "task": false}
CONFIGS = {
    # model: constructor arguments; train: arguments of starter.training.train
    "shapes": dict(model=dict(d_model=64, num_heads=4, num_layers=2, dim_feedforward=256, dropout=0.0),
                   train=dict(steps=700, batch_size=64, lr=2e-3, warmup=50)),
    # COCO, for a Colab GPU (section 9): sized for a T4; times and scores are whatever your run prints
    "coco-fc7": dict(model=dict(d_model=256, num_heads=8, num_layers=3, dim_feedforward=1024, dropout=0.2),
                     train=dict(steps=15000, batch_size=256, lr=5e-4, warmup=500)),
    "coco-grid": dict(model=dict(d_model=256, num_heads=8, num_layers=3, dim_feedforward=1024, dropout=0.2),
                      train=dict(steps=15000, batch_size=128, lr=5e-4, warmup=500)),
}
config = CONFIGS.get(DATASET, CONFIGS["coco-grid"])
train_args = dict(config["train"])
if GRADING:  # nbgrader is running the notebook: a tiny budget, the graded tests don't need a trained model
    train_args.update(steps=30, time_limit=10)
batch_size = train_args.pop("batch_size")
train_loader = make_loader(train_split, batch_size, shuffle=True)   # your Dataset and collate function
val_loader = make_loader(val_split, batch_size, shuffle=False)

RUN_DIR = Path("runs")   # where checkpoints go, in the course folder (notebook 05 looks there)
if GRADING:
    RUN_DIR = Path(tempfile.mkdtemp())
CHECKPOINT = RUN_DIR / Path(checkpoint_file(DATASET)).name  # the graded shapes model, or its COCO twin

device = pick_device()
seed_everything(0)
model_config = dict(vocab_size=len(vocab), feature_dim=ds.feature_dim, num_regions=ds.num_regions,
                    max_len=ds.max_length, layers=LAYERS, **config["model"])
model = CaptioningTransformer(**model_config).to(device)
print(f"{count_parameters(model):,} parameters; batch size {batch_size}; training: {train_args}")
untrained = "the model stays untrained and nothing is saved (the cells that need a trained model say so)"
yours = dict(fit_fn=yours_if_it_passes("fit", fit, instead=untrained),
             step_fn=yours_if_it_passes("train_step", train_step, instead=untrained),
             lr_fn=yours_if_it_passes("lr_at_step", lr_at_step, instead=untrained),
             val_fn=yours_if_it_passes("validation_loss", validation_loss, instead=untrained))
can_train = all(fn is not None for fn in yours.values())

# %% nbgrader={"grade": false, "grade_id": "code_16", "locked": true, "schema_version": 3, "solution": false, "task": false}
if yours["step_fn"] is not None:
    overfit = overfit_small_batch(model, teacher_forcing_loss, train_loader, yours["step_fn"], batch_size=8,
                                  steps=60 if GRADING else 150)
else:
    print("no overfit check: it trains with your train_step")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_17", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now the real run, with your loader, training loop, schedule, training step and validation loss (under a minute on a laptop CPU for `shapes`; longer on a slower machine, with the same 700 steps). It ends with one line naming the device and the time taken. Re-running the cell starts over from the same seed; the model is saved to `CHECKPOINT` at the end with its configuration and **your vocabulary**, and notebook 05 loads it from there. Each dataset has its own file: `runs/04_captioning_transformer.pt` is the `shapes` model, the one that is graded; a COCO run saves `runs/04_captioning_transformer_coco-grid.pt` (or `_coco-fc7`) and never overwrites it.

# %% nbgrader={"grade": false, "grade_id": "code_18", "locked": true, "schema_version": 3, "solution": false, "task": false}
seed_everything(0)
model = CaptioningTransformer(**model_config).to(device)
history = None
if can_train:
    history = train(model, teacher_forcing_loss, train_loader, val_split=val_loader, device=device, seed=0, **yours,
                    **train_args)
    print(f"final validation loss {history['val_loss'][-1]:.3f}")
    save_checkpoint(CHECKPOINT, model, model_config, vocab, history=history, dataset=DATASET)
    print("saved", CHECKPOINT)
else:
    print("not trained: the training pieces above do not all pass yet")

# %% nbgrader={"grade": false, "grade_id": "code_19", "locked": true, "schema_version": 3, "solution": false, "task": false}
if history is not None:
    plot_losses(history, title=f"training on {DATASET}")
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_20", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The loss is per real word, in nats: $\log V$ for a model that guesses uniformly (printed below). It cannot reach zero on `shapes`: each image has its three phrasings among its captions, and a caption is fully determined by the image once its phrasing is chosen, so the model must guess which phrasing it is writing, $\ln 3 \approx 1.10$ nats per caption. Spread over the words of a caption, that is the floor printed below, next to your final validation loss.

# %% nbgrader={"grade": false, "grade_id": "code_loss_floor", "locked": true, "schema_version": 3, "solution": false, "task": false}
targets = encoded["train"][:, 1:]
words_per_caption = float((targets != vocab.null_idx).sum(1).float().mean())   # real target words, <END> included
print(f"uniform guess: log V = log {len(vocab)} = {math.log(len(vocab)):.2f} nats per word")
if DATASET == "shapes" and history is not None:
    print(f"phrasing floor: ln 3 / {words_per_caption:.1f} words per caption = {math.log(3) / words_per_caption:.3f} nats per word; "
          f"your final validation loss: {history['val_loss'][-1]:.3f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_20b", "locked": true, "schema_version": 3, "solution": false, "task": false}
# A checkpoint holds the weights, the constructor arguments and the vocabulary, so a model can be rebuilt without this notebook's variables:

# %% nbgrader={"grade": false, "grade_id": "code_21", "locked": true, "schema_version": 3, "solution": false, "task": false}
if history is not None:
    restored, info = load_checkpoint(CHECKPOINT, CaptioningTransformer, device=device)
    features, captions = next(iter(val_loader))
    with torch.no_grad():
        same = torch.allclose(restored(features.to(device), captions.to(device)), model.eval()(features.to(device), captions.to(device)))
    print("restored model gives the same logits:", same, "| vocabulary of", len(info["vocab"]), "words")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_22", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 8 · Generating captions
#
# At test time there is no caption to feed: the model writes its own. Start from `<START>`, ask the model for the distribution of the next word, choose a word, **append it to the input**, and repeat until `<END>` (or a length limit). Each step runs the model on the whole prefix written so far and uses the logits of its **last** position.
#
# ### Greedy decoding
#
# Choose the most likely word at every step (`argmax`). Do it for the whole batch at once: every caption advances by one word per step; a caption that has produced `<END>` is finished, and everything after its `<END>` is `<NULL>`. Stop as soon as every caption has finished (or after `max_len` words).
#
# ### Task 13 · `greedy_decode(model, features, max_len, start_idx=1, end_idx=2, null_idx=0)`
#
# Return a `(B, max_len)` int64 tensor of generated words, **without** the `<START>` token, with the `<END>` token kept, and `null_idx` after it (and in every position not generated because decoding stopped early). Create new tensors on `features.device`. Run it under `torch.no_grad()` (a decorator is fine); the model is assumed to be in eval mode already.

# %% nbgrader={"grade": false, "grade_id": "greedy_decode", "locked": false, "schema_version": 3, "solution": true, "task": false}
@torch.no_grad()
def greedy_decode(model, features, max_len, start_idx=1, end_idx=2, null_idx=0):
    """Batched greedy decoding.

    Args:
        model: maps (features (B, R, D), words (B, t)) to logits (B, t, V).
        features: (B, R, D).
        max_len: number of words to generate at most.
    Returns:
        (B, max_len) int64: the generated words (no <START>), <END> kept, null_idx after it.
    """
    ### BEGIN SOLUTION
    B, device = features.shape[0], features.device
    words = torch.full((B, 1), start_idx, dtype=torch.long, device=device)
    out = torch.full((B, max_len), null_idx, dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    for t in range(max_len):
        next_word = model(features, words)[:, -1].argmax(dim=-1)
        next_word = next_word.masked_fill(finished, null_idx)
        out[:, t] = next_word
        finished = finished | (next_word == end_idx)
        if finished.all():
            break
        words = torch.cat([words, next_word[:, None]], dim=1)
    return out
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_greedy_decode", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("greedy/basic", with_model(greedy_decode))
### BEGIN HIDDEN TESTS
check("greedy/one_image", with_model(greedy_decode))
check("greedy/all_end_early", with_model(greedy_decode))
check("greedy/other_special_tokens", with_model(greedy_decode))
check("greedy/float64", with_model(greedy_decode))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_23", "locked": true, "schema_version": 3, "solution": false, "task": false}
# *How the decoding checks work:* `with_model(greedy_decode)` runs your function on a tiny stand-in model (`starter.layers.ToyCaptioner`, not a Transformer) with stored weights, so these checks test the decoding alone, whatever your model does.
#
# ### Evaluation on held-out images
#
# BLEU-$n$ measures the overlap of $n$-grams (1 to 4 words) between the generated caption and all the reference captions of the image (precision, with a penalty for captions that are too short); BLEU-4 is the usual headline number. CIDEr weighs $n$-grams by how specific they are (TF-IDF over the references), so a correct rare word counts more than "a"; it is scaled by 10, and on `shapes` values far above 1 are normal because every scene's captions share most words. ROUGE-L is based on the longest common subsequence. All three are computed by `pycocoevalcap` (tokenised in Python, so no Java is needed) on the **validation** images, which the model never trained on.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_eval_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 14 · the evaluation script: `evaluate_captions(model, decode_fn, split, vocab, max_len, batch_size=250)`
#
# Caption every image of `split` and score the captions against **all** the reference captions of each image:
#
# 1. put the model in eval mode (`model.eval()`: dropout off) and run everything under `torch.no_grad()` (no graph is built: faster, and less memory);
# 2. for the images `0 .. split.num_images - 1`, in batches of `batch_size` image indices (the last batch may be smaller): `features = split.features(idx).to(device)` (`device`: the model's, `next(model.parameters()).device`), then `tokens = decode_fn(model, features, max_len)`, an `(n, max_len)` tensor of word indices;
# 3. turn each row into a string: stop at `vocab.end_idx`, skip `vocab.null_idx` and `vocab.start_idx`, look the other indices up in `vocab.idx_to_word`, join with single spaces;
# 4. score: `caption_scores(references, generated)` (given, from `starter.metrics`, with dicts image index → list of reference strings, `split.references(i)`, and image index → generated string) returns BLEU-1..4, CIDEr and ROUGE-L; add `"exact_match"`: the fraction of images whose caption equals one of its references word for word (compare `tokenize`d words).
#
# Return `(scores, generated)`: the dict of scores and the list of generated strings, in image order.
#
# BLEU counts the n-grams of a generated caption that appear in *any* reference of its image: with all references, a caption that says the same thing in another valid phrasing is not punished, which is why COCO gives five references per image. CIDEr weights n-grams by how rare they are across the references of all evaluated images, so it rewards the specific words ("red", "left") over the ubiquitous ones ("a", "the").

# %% nbgrader={"grade": false, "grade_id": "evaluate_captions", "locked": false, "schema_version": 3, "solution": true, "task": false}
def evaluate_captions(model, decode_fn, split, vocab, max_len, batch_size=250):
    """Caption every image of `split` with decode_fn(model, features, max_len) and score the captions.

    Returns:
        (scores, generated): scores is caption_scores' dict plus "exact_match"; generated the list of
        caption strings, generated[i] for image i.
    """
    ### BEGIN SOLUTION
    device = next(model.parameters()).device
    model.eval()
    generated = []
    with torch.no_grad():
        for start in range(0, split.num_images, batch_size):
            idx = list(range(start, min(split.num_images, start + batch_size)))
            tokens = decode_fn(model, split.features(idx).to(device), max_len)
            for row in tokens.tolist():
                words = []
                for t in row:
                    if t == vocab.end_idx:
                        break
                    if t not in (vocab.null_idx, vocab.start_idx):
                        words.append(vocab.idx_to_word[t])
                generated.append(" ".join(words))
    references = {i: split.references(i) for i in range(split.num_images)}
    scores = caption_scores(references, dict(enumerate(generated)))
    hits = [tokenize(generated[i]) in [tokenize(r) for r in refs] for i, refs in references.items()]
    scores["exact_match"] = sum(hits) / len(hits)
    return scores, generated
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_evaluate_captions", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_split
check("evaluate/basic", with_split(evaluate_captions))
### BEGIN HIDDEN TESTS
check("evaluate/uneven_batches", with_split(evaluate_captions))
check("evaluate/many_references", with_split(evaluate_captions))
check("evaluate/words_after_end", with_split(evaluate_captions))
check("evaluate/one_batch", with_split(evaluate_captions))
check("evaluate/unknown_words", with_split(evaluate_captions))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_eval_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Your evaluation of the trained model, with greedy decoding, on the validation images (all of them for `shapes`, the first 5000 for COCO). BLEU-4 alone hides failures: on `shapes` a caption with the two objects swapped still shares most of its 4-grams with the references, so the exact-match rate, the share of captions that are *fully* right, is printed too.

# %% nbgrader={"grade": false, "grade_id": "code_24", "locked": true, "schema_version": 3, "solution": false, "task": false}
evaluate = yours_if_it_passes("evaluate_captions", evaluate_captions,
                              instead="no scores and no generated captions until it passes")
eval_images = 100 if GRADING else (None if DATASET == "shapes" else 5000)
eval_split = val_split if eval_images is None else val_split.head(eval_images)
generated = None
if evaluate is not None:
    t0 = time.perf_counter()
    scores, generated = evaluate(model, greedy_decode, eval_split, vocab, max_len=ds.max_length - 1)
    print(f"greedy, {len(generated)} validation images ({time.perf_counter() - t0:.1f} s):")
    print(format_scores(scores))
    print(f"exact match: {scores['exact_match']:.1%} of the captions equal one of their image's references")

# %% nbgrader={"grade": false, "grade_id": "code_25", "locked": true, "schema_version": 3, "solution": false, "task": false}
if generated is not None:
    show = [0, 1, 2, 3, 4, 5]
    images = [val_split.image(i) for i in show] if DATASET != "coco-fc7" else None
    show_captions(images, [generated[i] for i in show], [val_split.references(i) for i in show],
                  title="validation images: generated caption (bold) and the ground truth")
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_error_kinds", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### What kind of mistakes?
#
# BLEU-4 and exact match say how often the captions are wrong; on `shapes` we can also say *how*. Each wrong caption is compared with its image's references (`starter.metrics.shapes_error`): the relation between two objects reversed, a wrong colour, shape, size or position (of a single object), several of these at once, or other wording. The counts are printed and plotted, with one wrong caption of each kind that occurs.

# %% nbgrader={"grade": false, "grade_id": "code_error_kinds", "locked": true, "schema_version": 3, "solution": false, "task": false}
if DATASET == "shapes" and generated is not None:
    from starter.metrics import SHAPES_ERRORS, shapes_error
    kinds = [shapes_error(generated[i], eval_split.references(i)) for i in range(len(generated))]
    counts = Counter(kinds)
    two = [i for i in range(len(generated)) if len(eval_split.objects(i)) == 2]
    print(f"{len(generated)} validation captions: " + ", ".join(f"{k} {counts[k]}" for k in SHAPES_ERRORS if counts[k]))
    print(f"relation reversed in {sum(kinds[i] == 'relation' for i in two)} of the {len(two)} two-object images "
          f"({sum(kinds[i] == 'relation' for i in two) / max(1, len(two)):.1%})")
    wrong = [k for k in SHAPES_ERRORS[1:] if counts[k]]
    if wrong:
        plt.figure(figsize=(6, 2.6))
        plt.bar(wrong, [counts[k] for k in wrong], color="tab:red")
        plt.ylabel("captions"); plt.title(f"wrong captions by kind ({len(generated)} validation images)")
        plt.show()
        examples = [kinds.index(k) for k in wrong][:6]
        show_captions([val_split.image(i) for i in examples], [f"[{kinds[i]}] {generated[i]}" for i in examples],
                      [val_split.references(i) for i in examples], title="one wrong caption of each kind (generated in bold)")
        plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_trained_model", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Graded: your trained model
#
# The next test cell measures the model you trained in section 7, as it was saved: it loads `runs/04_captioning_transformer.pt` (the checkpoint of your `shapes` run) into your `CaptioningTransformer`, captions images with your `greedy_decode`, and counts the captions that are exactly one of their image's references. Its images are 100 new scenes, drawn like the validation images (combinations never seen in training); the public case asks for 65 % of them right. While grading, the same is asked on 100 scenes nobody has seen: 40 %, 55 % and 65 % right earn a point each. Compare with the exact match your evaluation printed above.
#
# **Hand in the checkpoint with your notebooks** (the `runs/` folder next to them): the grader does not train your model again, it loads that file. Retraining or changing the model after saving does not change what is graded until you save again.

# %% nbgrader={"grade": true, "grade_id": "test_trained_model", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.layers import trained_captioner
check("trained/new_scenes", trained_captioner(CaptioningTransformer, greedy_decode))
### BEGIN HIDDEN TESTS
check("trained/hidden_scenes_40", trained_captioner(CaptioningTransformer, greedy_decode))
check("trained/hidden_scenes_55", trained_captioner(CaptioningTransformer, greedy_decode))
check("trained/hidden_scenes_65", trained_captioner(CaptioningTransformer, greedy_decode))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_bleu_exact", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 4 (2 points).** Your evaluation printed a BLEU-4 and an exact-match rate for the same captions. (a) How can a caption that matches none of its image's references still score a high BLEU-4? Name a kind of mistake on `shapes` that BLEU barely punishes (the breakdown above counts them), and say why, in terms of the n-grams it keeps. (b) Exact match is the stricter number here; why would it be useless on COCO?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_bleu_exact", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) BLEU-4 is a (geometric mean of) n-gram precisions against *any* reference: a caption whose pieces each appear in some reference scores high even if the whole is wrong. Swapping the two objects of a relation ("a red circle to the left of a blue square" for "a blue square to the left of a red circle") keeps every 1- to 3-gram inside each noun phrase and most 4-grams, and the other phrasing of the same scene ("a blue square to the right of a red circle") supplies more of them; a wrong colour or size changes only the few n-grams that contain that word. (b) COCO captions are free text written by different people: there are many correct captions per image and the five references cover few of them, so almost no generated caption, however good, equals a reference word for word; exact match would be near zero for every model and would not rank them.
#
# **Rubric.** 1 point: n-gram overlap with any reference explains it, with a concrete shapes error (relation swap, or colour/size/shape) and what happens to its n-grams. 1 point: COCO has many valid phrasings, so exact match is near zero for all models.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_26", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Where does the model look? The cross-attention of the last layer, averaged over heads, for each generated word of the first validation image, over the $7 \times 7$ regions (notebook 05 studies this in detail):

# %% nbgrader={"grade": false, "grade_id": "code_27", "locked": true, "schema_version": 3, "solution": false, "task": false}
if ds.num_regions > 1:
    model.eval()
    feats = val_split.features([0]).to(device)
    words = greedy_decode(model, feats, ds.max_length - 1)[0]
    length = int((words != vocab.null_idx).sum())
    inputs = torch.cat([torch.tensor([vocab.start_idx], device=device), words[:length - 1]])[None]
    with torch.no_grad():
        _, att = model(feats, inputs, return_attention=True)
    cross = att["cross"][-1][0].mean(0).cpu()                 # (T, R), averaged over heads
    labels = [vocab.idx_to_word[int(w)] for w in words[:length]]
    show_attention(cross, queries=labels, keys=[f"{r // ds.grid_shape[1]},{r % ds.grid_shape[1]}" for r in range(ds.num_regions)],
                   title=f"last layer cross-attention: '{vocab.decode(words)}'", annotate=False)
    plt.gcf().set_size_inches(13, 3.6)
    plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_28", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Beam search
#
# Greedy decoding commits to the best word at each step, but the best caption need not start with the best first word. **Beam search** keeps the `beam_width` ($k$) best partial captions ("hypotheses") instead of one. Its score is the sum of the log-probabilities of its words. At each step:
#
# 1. run the model on every live hypothesis ($n$ of them; one, `<START>`, at the first step) and take the log-probabilities of the next word: $n \times V$ candidates, each scored by the hypothesis' score + the word's log-probability;
# 2. keep the best $k - f$ candidates **over all of them** (not the best word of each hypothesis), $f$ being the number of hypotheses finished so far: `topk` over the flattened scores, then `index // V` is the hypothesis and `index % V` the word;
# 3. a kept candidate whose word is `<END>`, or that has reached `max_len` words, is **finished**: set it aside with its score; the others live on. Stop when no hypothesis is alive. The beam narrows as hypotheses finish, and there are at most `max_len` steps.
#
# **The graded variant is this narrowing beam.** A common variant keeps $k$ hypotheses alive at every step until $k$ have finished; it finds other captions on some of the checks' cases and loses points there. For example, with $k = 3$: when one hypothesis has finished by step 2, step 3 keeps the best $3 - 1 = 2$ candidates, and once a second finishes, one; the search ends when all three are finished.
#
# **Length handling.** A sum of log-probabilities only goes down with every word, so raw scores prefer short captions. Finished hypotheses are compared by their **length-normalised** score $\frac{\sum \log p}{L^{\alpha}}$, with $L$ the number of words including `<END>` and $\alpha$ = `length_penalty`: $\alpha = 0$ is the raw sum, $\alpha = 1$ the mean log-probability per word. Only this final comparison is normalised; during the search hypotheses are ranked by their raw sum (they all have the same length at a given step).
#
# With $k = 1$ this is greedy decoding.
#
# ### Task 15 · `beam_search(model, features, beam_width, max_len, start_idx=1, end_idx=2, null_idx=0, length_penalty=0.7)`
#
# `features` is `(B, R, D)`; handle one image at a time (a loop over the batch is fine) and its hypotheses as a batch: `features[b:b+1].expand(n, -1, -1)` for $n$ live hypotheses. Return the best finished caption of each image in the format of `greedy_decode`: `(B, max_len)` int64, no `<START>`, `<END>` kept, `null_idx` after it.

# %% nbgrader={"grade": false, "grade_id": "beam_search", "locked": false, "schema_version": 3, "solution": true, "task": false}
@torch.no_grad()
def beam_search(model, features, beam_width, max_len, start_idx=1, end_idx=2, null_idx=0, length_penalty=0.7):
    """Beam search with length-normalised final scores.

    Args:
        model: maps (features (n, R, D), words (n, t)) to logits (n, t, V).
        features: (B, R, D).
        beam_width: k, the number of hypotheses kept.
        max_len: number of words to generate at most.
        length_penalty: alpha; finished hypotheses are ranked by sum(log p) / length**alpha.
    Returns:
        (B, max_len) int64, like greedy_decode.
    """
    ### BEGIN SOLUTION
    B, device = features.shape[0], features.device
    out = torch.full((B, max_len), null_idx, dtype=torch.long, device=device)
    for b in range(B):
        words = torch.full((1, 1), start_idx, dtype=torch.long, device=device)
        scores = torch.zeros(1, dtype=features.dtype, device=device)
        finished = []  # (normalised score, words without <START>)
        for step in range(max_len):
            n = words.shape[0]
            log_probs = F.log_softmax(model(features[b:b + 1].expand(n, -1, -1), words)[:, -1], dim=-1)
            V = log_probs.shape[-1]
            candidates = (scores[:, None] + log_probs).flatten()
            top, index = candidates.topk(min(beam_width - len(finished), candidates.numel()))
            hyp, word = index // V, index % V
            words = torch.cat([words[hyp], word[:, None]], dim=1)
            done = (word == end_idx) | (step == max_len - 1)
            for j in torch.nonzero(done).flatten().tolist():
                finished.append((top[j].item() / (step + 1) ** length_penalty, words[j, 1:]))
            words, scores = words[~done], top[~done]
            if words.shape[0] == 0:
                break
        best = max(finished, key=lambda f: f[0])[1]
        out[b, :len(best)] = best
    return out
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_beam_search", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("beam/basic", with_model(beam_search))
### BEGIN HIDDEN TESTS
check("beam/width_one_is_greedy", with_model(beam_search))
check("beam/raw_scores", with_model(beam_search))
check("beam/batch_wide", with_model(beam_search))
check("beam/other_special_tokens", with_model(beam_search))
check("beam/narrowing_beam", with_model(beam_search))
check("beam/end_in_length", with_model(beam_search))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_29", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Greedy and beam search on the same validation images, with the time each took. Beam search costs about $k$ times the computation of greedy decoding, and this simple version decodes one image at a time:

# %% nbgrader={"grade": false, "grade_id": "code_30", "locked": true, "schema_version": 3, "solution": false, "task": false}
n_compare = 20 if GRADING else 100
compare_split = val_split.head(n_compare)


def timed_evaluation(decode_fn):
    """(scores with the seconds it took, generated captions) of your evaluate_captions on the first n_compare images."""
    t0 = time.perf_counter()
    scores, captions = evaluate(model, decode_fn, compare_split, vocab, max_len=ds.max_length - 1)
    return dict(scores, seconds=time.perf_counter() - t0), captions


if evaluate is not None:
    greedy_scores, _ = timed_evaluation(greedy_decode)
    beam_scores, beam_captions = timed_evaluation(lambda m, f, n: beam_search(m, f, 3, n))
    print(f"first {n_compare} validation images")
    for name, s in (("greedy", greedy_scores), ("beam, k = 3", beam_scores)):
        print(f"{name:11} ({s['seconds']:4.1f} s): {format_scores(s)}  exact match {s['exact_match']:.1%}")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_sampling", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### A third decoder: sampling
#
# Greedy and beam search both look for the most likely caption. **Sampling** draws each word at random from the model's distribution instead, with a **temperature** $\tau$: $p_\tau(w) \propto \exp(\text{logit}_w / \tau)$. $\tau < 1$ sharpens the distribution (towards greedy), $\tau > 1$ flattens it. The cell below draws 3 captions per image at several temperatures, on the same images as the comparison above, and measures accuracy (exact match, averaged over the samples) against diversity (how many different captions the 3 samples of an image give, 1 to 3).

# %% nbgrader={"grade": false, "grade_id": "code_sampling", "locked": true, "schema_version": 3, "solution": false, "task": false}
@torch.no_grad()
def sample_decode(model, features, max_len, temperature=1.0, generator=None, start_idx=1, end_idx=2, null_idx=0):
    """Like greedy_decode, but each word is drawn from softmax(logits / temperature) instead of the argmax."""
    B, device = features.shape[0], features.device
    words = torch.full((B, 1), start_idx, dtype=torch.long, device=device)
    out = torch.full((B, max_len), null_idx, dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    for t in range(max_len):
        probs = F.softmax(model(features, words)[:, -1].float() / temperature, dim=-1)
        next_word = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(device)
        next_word = next_word.masked_fill(finished, null_idx)
        out[:, t] = next_word
        finished = finished | (next_word == end_idx)
        if finished.all():
            break
        words = torch.cat([words, next_word[:, None]], dim=1)
    return out


if evaluate is not None:
    g = torch.Generator().manual_seed(0)
    temperatures, accuracy, diversity = [0.5, 1.0, 1.5, 2.0], [], []
    for tau in temperatures:
        def sample(m, f, n, tau=tau):
            return sample_decode(m, f, n, temperature=tau, generator=g)
        runs = [timed_evaluation(sample) for _ in range(3)]
        accuracy.append(sum(s["exact_match"] for s, _ in runs) / 3)
        diversity.append(sum(len(set(caps)) for caps in zip(*(c for _, c in runs))) / n_compare)
        print(f"sampling, temperature {tau}: exact match {accuracy[-1]:.1%}, {diversity[-1]:.2f} different captions "
              f"in 3 samples per image")
    plt.figure(figsize=(5.5, 3.6))
    plt.plot(accuracy, diversity, "o-", label="sampling")
    for tau, a, d in zip(temperatures, accuracy, diversity):
        plt.annotate(f"τ = {tau}", (a, d), textcoords="offset points", xytext=(6, 4))
    plt.plot([greedy_scores["exact_match"]], [1.0], "s", label="greedy")
    plt.plot([beam_scores["exact_match"]], [1.0], "^", label="beam, k = 3")
    plt.xlabel("exact match"); plt.ylabel("different captions per 3 samples"); plt.ylim(0.9, 3.1)
    plt.title(f"accuracy against diversity, first {n_compare} validation images"); plt.legend()
    plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_decoding", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 5 (2 points).** Use the numbers and the plot above. (a) Why can beam search find a caption that greedy decoding misses? Say what it gained and what it cost here, from the printed scores and times. (b) What does the temperature do to accuracy and diversity, as measured, and for what kind of use would you pick sampling over beam search?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_decoding", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) Greedy commits to the single most likely word at each step; a caption whose first word is slightly less likely can still be the most likely caption overall, and beam search keeps $k$ prefixes so such a caption survives until its later words make up for it. Here (first 100 validation images) the beam raised the exact match and every score, at several times greedy's time: this version runs the model once per hypothesis and image, while greedy runs it once per step for the whole batch. (b) Low temperature sharpens the distribution: samples are nearly always the greedy caption (high exact match, close to 1 distinct caption per 3 samples); high temperature flattens it: more distinct captions but more wrong words, so exact match falls. The plot shows the trade-off. Sampling suits uses that want variety (several different captions for one image, dialogue, creative text, data augmentation); beam search suits one best, accurate caption.
#
# **Rubric.** 1 point: beam keeps alternatives whose joint probability wins later, with the measured gain and cost. 1 point: the direction of the trade-off as measured (accuracy down, diversity up with temperature) and a sensible use for sampling.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_leaky", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### What the causal mask is for, measured
#
# The same model, trained the same way, but with a **leaky mask**: every word may attend to every word of the input, later ones included. The cell trains it briefly and prints its teacher-forced validation loss and its greedy exact match on the same images as above, next to your model's.

# %% nbgrader={"grade": false, "grade_id": "code_leaky", "locked": true, "schema_version": 3, "solution": false, "task": false}
class LeakyCaptioner(CaptioningTransformer):
    """Your model with a mask that allows everything: position t also sees the words after it."""

    def forward(self, features, captions, return_attention=False):
        R, T = features.shape[1], captions.shape[1]
        memory = self.feature_proj(features) + self.region_embed.weight[:R]
        x = self.pos_encoding(self.word_embed(captions))
        for layer in self.decoder_layers:
            x, _, _ = layer(x, memory, tgt_mask=torch.ones(T, T, dtype=torch.bool, device=captions.device))
        return self.vocab_head(self.final_norm(x))


if history is not None and evaluate is not None:
    seed_everything(0)
    leaky = LeakyCaptioner(**model_config).to(device)
    leaky_history = train(leaky, teacher_forcing_loss, train_loader, val_split=val_loader, device=device, seed=0,
                          **yours, **dict(train_args, steps=min(300, train_args["steps"])))
    leaky_scores, leaky_captions = evaluate(leaky, greedy_decode, compare_split, vocab, max_len=ds.max_length - 1)
    print(f"your model ({len(history['val_loss'])} validations): teacher-forced val loss {history['val_loss'][-1]:.4f}, "
          f"greedy exact match {greedy_scores['exact_match']:.1%}")
    print(f"leaky mask ({len(leaky_history['step'])} steps):      teacher-forced val loss {leaky_history['val_loss'][-1]:.4f}, "
          f"greedy exact match {leaky_scores['exact_match']:.1%}")
    print("leaky model's first captions:", leaky_captions[:3])
else:
    print("skipped: it trains and evaluates with your training pieces and evaluate_captions")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_causal_mask", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 6 (2 points).** Explain the two numbers of the leaky model printed above: (a) why its teacher-forced validation loss is what it is, compared with your model's (look at the teacher-forcing table of section 6: which input word does position $t$ have to predict?), and (b) why its generated captions are what they are.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_causal_mask", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) With teacher forcing the target at position $t$ is the input word at position $t+1$. Without the causal mask position $t$ can attend to position $t+1$ and simply copy that word, so the loss drops far below what predicting the next word honestly allows (below the phrasing floor printed in section 7), without the model learning the language or looking at the image much. (b) At generation time there is no word $t+1$ yet: the prefix ends at $t$, so the copying shortcut has nothing to copy and the model, which never learned to predict from the past alone, produces nonsense (repeated or random words, often no `<END>`). The low loss measured a different, easier task than captioning.
#
# **Rubric.** 1 point: position $t$ sees its own target (the next input word) and copies it. 1 point: at generation there is no future word, so the learned shortcut fails; the teacher-forced loss does not measure generation.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_exposure_bias", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 7 (2 points).** Even with a correct mask, teacher forcing trains on the *true* previous words while generation feeds back the model's *own*. (a) What is this mismatch called, and how can one wrong word early in a caption spoil the words after it? Look for an example among your model's wrong captions (above, or notebook 05's failure cases) and quote it if you find one. (b) Name one way to reduce it and say why it helps.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_exposure_bias", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) Exposure bias: during training the model only ever sees prefixes from the data; at test time a wrong word puts it on a prefix it never saw, where its predictions are less reliable, so errors compound (e.g. after a wrong colour it may describe the wrong object, or after choosing the 'there is a ... and a ...' phrasing with the wrong first object it cannot recover). (b) Scheduled sampling (feed some of the model's own predictions during training, more as training goes on), sequence-level training on the model's own samples (e.g. self-critical training with CIDEr as the reward), or beam search at test time (keeps alternatives, so one bad word is less often fatal); each exposes the model to, or protects it from, its own mistakes.
#
# **Rubric.** 1 point: the name and the compounding mechanism (prefixes never seen in training). 1 point: one remedy with a correct reason. An example from the student's own output is welcome but not required.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("04_captioning_transformer", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_31", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 9 · COCO on a GPU
#
# The same notebook trains on COCO: change `DATASET` in section 1 and run everything on a GPU (on Colab: *Runtime → Change runtime type → GPU*; `pick_device` finds it). Get the data first:
#
# - `"coco-fc7"`: the CS231n files (one 512-d fc7 vector per image, so $R = 1$ and cross-attention has a single region to look at), `python -m data.coco_cs231n` (about 1 GB download);
# - `"coco-grid"`: $7 \times 7$ grid features built from the official COCO images, `python -m data.coco_grid` (downloads images and runs a CNN: build it once on a GPU, see its `--help`).
#
# The configurations in `CONFIGS` above are sized for a Colab T4 GPU: `coco-fc7` and `coco-grid` both train a 3-layer model with $d_{model} = 256$ and 8 heads for 15 000 steps (batches of 256 and 128 captions). This course kit was not run on COCO (its builders had no COCO data), so no time or score is claimed here: the training cell prints your time, and the evaluation cell your scores.
#
# For comparison, published models with fine-tuned CNNs and much larger decoders reach BLEU-4 ≈ 0.35–0.40 and CIDEr ≈ 1.1–1.3 on COCO; the point here is the method. Evaluation uses the first 5000 validation images (`eval_images`); with one vector per image, CS231n's fc7 files come without usable image links, so no images are shown for `coco-fc7`.
#
# ## Summary
#
# - The image enters as **memory tokens**: grid features projected to $d_{model}$, plus a learned embedding of each region's position; every decoding step attends to all regions (a new context per word, as in *Show, Attend and Tell*).
# - Words: embeddings + positional encoding, a **causal mask** (position $t$ sees $0 \ldots t$), pre-norm decoder blocks, a final LayerNorm and a vocabulary head.
# - **Teacher forcing** trains all positions in parallel: inputs `captions[:, :-1]`, targets `captions[:, 1:]`; the loss is averaged over **real words only**, never over `<NULL>` padding.
# - Generation feeds back the model's own words: **greedy** takes the argmax and stops each caption at `<END>`; **beam search** keeps the $k$ best hypotheses and compares finished ones by length-normalised log-probability.
# - Overfit a small batch before a long run; evaluate with BLEU, CIDEr and ROUGE-L on held-out images, and look at the captions.
#
# Next, **05 · Visualising attention** loads the checkpoint saved above and looks inside the trained model.
