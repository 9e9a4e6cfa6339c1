# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 03 · Multi-head attention and the decoder block
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/03_multi_head_attention.ipynb)
#
# One attention layer computes one set of weights per query: one way of deciding what is relevant. In this notebook you run **several attention heads in parallel** and then assemble the block that notebook 05 stacks into a captioning model:
#
# 1. `split_heads` and `merge_heads`: cutting the model dimension into $h$ heads of size $d_k = d_{model}/h$ and gluing them back, with a reshape and a transpose;
# 2. `MultiHeadAttention`: projections $W^Q, W^K, W^V$, all heads at once, **one combined mask** (causal and padding), dropout on the attention weights, the output projection $W^O$, and the per-head weights returned for visualisation;
# 3. `TransformerDecoderLayer`: masked self-attention, cross-attention to a memory (the image), a position-wise feed-forward network, residual connections and LayerNorm.
#
# **How to work.** Fill in the cells marked `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line). After each one, run the test cell below it: it prints `✓ … passed`, or one line naming the likely bug. The graded version of each test cell also runs hidden cases (other batch sizes and head counts, masks, cross-attention with a query length different from the key length, float64, gradients). Don't edit or delete test cells, and keep the layers declared in the given part of each `__init__` exactly as they are: the checks load stored weights into them by name. This notebook stands alone: it needs nothing from notebooks 01 and 02.

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

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from starter.checks import check, load_case
from starter.plotting import show_attention, show_heads

torch.manual_seed(0)


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · Why several heads?
#
# Scaled dot-product attention, $\mathrm{Attention}(Q,K,V) = \mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$, gives each query **one** distribution over the keys. But a word often needs several things at once: in *"the small red circle left of the square"*, the word "circle" may want its adjectives, and also the object it is compared with. A single softmax has to average these needs into one set of weights. **Multi-head attention** runs $h$ attention operations ("heads") in parallel, each with its own projections:
#
# $$\mathrm{head}_i = \mathrm{Attention}(QW_i^Q,\; KW_i^K,\; VW_i^V), \qquad \mathrm{MultiHead}(Q,K,V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O.$$
#
# Each head can attend to **different positions**, and each works in its own **representation subspace** of size $d_k$, so no single head has to do everything. The original Transformer uses $d_{model} = 512$ and $h = 8$ heads of size $d_k = d_v = d_{model}/h = 64$. With that choice the total cost is about that of one head of full width: we do not pay $h$ times more, we cut the same $d_{model}$ features into $h$ groups.
#
# The output projection $W^O$ ($d_{model} \times d_{model}$) then **mixes the heads**: the concatenation just puts the heads side by side, and $W^O$ lets every output feature combine information from all of them.
#
# ### Heads without loops
#
# We never loop over heads. One `nn.Linear(d_model, d_model)` computes the queries of all heads at once: its output features $0..d_k-1$ belong to head 0, features $d_k..2d_k-1$ to head 1, and so on (the matrices $W^Q_i$ are the column blocks of one big $W^Q$). To run the heads as a batch we
#
# 1. **split**: reshape `(B, T, d_model)` to `(B, T, h, d_k)` (cut the last axis into $h$ blocks of $d_k$), then **transpose** to `(B, h, T, d_k)`, so that heads become a batch dimension;
# 2. compute attention over `(B, h, T, d_k)` tensors: `q @ k.transpose(-2, -1)` treats $B$ and $h$ as batch dimensions;
# 3. **merge**: transpose back to `(B, T, h, d_k)` and reshape to `(B, T, d_model)`, which is exactly the concatenation of the heads.
#
# Skipping the transpose is the classic bug: `x.reshape(B, h, T, d_k)` has the right shape, but it cuts the *sequence* into pieces instead of the features, mixing positions between heads. Shapes don't catch it, values do.
#
# ### Task 1 · `split_heads` and `merge_heads`
#
# After a transpose the tensor is no longer contiguous in memory, so `.view` refuses to reshape it: use `.reshape` (which copies only when needed).

# %% nbgrader={"grade": false, "grade_id": "split_heads", "locked": false, "schema_version": 3, "solution": true, "task": false}
def split_heads(x, num_heads):
    """Cut the feature axis into heads and move the heads next to the batch axis.

    Args:
        x: (B, T, E) tensor, E divisible by num_heads.
        num_heads: h.
    Returns:
        (B, h, T, E // h) tensor; [:, i] holds features i*d_k .. (i+1)*d_k - 1 of every position.
    """
    B, T, E = x.shape
    ### BEGIN SOLUTION
    return x.reshape(B, T, num_heads, E // num_heads).transpose(1, 2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_split_heads", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("split/basic", split_heads)
### BEGIN HIDDEN TESTS
check("split/four_heads", split_heads)
check("split/float64", split_heads)
check("split/grad", split_heads)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "merge_heads", "locked": false, "schema_version": 3, "solution": true, "task": false}
def merge_heads(x):
    """Inverse of split_heads: concatenate the heads along the feature axis.

    Args:
        x: (B, h, T, d_k) tensor.
    Returns:
        (B, T, h * d_k) tensor; features i*d_k .. (i+1)*d_k - 1 come from head i.
    """
    B, H, T, d_k = x.shape
    ### BEGIN SOLUTION
    return x.transpose(1, 2).reshape(B, T, H * d_k)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_merge_heads", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("merge/basic", merge_heads)
### BEGIN HIDDEN TESTS
check("merge/four_heads", merge_heads)
check("merge/float64", merge_heads)
check("merge/grad", merge_heads)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "code_05", "locked": true, "schema_version": 3, "solution": false, "task": false}
x = torch.arange(2 * 3 * 8.0).reshape(2, 3, 8)      # B=2, T=3, E=8
parts = split_heads(x, num_heads=2)
print("split:", tuple(parts.shape), "| head 1 of position 0:", parts[0, 1, 0].tolist())
print("merge(split(x)) == x:", torch.equal(merge_heads(parts), x))


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_06", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2 · Masks: causal and padding, combined
#
# Two different reasons to block a (query, key) pair, and two masks with **different conventions**; read this carefully.
#
# - **`attn_mask`** (bool, broadcastable to `(T_q, T_k)` or `(B, h, T_q, T_k)`): **True = may attend**, as in notebook 01 and in `F.scaled_dot_product_attention`. Its typical use is the causal mask of notebook 01 (`causal_mask(T)`, `(T, T)`), shared by every sequence and every head.
# - **`key_padding_mask`** (bool, `(B, T_k)`): **True = this key is padding, ignore it**, as in `torch.nn.MultiheadAttention`. Sentences in a batch have different lengths and are padded to the longest one; the mask marks the padding tokens, one row per sequence.
#
# Why opposite conventions? Each name says what its `True` entries are. An *attention mask* marks the attention that is allowed; a *key padding mask* marks the keys that are padding, and padding is what we ignore. (PyTorch's own `nn.MultiheadAttention` uses True = blocked for both of its masks, so when you pass our `attn_mask` to it you must invert it: we do exactly that in a comparison below.)
#
# Inside the layer we combine them into **one** boolean tensor of allowed pairs and apply it **once**, to the scores, before the softmax:
#
# $$\text{allowed}[b, i, t, s] = \text{attn\_mask}[t, s] \;\wedge\; \neg\,\text{key\_padding\_mask}[b, s],$$
#
# with the padding mask reshaped to `(B, 1, 1, T_k)` so that it broadcasts over heads and queries. Blocked scores become $-\infty$ and get **exactly zero weight** after the softmax. Every query must keep at least one allowed key (otherwise its softmax is $0/0$ = NaN); with causal masking and padding at the end of each sequence, position 0 is always available.
#
# ## 3 · Dropout on the attention weights, and what we return
#
# Transformers regularise attention by applying dropout to the **attention weights, after the softmax and before they multiply the values**: $\text{out} = \mathrm{dropout}(\mathrm{softmax}(\cdot))\,V$. In training mode, dropout zeroes random weights and scales the rest by $1/(1-p)$ (so rows sum to 1 only on average); in `eval()` mode it does nothing. The checks run your layers in eval mode, except the `train_dropout` cases: they run them in training mode with a dropout that scales each value by a fixed function of that value instead of a random mask, so they see where the dropout goes whether you call it once or once per head.
#
# The layer returns two things: the output `(B, T_q, d_model)`, and the **per-head weights `(B, h, T_q, T_k)` as computed by the softmax, before dropout**, so that visualising them (notebook 09) shows what the model computes, not dropout noise. (`torch.nn.MultiheadAttention` averages the heads by default; we keep them apart.)
#
# ### Task 2 · `MultiHeadAttention`
#
# The four projections $W^Q, W^K, W^V, W^O$ (`q_proj`, `k_proj`, `v_proj`, `out_proj`, each `nn.Linear(embed_dim, embed_dim)` with a bias) and the dropout are declared for you, in a fixed order. Write `forward`:
#
# 1. project `query`, `key`, `value` and split them into heads (your `split_heads`);
# 2. scores $q k^\top / \sqrt{d_k}$, with $d_k$ the **head** size, `embed_dim // num_heads`, not `embed_dim`;
# 3. combine `attn_mask` and `key_padding_mask` (either may be `None`) and fill the blocked scores with $-\infty$;
# 4. softmax over the keys, keep these weights to return, apply `self.dropout` and multiply by the values;
# 5. merge the heads and apply `out_proj`.
#
# The query may come from a different sequence than the keys and values (**cross-attention**, $T_q \ne T_k$); keys and values always have the same length. Compute the attention yourself with basic tensor ops: the checks refuse PyTorch's built-in attention functions.

# %% nbgrader={"grade": false, "grade_id": "MultiHeadAttention", "locked": false, "schema_version": 3, "solution": true, "task": false}
class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention, batch first.

    Args:
        embed_dim: d_model, the size of queries, keys, values and outputs.
        num_heads: h; embed_dim must be divisible by it (head size d_k = embed_dim // h).
        dropout:   dropout probability on the attention weights (after the softmax, before @ V).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)    # W^Q of all heads
        self.k_proj = nn.Linear(embed_dim, embed_dim)    # W^K
        self.v_proj = nn.Linear(embed_dim, embed_dim)    # W^V
        self.out_proj = nn.Linear(embed_dim, embed_dim)  # W^O
        self.dropout = nn.Dropout(dropout)               # on the attention weights

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None):
        """
        Args:
            query: (B, T_q, E).
            key, value: (B, T_k, E).
            attn_mask: optional bool, broadcastable to (T_q, T_k) or (B, h, T_q, T_k); True = MAY attend.
            key_padding_mask: optional bool (B, T_k); True = the key is PADDING and gets zero weight.
        Returns:
            output:  (B, T_q, E).
            weights: (B, h, T_q, T_k) per-head attention weights after the softmax, before dropout.
        """
        ### BEGIN SOLUTION
        q = split_heads(self.q_proj(query), self.num_heads)   # (B, h, T_q, d_k)
        k = split_heads(self.k_proj(key), self.num_heads)     # (B, h, T_k, d_k)
        v = split_heads(self.v_proj(value), self.num_heads)   # (B, h, T_k, d_k)
        scores = (q * (1.0 / math.sqrt(self.head_dim))) @ k.transpose(-2, -1)  # (B, h, T_q, T_k)
        allowed = attn_mask
        if key_padding_mask is not None:
            keep = ~key_padding_mask[:, None, None, :]          # (B, 1, 1, T_k)
            allowed = keep if allowed is None else allowed & keep
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = self.dropout(weights) @ v                        # (B, h, T_q, d_k)
        return self.out_proj(merge_heads(out)), weights
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_multi_head_attention", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("mha/self", MultiHeadAttention)
check("mha/train_dropout", MultiHeadAttention)
### BEGIN HIDDEN TESTS
check("mha/cross", MultiHeadAttention)
check("mha/one_head", MultiHeadAttention)
check("mha/eight_heads_float64", MultiHeadAttention)
check("mha/grad", MultiHeadAttention)
check("mha/train_dropout_masks", MultiHeadAttention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_multi_head_attention_masks", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("mha/causal_padding", MultiHeadAttention)
### BEGIN HIDDEN TESTS
check("mha/cross_padding", MultiHeadAttention)
check("mha/mask_per_head", MultiHeadAttention)
check("mha/padding_only", MultiHeadAttention)
check("mha/masks_grad", MultiHeadAttention)
check("mha/mask_per_sequence", MultiHeadAttention)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_07", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Compare with PyTorch.** `torch.nn.MultiheadAttention` stores the three input projections in one matrix `in_proj_weight` (the rows of $W^Q$, then $W^K$, then $W^V$). Copy your weights into it and both layers must agree, once the `attn_mask` is inverted to PyTorch's True = blocked:

# %% nbgrader={"grade": false, "grade_id": "code_08", "locked": true, "schema_version": 3, "solution": false, "task": false}
B, T, E, H = 2, 6, 16, 4
mha = MultiHeadAttention(E, H).eval()
ref = nn.MultiheadAttention(E, H, batch_first=True).eval()
with torch.no_grad():
    ref.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
    ref.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
    ref.out_proj.weight.copy_(mha.out_proj.weight)
    ref.out_proj.bias.copy_(mha.out_proj.bias)

x = torch.randn(B, T, E)
causal = nn.Transformer.generate_square_subsequent_mask(T) == 0    # PyTorch's causal mask (-inf above the diagonal) as True = may attend
padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])    # True = padding (sequence 1 has 4 tokens)
with torch.no_grad():
    out, w = mha(x, x, x, attn_mask=causal, key_padding_mask=padding)
    out_ref, w_ref = ref(x, x, x, attn_mask=~causal, key_padding_mask=padding, average_attn_weights=False)
print("output matches PyTorch:", torch.allclose(out, out_ref, atol=1e-5),
      "| per-head weights match:", torch.allclose(w, w_ref, atol=1e-6))
print("weight on padded keys of sequence 1:", w[1, :, :, 4:].abs().max().item())

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_09", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The four heads of this untrained layer on the padded sequence: each head has its own pattern, the future (upper triangle) and the two padded keys get exactly zero weight, and every row sums to 1. (The padded *queries* in rows 4 and 5 still produce outputs; the loss of notebook 05 ignores them.)

# %% nbgrader={"grade": false, "grade_id": "code_10", "locked": true, "schema_version": 3, "solution": false, "task": false}
tokens = ["<START>", "a", "red", "circle", "<NULL>", "<NULL>"]
show_heads(w[1], queries=tokens, keys=tokens, title="per-head weights, causal + padding mask (untrained layer)")
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_11", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Dropout acts in training mode only, and the returned weights are taken before it:

# %% nbgrader={"grade": false, "grade_id": "code_12", "locked": true, "schema_version": 3, "solution": false, "task": false}
drop = MultiHeadAttention(E, H, dropout=0.5).train()
out1, w1 = drop(x, x, x)
out2, w2 = drop(x, x, x)
print("train mode: returned weights identical across calls:", torch.equal(w1, w2),
      "| outputs differ (dropout on the weights):", not torch.allclose(out1, out2))
drop.eval()
print("eval mode: outputs identical:", torch.equal(drop(x, x, x)[0], drop(x, x, x)[0]))


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_13", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4 · The decoder block
#
# A Transformer decoder layer has three sublayers. For a caption (the target sequence `tgt`, `(B, T, d_model)`) and an image turned into a sequence of memory vectors (`memory`, `(B, S, d_model)`, e.g. $S = 7 \times 7$ regions):
#
# 1. **masked self-attention**: each word attends to the words before it (causal `tgt_mask`, plus `tgt_key_padding_mask` for padded captions);
# 2. **cross-attention**: queries from the words, keys and values from the memory, so each word looks at the image regions it needs (`memory_key_padding_mask` if some memories are padding);
# 3. a **position-wise feed-forward network** $\mathrm{FFN}(x) = \max(0, xW_1 + b_1)W_2 + b_2$, the same two-layer MLP applied to every position separately, widening to `dim_feedforward` (typically $4 \cdot d_{model}$) and back.
#
# Each sublayer is wrapped in a **residual connection** (its input is added to its output, so information and gradients have a direct path through the stack) and a **LayerNorm**, which normalises each token's feature vector on its own (unlike BatchNorm, nothing is shared across the batch or the positions) and then rescales it with learned $\gamma, \beta$.
#
# ### Pre-norm or post-norm?
#
# The original Transformer is **post-norm**: $x \leftarrow \mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$. Here we use **pre-norm**: $x \leftarrow x + \mathrm{Sublayer}(\mathrm{LayerNorm}(x))$. In pre-norm, the residual path from the first layer to the last is a plain sum, never normalised, so gradients reach the early layers undiminished and training is stable from the start, with little or no learning-rate warm-up (Xiong et al., 2020, *On Layer Normalization in the Transformer Architecture*). Post-norm puts a LayerNorm on that path after every sublayer, and deep post-norm models often need a learning-rate warm-up, or a lower learning rate, to train at all (the measurement below shows both). Since notebooks 05–06 train a small model quickly, often on a laptop CPU, we prefer the robust choice.
#
# **Measured** by a benchmark of the course's authors, which trains a stack of 12 PyTorch encoder layers ($d_{model} = 64$, 4 heads, no dropout) to sort 12 digits, with Adam for 300 steps at a constant learning rate or with a linear warm-up over the first 100 steps, the same seed and batches for every run, and prints the mean training loss of the last 20 steps (guessing scores $\ln 10 \approx 2.30$):
#
# | learning rate | pre-norm | pre-norm, warm-up | post-norm | post-norm, warm-up |
# |---|---:|---:|---:|---:|
# | 0.001 | 0.10 | 0.10 | 0.26 | 0.26 |
# | 0.003 | 0.52 | 0.12 | 2.07 | 0.23 |
#
# Two consequences: the output of a pre-norm stack is not normalised, so **a final LayerNorm follows the last layer** (notebook 05 adds it), and this layer does not normalise the memory (whoever produces it does). This layer matches `torch.nn.TransformerDecoderLayer(..., batch_first=True, norm_first=True, activation="relu")`.
#
# In formulas, with $h$ the running value:
#
# $$h = \mathrm{tgt} + \mathrm{Drop}(\mathrm{SelfAttn}(\mathrm{LN}_1(\mathrm{tgt}))), \quad h = h + \mathrm{Drop}(\mathrm{CrossAttn}(\mathrm{LN}_2(h), \mathrm{memory})), \quad \mathrm{out} = h + \mathrm{Drop}(\mathrm{FFN}(\mathrm{LN}_3(h))),$$
#
# where the FFN also applies dropout after its ReLU. So dropout appears in three places in this block: on the attention weights inside each attention layer, on each sublayer's output before it is added to the residual, and inside the FFN. One `nn.Dropout` module can serve all of the block's own uses: it has no state.
#
# ### Task 3 · `TransformerDecoderLayer`
#
# All submodules are declared for you. Write `forward` with your `MultiHeadAttention` layers (`self.self_attn`, `self.cross_attn`), `self.linear1`, `self.linear2`, `self.norm1` to `self.norm3` and `self.dropout`. Pass `tgt_mask` (True = may attend) and `tgt_key_padding_mask` to the self-attention, `memory_key_padding_mask` to the cross-attention, and return both layers' per-head weights. Its check runs your layer with PyTorch's attention (`F.multi_head_attention_forward` on your layers' own `q_proj`, `k_proj`, `v_proj`, `out_proj`) in place of your `MultiHeadAttention`, so a mistake in Tasks 1–2 costs points once, in their own tests; to run the block in notebooks 05–06 your attention must pass too.

# %% nbgrader={"grade": false, "grade_id": "TransformerDecoderLayer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class TransformerDecoderLayer(nn.Module):
    """Pre-norm Transformer decoder layer (masked self-attention, cross-attention, feed-forward).

    Args:
        d_model: size of the token vectors (and of the memory vectors).
        num_heads: heads of both attention layers.
        dim_feedforward: hidden size of the feed-forward network.
        dropout: dropout probability (attention weights, sublayer outputs, feed-forward hidden layer).
    """

    def __init__(self, d_model, num_heads, dim_feedforward, dropout=0.1):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)  # before self-attention
        self.norm2 = nn.LayerNorm(d_model)  # before cross-attention
        self.norm3 = nn.LayerNorm(d_model)  # before the feed-forward network
        self.dropout = nn.Dropout(dropout)

    def forward(self, tgt, memory, tgt_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None):
        """
        Args:
            tgt: (B, T, d_model) target tokens (e.g. caption words).
            memory: (B, S, d_model) memory vectors (e.g. image regions).
            tgt_mask: optional bool, broadcastable to (T, T) or (B, h, T, T); True = MAY attend (e.g. causal).
            tgt_key_padding_mask: optional bool (B, T); True = padding token.
            memory_key_padding_mask: optional bool (B, S); True = padding memory vector.
        Returns:
            output: (B, T, d_model).
            self_attn_weights: (B, h, T, T).
            cross_attn_weights: (B, h, T, S).
        """
        ### BEGIN SOLUTION
        x = tgt
        h = self.norm1(x)
        attended, self_weights = self.self_attn(h, h, h, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask)
        x = x + self.dropout(attended)
        h = self.norm2(x)
        attended, cross_weights = self.cross_attn(h, memory, memory, key_padding_mask=memory_key_padding_mask)
        x = x + self.dropout(attended)
        h = self.norm3(x)
        x = x + self.dropout(self.linear2(self.dropout(torch.relu(self.linear1(h)))))
        return x, self_weights, cross_weights
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_decoder_layer", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("decoder/causal", TransformerDecoderLayer)
check("decoder/train_dropout", TransformerDecoderLayer)
### BEGIN HIDDEN TESTS
check("decoder/no_masks", TransformerDecoderLayer)
check("decoder/padding", TransformerDecoderLayer)
check("decoder/float64", TransformerDecoderLayer)
check("decoder/grad", TransformerDecoderLayer)
check("decoder/train_dropout_padding", TransformerDecoderLayer)
check("decoder/mask_per_head", TransformerDecoderLayer)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_14", "locked": true, "schema_version": 3, "solution": false, "task": false}
# A caption of 6 tokens attending to a $7 \times 7$ grid of image features ($S = 49$). The layer agrees with PyTorch's pre-norm decoder layer once the weights are copied and the causal mask inverted; the cross-attention weights of each head form a distribution over the 49 regions for every word.

# %% nbgrader={"grade": false, "grade_id": "code_15", "locked": true, "schema_version": 3, "solution": false, "task": false}
d_model, heads, S, T = 32, 4, 49, 6
layer = TransformerDecoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.1).eval()
ref = nn.TransformerDecoderLayer(d_model, heads, 4 * d_model, dropout=0.1, activation="relu",
                                 batch_first=True, norm_first=True).eval()
with torch.no_grad():
    for ours, theirs in ((layer.self_attn, ref.self_attn), (layer.cross_attn, ref.multihead_attn)):
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.load_state_dict(ours.out_proj.state_dict())
    for name in ("linear1", "linear2", "norm1", "norm2", "norm3"):
        getattr(ref, name).load_state_dict(getattr(layer, name).state_dict())

tgt, memory = torch.randn(2, T, d_model), torch.randn(2, S, d_model)
causal = nn.Transformer.generate_square_subsequent_mask(T) == 0    # True = may attend
with torch.no_grad():
    out, w_self, w_cross = layer(tgt, memory, tgt_mask=causal)
    out_ref = ref(tgt, memory, tgt_mask=~causal)
print("output", tuple(out.shape), "| self-attention weights", tuple(w_self.shape),
      "| cross-attention weights", tuple(w_cross.shape))
print("matches torch.nn.TransformerDecoderLayer(norm_first=True):", torch.allclose(out, out_ref, atol=1e-5))
fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
show_attention(w_self[0, 0], title="self-attention, head 0 (causal)", ax=axes[0])
show_attention(w_cross[0, 0], title="cross-attention, head 0: words over 49 image regions", ax=axes[1],
               annotate=False)
axes[1].set_xticks(range(0, S, 7), [f"row {r}" for r in range(7)])   # regions in reading order, 7 per row
axes[1].set_xlabel("key (image region)")
plt.tight_layout()
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_prenorm", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 6 (2 points).** Your block is pre-norm. (a) Write where the LayerNorm sits in a pre-norm and in a post-norm sublayer, and explain why a stack of pre-norm blocks needs one more LayerNorm after its last block while a post-norm stack does not. (b) Read the table of the measurement above: for which stack and at which learning rate does the warm-up decide whether the model learns at all? Explain why a deep post-norm stack is hard to train without a warm-up, and why the pre-norm stack learns without one.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_prenorm", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) Pre-norm: $x + \mathrm{Sublayer}(\mathrm{LN}(x))$; post-norm: $\mathrm{LN}(x + \mathrm{Sublayer}(x))$. In pre-norm the residual stream is a plain sum that is never normalised, so its scale grows with depth and the output of the last block is unnormalised: a final LayerNorm puts it on a fixed scale for the vocabulary head. Post-norm ends every block with a LayerNorm, so its output is already normalised. (b) At 0.003 the post-norm stack without warm-up stays close to guessing (2.07 against 2.30) and learns with the warm-up (0.23); the pre-norm stack learns either way (0.52 without, 0.12 with: the warm-up still helps it, but it does not decide). At 0.001 the warm-up changes neither. In post-norm every residual path passes through a LayerNorm after each sublayer; at initialisation the gradients near the output are large and those reaching the early layers are rescaled at every block (Xiong et al., 2020), so the first updates at a high learning rate can wreck training, and a warm-up keeps them small until the model is in a better place. Pre-norm keeps an identity path from the loss to every layer, so its gradients are well scaled from the start.
#
# **Rubric.** 1 point: both placements correct and the reason for the final LayerNorm (unnormalised residual sum). 1 point: the table read right (post-norm at 0.003 needs the warm-up to learn; pre-norm learns without) and post-norm's gradient problem at initialisation (LayerNorm on the residual path / large or badly scaled gradients) against pre-norm's identity path; half a point for one of the two.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("03_multi_head_attention", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_16", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - Multi-head attention runs $h$ heads of size $d_k = d_{model}/h$ in parallel: split with reshape **and transpose**, attend with the heads as a batch dimension, merge back, and mix the heads with $W^O$.
# - Scale the scores by $\sqrt{d_k}$ (the head size), combine the causal `attn_mask` (True = may attend) and the `key_padding_mask` (True = padding) into one mask, and fill blocked scores with $-\infty$ before the softmax.
# - Dropout acts on the attention weights after the softmax; the returned per-head weights are taken before it.
# - The pre-norm decoder layer: $x + \mathrm{Sublayer}(\mathrm{LN}(x))$ around masked self-attention, cross-attention to the memory and the feed-forward network; a final LayerNorm follows the stack.
#
# Next, **04 · The captioning Transformer: the data** prepares image features and captions; notebook 05 stacks these layers on top of the features, and notebooks 06 to 08 train the model to write captions and decode them.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
