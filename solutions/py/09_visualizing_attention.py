# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 09 · Visualising what the Transformer learned
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/09_visualizing_attention.ipynb)
#
# A trained captioning Transformer is a pile of weight matrices, but its attention weights are readable: every weight says how much one position looked at another. In this notebook you open up the model of notebooks 05–07 and look at
#
# 1. the **positional encoding** it adds to the words: its structure, and what "a shift is a rotation" means;
# 2. **self-attention** over the words of a generated caption, for every layer and head;
# 3. **cross-attention** over the image regions while each word is generated, drawn over the image as in *Show, Attend and Tell* (Xu et al., 2015);
# 4. a **number** for how well that attention localises the objects, compared with chance;
# 5. **rollout**: what reaches a word from the image through every layer, not only the last one, measured with the same number;
# 6. an **explorer** in which you click a word and switch layers and heads, with no Python run;
# 7. **failure cases**: wrong captions, and where the model was looking when it made the mistake.
#
# The graded tasks are the tools for this: turning a weight vector over regions into a grid (`attention_to_grid`), and the grid into an image-sized overlay (`upsample_attention`); the localisation metric and its chance level (`localisation_accuracy`, `chance_accuracy`); and the rollout of the image through the layers (`rollout_to_regions`). They are checked on stored inputs, not on your model, so a bug in notebooks 04–08 costs no points here.
#
# **How to work.** Fill in the cells marked `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line) and run the test cell below each one: it prints `✓ … passed`, or one line naming the likely bug. The graded version of each test cell also runs hidden cases (other grid shapes, batch dimensions, float64, gradients). Don't edit or delete test cells.
#
# **What you need.** The pictures use the model you trained in notebook 06: finish `05_captioning_model.ipynb` and `07_generation_and_evaluation.ipynb`, run `06_training.ipynb` to the end first (it saves `runs/captioning_transformer.pt`), and keep them next to this notebook (on Colab: in the course folder or in `My Drive/Colab Notebooks`). While the notebook is being graded, the cells that need the trained model are skipped. If your model does not train, Questions 15 and 16 can be answered from the course's reference run (`reference_run/`), and the explorer then shows that run's attention: the questions say where.

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

from starter.checks import check, load_case
from starter.metrics import shapes_error
from starter.plotting import (overlay_attention, show_attention, show_attention_layers, show_matrix,
                              show_similarity_vs_distance, show_word_overlays)

torch.manual_seed(0)
# The pictures need the model trained in notebook 06. While nbgrader grades (NBGRADER_EXECUTION is set)
# they are skipped: no graded test depends on them.
RUN_MODEL = not os.environ.get("NBGRADER_EXECUTION")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · Positional encoding, once more
#
# Self-attention sees a set, not a sequence; the decoder of notebook 05 knows the order of the words only because a positional code $PE(pos)$ is added to each word embedding. With $\omega_i = 10000^{-2i/d}$, column pair $i$ of $PE(pos)$ is $(\sin \omega_i pos, \cos \omega_i pos)$: a point on the unit circle that turns by $\omega_i$ radians per position.
#
# We take the table from **your notebook 02** (its `sinusoidal_encoding`), at the size the captioning model uses. The first picture is the table itself: fast clocks on the left, slow ones on the right.

# %% nbgrader={"grade": false, "grade_id": "code_05", "locked": true, "schema_version": 3, "solution": false, "task": false}
D_MODEL_PE, MAX_LEN_PE = 64, 40          # about the size of the captioning model of notebook 05
pe = None
if RUN_MODEL:
    from starter.notebook_loader import NotebookLoadError, load_definitions
    try:
        mine = load_definitions("02_positional_encoding.ipynb", ["sinusoidal_encoding"])
        print(f"sinusoidal_encoding from {mine.path}")
        pe = mine["sinusoidal_encoding"](MAX_LEN_PE, D_MODEL_PE).double()
    except NotebookLoadError as exc:
        print(f"positional-encoding pictures skipped: {exc}")
    except NotImplementedError:
        print(f"positional-encoding pictures skipped: sinusoidal_encoding in {mine.path} is not implemented yet")
if pe is not None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.25]})
    show_matrix(pe, title=f"PE table ({MAX_LEN_PE} positions, d_model = {D_MODEL_PE})",
                xlabel="dimension (even: sin, odd: cos)", ylabel="position", ax=ax1, colorbar_label="PE value")
    show_similarity_vs_distance(pe, anchors=(0, 12, 25), ax=ax2,
                                title="PE(p) · PE(q) depends only on the distance q - p")
    plt.tight_layout()
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_06", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **What the rotation property means.** Moving $\phi$ positions forward turns every clock hand $i$ by the same angle $\omega_i \phi$, wherever you start: $PE(pos+\phi) = M(\phi)\,PE(pos)$ with a block-diagonal rotation $M(\phi)$ that does not depend on $pos$. Below, each panel is one column pair; the dots are positions $0, 1, 2, \dots$ and the arrows show the shift by $\phi = 3$ from several starting positions. All arrows of one panel span the same angle: "three words later" is one fixed linear map, so a query/key projection can learn to look a fixed number of words back, at every position. Fast pairs (left) wrap around the circle within a caption and tell neighbouring words apart; slow pairs (right) barely move and place a word coarsely in the sentence.

# %% nbgrader={"grade": false, "grade_id": "code_07", "locked": true, "schema_version": 3, "solution": false, "task": false}
if pe is not None:
    PHI = 3
    pairs = (0, 4, 12)
    hands = pe[:, 1::2].numpy() + 1j * pe[:, 0::2].numpy()   # pair i at each position as the point cos + i·sin
    turns = hands[PHI:] / hands[:-PHI]                        # the turn from pos to pos + φ, read off the table
    fig, axes = plt.subplots(1, len(pairs), figsize=(13, 4.4), layout="constrained")
    for ax, i in zip(axes, pairs):
        s, c = pe[:, 2 * i].numpy(), pe[:, 2 * i + 1].numpy()
        ax.add_patch(plt.Circle((0, 0), 1, fill=False, color="lightgray"))
        sc = ax.scatter(c, s, c=np.arange(len(s)), cmap="viridis", s=18, zorder=3)
        for start in (2, 9, 20):
            ax.annotate("", xy=(c[start + PHI], s[start + PHI]), xytext=(c[start], s[start]),
                        arrowprops=dict(arrowstyle="->", color="crimson", lw=1.3))
            ax.text(1.08 * c[start], 1.08 * s[start], str(start), fontsize=8, ha="center", va="center")
        ax.set_title(f"pair {i}: {np.degrees(np.angle(turns[0, i])):.1f}° per shift of {PHI} positions", fontsize=10)
        ax.set_xlabel(f"cos(ω_{i} · pos)  (column {2 * i + 1})")
        ax.set_ylabel(f"sin(ω_{i} · pos)  (column {2 * i})")
        ax.set_aspect("equal")
        ax.set_xlim(-1.25, 1.25)
        ax.set_ylim(-1.25, 1.25)
    fig.colorbar(sc, ax=axes.tolist(), fraction=0.02, label="position")
    fig.suptitle(f"each column pair is a clock hand; a shift by φ = {PHI} is the same rotation from every start (red arrows)")
    plt.show()
    spread = np.abs(np.angle(turns / turns[:1])).max()        # every start's turn against the turn from position 0
    print(f"a shift by φ = {PHI} turns each pair by the same angle from every start: largest difference over "
          f"all {len(turns)} starts and {turns.shape[1]} pairs {spread:.1e} rad")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_08", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2 · From a weight vector to a picture
#
# The captioning model sees an image as $R = H \times W$ **memory tokens**, one per cell of the CNN's feature grid ($7 \times 7$ for the default dataset and for COCO grid features). The features were flattened **row by row**: region $r$ is the cell in row $r \,//\, W$ and column $r \,\%\, W$ (`cell = row * W + col`, the same index `split.objects(i)` gives for each object). When the decoder generates word $t$, its cross-attention is a vector $a_t \in \mathbb{R}^R$ with $a_{t,r} \ge 0$ and $\sum_r a_{t,r} = 1$: exactly the $a_{t,i,j}$ of *Show, Attend and Tell*, only stored flat.
#
# ### Task 1 · `attention_to_grid(weights, grid_shape)`
#
# Undo the flattening: a tensor of shape `(..., R)` becomes `(..., H, W)`, with any number of leading dimensions (batch, heads, words) kept as they are. Cell $(i, j)$ of the result holds the weight of region $i \cdot W + j$. If $R \neq H \cdot W$, raise a `ValueError` that says so: a map forced into the wrong grid would draw nonsense.

# %% nbgrader={"grade": false, "grade_id": "attention_to_grid", "locked": false, "schema_version": 3, "solution": true, "task": false}
def attention_to_grid(weights, grid_shape):
    """Reshape attention over R = H * W flattened regions back onto the H x W feature grid.

    Args:
        weights: (..., R) tensor; region r is the grid cell (r // W, r % W) (row-major flattening).
        grid_shape: (H, W).
    Returns:
        (..., H, W) tensor, same dtype, leading dimensions unchanged.
    Raises:
        ValueError if weights.shape[-1] != H * W.
    """
    ### BEGIN SOLUTION
    H, W = grid_shape
    if weights.shape[-1] != H * W:
        raise ValueError(f"{weights.shape[-1]} regions can't be laid out on a {H} x {W} grid ({H * W} cells)")
    return weights.unflatten(-1, (H, W))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_attention_to_grid", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("grid/basic", attention_to_grid)
### BEGIN HIDDEN TESTS
check("grid/batched", attention_to_grid)
check("grid/nonsquare_float64", attention_to_grid)
check("grid/one_region", attention_to_grid)
check("grid/grad", attention_to_grid)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_attention_to_grid_mismatch", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("grid/mismatch", attention_to_grid)
### BEGIN HIDDEN TESTS
check("grid/mismatch_small", attention_to_grid)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_09", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2 · `upsample_attention(grid, image_size)`
#
# A $7 \times 7$ grid over a $112 \times 112$ image means one weight per $16 \times 16$ pixel block. Drawn as blocks the map looks like a chessboard; *Show, Attend and Tell* smooths it instead. You will
#
# 1. **upsample bilinearly** to the image size `(height, width)`, with the **pixel-centre convention**: the value of grid cell $(i, j)$ sits at the *centre* of its block, pixels between two centres are linear blends, and pixels outside the outermost centres take the edge value. In numbers: pixel row $y$ of an image of height $h$ reads the grid at row coordinate $(y + \tfrac12)\,H/h - \tfrac12$, clamped to $[0, H-1]$, and columns likewise. (The other convention pins the cell values to the image *corners* instead, stretching the map by about one cell: the peak of an object would drift toward the image border.) The input may have any number of leading dimensions.
# 2. **normalise each map for display**: every map (every `(height, width)` slice) scaled by **its own maximum**, so that its peak is exactly 1 and zero stays zero. Then one colour scale, $[0, 1]$, fits every word, whether its attention is peaked (maximum 0.9) or spread out (maximum 0.05). An all-zero map stays zero, not NaN.
#
# The result keeps the input's dtype and leading dimensions. It stays differentiable: a gradient flows back to `grid`.

# %% nbgrader={"grade": false, "grade_id": "upsample_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def upsample_attention(grid, image_size):
    """Bilinear upsampling of attention grids to the image size, each map normalised to peak 1.

    Args:
        grid: (..., H, W) tensor of non-negative weights.
        image_size: (height, width) of the image in pixels.
    Returns:
        (..., height, width) tensor, same dtype: each map upsampled bilinearly (pixel-centre convention)
        and scaled to its own maximum 1 (an all-zero map stays zero).
    """
    ### BEGIN SOLUTION
    lead, (h, w) = grid.shape[:-2], grid.shape[-2:]
    flat = grid.reshape(-1, 1, h, w)
    up = F.interpolate(flat, size=tuple(image_size), mode="bilinear", align_corners=False)
    up = up.reshape(*lead, *up.shape[-2:])
    return up / up.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_upsample_attention", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("upsample/basic", upsample_attention)
### BEGIN HIDDEN TESTS
check("upsample/batched", upsample_attention)
check("upsample/nonsquare_float64", upsample_attention)
check("upsample/one_region", upsample_attention)
check("upsample/all_zero", upsample_attention)
check("upsample/grad", upsample_attention)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_10", "locked": true, "schema_version": 3, "solution": false, "task": false}
# What the two steps do to a made-up attention vector that puts most weight on one cell and a little on its neighbour. Blocks (left) are the honest picture of what the model can resolve; the bilinear map (middle) is easier on the eye and peaks where the weight is; `align_corners=True` (right) shifts the same peak toward the border.

# %% nbgrader={"grade": false, "grade_id": "code_11", "locked": true, "schema_version": 3, "solution": false, "task": false}
toy = torch.full((49,), 0.1 / 47)
toy[2 * 7 + 4], toy[2 * 7 + 5] = 0.7, 0.2                  # row 2, columns 4 and 5
toy_grid = attention_to_grid(toy, (7, 7))
smooth = upsample_attention(toy_grid, (112, 112))
corners = F.interpolate(toy_grid[None, None], size=(112, 112), mode="bilinear", align_corners=True)[0, 0]
fig, axes = plt.subplots(1, 3, figsize=(13, 3.9), layout="constrained")
blank = np.full((112, 112, 3), 200, dtype=np.uint8)
overlay_attention(blank, toy_grid.repeat_interleave(16, 0).repeat_interleave(16, 1) / toy_grid.max(), ax=axes[0],
                  title="7 x 7 weights drawn as blocks", grid_shape=(7, 7))
overlay_attention(blank, smooth, ax=axes[1], title="upsample_attention (bilinear, pixel centres)", grid_shape=(7, 7))
overlay_attention(blank, corners / corners.max(), ax=axes[2], title="align_corners=True: peak pulled outward",
                  grid_shape=(7, 7))
plt.show()

def peak(m):
    return tuple(int(i) for i in np.unravel_index(int(m.argmax()), m.shape))

print("peak pixel (y, x): bilinear", peak(smooth), "| align_corners=True", peak(corners),
      "| centre of cell (2, 4):", (2 * 16 + 8, 4 * 16 + 8))

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_12", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3 · Getting the attention out of the model
#
# Your `CaptioningTransformer` (notebook 05) returns its attention weights when asked: `model(features, captions, return_attention=True)` gives `(logits, attn)` with
#
# * `attn["self"]`: one tensor per decoder layer, `(B, heads, T, T)`: word $t$ attending to words $0..t$ (causal);
# * `attn["cross"]`: one tensor per decoder layer, `(B, heads, T, R)`: word $t$ attending to the $R$ image regions.
#
# A model that does not return its weights can still be inspected with a **forward hook**: `module.register_forward_hook(fn)` makes PyTorch call `fn(module, inputs, output)` after every forward pass of that module, and `fn` can store what it sees. For `nn.MultiheadAttention` the output is `(attn_output, attn_weights)`, and the weights are only computed when the module is called with `need_weights=True` (PyTorch's own `nn.TransformerDecoderLayer` passes `need_weights=False`, so for it you would also have to change that argument). A small example:

# %% nbgrader={"grade": false, "grade_id": "code_13", "locked": true, "schema_version": 3, "solution": false, "task": false}
mha = nn.MultiheadAttention(embed_dim=8, num_heads=2, batch_first=True).eval()
captured = []
handle = mha.register_forward_hook(lambda module, inputs, output: captured.append(output[1].detach()))
with torch.no_grad():
    mha(torch.randn(1, 5, 8), torch.randn(1, 9, 8), torch.randn(1, 9, 8), need_weights=True, average_attn_weights=False)
handle.remove()                          # always remove hooks when done, or they keep collecting
print("captured weights:", tuple(captured[0].shape), "= (batch, heads, queries, keys)")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_14", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Given: `collect_attention(layers, layer=-1, head=None)`
#
# The pictures below pick the weights to draw with this helper: from the list of per-layer tensors `(B, heads, T, S)` (`S` = `T` for self-attention, `R` for cross-attention) it takes layer `layer` (Python indexing: `-1` is the last layer) and then one head (`head` an integer) or the **mean over the heads** (`head=None`), shape `(B, T, S)`. Every row of the mean is still a probability distribution: a mean of distributions is one.

# %% nbgrader={"grade": false, "grade_id": "code_collect", "locked": true, "schema_version": 3, "solution": false, "task": false}
def collect_attention(layers, layer=-1, head=None):
    """One layer's attention weights, for one head or averaged over the heads.

    Args:
        layers: sequence of per-layer (B, heads, T, S) tensors (a list, or one (L, B, heads, T, S) tensor).
        layer: which layer (an int, negative counts from the end).
        head: an int to pick one head, or None for the mean over all heads.
    Returns:
        (B, T, S) tensor, same dtype.
    """
    weights = layers[layer]                       # (B, heads, T, S)
    return weights.mean(dim=1) if head is None else weights[:, head]



# %% [markdown] nbgrader={"grade": false, "grade_id": "md_15", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Loading your model
#
# The next cell runs the set-up and answer cells of **your** `05_captioning_model.ipynb` and `07_generation_and_evaluation.ipynb` (nothing else: no training, no plots) to get `CaptioningTransformer` and `greedy_decode`, then loads the weights notebook 06 trained from the checkpoint (`starter.notebook_loader.load_trained_captioner`). The notebooks are looked for in the course folder and, on Colab, in `My Drive/Colab Notebooks`. The dataset is the one recorded in the checkpoint (set `DATASET` to override it); change `CHECKPOINT` if you keep it elsewhere. Without a checkpoint the cell says in one line how to get one, and the model sections are skipped.

# %% nbgrader={"grade": false, "grade_id": "code_16", "locked": true, "schema_version": 3, "solution": false, "task": false}
CHECKPOINT = os.path.join("runs", "captioning_transformer.pt")  # in the course folder, where 06 saved it
DATASET = None                                             # None: the dataset recorded in the checkpoint
device = torch.device("cpu")                               # plenty for inspecting a trained model

model = ds = None
if RUN_MODEL:  # without your notebooks 05 and 07 or the checkpoint: one line saying what to do, and no model sections
    from starter.notebook_loader import NotebookLoadError, load_trained_captioner
    try:
        trained = load_trained_captioner(CHECKPOINT, dataset=DATASET, device=device)
    except NotebookLoadError as exc:
        print(f"model sections skipped: {exc}")
        RUN_MODEL = False
if RUN_MODEL:
    model, ds, vocab, greedy_decode = trained.model, trained.dataset, trained.vocab, trained.greedy_decode
    DATASET = ds.name
    val = ds.split("val")
elif os.environ.get("NBGRADER_EXECUTION"):
    print("model pictures skipped while grading (NBGRADER_EXECUTION is set)")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_17", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Caption a few validation images greedily, then run the model once more on its **own** caption (teacher forcing with the generated words) to get the attention weights of every step. Mind the offset: the input is `<START> w1 w2 ... wn`, and the row of input position $t$ is the step that **produces** word $t+1$. So the attention that went into choosing word $w_k$ is row $k-1$ (0-based: row $k$ for the $k$-th word counted from 0), and the row of the last word is the step that produced `<END>`.

# %% nbgrader={"grade": false, "grade_id": "code_18", "locked": true, "schema_version": 3, "solution": false, "task": false}
def caption_with_attention(model, features):
    """Greedy captions for a batch of images and the attention of every decoding step.

    Returns (words, attn): words[b] is the list of generated words of image b (without <START>/<END>);
    attn is the model's dict {"self": [...], "cross": [...]} for the input <START> w1 ... w_L, whose row k
    is the step that produced word k+1 (0-based: row k -> words[b][k]).
    """
    with torch.no_grad():
        tokens = greedy_decode(model, features, max_len=ds.max_length - 1,
                               start_idx=vocab.start_idx, end_idx=vocab.end_idx, null_idx=vocab.null_idx)
        start = torch.full((len(tokens), 1), vocab.start_idx, dtype=tokens.dtype, device=tokens.device)
        _, attn = model(features, torch.cat([start, tokens], dim=1), return_attention=True)
    words = [vocab.decode(row).split() for row in tokens]
    return words, attn

if RUN_MODEL:
    SHOW = [0, 3, 4, 7]                                          # a few validation images
    words, attn = caption_with_attention(model, val.features(SHOW).to(device))
    for i, w in zip(SHOW, words):  # a caption may be right and still differ from the first reference
        refs = val.references(i)
        kind = shapes_error(" ".join(w), refs)  # "correct" (one of its references), else the kind of mistake
        said = "one of its references" if kind == "correct" else f"{kind}; a reference: {refs[0]}"
        print(f"image {i:3d}: {' '.join(w):<55s} | {said}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_19", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4 · Self-attention over the words
#
# For one caption, every layer and head of the masked self-attention: row = the input token doing the looking (the query), column = the token looked at. Everything above the diagonal is zero because of the causal mask. Things to look for: heads that attend to the **previous word** (a bright line just below the diagonal: this is where the positional encoding is used), heads that keep going back to `<START>` (a "nothing interesting here" default), and heads that look at the **noun phrase** of the first object while the second one is being described.

# %% nbgrader={"grade": false, "grade_id": "code_20", "locked": true, "schema_version": 3, "solution": false, "task": false}
if RUN_MODEL:
    b = 2
    n = len(words[b]) + 1                                      # <START> + words: the rows that produced words and <END>
    labels = ["<START>"] + words[b]
    self_w = torch.stack([layer_w[b, :, :n, :n] for layer_w in attn["self"]])   # (L, heads, n, n)
    show_attention_layers(self_w, labels, labels,
                          title=f"self-attention of every layer and head: \u201c{' '.join(words[b])}\u201d")
    plt.show()
    mean_last = collect_attention(attn["self"], layer=-1)[b, :n, :n]
    show_attention(mean_last, labels, labels, title="last layer, mean over heads", annotate=False)
    plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_21", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5 · Cross-attention over the image: *Show, Attend and Tell* with a Transformer
#
# For each generated word, the last layer's cross-attention (mean over the heads) of the step that produced it, as a grid, upsampled and laid over the image. Dashed boxes mark the object each object word names. In a good model the shape, colour and size words light up their object, while words like "a", "in", "the" often look at nothing in particular (a spread-out map) or at the region the sentence is going to talk about next.
#
# Unlike the RNN of *Show, Attend and Tell*, the Transformer decoder attends to the image in **every layer**, with several heads each, and the residual stream mixes what all of them found; a single map is a simplification. The last layer, averaged over the heads, is the one directly before the word is predicted.

# %% nbgrader={"grade": false, "grade_id": "code_22", "locked": true, "schema_version": 3, "solution": false, "task": false}
def word_maps(attn, b, n_words, layer=-1, head=None):
    """(n_words, height, width) image-sized maps of image b's first n_words generated words."""
    cross = collect_attention(attn["cross"], layer=layer, head=head)[b, :n_words]   # (n_words, R)
    return upsample_attention(attention_to_grid(cross, ds.grid_shape), IMAGE_SIZE)


def object_boxes(split, image_idx, word_list):
    """{word index: [bbox]} for the words that name an attribute of an object in the image (shapes only)."""
    try:
        objects = split.objects(image_idx)
    except Exception:
        return {}
    out = {}
    for k, w in enumerate(word_list):
        hits = [o["bbox"] for o in objects if w in (o["colour"], o["shape"], o["size"])]
        if len(hits) == 1:
            out[k] = hits
    return out

if RUN_MODEL and ds.num_regions > 1:
    IMAGE_SIZE = val.image(0).shape[:2]
    for b, i in enumerate(SHOW[:3]):
        maps = word_maps(attn, b, len(words[b]))
        show_word_overlays(val.image(i), maps, words[b], grid_shape=ds.grid_shape, boxes=object_boxes(val, i, words[b]),
                           title=f"val image {i}: cross-attention (last layer, mean of heads) while generating each word")
        plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_23", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The same caption, one picture per layer (rows) and head (columns) for the word that names the first object's shape. Heads of one layer often split the work: some look at the object, some at the background or at the other object.

# %% nbgrader={"grade": false, "grade_id": "code_24", "locked": true, "schema_version": 3, "solution": false, "task": false}
SHAPE_WORDS = {"circle", "square", "triangle", "cross"}

if RUN_MODEL and ds.num_regions > 1:
    b = 0
    k = next((k for k, w in enumerate(words[b]) if w in SHAPE_WORDS), 0)
    L, H = len(attn["cross"]), attn["cross"][0].shape[1]
    fig, axes = plt.subplots(L, H, figsize=(2.4 * H + 1.2, 2.4 * L + 0.6), squeeze=False, layout="constrained")
    for l in range(L):
        maps = upsample_attention(attention_to_grid(torch.stack(
            [collect_attention(attn["cross"], layer=l, head=h)[b, k] for h in range(H)]), ds.grid_shape), IMAGE_SIZE)
        for h in range(H):
            overlay_attention(val.image(SHOW[b]), maps[h], ax=axes[l, h], colorbar=False, title=f"layer {l}, head {h}")
            axes[l, h].set_xlabel("x (px)" if l == L - 1 else "")
            axes[l, h].set_ylabel("y (px)" if h == 0 else "")
    fig.colorbar(plt.cm.ScalarMappable(cmap="jet"), ax=axes.ravel().tolist(), fraction=0.02,
                 label="attention (peak = 1 per panel)")
    fig.suptitle(f"cross-attention for \u201c{words[b][k]}\u201d in \u201c{' '.join(words[b])}\u201d, every layer and head")
    plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_25", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6 · Does the attention find the objects? A number
#
# Pictures can be picked to look good. On the default dataset we know where every object is: `split.objects(i)` gives each object's words and the grid `cell` (`row * W + col`) that holds its centre. So we can count: for every generated word that names an object, does the cross-attention of the step that produced it **peak** (argmax over the regions) on that object's cell?
#
# ### Task 3 · `localisation_accuracy(cross, target_cells, grid_shape, radius=0)`
#
# `cross` holds one attention vector per word, `(..., R)`, and `target_cells` the cell each word should find, `(...)` (int64). A word is a **hit** when its argmax cell $(r, c)$ is within `radius` cells of the target $(r^*, c^*)$ in **both** directions: $|r - r^*| \le$ `radius` and $|c - c^*| \le$ `radius` (`radius=0`: exactly the target cell; `radius=1`: the $3 \times 3$ block around it, since a large object covers about $2 \times 2$ cells). Return the fraction of hits as a 0-d tensor with `cross`'s dtype.
#
# ### Task 4 · `chance_accuracy(target_cells, grid_shape, radius=0)`
#
# A hit rate means little without the rate of a model that attends **at random**. If the argmax were a uniformly random cell, the hit probability of a word would be (number of cells within `radius` of its target, *counting only cells inside the grid*) $/\ R$; return the mean over the words as a 0-d float32 tensor. With `radius=0` that is $1/R$ for every word.

# %% nbgrader={"grade": false, "grade_id": "localisation_accuracy", "locked": false, "schema_version": 3, "solution": true, "task": false}
def localisation_accuracy(cross, target_cells, grid_shape, radius=0):
    """Fraction of words whose attention peak lies within `radius` cells of their target cell.

    Args:
        cross: (..., R) attention weights over R = H * W regions (row-major cells).
        target_cells: (...) int64 tensor, the cell each word should find.
        grid_shape: (H, W).
        radius: a hit needs |row - target row| <= radius and |col - target col| <= radius.
    Returns:
        0-d tensor with cross's dtype: hits / number of words.
    """
    ### BEGIN SOLUTION
    H, W = grid_shape
    peak = cross.argmax(dim=-1)
    row_ok = (peak // W - target_cells // W).abs() <= radius
    col_ok = (peak % W - target_cells % W).abs() <= radius
    return (row_ok & col_ok).to(cross.dtype).mean()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_localisation_accuracy", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("locacc/basic", localisation_accuracy)
check("locacc/radius1", localisation_accuracy)
### BEGIN HIDDEN TESTS
check("locacc/nonsquare", localisation_accuracy)
check("locacc/batched_float64", localisation_accuracy)
check("locacc/large_radius", localisation_accuracy)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "chance_accuracy", "locked": false, "schema_version": 3, "solution": true, "task": false}
def chance_accuracy(target_cells, grid_shape, radius=0):
    """Expected localisation accuracy if the attention peak were a uniformly random cell.

    Args:
        target_cells: (...) int64 tensor of target cells (row-major, row * W + col).
        grid_shape: (H, W).
        radius: as in localisation_accuracy.
    Returns:
        0-d float32 tensor: mean over the targets of (cells of the grid within `radius` of the target) / (H * W).
    """
    ### BEGIN SOLUTION
    H, W = grid_shape
    r, c = target_cells // W, target_cells % W
    rows = (r + radius).clamp(max=H - 1) - (r - radius).clamp(min=0) + 1
    cols = (c + radius).clamp(max=W - 1) - (c - radius).clamp(min=0) + 1
    return (rows * cols).to(torch.float32).mean() / (H * W)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_chance_accuracy", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("chance/radius1", chance_accuracy)
### BEGIN HIDDEN TESTS
check("chance/radius0", chance_accuracy)
check("chance/corners_nonsquare", chance_accuracy)
check("chance/large_radius", chance_accuracy)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_26", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now the measurement on the whole validation split. `object_targets` (given) decides which words name an object: a size, colour or shape word whose noun phrase (`[size] [colour] shape`, read around the word) matches exactly one object of the image, with the target being that object's centre cell. Words of a wrong noun phrase (say "blue" when the object is red) match no object and are left out; the failure cases below look at those. We report the **last layer, averaged over the heads** as the headline number (fixed in advance: it is what the word prediction reads), and then every layer and head, to see where localisation happens.

# %% nbgrader={"grade": false, "grade_id": "code_27", "locked": true, "schema_version": 3, "solution": false, "task": false}
SIZE_WORDS = {"small", "large"}
COLOUR_WORDS = {"red", "green", "blue", "yellow", "purple"}


def object_targets(word_list, objects):
    """[(word index, kind, target cell)] for the words that name an object of the image.

    A noun phrase is [size] [colour] shape; each of its words is assigned to the single object whose
    attributes match all words of the phrase (phrases matching no object or several are skipped).
    """
    out, k = [], 0
    while k < len(word_list):
        if word_list[k] not in SIZE_WORDS | COLOUR_WORDS | SHAPE_WORDS:
            k += 1
            continue
        j = k                                                   # the phrase is word_list[k:j + 1]
        while j < len(word_list) and word_list[j] not in SHAPE_WORDS and word_list[j] in SIZE_WORDS | COLOUR_WORDS:
            j += 1
        phrase = word_list[k:j + 1] if j < len(word_list) and word_list[j] in SHAPE_WORDS else word_list[k:j]
        match = [o for o in objects if all(w in (o["size"], o["colour"], o["shape"]) for w in phrase)]
        if len(match) == 1:
            for m, w in enumerate(phrase):
                kind = "size" if w in SIZE_WORDS else "colour" if w in COLOUR_WORDS else "shape"
                out.append((k + m, kind, match[0]["cell"]))
        k += max(len(phrase), 1)
    return out

if RUN_MODEL and ds.num_regions > 1 and ds.name == "shapes":
    all_words, rows = [], []                                  # rows: (image, word index, kind, target)
    all_cross = []                                            # per image: (L, heads, n_words, R)
    for start in range(0, val.num_images, 100):
        idx = list(range(start, min(start + 100, val.num_images)))
        w_batch, a_batch = caption_with_attention(model, val.features(idx).to(device))
        stacked = torch.stack(a_batch["cross"], dim=1)             # (B, L, heads, T, R)
        for b, i in enumerate(idx):
            all_words.append(w_batch[b])
            for k, kind, cell in object_targets(w_batch[b], val.objects(i)):
                rows.append((i, k, kind, cell))
                all_cross.append(stacked[b, :, :, k])             # (L, heads, R)
    cross_words = torch.stack(all_cross)                            # (N_words, L, heads, R)
    targets = torch.tensor([r[3] for r in rows])
    kinds = np.array([r[2] for r in rows])
    # as the model returns it: a list over layers of (batch = 1, heads, "time" = N_words, R)
    by_layer = list(cross_words.permute(1, 2, 0, 3).unsqueeze(1))
    headline = collect_attention(by_layer, layer=-1)[0]               # (N_words, R): last layer, mean of heads
    G = ds.grid_shape
    ACC = {r: float(localisation_accuracy(headline, targets, G, radius=r)) for r in (0, 1)}
    CHANCE = {r: float(chance_accuracy(targets, G, radius=r)) for r in (0, 1)}
    print(f"{len(rows)} object words in {val.num_images} validation captions "
          f"({', '.join(f'{(kinds == k).sum()} {k}' for k in ('size', 'colour', 'shape'))})")
    for r in (0, 1):
        where = "exact cell" if r == 0 else "within 1 cell (3 x 3 block)"
        print(f"localisation accuracy, last layer, mean of heads, {where}: {ACC[r]:.1%}   (chance {CHANCE[r]:.1%})")
    # every layer and every head (and the mean of the heads), as one table
    L, Hh = len(by_layer), by_layer[0].shape[1]
    table = np.zeros((L, Hh + 1))
    for l in range(L):
        for h in range(Hh):
            table[l, h] = float(localisation_accuracy(collect_attention(by_layer, layer=l, head=h)[0], targets, G))
        table[l, Hh] = float(localisation_accuracy(collect_attention(by_layer, layer=l)[0], targets, G))
    by_kind = {k: float(localisation_accuracy(headline[kinds == k], targets[kinds == k], G))
               for k in ("size", "colour", "shape")}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 3.8), gridspec_kw={"width_ratios": [1.4, 1]},
                                   layout="constrained")
    im = ax1.imshow(table, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for (l, h), v in np.ndenumerate(table):
        ax1.text(h, l, f"{v:.0%}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=9)
    ax1.set_xticks(range(Hh + 1), [f"head {h}" for h in range(Hh)] + ["mean of heads"])
    ax1.set_yticks(range(L), [f"layer {l}" for l in range(L)])
    ax1.set_xlabel("head")
    ax1.set_ylabel("decoder layer")
    ax1.set_title(f"hit rate, exact cell (chance {CHANCE[0]:.1%})")
    fig.colorbar(im, ax=ax1, label="localisation accuracy")
    names = list(by_kind) + ["all"]
    values = list(by_kind.values()) + [ACC[0]]
    ax2.bar(names, values, color=["#8da0cb"] * 3 + ["#66c2a5"])
    ax2.axhline(CHANCE[0], color="crimson", ls="--", label=f"chance = 1/R = {CHANCE[0]:.1%}")
    for x, v in enumerate(values):
        ax2.text(x, v + 0.01, f"{v:.0%}", ha="center", va="bottom")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("kind of object word")
    ax2.set_ylabel("localisation accuracy (exact cell)")
    ax2.set_title("last layer, mean of heads, by kind of word")
    ax2.legend(loc="upper left")
    fig.suptitle("does the cross-attention peak on the object a word names? (validation split)")
    plt.show()
    best = np.unravel_index(int(np.argmax(table)), table.shape)
    print(f"best single map: layer {best[0]}, {'mean of heads' if best[1] == Hh else f'head {best[1]}'}: {table[best]:.1%}")
    print(f"last layer: its best head (head {int(table[-1, :Hh].argmax())}) {table[-1, :Hh].max():.1%}, "
          f"the mean of its heads {table[-1, Hh]:.1%}")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_28", "locked": true, "schema_version": 3, "solution": false, "task": false}
# How to read the number. Chance is what a model that attends to a random cell would score: $1/R = 1/49 \approx 2\%$ for the exact cell, about $9/49 \approx 18\%$ for the $3\times 3$ block (objects never sit on the border of the grid here, so no block is clipped). A hit rate far above that means the words do come from looking at the right place. It will not be 100%: the attention of one step may already be on the *next* object, or spread over a large object whose centre lies near a cell border, and the decoder can also find the object through self-attention to earlier words instead of looking again. The headline number is the last layer's, the layer whose output becomes the word; the best single map can be another layer's, and this run prints which, under its table, with whether one head localises better than the mean of its layer's heads: heads share the work (one may follow the named object while the others look at the background, at the other object, or at nothing in particular), so a head can be sharper than the mean or blurrier, and an earlier layer may already have found the object that the last layer no longer needs to look at.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_heads_mean", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 15 (2 points).** The table above gives the localisation accuracy of every head of every layer and of the mean of each layer's heads, and the printout compares the best head of the last layer with the mean of its heads. (a) In your run, which localises the objects better: the last layer's best head, or the mean of its heads? Why can the mean of the heads do better than every single head, and why could one head do better than the mean in another model? (b) What does this say about reading an attention map as an explanation of why the model wrote a word?
#
# If your own model does not train, answer from the course's reference run: section 6 of `reference_run/09_visualizing_attention.md`, in the course repository (on Colab under `/content/attention-transformers/`), has its table and its printout.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_heads_mean", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) In the course's reference run the mean of the last layer's heads localises better than its best head. Heads specialise: one head may attend sharply to the object named by the word, others to positions, to the other object, or diffusely to the background. Averaging mixes the sharp head with the others, so the mean can be worse than the best head; when several heads each point roughly at the object but with different errors, averaging cancels their noise and the mean can beat every single head. (b) An attention map shows where information was read from, in one layer and head, not why the word was chosen: other heads, layers, the residual path and the feed-forward layers also contribute. Conclusions drawn from one map (or from the mean) can mislead; they should be checked quantitatively, as with this accuracy against chance.
#
# **Rubric.** 1 point: specialisation of heads and the averaging argument in both directions. 1 point: attention is where information flows from, not a full explanation; maps need quantitative checks. Answers that use the printed numbers earn full credit more easily than generic ones.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_rollout", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7 · Following the image through the layers: rollout
#
# One map is one layer's view. The last layer's cross-attention is not all the image a word gets: every layer reads the image, and self-attention passes what a position has read on to the positions after it. Section 6's table already hinted at it: the best map need not be the last layer's. **Attention rollout** (Abnar & Zuidema, 2020) follows such paths through the layers under a simple model of the residual stream. Here you carry it through to the image regions.
#
# ### Task 5 · `rollout_to_regions(self_layers, cross_layers, residual=0.5)`
#
# The model: every position's state is a **mixture of sources**, the word embeddings and the $R$ image regions, and we follow the shares. In each attention sublayer a position keeps a share `residual` of what it held (the residual path) and takes the other `1 - residual` from what it reads, in the proportions of that layer's attention weights **averaged over the heads**:
#
# - **self-attention** (position $t$ reads positions $s \le t$) brings in the *whole mixture* that each position it reads held at that point, image shares included;
# - **cross-attention** reads the regions themselves: region $r$ is 100% region $r$.
#
# A decoder layer is self-attention, then cross-attention, then a feed-forward network; the feed-forward network and the layer norms work inside one position and move nothing between positions, so the model leaves them out. Before the first layer no position holds anything of the image.
#
# Return, for every position $t$, the share of its state after the last layer that came from each region: `(B, T, R)`, the dtype of the inputs. A row sums to the image's share of that position, less than 1 (the rest came from the words); under this model that share is the same for every position, $1 - \text{residual}^L$, which makes a good check. What differs from word to word is how the share is spread over the regions. To check your reading on paper: with one layer the result is `1 - residual` times that layer's cross-attention averaged over the heads.
#
# `self_layers` holds $L$ tensors `(B, heads, T, T)` and `cross_layers` $L$ tensors `(B, heads, T, R)`, layer 0 first; each may also come as one stacked `(L, B, heads, T, S)` tensor, as in the checks. `residual` is a number in $[0, 1]$.

# %% nbgrader={"grade": false, "grade_id": "rollout_to_regions", "locked": false, "schema_version": 3, "solution": true, "task": false}
def rollout_to_regions(self_layers, cross_layers, residual=0.5):
    """The share of each position's final state that came from each image region, by attention rollout.

    Args:
        self_layers: L per-layer self-attention weights (B, heads, T, T), layer 0 first (a list or a stacked tensor).
        cross_layers: L per-layer cross-attention weights (B, heads, T, R).
        residual: the share of its state a position keeps in each attention sublayer.
    Returns:
        (B, T, R) tensor, the inputs' dtype: row t sums to the image's share of position t.
    """
    ### BEGIN SOLUTION
    shares = torch.zeros_like(cross_layers[0][:, 0])                       # (B, T, R): nothing of the image yet
    for self_w, cross_w in zip(self_layers, cross_layers):
        eye = torch.eye(self_w.shape[-1], dtype=self_w.dtype, device=self_w.device)
        mix = residual * eye + (1 - residual) * self_w.mean(dim=1)         # (B, T, T): who passes what to whom
        shares = residual * (mix @ shares) + (1 - residual) * cross_w.mean(dim=1)
    return shares
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_rollout_to_regions", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("rollout/basic", rollout_to_regions)
check("rollout/one_layer", rollout_to_regions)
### BEGIN HIDDEN TESTS
check("rollout/three_layers_float64", rollout_to_regions)
check("rollout/one_head", rollout_to_regions)
check("rollout/one_position", rollout_to_regions)
check("rollout/no_residual", rollout_to_regions)
check("rollout/batched_grid", rollout_to_regions)
check("rollout/grad", rollout_to_regions)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_rollout_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now the measurement: the rollout's peak for every object word of section 6, scored with your `localisation_accuracy`, beside each layer's map (mean of the heads), for all object words and by kind of word. The residual share of 0.5 is Abnar & Zuidema's choice, not a property of the model, so the cell also prints what 0.3 and 0.7 give.

# %% nbgrader={"grade": false, "grade_id": "code_rollout", "locked": true, "schema_version": 3, "solution": false, "task": false}
if RUN_MODEL and ds.num_regions > 1 and ds.name == "shapes":
    RESIDUALS = (0.3, 0.5, 0.7)
    rolled = {a: [] for a in RESIDUALS}                                 # per residual share: one (R,) map per object word
    try:
        for start in range(0, val.num_images, 100):                   # the same images and order as section 6
            idx = list(range(start, min(start + 100, val.num_images)))
            w_batch, a_batch = caption_with_attention(model, val.features(idx).to(device))
            flows = {a: rollout_to_regions(a_batch["self"], a_batch["cross"], residual=a) for a in RESIDUALS}
            for b, i in enumerate(idx):
                for k, _kind, _cell in object_targets(w_batch[b], val.objects(i)):
                    for a in RESIDUALS:
                        rolled[a].append(flows[a][b, k])
    except NotImplementedError:
        rolled = None
        print("rollout skipped: rollout_to_regions is not implemented yet")
    if rolled is not None:
        rolled = {a: torch.stack(maps) for a, maps in rolled.items()}
        ROLL = {a: float(localisation_accuracy(maps, targets, G)) for a, maps in rolled.items()}
        layer_acc = table[:, -1]                                       # section 6: each layer, mean of heads
        same_peak = float((rolled[0.5].argmax(-1) == headline.argmax(-1)).double().mean())
        print("localisation accuracy, exact cell: " + ", ".join(f"layer {l} {v:.1%}" for l, v in enumerate(layer_acc))
              + f", rollout {ROLL[0.5]:.1%}   (chance {CHANCE[0]:.1%})")
        print("rollout with another residual share: " + ", ".join(f"{a}: {ROLL[a]:.1%}" for a in RESIDUALS))
        print(f"the rollout peaks on the last layer's peak cell for {same_peak:.0%} of the object words")
        kinds_order = ("size", "colour", "shape")
        per_kind = {name: [float(localisation_accuracy(maps[kinds == k], targets[kinds == k], G)) for k in kinds_order]
                    for name, maps in [("last layer", headline), ("rollout", rolled[0.5])]}
        print("by kind of word (last layer, rollout): " + ", ".join(
            f"{k} {per_kind['last layer'][j]:.1%}, {per_kind['rollout'][j]:.1%}" for j, k in enumerate(kinds_order)))
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 3.8), layout="constrained")
        names = [f"layer {l}" for l in range(len(layer_acc))] + ["rollout"]
        values = list(layer_acc) + [ROLL[0.5]]
        ax1.bar(names, values, color=["#8da0cb"] * len(layer_acc) + ["#fc8d62"])
        ax1.axhline(CHANCE[0], color="crimson", ls="--", label=f"chance {CHANCE[0]:.1%}")
        for x, v in enumerate(values):
            ax1.text(x, v + 0.01, f"{v:.0%}", ha="center", va="bottom")
        ax1.set_ylim(0, 1.05)
        ax1.set_xlabel("map (single layers: mean of heads)")
        ax1.set_ylabel("localisation accuracy (exact cell)")
        ax1.set_title("all object words")
        ax1.legend(loc="upper right")
        x = np.arange(len(kinds_order))
        for j, (name, accs) in enumerate(per_kind.items()):
            ax2.bar(x + (j - 0.5) * 0.38, accs, width=0.38, label=name, color=["#8da0cb", "#fc8d62"][j])
        ax2.axhline(CHANCE[0], color="crimson", ls="--")
        ax2.set_xticks(x, kinds_order)
        ax2.set_ylim(0, 1.05)
        ax2.set_xlabel("kind of object word")
        ax2.set_ylabel("localisation accuracy (exact cell)")
        ax2.set_title("by kind of word")
        ax2.legend(loc="upper right")
        fig.suptitle("does the map peak on the object the word names? rollout through every layer against single layers")
        plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_explorer", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 8 · Explore it yourself
#
# The pictures so far are the ones this notebook chose. The explorer below holds the attention of twelve validation captions: pick an image, click (or hover) a word, and the picture shows the cross-attention of the step that produced it; the buttons switch the layer, the head or the mean of the heads, and **rollout** (your `rollout_to_regions`). The words before the chosen one are shaded by the same step's self-attention. Arrow keys move along the caption. Nothing runs in Python when you click: every weight is in the page, which also works in the executed HTML copy of this notebook and offline.
#
# If your model is not loaded (no checkpoint, or notebooks 05–07 not finished), the explorer shows the attention of the **course's reference run** instead (`reference_run/09_visualizing_attention/explorer.json`), with the rollout computed by your function from those weights; the line above it says which one you see. In JupyterLab or Notebook 7, a notebook that was saved and reopened must be trusted (File → Trust Notebook) or the cell run again before the explorer draws.

# %% nbgrader={"grade": false, "grade_id": "code_explorer", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.explorer import explorer_from_run, reference_explorer

explorer = None
if RUN_MODEL and ds.num_regions > 1:
    EXPLORE = list(range(12))                                          # validation images in the explorer
    words_x, attn_x = caption_with_attention(model, val.features(EXPLORE).to(device))
    explorer = explorer_from_run(words_x, attn_x, ds.grid_shape, images=[val.image(i) for i in EXPLORE],
                                 titles=[f"val image {i}: {' '.join(w)}" for i, w in zip(EXPLORE, words_x)],
                                 title=f"your model ({DATASET}), validation images")
    print(f"the explorer shows your model on {len(EXPLORE)} validation images")
elif not os.environ.get("NBGRADER_EXECUTION"):
    try:
        explorer = reference_explorer()
        print("your model is not loaded: the explorer shows the course's reference run")
    except FileNotFoundError as exc:
        print(f"explorer skipped: {exc}")
if explorer is not None:
    try:                                                               # your rollout, on the explorer's own weights
        stored = [explorer.attention(i) for i in range(len(explorer))]
        explorer.add_view("rollout", [rollout_to_regions(torch.from_numpy(s)[:, None], torch.from_numpy(c)[:, None])[0]
                                      for c, s in stored])
    except NotImplementedError:
        print("no rollout in the explorer: rollout_to_regions is not implemented yet")
explorer

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_explorer", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 16 (2 points).** (a) From section 7's printout: does the rollout localise the named objects better or worse than the last layer's map, and than the best single layer? How does the number change with the residual share, and what does that say about the rollout as a measurement? (b) In the explorer, pick a caption of two objects and click the shape word of the *second* object. Compare layer 0, the last layer and the rollout, and the shaded self-attention over the earlier words: what do you see, and what would you conclude from the last layer's map alone? (c) Name one assumption of the rollout that could make its map wrong even where its peak is right.
#
# If your own model does not train, answer (a) from the course's reference run (section 7 of `reference_run/09_visualizing_attention.md`, in the course repository; on Colab under `/content/attention-transformers/`) and (b) from the explorer, which then shows that run.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_explorer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) In the course's reference run the rollout localises the object words far better than the last layer's map (mean of the heads) and about as well as layer 0's map, the best single layer: it adds the earlier layer's reading, which localises well, to the last layer's, which localises less well, and a peak that both agree on wins. The number grows with the residual share: a larger share keeps more of each position's own state and weighs layer 0's reading more against the last layer's. So the rollout's accuracy measures the model *and* the analyst's choice of that share; it is not a property of the model alone, and a comparison of models must fix the share in advance. (b) In the reference run's explorer, val image 5 ("a small red square below a large green cross"): for "cross", layer 0 and the rollout peak on the cross's cell, while the last layer peaks on the square's, the first object; the step's self-attention is spread over the earlier words, its largest weight on `<START>`. From the last layer alone one would conclude that the model was looking at the square when it named the cross; layer 0 had read the cross, and the residual stream carried that reading up to the word. (c) The rollout treats every sublayer as keeping a fixed share of its state and mixing the rest in proportion to the attention weights; it ignores the sizes of the value vectors and of the residual stream, the output projections and the feed-forward network, which can amplify or suppress what was read, and it averages the heads as if each counted the same.
#
# **Rubric.** 1 point: (a) the run's numbers (rollout against the last and the best single layer, the effect of the residual share) and what the share's effect means for the measurement. 1 point: (b) a concrete observation from the explorer that the last layer's map alone would mislead, and (c) one real assumption of the rollout (fixed residual share; value norms, projections and feed-forward ignored; heads weighed alike).
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_29", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 9 · Failure cases
#
# Now the captions that are **wrong**: the generated sentence matches none of the image's reference captions. For each we print both and show the attention of every word, with the true objects outlined. Notebook 08 counted the kinds of mistake: on `shapes` most wrong captions **reverse a relation**, the right two objects in the wrong order ("a small red square above a large green cross" when the cross is above the square); the few others, where there are any, get an attribute wrong (a colour, shape, size or position) or leave an object out or add one: notebook 08's counts say which occur in your run. Read the attention of each word. In a reversal whose object words attend to their own objects, the model found both objects and got wrong *which is where*: a relation is read off where the two objects are relative to each other, not off what either region contains. A wrong colour or shape whose attention lies on the *other* object says instead that the model looked at the wrong place and named what it saw there.

# %% nbgrader={"grade": false, "grade_id": "code_30", "locked": true, "schema_version": 3, "solution": false, "task": false}
if RUN_MODEL and ds.num_regions > 1 and ds.name == "shapes":
    wrong = [i for i, w in enumerate(all_words) if " ".join(w) not in set(val.references(i))]
    print(f"{len(wrong)} of {val.num_images} validation captions ({len(wrong) / val.num_images:.0%}) match no reference")
    for i in wrong[:3]:
        w_i, a_i = caption_with_attention(model, val.features([i]).to(device))
        objs = val.objects(i)
        truth = ", ".join(f"{o['size']} {o['colour']} {o['shape']} (cell {o['cell']})" for o in objs)
        print(f"image {i}: generated \u201c{' '.join(w_i[0])}\u201d\n    objects: {truth}\n    reference: \u201c{val.references(i)[0]}\u201d")
        boxes = {k: [o["bbox"] for o in objs] for k in range(len(w_i[0]))}
        show_word_overlays(val.image(i), word_maps(a_i, 0, len(w_i[0])), w_i[0], grid_shape=ds.grid_shape, boxes=boxes,
                           title=f"failure case, val image {i}: \u201c{' '.join(w_i[0])}\u201d (true objects dashed)")
        plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_31", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 10 · Other features: COCO grids and CS231n fc7 vectors
#
# **COCO grid features** (`load_dataset("coco-grid")`, built by `python -m starter.build_coco_grid`) have the same $7 \times 7$ layout, so sections 4, 5, 8 and 9 work unchanged on a model trained on them in notebook 06: set `CHECKPOINT` in section 3 to `runs/captioning_transformer_coco-grid.pt`, where that run saves it (the dataset is read from the checkpoint) and draw the attention over real photographs. That file has no object annotations, so section 6 (the number) is skipped and the overlays are the evidence. Expect them to be noisier than on the shapes: words like "a", "of", "with" have no place in the image, objects spread over several cells, and a $7 \times 7$ grid is coarse.
#
# **CS231n fc7 features** (`load_dataset("coco-fc7")`) are one 512-dimensional vector per image: $R = 1$ memory token. Cross-attention then has nothing to choose from: a softmax over one key is $e^{s}/e^{s} = 1$, whatever the query. Every word "attends" 100% to the only token, and the context it receives is a projection of the same image vector at every step: the single-context bottleneck of the RNN encoder-decoder from the lecture, in Transformer clothing. There is no map to draw; with fc7 features only the self-attention (section 4) is worth looking at. A one-region attention layer shows it directly:

# %% nbgrader={"grade": false, "grade_id": "code_32", "locked": true, "schema_version": 3, "solution": false, "task": false}
one_region = nn.MultiheadAttention(embed_dim=16, num_heads=2, batch_first=True).eval()
words_q, image_kv = torch.randn(1, 6, 16), torch.randn(1, 1, 16)        # 6 words, R = 1 region
with torch.no_grad():
    _, w1 = one_region(words_q, image_kv, image_kv, average_attn_weights=False)
print("cross-attention weights with R = 1, shape", tuple(w1.shape), "- all exactly 1:", bool((w1 == 1).all()))
print("as a picture it is a constant map:", upsample_attention(attention_to_grid(w1[0, 0], (1, 1)), (4, 4)).unique().tolist())
if RUN_MODEL and ds.num_regions == 1:
    print(f"{DATASET!r} has one region per image: no cross-attention maps to show; see the self-attention above.")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("09_visualizing_attention", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_33", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - The positional code is a set of clocks; a shift by $\phi$ words turns every clock by a fixed angle, the same from every start, and the similarity of two codes depends only on their distance.
# - `attention_to_grid` undoes the row-major flattening of the regions; `upsample_attention` turns a $7\times 7$ grid into an image-sized map (bilinear, pixel centres, `align_corners=False`), each map normalised to peak 1.
# - Forward hooks get the attention weights out of models that don't return them.
# - The row of input position $t$ is the step that produces word $t+1$: draw the attention of the step that produced a word.
# - `localisation_accuracy` turns the pictures into a number, and `chance_accuracy` says what that number would be by luck.
# - `rollout_to_regions` follows the image through every layer, self-attention included, under a stated model of the residual stream; its map is an estimate whose assumptions change the number.
# - The explorer shows every word, layer and head without re-running Python, in the notebook and in its HTML copy.
# - With one region per image (fc7) cross-attention is identically 1: there is nothing to see, and only self-attention is informative.
#
# Next, **10 · Faster attention** makes the same model decode with a cache of keys and values, and computes attention in blocks without the whole score matrix.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
