# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 05 · The captioning Transformer: the model
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/05_captioning_model.ipynb)
#
# Notebook 04 prepared the data. Here you build the model that captions an image from them, and what trains it:
#
# - `CaptioningTransformer.forward`: the image's regions as memory, the words with their positions, the decoder layers of notebook 03 under a causal mask, and a score for every word of the vocabulary;
# - `caption_loss` and `teacher_forcing_loss`: the loss of a batch, over its real words only;
# - `make_optimizer`: AdamW, with weight decay on the weight matrices only;
#
# and the notebook ends with the first sign that they work together: your model, trained for 150 steps on 8 captions, **memorises them**. Notebook 06 trains it on all of `shapes`.
#
# Given: the dataset files and their reader (`starter.data`), the layers of PyTorch as an alternative to yours (`starter.layers`) and the plots. The kit has no version of these pieces: while one does not pass its public check yet, the notebook says so in one line and skips what needs it.
#
# **What you need from notebook 04.** Section 1 loads your `build_vocab`, `encode_captions`, `CaptionFeatures` and `collate_captions` from your `04_captioning_data.ipynb` (its set-up and answer cells only: no plots, no test cells), found next to this notebook (on Colab: also in `My Drive/Colab Notebooks`). A piece that does not pass its public check yet is replaced by the dataset's stored data (vocabulary, encoded captions, batches), with one line saying so. The graded checks of this notebook run on stand-ins and do not use notebook 04.
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

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tqdm.auto import trange

from starter.checks import check
from starter.data import load_dataset
from starter.layers import get_layers, with_attention, with_model
from starter.notebook_loader import load_or_none
from starter.pipeline import CaptionData, yours_if_it_passes
from starter.training import GRADING, seed_everything

torch.manual_seed(0)

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_from04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · The data, and your pieces from notebook 04
#
# The dataset is chosen here, in one line (`shapes` by default): `shapes` is built on first use, and a COCO dataset that is not on disk is an error naming the command that fetches it. Then your pieces of notebook 04 are loaded and each one runs its public check; the line printed for each says whether yours is used.

# %% nbgrader={"grade": false, "grade_id": "code_data05", "locked": true, "schema_version": 3, "solution": false, "task": false}
DATASET = "shapes"   # or "coco-fc7" (CS231n features: python -m data.coco_cs231n), "coco-grid" (python -m starter.build_coco_grid)

ds = load_dataset(DATASET)
train_split, val_split = ds.split("train"), ds.split("val")
print(ds)

# %% nbgrader={"grade": false, "grade_id": "code_from04", "locked": true, "schema_version": 3, "solution": false, "task": false}
mine = load_or_none("04_captioning_data.ipynb", ["build_vocab", "encode_captions", "CaptionFeatures",
                                             "collate_captions"])   # None for each piece if the notebook can't be loaded

data = CaptionData.of(ds, mine)   # your vocabulary, encoding, Dataset and collate function, each once it passes
vocab, encoded, make_loader = data.vocab, data.encoded, data.loader   # make_loader(split, batch_size, shuffle, seed=0)
print(vocab)

features, captions = next(iter(make_loader(train_split, 3, shuffle=True)))   # a batch for the cells below
print("a batch: features", tuple(features.shape), features.dtype, "| captions", tuple(captions.shape), captions.dtype)

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_07", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2 · Your layers, or PyTorch's
#
# The model uses a decoder layer and a positional encoding with the interfaces of notebooks 02–03. By default it uses **yours**: the next cell loads `TransformerDecoderLayer` from your `03_multi_head_attention.ipynb` and `PositionalEncoding` from your `02_positional_encoding.ipynb`, found in the course folder (the folder of this notebook; on Colab, the Google Drive folder that the first cell set up, and also `My Drive/Colab Notebooks`, where *Save a copy in Drive* puts a notebook opened from its badge: the newest copy you worked on is used), prints which files it used, and runs their public checks. It never falls back to the kit's blank copies. If those notebooks are not finished, or a check fails, it stops with a one-line message; then either fix that notebook or switch to `LAYERS = "torch"`: PyTorch's `nn.TransformerDecoderLayer` (pre-norm, same masks convention as yours once converted) and a *learned* positional encoding, one trained vector per position, the alternative to the sinusoidal one discussed in notebook 02. Either way the rest of the notebook is the same. The graded checks always build the model with `layers="torch"`, so they do not depend on notebooks 02–03.

# %% nbgrader={"grade": false, "grade_id": "code_08", "locked": true, "schema_version": 3, "solution": false, "task": false}
LAYERS = "mine"   # or "torch": PyTorch-backed layers with the same interface (starter/layers.py)

DecoderLayer, PositionalEncoding = get_layers(LAYERS, verbose=True)


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_09", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3 · The model
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
# ### Task 1 · `CaptioningTransformer.forward(features, captions, return_attention=False)`
#
# What it computes, in this order:
#
# - the **memory** the words attend to: one token per region, the region's projected feature plus the learned embedding of its region index;
# - the **words**: their embeddings with the position vectors added by `pos_encoding` (the embeddings are not scaled by $\sqrt{d_{model}}$);
# - the decoder layers in turn, each attending to the memory under a **causal mask**, a bool `(T, T)` mask with True = may attend: position $t$ sees positions $0 \ldots t$, itself included, and nothing later. This is what makes training on whole captions honest: without it the word at position $t$ could read the word it is supposed to predict. A layer is called as in notebook 03, `layer(x, memory, tgt_mask=mask)`, and returns `(x, self_weights, cross_weights)`;
# - the **logits**: the final LayerNorm, then the vocabulary head; raw scores, no softmax (the loss applies it).
#
# Return the logits `(B, T, V)`; with `return_attention=True` return `(logits, {"self": [...], "cross": [...]})`, the per-layer weight lists, `(B, h, T, T)` and `(B, h, T, R)` per layer (notebook 09 draws them).
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
# ## 4 · The loss, and why it must ignore padding
#
# The captions of a batch have different lengths, so they are padded with `<NULL>` (index 0) to a common length $T$. The model outputs a distribution over the vocabulary at every position; the loss is the cross-entropy of the correct next word, **averaged over the real words only**:
#
# $$\mathcal{L} = -\frac{1}{N}\sum_{(b,t)\,:\,y_{b,t} \neq \texttt{<NULL>}} \log p_\theta(y_{b,t} \mid \ldots), \qquad N = \#\{(b,t) : y_{b,t} \neq \texttt{<NULL>}\}.$$
#
# Why not average over every position? Padding positions have a trivial target: after `<END>` the answer is always `<NULL>`. Including them (i) rewards the model for predicting `<NULL>` after `<NULL>`, which it learns in a few steps and which says nothing about captions; (ii) dilutes the gradient of the real words by the share of padding (measured on your batches at the end of notebook 04), as if the learning rate were lowered by a different factor for every batch; (iii) makes the loss depend on how much the batch was padded, so numbers are not comparable across batches or datasets. Dividing by the number of real words (not by the batch size, and not per caption) gives each real word the same weight.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_12b", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2 · `caption_loss(logits, targets, null_idx=0)`
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
# ## 5 · Teacher forcing
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
# ### Task 3 · `teacher_forcing_loss(model, features, captions, null_idx=0)`
#
# Split the captions into inputs and targets as in the table, run the model, and return your `caption_loss`. The memorisation run at the end of this notebook, and the training loop of notebook 06, call this function for every batch.

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
# ## 6 · The optimiser
#
# Training (notebook 06, and the small run at the end of this notebook) updates the weights with an optimiser. Which weights it treats how depends on the model you just built: its weight matrices and embedding tables on one side, its biases and LayerNorm parameters on the other.
#
# ### Task 4 · `make_optimizer(model, lr, weight_decay)`
#
# The optimiser is **AdamW** (Loshchilov & Hutter, 2019): Adam's update plus **weight decay**, a pull of every weight towards zero by `lr * weight_decay` of its value at each step, so that weights do not grow without need. AdamW applies it to the weights directly, apart from the gradient (*decoupled*). `torch.optim.Adam(..., weight_decay=...)` instead adds `weight_decay * w` to the gradient, and Adam's per-weight scaling then weakens that pull most for the weights with the largest gradients: the same setting does something else.
#
# Weight decay goes on the **weight matrices and embedding tables** (every parameter with 2 or more dimensions, `p.dim() >= 2`) and **not on the vectors**: the biases and LayerNorm's gains and shifts (`p.dim() < 2`). A vector has few numbers to overfit with, and pulling a LayerNorm gain towards 0 would only shrink the signal it passes on. Return a `torch.optim.AdamW` over all of `model`'s parameters, each in exactly one of two **parameter groups** (PyTorch's per-group settings: a group is a dict of its parameters under `"params"` and the settings it overrides): the matrices with weight decay `weight_decay` and the vectors with weight decay 0.0 (in either order), and learning rate `lr` (notebook 06's `train_step`, yours, sets every group's rate at each step; this is its starting value). Set nothing else: AdamW's other settings stay at PyTorch's defaults (`betas=(0.9, 0.999)`, `eps=1e-8`, no `amsgrad`). The Transformer paper's `betas=(0.9, 0.98), eps=1e-9` is another sound choice, but not this task's: the check compares the weights after three steps with the defaults.
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
# ## 7 · Your model memorises a small batch
#
# The first test of a model and its loss together, before any real training (notebook 06): train a fresh model on **one batch of 8 captions** for 150 steps of your `make_optimizer`'s AdamW, with no weight decay (learning 8 captions by heart is just what weight decay works against; with none, AdamW's steps are Adam's), in the plainest optimisation loop there is (the one below: loss, `zero_grad`, `backward`, `step`). Until your `make_optimizer` passes its public check, the cell uses `torch.optim.AdamW` over all the parameters at once: with no weight decay, the same steps. A correct model and loss drive the loss of those 8 captions close to zero within those 150 steps: the model has far more parameters than 8 captions have words, so it can learn them by heart.
#
# If the loss stalls, the model cannot even memorise 8 captions, typically because the forward pass ignores the words or the image, or the loss compares the wrong positions; a long run would only waste time. Passing is no proof of everything: Question 8 asks what it does not show.

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
    print(f"8 captions, {MEMORISE_STEPS} steps: loss {losses[0]:.3f} (log V = {math.log(len(vocab)):.3f}) -> {losses[-1]:.4f} "
          + ("✓ memorised (below 0.1)" if memorised else "✗ not below 0.1: look at the forward pass and the loss"))
    plt.figure(figsize=(5.5, 3))
    plt.semilogy(losses)
    plt.xlabel("step"); plt.ylabel("loss (log scale)"); plt.title("one batch of 8 captions, memorised")
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_memorise", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 8 (2 points).** The memorisation cell printed the loss of the first step next to $\log V$, the loss of a guess spread evenly over the $V$ words of the vocabulary, and the loss after 150 steps. (a) Why is the first loss of a freshly initialised model close to $\log V$? What would a first loss far above it tell you about the model? (b) The loss fell close to zero. Why is that no evidence that the model will caption images it has not seen? Name one bug in the forward pass that would memorise the batch just as well, and say why it would.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_memorise", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) At initialisation the weights are small and random, so the vocabulary head gives every word a logit close to the others and the softmax is close to uniform, $p \approx 1/V$ for the right word too; the cross-entropy is then $-\log(1/V) = \log V$. A first loss far above it means the model starts out confident and wrong: its logits are large before it has learned anything (weights initialised too large, or vectors that grow through the layers), which makes the first steps large and unstable. (b) Eight captions hold far fewer words than the model has parameters: it can store them by heart, so a loss near zero shows only that the forward pass, the loss and the updates are wired together, not that anything learned carries over to other images. A causal mask that lets position $t$ see word $t + 1$ (one shifted by one, or none at all) memorises the batch just as well, even faster: its input holds the word it must predict, so it learns to copy it. While generating, that word has not been written yet, and the model has learned nothing else.
#
# **Rubric.** 1 point (a): near-uniform predictions at initialisation give $\log V$, with the printed numbers or the argument; a much higher start means over-confident initial logits. 1 point (b): memorising a small batch shows only that the model can fit it, plus one bug that still fits it with the reason (a mask that shows the target: it copies it; also accepted: a loss averaged over padding, which memorises too). Half a point for the bug without the reason.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("05_captioning_model", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - The image enters the model as **memory tokens**: grid features projected to $d_{model}$, plus a learned embedding of each region's position; every decoding step attends to all regions (a new context per word, as in *Show, Attend and Tell*).
# - Words: embeddings + positional encoding, a **causal mask** (position $t$ sees $0 \ldots t$), pre-norm decoder blocks, a final LayerNorm and a vocabulary head.
# - **Teacher forcing** trains all positions in parallel: inputs `captions[:, :-1]`, targets `captions[:, 1:]`; the loss is averaged over **real words only**, never over `<NULL>` padding.
# - **AdamW** decays the weights apart from the gradient; weight decay goes on the weight matrices and embedding tables, in one parameter group, and not on the biases and LayerNorm parameters, in the other.
# - A model and loss that work together memorise a small batch in 150 steps; a fresh model's first loss is about $\log V$.
#
# Next, **06 · Training the captioner** loads your pieces from notebooks 04 and this one, and trains the model on all of `shapes`.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
