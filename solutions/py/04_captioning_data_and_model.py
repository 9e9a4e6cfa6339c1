# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 04 · The captioning Transformer: data and model
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/04_captioning_data_and_model.ipynb)
#
# Notebooks 01–03 built the parts: attention, positional encoding, multi-head attention and the decoder block. Notebooks 04–06 stack them into a model that **writes a caption for an image**: here you prepare the data and build the model; notebook 05 trains and evaluates it; notebook 06 decodes with beam search and sampling; notebook 07 looks inside the trained model.
#
# You write:
#
# - **data preparation**: `extract_grid_features` turns images into the grid features the model reads; `build_vocab` and `encode_captions` turn caption text into index tensors; `CaptionFeatures` (a PyTorch `Dataset`) and `collate_captions` feed them to a `DataLoader`;
# - **the model and its loss**: `CaptioningTransformer.forward`, `caption_loss`, `teacher_forcing_loss`;
#
# and the notebook ends with the first sign that they work together: your model, trained for 150 steps on 8 captions, **memorises them**.
#
# Given: the dataset files and their reader (`starter.data`), the layers of PyTorch as an alternative to yours (`starter.layers`) and the plots. Each piece you write is then **used**: the loaders are built from your vocabulary, encoding, `Dataset` and `collate_captions`, and notebook 05 trains on them. The kit has no version of these pieces: while one does not pass its public check yet, the notebook says so in one line and goes on without it, with the data the dataset file stores (its vocabulary, encoded captions and features) where that can stand in, and otherwise skipping what needs the piece.
#
# **How to work.** Fill in the cells marked `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line) and run the test cell below each one: it prints `✓ … passed` or one line naming the likely bug. The graded version of each test cell also runs hidden cases. Don't edit or delete test cells. Keep the layers declared in the given part of `CaptioningTransformer.__init__` as they are: the checks load stored weights into them by name. The checks never use your layers from notebooks 02–03 (they build the model with PyTorch's layers), so your grade here does not depend on those notebooks.

# %% nbgrader={"grade": false, "grade_id": "code_02", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["colab"]
# Run this cell first. On Google Colab it installs the course kit (only what Colab lacks, once per runtime)
# and, with USE_DRIVE, keeps your notebooks and checkpoints in one Google Drive folder. Locally it installs
# nothing (install the kit as the README says); everywhere it makes unfinished tasks show as one line, not a traceback.
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

from tqdm.auto import trange

from starter.checks import check
from starter.data import StoredBatches, Vocab, load_dataset
from starter.layers import get_layers, with_attention, with_model
from starter.pipeline import yours_if_it_passes
from starter.plotting import show_captions
from starter.training import GRADING, seed_everything

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
# The default dataset, `shapes`, is generated: scenes of one or two coloured shapes on a grid, captioned in several phrasings ("a small red circle in the top left", "in the top left there is a small red circle"), with $7 \times 7$ grid features of a pretrained EfficientNet and the small images kept for display. It trains on a laptop CPU (notebook 05 prints how long it took on yours) and its captions can be checked by eye. COCO (notebook 05, section 6) uses the same interface. The dataset is chosen here, in one line: a dataset that is not on disk is an error naming the command that fetches it.

# %% nbgrader={"grade": false, "grade_id": "code_05", "locked": true, "schema_version": 3, "solution": false, "task": false}
DATASET = "shapes"   # or "coco-fc7" (CS231n features: python -m data.coco_cs231n), "coco-grid" (python -m starter.build_coco_grid)

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
                  [train_split.references(i) for i in idx], title="training images, one caption each (bold) and all their captions",
                  label="caption")
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
# 1. `images` is a batch of RGB images, `(B, H, W, 3)` uint8 (a NumPy array or a tensor). Anything else (a grayscale batch `(B, H, W)`, RGBA `(B, H, W, 4)`, one image without its batch axis) would fail deep inside the CNN or, worse, be misread without an error: raise a `ValueError` that names the shape you got. The CNN takes the layout of PyTorch's convolutions, `(B, 3, H, W)`, as floats in $[0, 1]$ (the uint8 values divided by 255); moving the channel axis is not a reshape, which would scramble the pixels;
# 2. each image is resized to `size` × `size`, bilinearly and with antialiasing (the network was trained at a fixed resolution; antialiasing averages the pixels a shrink covers instead of skipping them; see `torch.nn.functional.interpolate`);
# 3. normalise each channel with the ImageNet statistics the network was trained with, `(x - IMAGENET_MEAN) / IMAGENET_STD` (given below, one value per channel);
# 4. the CNN runs in **eval mode** (BatchNorm then uses its stored statistics, not the batch's) and without gradients, on the device its parameters are on;
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
# Your extraction on the real network. `shapes` was built with EfficientNet-Lite0 (ImageNet weights), cut after block 10, on its 112-pixel images: a $7 \times 7$ map of 112 channels per image, reduced to 64 channels by a PCA stored in the file. Run your function with that network on validation images, apply the stored PCA, and compare with the features in the file: they agree to within a few per cent of their typical size (printed below), not exactly, because the file stores them as float16 and a CNN's arithmetic differs a little from machine to machine. The check above used a tiny stand-in network; this is the full-size one.

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
              f"{mine.shape}; largest difference to the stored features {abs(mine - stored).max():.3f}, "
              f"{abs(mine - stored).max() / abs(stored).mean():.1%} of their typical size {abs(stored).mean():.2f}")
else:
    print("this step runs on the shapes images (COCO grid features are built by python -m starter.build_coco_grid)")

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
# Your vocabulary and encoding, used: the loaders of this notebook, and the training of notebook 05, use the vocabulary you build from the training captions and your encoding of both splits.

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
# - `caption`: row `i` of `captions` **up to and including its `<END>`** (index 2 in every vocabulary of the course, `SPECIAL_TOKENS` above), padding removed, a 1-D int64 tensor. A row without `<END>` (an empty or damaged caption) has no right length: raise a `ValueError` that names the row `i`. Padding is added back per batch, to the longest caption of that batch, which is shorter than `max_len` for most batches.
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
# What it computes, in this order:
#
# - the **memory** the words attend to: one token per region, the region's projected feature plus the learned embedding of its region index;
# - the **words**: their embeddings with the position vectors added by `pos_encoding` (the embeddings are not scaled by $\sqrt{d_{model}}$);
# - the decoder layers in turn, each attending to the memory under a **causal mask**, a bool `(T, T)` mask with True = may attend: position $t$ sees positions $0 \ldots t$, itself included, and nothing later. This is what makes training on whole captions honest: without it the word at position $t$ could read the word it is supposed to predict. A layer is called as in notebook 03, `layer(x, memory, tgt_mask=mask)`, and returns `(x, self_weights, cross_weights)`;
# - the **logits**: the final LayerNorm, then the vocabulary head; raw scores, no softmax (the loss applies it).
#
# Return the logits `(B, T, V)`; with `return_attention=True` return `(logits, {"self": [...], "cross": [...]})`, the per-layer weight lists, `(B, h, T, T)` and `(B, h, T, R)` per layer (notebook 07 draws them).
#
# No padding mask is needed for the words: padding only ever comes *after* a caption's last real word, and the causal mask already hides later positions from every real word. Padded positions still get (meaningless) outputs; the loss ignores them. The mask must be on the inputs' device, so that the model runs on a GPU too.

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
# **Cross-check against PyTorch.** With `layers="torch"` your model's decoder layers are `nn.TransformerDecoderLayer`s, so the same computation can be done by PyTorch's own `nn.TransformerDecoder` (which applies the final LayerNorm itself) with your layers' weights copied into it. `matches_torch_decoder` (in `starter/layers.py`) records the word vectors and the image memory your forward hands its first decoder layer, runs PyTorch's stack on them with PyTorch's causal mask (True = blocked, the opposite of ours), applies your `vocab_head`, and says whether that equals your logits. A missing or inverted causal mask, a skipped final norm or layers applied in another order all show up as `False`:

# %% nbgrader={"grade": false, "grade_id": "code_11", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.layers import matches_torch_decoder

torch_model = CaptioningTransformer(len(vocab), ds.feature_dim, ds.num_regions, layers="torch").eval()
with torch.no_grad():
    logits, att = torch_model(features, captions, return_attention=True)
print("logits", tuple(logits.shape), "| matches nn.TransformerDecoder:", matches_torch_decoder(torch_model, features, captions))
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


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_padding", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 5 (2 points).** The cell above printed the share $s$ of padding among the target positions of your batches, and what it would be if every caption were padded to $T$. (a) Suppose the loss were averaged over every position, padding included, and the model had learned to predict `<NULL>` after `<END>` (a loss of about 0 there). Then the loss, and the gradient, of the real words are scaled by a factor: which, in terms of $s$, and what is it for each of the two shares printed? (b) Why does this amount to a learning rate that changes from batch to batch, and why does padding each batch only to its longest caption (your `collate_captions`) not remove the need to leave padding out of the loss?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_padding", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) The mean over all positions is the sum over the real words divided by all positions, $N / (1 - s)$ of them: it is $(1 - s)$ times the mean over the real words, and so is its gradient. Each of the two shares printed gives its own factor $1 - s$, the larger share (every caption padded to $T$) the smaller factor. (b) An update is the learning rate times the gradient, so scaling the gradient by $1 - s$ is the same as scaling the learning rate by it; $s$ depends on which captions a batch happens to hold (a batch of short captions is more padding), so each batch trains the real words at a different rate, and losses of batches or datasets with different padding are not comparable. Padding to the longest caption of the batch makes $s$ smaller but not 0: every caption shorter than the longest is still padded, so only dividing by the number of real words gives every real word the same weight in every batch.
#
# **Rubric.** 1 point: the factor $1 - s$, with the two printed shares put in (the student's own numbers). 1 point: the factor varies with the batch (an effective learning rate per batch) and padding to the longest caption leaves $s > 0$. Half a point for "padding dilutes the loss" without the factor.
# ### END SOLUTION

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
# Split the captions into inputs and targets as in the table, run the model, and return your `caption_loss`. The memorisation run at the end of this notebook, and the training loop of notebook 05, call this function for every batch.

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

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_optimizer", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7 · The optimiser
#
# Training (notebook 05, and the small run at the end of this notebook) updates the weights with an optimiser. Which weights it treats how depends on the model you just built: its weight matrices and embedding tables on one side, its biases and LayerNorm parameters on the other.
#
# ### Task 9 · `make_optimizer(model, lr, weight_decay)`
#
# The optimiser is **AdamW** (Loshchilov & Hutter, 2019): Adam's update plus **weight decay**, a pull of every weight towards zero by `lr * weight_decay` of its value at each step, so that weights do not grow without need. AdamW applies it to the weights directly, apart from the gradient (*decoupled*). `torch.optim.Adam(..., weight_decay=...)` instead adds `weight_decay * w` to the gradient, and Adam's per-weight scaling then weakens that pull most for the weights with the largest gradients: the same setting does something else.
#
# Weight decay goes on the **weight matrices and embedding tables** (every parameter with 2 or more dimensions, `p.dim() >= 2`) and **not on the vectors**: the biases and LayerNorm's gains and shifts (`p.dim() < 2`). A vector has few numbers to overfit with, and pulling a LayerNorm gain towards 0 would only shrink the signal it passes on. Return a `torch.optim.AdamW` over all of `model`'s parameters, each in exactly one of two **parameter groups** (PyTorch's per-group settings: a group is a dict of its parameters under `"params"` and the settings it overrides): the matrices with weight decay `weight_decay` and the vectors with weight decay 0.0 (in either order), and learning rate `lr` (notebook 05's `train_step`, yours, sets every group's rate at each step; this is its starting value). Set nothing else: AdamW's other settings stay at PyTorch's defaults (`betas=(0.9, 0.999)`, `eps=1e-8`, no `amsgrad`). The Transformer paper's `betas=(0.9, 0.98), eps=1e-9` is another sound choice, but not this task's: the check compares the weights after three steps with the defaults.
#
# The check looks at the group each parameter landed in, and at the weights after three AdamW steps with stored gradients.

# %% nbgrader={"grade": false, "grade_id": "make_optimizer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def make_optimizer(model, lr, weight_decay):
    """AdamW over every parameter of `model`: weight decay `weight_decay` for the parameters of 2 or more
    dimensions (weight matrices, embedding tables), 0.0 for the others (biases, LayerNorm gains and shifts).

    Args:
        model: an nn.Module; lr: the learning rate; weight_decay: AdamW's weight decay for the matrices.
    Returns: a torch.optim.AdamW with two parameter groups.
    """
    ### BEGIN SOLUTION
    params = list(model.parameters())
    matrices = [p for p in params if p.dim() >= 2]
    vectors = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": weight_decay},
                              {"params": vectors, "weight_decay": 0.0}], lr=lr)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_make_optimizer", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_param_groups
check("optimizer/basic", with_param_groups(make_optimizer))
### BEGIN HIDDEN TESTS
check("optimizer/strong_decay", with_param_groups(make_optimizer))
check("optimizer/no_decay", with_param_groups(make_optimizer))
check("optimizer/wider", with_param_groups(make_optimizer))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_memorise", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 8 · Your model memorises a small batch
#
# The first test of a model and its loss together, before any real training (notebook 05): train a fresh model on **one batch of 8 captions** for 150 steps of your `make_optimizer`'s AdamW, with no weight decay (learning 8 captions by heart is just what weight decay works against; with none, AdamW's steps are Adam's), in the plainest optimisation loop there is (the one below: loss, `zero_grad`, `backward`, `step`). Until your `make_optimizer` passes its public check, the cell uses `torch.optim.AdamW` over all the parameters at once: with no weight decay, the same steps. A correct model and loss drive the loss of those 8 captions close to zero within those 150 steps: the model has far more parameters than 8 captions have words, so it can learn them by heart.
#
# If the loss stalls, the model cannot even memorise 8 captions, typically because the forward pass ignores the words or the image, or the loss compares the wrong positions; a long run would only waste time. Passing is no proof: a model whose mask lets each word see its own target memorises the batch just as well (notebook 06 measures what that does), and so does a loss averaged over padding.

# %% nbgrader={"grade": false, "grade_id": "code_memorise", "locked": true, "schema_version": 3, "solution": false, "task": false}
MEMORISE_STEPS = 150
ready = [yours_if_it_passes(name, fn, instead="no memorisation run until it passes")
         for name, fn in (("CaptioningTransformer", CaptioningTransformer), ("teacher_forcing_loss", teacher_forcing_loss))]


def one_group(model, lr, weight_decay):
    """AdamW over every parameter at once: the stand-in until your make_optimizer passes."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


optimizer_of = yours_if_it_passes("make_optimizer", make_optimizer,
                                  instead="torch.optim.AdamW over every parameter at once is used") or one_group
memorised = None
if GRADING:  # nbgrader is running the notebook: no grade depends on this run
    print("grading run: no memorisation run")
elif all(fn is not None for fn in ready):
    seed_everything(0)
    small = CaptioningTransformer(len(vocab), ds.feature_dim, ds.num_regions, d_model=64, num_heads=4, num_layers=2,
                                  dim_feedforward=256, max_len=ds.max_length, dropout=0.0, layers=LAYERS)
    features, captions = next(iter(make_loader(train_split, 8, shuffle=True)))
    optimizer = optimizer_of(small, lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in trange(MEMORISE_STEPS, desc="memorising 8 captions"):
        loss = teacher_forcing_loss(small, features, captions, null_idx=vocab.null_idx)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    memorised = losses[-1] < 0.1
    print(f"8 captions, {MEMORISE_STEPS} steps: loss {losses[0]:.3f} -> {losses[-1]:.4f} "
          + ("✓ memorised (below 0.1)" if memorised else "✗ not below 0.1: look at the forward pass and the loss"))
    plt.figure(figsize=(5.5, 3))
    plt.semilogy(losses)
    plt.xlabel("step"); plt.ylabel("loss (log scale)"); plt.title("one batch of 8 captions, memorised")
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("04_captioning_data_and_model", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - Data: a pretrained CNN's **grid features** (extracted once, stored in HDF5), a **vocabulary** built from the training captions only, captions **encoded** as `<START> w1 ... wn <END>` indices, a `Dataset` that reads one caption and its image's features, and a `collate_fn` that pads each batch to its longest caption.
# - The image enters the model as **memory tokens**: grid features projected to $d_{model}$, plus a learned embedding of each region's position; every decoding step attends to all regions (a new context per word, as in *Show, Attend and Tell*).
# - Words: embeddings + positional encoding, a **causal mask** (position $t$ sees $0 \ldots t$), pre-norm decoder blocks, a final LayerNorm and a vocabulary head.
# - **Teacher forcing** trains all positions in parallel: inputs `captions[:, :-1]`, targets `captions[:, 1:]`; the loss is averaged over **real words only**, never over `<NULL>` padding.
# - **AdamW** decays the weights apart from the gradient; weight decay goes on the weight matrices and embedding tables, in one parameter group, and not on the biases and LayerNorm parameters, in the other.
# - A model and loss that work together memorise a small batch in 150 steps.
#
# Next, **05 · Training and evaluation** loads your pieces from this notebook, trains the model on all of `shapes` and measures its captions.
#
# ## Handing in
#
# Hand in your seven notebooks, `01_scaled_dot_product_attention.ipynb` to `07_visualizing_attention.ipynb`, and notebook 05's trained model, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 05's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
