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
# 5. **failure cases**: wrong captions, and where the model was looking when it made the mistake.
#
# The graded tasks are the tools for this: turning a weight vector over regions into a grid (`attention_to_grid`), and the grid into an image-sized overlay (`upsample_attention`); picking one layer's and head's weights out of what the model returns (`collect_attention`); the localisation metric and its chance level (`localisation_accuracy`, `chance_accuracy`). They are checked on stored inputs, not on your model, so a bug in notebooks 04–08 costs no points here.
#
# **How to work.** Fill in the cells marked `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line) and run the test cell below each one: it prints `✓ … passed`, or one line naming the likely bug. The graded version of each test cell also runs hidden cases (other grid shapes, batch dimensions, float64, gradients). Don't edit or delete test cells.
#
# **What you need.** The pictures use the model you trained in notebook 06: finish `05_captioning_model.ipynb` and `07_generation_and_evaluation.ipynb`, run `06_training.ipynb` to the end first (it saves `runs/captioning_transformer.pt`), and keep them next to this notebook (on Colab: in the course folder or in `My Drive/Colab Notebooks`). While the notebook is being graded, the cells that need the trained model are skipped. If your model does not train, Question 15 can be answered from the course's reference run (`reference_run/`): it says where.

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
# Undo the flattening: a tensor of shape `(..., R)` becomes `(..., H, W)`, with any number of leading dimensions (batch, heads, words) kept as they are. If $R \neq H \cdot W$, raise a `ValueError` that says so; a silent reshape into the wrong grid would draw nonsense. One `reshape` (or `unflatten`) does it; the classic bug is the column-major order (`(W, H)` then a transpose), which draws the attention mirrored along the diagonal.

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
# 1. **upsample bilinearly** to the image size `(height, width)`, with the **pixel-centre convention**: the value of grid cell $(i, j)$ sits at the *centre* of its block, pixels between two centres are linear blends, and pixels outside the outermost centres take the edge value. (The other convention pins the cell values to the image *corners* instead, stretching the map by about one cell: the peak of an object would drift toward the image border.) `torch.nn.functional.interpolate` has both conventions, and its documentation says which is which. The input may have any number of leading dimensions.
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
# ### Task 3 · `collect_attention(layers, layer=-1, head=None)`
#
# Pick the weights to draw: from the list of per-layer tensors `(B, heads, T, S)` (`S` = `T` for self-attention, `R` for cross-attention), take layer `layer` (Python indexing: `-1` is the last layer) and then either one head (`head` an integer) or the **mean over the heads** (`head=None`). The result has shape `(B, T, S)`; every row is still a probability distribution, because a mean of distributions is one. The checks pass the layers stacked into one `(L, B, heads, T, S)` tensor: a list and such a tensor must both work.

# %% nbgrader={"grade": false, "grade_id": "collect_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def collect_attention(layers, layer=-1, head=None):
    """One layer's attention weights, for one head or averaged over the heads.

    Args:
        layers: sequence of per-layer (B, heads, T, S) tensors (a list, or one (L, B, heads, T, S) tensor).
        layer: which layer (an int, negative counts from the end).
        head: an int to pick one head, or None for the mean over all heads.
    Returns:
        (B, T, S) tensor, same dtype.
    """
    ### BEGIN SOLUTION
    weights = layers[layer]                       # (B, heads, T, S)
    return weights.mean(dim=1) if head is None else weights[:, head]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_collect_attention", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("collect/mean_heads", collect_attention)
check("collect/one_head", collect_attention)
### BEGIN HIDDEN TESTS
check("collect/first_layer", collect_attention)
check("collect/head_zero", collect_attention)
check("collect/float64_cross", collect_attention)
check("collect/grad", collect_attention)
### END HIDDEN TESTS

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
# ### Task 4 · `localisation_accuracy(cross, target_cells, grid_shape, radius=0)`
#
# `cross` holds one attention vector per word, `(..., R)`, and `target_cells` the cell each word should find, `(...)` (int64). A word is a **hit** when its argmax cell $(r, c)$ is within `radius` cells of the target $(r^*, c^*)$ in **both** directions: $|r - r^*| \le$ `radius` and $|c - c^*| \le$ `radius` (`radius=0`: exactly the target cell; `radius=1`: the $3 \times 3$ block around it, since a large object covers about $2 \times 2$ cells). Convert flat indices with the **grid width**: row `= idx // W`, column `= idx % W`. Return the fraction of hits as a 0-d tensor with `cross`'s dtype.
#
# ### Task 5 · `chance_accuracy(target_cells, grid_shape, radius=0)`
#
# A hit rate means little without the rate of a model that attends **at random**. If the argmax were a uniformly random cell, the hit probability of a word would be (number of cells within `radius` of its target, *counting only cells inside the grid*) $/\ R$; return the mean over the words as a 0-d float32 tensor. With `radius=0` that is $1/R$ for every word; near the border a $3\times 3$ block loses the cells that fall off the grid, so don't use $(2\,\text{radius}+1)^2 / R$ blindly.

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

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_29", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7 · Failure cases
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
# ## 8 · Other features: COCO grids and CS231n fc7 vectors
#
# **COCO grid features** (`load_dataset("coco-grid")`, built by `python -m starter.build_coco_grid`) have the same $7 \times 7$ layout, so sections 4, 5 and 7 work unchanged on a model trained on them in notebook 06: set `CHECKPOINT` in section 3 to `runs/captioning_transformer_coco-grid.pt`, where that run saves it (the dataset is read from the checkpoint) and draw the attention over real photographs. That file has no object annotations, so section 6 (the number) is skipped and the overlays are the evidence. Expect them to be noisier than on the shapes: words like "a", "of", "with" have no place in the image, objects spread over several cells, and a $7 \times 7$ grid is coarse.
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
# - `collect_attention` picks one layer and one head, or the mean of the heads, from what the model returns; forward hooks get the same from models that don't return their weights.
# - The row of input position $t$ is the step that produces word $t+1$: draw the attention of the step that produced a word.
# - `localisation_accuracy` turns the pictures into a number, and `chance_accuracy` says what that number would be by luck.
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
