# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 04 · The captioning Transformer: the data
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/04_captioning_data.ipynb)
#
# Notebooks 01–03 built the parts: attention, positional encoding, multi-head attention and the decoder block. Notebooks 04–07 stack them into a model that **writes a caption for an image**: here you prepare the data; notebook 05 builds the model and its loss; notebook 06 trains it; notebook 07 generates captions and measures them. Notebook 08 decodes with beam search and sampling, and notebook 09 looks inside the trained model.
#
# You write the **data preparation**: `extract_grid_features` turns images into the grid features the model reads; `build_vocab` and `encode_captions` turn caption text into index tensors; `CaptionFeatures` (a PyTorch `Dataset`) and `collate_captions` feed them to a `DataLoader`. The notebook ends by measuring how much of your batches is padding, the positions notebook 05's loss must leave out.
#
# Given: the dataset files and their reader (`starter.data`) and the plots. Each piece you write is then **used**: the loaders are built from your vocabulary, encoding, `Dataset` and `collate_captions`, and notebooks 05 and 06 train on them. The kit has no version of these pieces: while one does not pass its public check yet, the notebook says so in one line and goes on without it, with the data the dataset file stores (its vocabulary, encoded captions and features) where that can stand in, and otherwise skipping what needs the piece.
#
# **How to work.** Fill in the cells marked `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line) and run the test cell below each one: it prints `✓ … passed` or one line naming the likely bug. The graded version of each test cell also runs hidden cases. Don't edit or delete test cells.

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

from starter.checks import check
from starter.data import StoredBatches, Vocab, load_dataset
from starter.pipeline import yours_if_it_passes
from starter.plotting import show_captions
from starter.training import GRADING

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
# The default dataset, `shapes`, is generated: scenes of one or two coloured shapes on a grid, captioned in several phrasings ("a small red circle in the top left", "in the top left there is a small red circle"), with $7 \times 7$ grid features of a pretrained EfficientNet and the small images kept for display. It trains on a laptop CPU (notebook 06 prints how long it took on yours) and its captions can be checked by eye. COCO (notebook 06, section 3) uses the same interface. The dataset is chosen here, in one line: `shapes` is built on first use, and a COCO dataset that is not on disk is an error naming the command that fetches it.

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
# Your vocabulary and encoding, used: the loaders of this notebook, and the training of notebooks 05 and 06, use the vocabulary you build from the training captions and your encoding of both splits.

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

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_padding", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3 · How much of a batch is padding
#
# The captions of a batch have different lengths, so `collate_captions` pads them with `<NULL>` to the longest one. The model of notebook 05 is trained to predict each next word of a caption: its targets are `captions[:, 1:]`, and at a padded position the target is `<NULL>`. The cell below measures the share of padding among the target positions of your batches, and what it would be if every caption were padded to the dataset's caption length $T$. Notebook 05's loss leaves those positions out; the question below asks why it must.

# %% nbgrader={"grade": false, "grade_id": "code_pad_share", "locked": true, "schema_version": 3, "solution": false, "task": false}
# how much of a batch is padding: target positions (captions[:, 1:]) that hold <NULL>
padded = [caps[:, 1:] for _, (_, caps) in zip(range(20), make_loader(train_split, 64, shuffle=True))]
share = sum(int((t == vocab.null_idx).sum()) for t in padded) / sum(t.numel() for t in padded)
full = float((encoded["train"][:, 1:] == vocab.null_idx).float().mean())
padding = "each batch padded to its longest caption" if collate is not None else "the stored batches, full length"
print(f"{DATASET}: {share:.0%} of the target positions of 20 batches of 64 are padding ({padding}); "
      f"{full:.0%} if every caption were padded to T = {encoded['train'].shape[1]}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_padding", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 7 (2 points).** The cell above printed the share $s$ of padding among the target positions of your batches, and what it would be if every caption were padded to $T$. (a) Suppose the loss were averaged over every position, padding included, and the model had learned to predict `<NULL>` after `<END>` (a loss of about 0 there). Then the loss, and the gradient, of the real words are scaled by a factor: which, in terms of $s$, and what is it for each of the two shares printed? (b) Why does this amount to a learning rate that changes from batch to batch, and why does padding each batch only to its longest caption (your `collate_captions`) not remove the need to leave padding out of the loss?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_padding", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) The mean over all positions is the sum over the real words divided by all positions, $N / (1 - s)$ of them: it is $(1 - s)$ times the mean over the real words, and so is its gradient. Each of the two shares printed gives its own factor $1 - s$, the larger share (every caption padded to $T$) the smaller factor. (b) An update is the learning rate times the gradient, so scaling the gradient by $1 - s$ is the same as scaling the learning rate by it; $s$ depends on which captions a batch happens to hold (a batch of short captions is more padding), so each batch trains the real words at a different rate, and losses of batches or datasets with different padding are not comparable. Padding to the longest caption of the batch makes $s$ smaller but not 0: every caption shorter than the longest is still padded, so only dividing by the number of real words gives every real word the same weight in every batch.
#
# **Rubric.** 1 point: the factor $1 - s$, with the two printed shares put in (the student's own numbers). 1 point: the factor varies with the batch (an effective learning rate per batch) and padding to the longest caption leaves $s > 0$. Half a point for "padding dilutes the loss" without the factor.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("04_captioning_data", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - Data: a pretrained CNN's **grid features** (extracted once, stored in HDF5), a **vocabulary** built from the training captions only, captions **encoded** as `<START> w1 ... wn <END>` indices, a `Dataset` that reads one caption and its image's features, and a `collate_fn` that pads each batch to its longest caption.
# - Padding is a share of every batch's targets that depends on the batch: a loss averaged over it would train each batch at another rate.
#
# Next, **05 · The captioning Transformer: the model** builds the captioning Transformer on these data, with its loss and its optimiser, and lets it memorise one batch.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
