# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 01 · Scaled dot-product attention
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/01_scaled_dot_product_attention.ipynb)
#
# In this notebook you build the operation at the heart of every Transformer, one step at a time:
#
# 1. **attention as a weighted average**, written with explicit loops so every number is visible;
# 2. the **vectorised** `scaled_dot_product_attention(q, k, v, mask=None)` that works for any number of batch dimensions;
# 3. a **causal mask** that stops a position from looking at the future, and how PyTorch's own attention and `nn.MultiheadAttention` read a mask;
# 4. a **self-attention layer** with learned projections $W_q, W_k, W_v$.
#
# Along the way you will measure *why* the scores are divided by $\sqrt{d_k}$ and see that attention, on its own, does not know the order of its inputs.
#
# **How to work.** Fill in the cells marked `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line). After each one, run the test cell below it: it prints `✓ … passed`, or one line saying what is wrong and the likely cause. The graded version of each test cell also runs hidden cases (other shapes, masks, dtypes and gradients), so make your code general, not just right for the example. Don't edit or delete test cells.

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
from starter.plotting import show_attention

torch.manual_seed(0)


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · From the RNN bottleneck to attention
#
# A sequence-to-sequence RNN reads the input $x_1, \dots, x_T$ with an **encoder** $h_t = f_W(x_t, h_{t-1})$ and then writes the output with a **decoder** $s_t = g_U(y_{t-1}, s_{t-1}, c)$. Classically the context $c$ is just the last encoder state, $c = h_T$: whatever the decoder needs to know about the whole input must squeeze through **one fixed-size vector**. For long inputs (or an image described in detail) that vector is a bottleneck.
#
# **Attention** removes the bottleneck by computing a *new* context vector at every decoder step:
#
# | step | formula | meaning |
# |---|---|---|
# | alignment scores | $e_{t,i} = f_{att}(s_{t-1}, h_i)$ | how relevant is input $i$ to output step $t$? (a scalar) |
# | attention weights | $a_{t,:} = \mathrm{softmax}(e_{t,:})$ | $0 < a_{t,i} < 1$ and $\sum_i a_{t,i} = 1$ |
# | context vector | $c_t = \sum_i a_{t,i}\, h_i$ | a weighted average of the inputs |
#
# Translating *"we see the sky"* into Italian, the word *vediamo* ("we see") should look mostly at the first two inputs, e.g. $a_{1,1}=a_{1,2}=0.45$ and $a_{1,3}=a_{1,4}=0.05$. Nothing supervises these weights: everything is differentiable, so they are learned by backpropagation.
#
# The same recipe works for images. A CNN turns an image into an $H \times W$ grid of feature vectors $z_{i,j}$; a captioning decoder computes scores $e_{t,i,j}$ over the grid, a softmax over all $H\cdot W$ cells, and a context $c_t = \sum_{i,j} a_{t,i,j} z_{i,j}$ that "looks at" different image regions for different words. That is exactly what you will build in notebooks 04–08 and visualise in notebook 09.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_05", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2 · Dot-product alignment, queries, keys and values
#
# The general attention layer drops the RNN and keeps the recipe. Replace the learned scoring function $f_{att}$ by a **dot product**, and let several **queries** ask at once:
#
# - queries $q_j$ (shape $M \times D$), one per output we want;
# - **keys** $k_i$ that the queries are compared with, and **values** $v_i$ that are averaged (both $N$ rows);
# - scores $e_{j,i} = q_j \cdot k_i / \sqrt{D}$, weights $a_{j,:} = \mathrm{softmax}(e_{j,:})$, output $y_j = \sum_i a_{j,i} v_i$.
#
# Keys and values may differ: since the scores are only scalars, the values can even have another dimension $D_v$.
#
# ### Task 1 · attention with explicit loops
#
# Write `attention_loop(query, keys, values)` **with Python loops over queries and keys** (dot products between vectors are fine; don't use matrix products of whole matrices here). Compute each score $q_j \cdot k_i / \sqrt{D}$, turn each query's scores into weights with a softmax *over the keys* (write it out: $\exp$, then divide by the sum), and average the values. What the checks enforce, while your function runs, is two rules: they watch every operation torch performs, whatever name reached it (`@`, `torch.matmul`, `mm`, `bmm`, `einsum`, `F.linear`, `F.scaled_dot_product_attention`, a convolution, an alias of any of these), and refuse a product of whole matrices (one that yields more than one number; a dot product of two vectors is fine) and any ready-made softmax (`torch.softmax`, `F.softmax`, `.softmax()`, `log_softmax`, `softmin`, `nn.Softmax`). The loops themselves are not checked: they see only torch, so scores computed all at once by broadcasting and summing, or work done in NumPy, would get past them while missing the point of this task.

# %% nbgrader={"grade": false, "grade_id": "attention_loop", "locked": false, "schema_version": 3, "solution": true, "task": false}
def attention_loop(query, keys, values):
    """Dot-product attention, one query and one key at a time.

    Args:
        query:  (M, D) tensor, one query per row.
        keys:   (N, D) tensor.
        values: (N, D_v) tensor; row i is the value of key i.
    Returns:
        output:  (M, D_v) tensor, output[j] = sum_i weights[j, i] * values[i].
        weights: (M, N) tensor, weights[j] = softmax over i of query[j] . keys[i] / sqrt(D).
    """
    M, D = query.shape
    N = keys.shape[0]
    output = torch.zeros(M, values.shape[1], dtype=values.dtype)
    weights = torch.zeros(M, N, dtype=query.dtype)
    ### BEGIN SOLUTION
    for j in range(M):
        scores = torch.stack([torch.dot(query[j], keys[i]) / math.sqrt(D) for i in range(N)])
        exp = torch.exp(scores - scores.max())  # subtracting the max changes nothing but avoids overflow
        weights[j] = exp / exp.sum()
        for i in range(N):
            output[j] = output[j] + weights[j, i] * values[i]
    ### END SOLUTION
    return output, weights


# %% nbgrader={"grade": true, "grade_id": "test_attention_loop", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("loop/basic", attention_loop)
### BEGIN HIDDEN TESTS
check("loop/rectangular", attention_loop)
check("loop/float64", attention_loop)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_06", "locked": true, "schema_version": 3, "solution": false, "task": false}
# A tiny example you can reason about by hand: three keys that are one-hot vectors, and a query that points mostly along the second one. The weights should peak on key 1, and the output should lean towards value 1, $(0, 1)$, pulled a little towards the other two values by the weight they keep.

# %% nbgrader={"grade": false, "grade_id": "code_07", "locked": true, "schema_version": 3, "solution": false, "task": false}
keys = torch.eye(3, 4)                       # 3 keys in 4 dimensions
values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
query = torch.tensor([[0.5, 4.0, 0.0, 0.0]])
out, w = attention_loop(query, keys, values)
print("weights:", w.numpy().round(3), " output:", out.numpy().round(3))


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_08", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3 · Why divide by $\sqrt{d_k}$?
#
# If the entries of $q$ and $k$ are independent with mean 0 and variance 1, the dot product $q \cdot k = \sum_{m=1}^{d} q_m k_m$ is a sum of $d$ terms of variance 1, so its **variance is $d$**. Larger dimensions therefore give larger logits, and a softmax of large logits is nearly one-hot: one key gets almost all the weight and the others get almost none. Such a softmax has **low entropy**, and its gradients almost vanish, which makes training hard. Dividing by $\sqrt{d}$ brings the variance back to 1 whatever $d$ is, the same reasoning as Xavier/Kaiming initialisation.
#
# The experiment below measures this: for each $d$ it draws random queries and 16 keys, and reports the logit variance and the entropy of the softmax, with and without scaling. (The maximum entropy over 16 keys is $\ln 16 \approx 2.77$: uniform weights.)

# %% nbgrader={"grade": false, "grade_id": "code_09", "locked": true, "schema_version": 3, "solution": false, "task": false}
def logit_stats(d, n_keys=16, n_queries=200, scale=True):
    q = torch.randn(n_queries, 1, d)
    k = torch.randn(n_queries, n_keys, d)
    logits = (q * k).sum(-1)
    if scale:
        logits = logits / math.sqrt(d)
    p = torch.softmax(logits, dim=-1)
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(-1).mean()
    return logits.var().item(), entropy.item()

dims = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
raw = [logit_stats(d, scale=False) for d in dims]
scaled = [logit_stats(d, scale=True) for d in dims]

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
ax1.loglog(dims, [v for v, _ in raw], "o-", label="q·k")
ax1.loglog(dims, [v for v, _ in scaled], "s-", label="q·k / √d")
ax1.set(xlabel="dimension d", ylabel="variance of the logits", title="Logit variance grows like d")
ax1.legend()
ax2.semilogx(dims, [h for _, h in raw], "o-", label="softmax(q·k)")
ax2.semilogx(dims, [h for _, h in scaled], "s-", label="softmax(q·k / √d)")
ax2.axhline(math.log(16), color="gray", ls="--", label="uniform (ln 16)")
ax2.set(xlabel="dimension d", ylabel="entropy (nats)", title="Unscaled softmax collapses to one key")
ax2.legend()
plt.tight_layout()
plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_10", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Without scaling the variance grows in proportion to $d$ (the points follow a line of slope 1 on the log-log plot, up to sampling noise) and the entropy falls towards 0 (a one-hot softmax); with scaling both stay flat. Keep this picture in mind when a model "refuses to learn": saturated softmaxes pass almost no gradient.
#
# ## 4 · Vectorised attention with masks
#
# Loops are clear, but they take one small step per query and key, and each step pays Python's overhead. Stack the queries into a matrix $Q$ and the keys and values into $K$ and $V$:
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right)V$$
#
# In PyTorch, `q @ k.transpose(-2, -1)` multiplies the last two dimensions and treats **every leading dimension as a batch dimension**, so one function serves `(T, d)`, `(B, T, d)` and `(B, heads, T, d)` inputs alike.
#
# **Masking.** Sometimes a query must not see some keys: padding tokens, or future words (next section). A boolean `mask` says which (query, key) pairs are allowed. We use PyTorch's convention for boolean masks in `F.scaled_dot_product_attention`: **`True` means "may attend"**. Set the disallowed scores to $-\infty$ **before** the softmax: $e^{-\infty} = 0$, so they get exactly zero weight and each row still sums to 1. (Zeroing the weights *after* the softmax leaves rows that no longer sum to 1; filling with 0 instead of $-\infty$ still gives blocked keys weight $e^0$.) The mask broadcasts against the scores, e.g. a `(T_q, T_k)` mask is shared by the whole batch. Every query must keep at least one allowed key, otherwise its softmax is $0/0$.
#
# ### Task 2 · `scaled_dot_product_attention`

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_scaling", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 1 (2 points).** The $1/\sqrt{d_k}$ factor above assumed entries of $q$ and $k$ with variance 1. Suppose instead that they come out of a projection whose outputs have variance 4 per entry (mean 0, independent). What is then the variance of $q \cdot k / \sqrt{d_k}$, and what do you expect of the softmax over 16 keys (compare with the entropy curve above)? What does this tell you about what the scaling factor does, and does not, take care of?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_scaling", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** Each term $q_m k_m$ has variance $\sigma_q^2 \sigma_k^2 = 4 \cdot 4 = 16$, so $q\cdot k$ has variance $16\,d_k$ and $q\cdot k/\sqrt{d_k}$ has variance 16 (standard deviation 4) for every $d_k$. Logits spread by about $\pm 4$ make the softmax over 16 keys far from uniform, close to the unscaled curve at small $d$ (low entropy: a few keys take most of the weight), with the small gradients that come with it. The factor removes the dependence on the *dimension* only; it cannot correct the scale of the entries themselves, which is why the projections are initialised to keep unit variance and why a LayerNorm sits before attention in a pre-norm block.
#
# **Rubric.** 1 point: variance 16 (the variances multiply; the dimension cancels). 1 point: the softmax is sharp/low-entropy with small gradients, and the factor fixes the dependence on $d_k$ only, not the entries' scale (mention of initialisation or normalisation welcome, not required). Half a point for a correct conclusion with a wrong variance.
# ### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "scaled_dot_product_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d_k)) v, over any leading batch dimensions.

    Args:
        q:    (..., T_q, d_k) queries.
        k:    (..., T_k, d_k) keys.
        v:    (..., T_k, d_v) values.
        mask: optional bool tensor broadcastable to (..., T_q, T_k); True where the query MAY attend to
              the key. Blocked scores are set to -inf before the softmax.
    Returns:
        output:  (..., T_q, d_v), same dtype as q.
        weights: (..., T_q, T_k), each row sums to 1 over the keys; exactly 0 where mask is False.
    """
    ### BEGIN SOLUTION
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    output = weights @ v
    return output, weights
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_sdpa", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("sdpa/basic", scaled_dot_product_attention)
### BEGIN HIDDEN TESTS
check("sdpa/4d", scaled_dot_product_attention)
check("sdpa/unbatched", scaled_dot_product_attention)
check("sdpa/float64", scaled_dot_product_attention)
check("sdpa/grad", scaled_dot_product_attention)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_sdpa_mask", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("sdpa/masked", scaled_dot_product_attention)
### BEGIN HIDDEN TESTS
check("sdpa/masked_padding", scaled_dot_product_attention)
check("sdpa/masked_4d", scaled_dot_product_attention)
check("sdpa/masked_grad", scaled_dot_product_attention)
check("sdpa/mask_per_key", scaled_dot_product_attention)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_11", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Your vectorised function should agree with your loop version, and with PyTorch's own implementation `F.scaled_dot_product_attention` (which returns only the output). Compare them, and the speed:

# %% nbgrader={"grade": false, "grade_id": "code_12", "locked": true, "schema_version": 3, "solution": false, "task": false}
import timeit

from starter.training import GRADING  # True while nbgrader grades this notebook

q, k, v = torch.randn(20, 16), torch.randn(30, 16), torch.randn(30, 8)
out_loop, w_loop = attention_loop(q, k, v)
out_vec, w_vec = scaled_dot_product_attention(q, k, v)
out_torch = F.scaled_dot_product_attention(q, k, v)
print("loop == vectorised:", torch.allclose(out_loop, out_vec, atol=1e-5),
      "| vectorised == PyTorch:", torch.allclose(out_vec, out_torch, atol=1e-5))

# best of 5 rounds of 20 calls each: one call is too short to time (the clock's resolution and the first
# call's warm-up would dominate); 3 rounds of 5 while nbgrader grades the notebook (the timing is not graded)
rounds, calls = (3, 5) if GRADING else (5, 20)
t_loop = min(timeit.repeat(lambda: attention_loop(q, k, v), number=calls, repeat=rounds)) / calls
t_vec = min(timeit.repeat(lambda: scaled_dot_product_attention(q, k, v), number=calls, repeat=rounds)) / calls
print(f"loop {t_loop * 1e3:.1f} ms, vectorised {t_vec * 1e3:.3f} ms per call: the loop takes {t_loop / t_vec:.1f} "
      "times as long on this machine now")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_13", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5 · The causal mask
#
# A decoder that generates a caption word by word must not peek at the words it has not produced yet. During training all positions are computed in parallel, so we block the future with a mask: query position $t$ may attend to key position $s$ only if $s \le t$. This **masked self-attention** is what lets a Transformer train on whole sequences at once instead of stepping through them like an RNN.
#
# ### Task 3 · `causal_mask(T)`

# %% nbgrader={"grade": false, "grade_id": "causal_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def causal_mask(T, device=None):
    """Boolean mask for causal (masked) self-attention.

    Args:
        T: sequence length (int).
        device: where to create the mask (default: CPU).
    Returns:
        (T, T) bool tensor with mask[t, s] = True when s <= t: position t may attend to itself and the past.
    """
    ### BEGIN SOLUTION
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_causal_mask", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("causal/5", causal_mask)
### BEGIN HIDDEN TESTS
check("causal/1", causal_mask)
check("causal/17", causal_mask)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "code_14", "locked": true, "schema_version": 3, "solution": false, "task": false}
words = ["<START>", "a", "red", "circle", "left", "of", "a", "square"]
x = 0.4 * torch.randn(len(words), 16)   # small random "embeddings"
_, w = scaled_dot_product_attention(x, x, x, mask=causal_mask(len(words)))
show_attention(w, queries=words, keys=words, title="causal self-attention: no weight on the future")
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_masking", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 2 (2 points).** A classmate masks differently: `w = torch.softmax(scores, -1) * mask`, then divides each row of `w` by its sum. (a) Show that, when every row keeps at least one allowed key, this gives the same weights as filling the blocked scores with $-\infty$ before the softmax. (b) Why is the $-\infty$ version still the better choice? Think of blocked scores that are much larger than the allowed ones (in float32 or float16), and of a row in which every key is blocked.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_masking", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) With $m_j \in \{0, 1\}$: $\frac{\mathrm{softmax}(s)_j m_j}{\sum_i \mathrm{softmax}(s)_i m_i} = \frac{e^{s_j} m_j / Z}{\sum_i e^{s_i} m_i / Z} = \frac{e^{s_j} m_j}{\sum_{i: m_i = 1} e^{s_i}}$, which is the softmax over the allowed keys only, exactly what $-\infty$ gives. (b) Numerically the two differ: if a blocked score is much larger than the allowed ones, the full softmax gives the allowed keys weights that underflow to 0 (or lose most of their digits, especially in float16), and renormalising then divides 0 by 0 (NaN) or amplifies rounding error; with $-\infty$ the blocked keys never enter the exponentials, so the allowed weights are computed at full precision. A fully blocked row gives NaN either way ($0/0$) and must be avoided or handled explicitly (every query keeps at least one key).
#
# **Rubric.** 1 point: the algebra of (a) (the normaliser $Z$ cancels). 1 point: underflow/precision with large blocked scores (or an equivalent numerical argument); the fully blocked row alone earns half a point.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_torch_sdpa", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### PyTorch's attention, and which way a mask points
#
# From here on you may use PyTorch's own `F.scaled_dot_product_attention` (on a GPU it picks a fused kernel). Its boolean `attn_mask` follows your convention, **True = may attend**; a float `attn_mask` is *added* to the scores; `is_causal=True` makes the causal mask itself. `nn.MultiheadAttention` reads its boolean masks (`key_padding_mask`, and `attn_mask` when it is boolean) the other way round: **True = blocked**. Mixing the two up raises no error, since the shapes fit. The cell below compares your function with PyTorch's under each kind of mask, then passes the causal mask flipped, and as a float tensor of ones and zeros.

# %% nbgrader={"grade": false, "grade_id": "code_torch_sdpa", "locked": true, "schema_version": 3, "solution": false, "task": false}
T = 5
q, k, v = torch.randn(2, T, 8), torch.randn(2, T, 8), torch.randn(2, T, 4)
allowed = causal_mask(T)                                             # True = may attend
yours, _ = scaled_dot_product_attention(q, k, v, mask=allowed)
additive = nn.Transformer.generate_square_subsequent_mask(T)        # PyTorch's float causal mask: 0 or -inf
for name, theirs in (("a bool mask", F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)),
                     ("an additive float mask", F.scaled_dot_product_attention(q, k, v, attn_mask=additive)),
                     ("is_causal=True", F.scaled_dot_product_attention(q, k, v, is_causal=True))):
    print(f"yours == PyTorch's with {name}: {torch.allclose(yours, theirs, atol=1e-5)}")

flipped = ~allowed                                                   # nn.MultiheadAttention's reading: True = blocked
_, w_flipped = scaled_dot_product_attention(q, k, v, mask=flipped)
print(f"flipped: query 0 may attend to keys {flipped[0].nonzero().flatten().tolist()}, the last query to "
      f"{flipped[-1].nonzero().flatten().tolist()}; the last query's weights from yours: "
      f"{[round(x, 3) for x in w_flipped[0, -1].tolist()]}, its output from PyTorch's (version {torch.__version__}): "
      f"{[round(x, 3) for x in F.scaled_dot_product_attention(q, k, v, attn_mask=flipped)[0, -1].tolist()]}")

future_moved = v.clone()
future_moved[:, 1:] += 1.0                                           # other values for keys 1 .. T-1: query 0's future
for name, mask in (("the additive mask", additive), ("the bool mask cast to float (1.0 / 0.0)", allowed.float())):
    before = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[:, 0]
    after = F.scaled_dot_product_attention(q, k, future_moved, attn_mask=mask)[:, 0]
    print(f"with {name}, query 0's output moves when its future changes: {not torch.allclose(before, after)}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_polarity", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 3 (2 points).** Use what the cell above printed. (a) With the causal mask flipped, as `nn.MultiheadAttention` would read it, which keys may query 0 attend to, and what did the last query get from your function and from PyTorch's? A model trained with this mask in PyTorch's attention raises no error: what would it learn, and why is that worse than an error? (b) A float mask is added to the scores. Why does the boolean mask cast to float (1.0 where allowed, 0.0 where blocked) block nothing, as the last line shows? What must an additive mask hold instead?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_polarity", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) Flipped, query 0 may attend only to keys 1 to 4, its future, and not to itself; every query sees only the keys after it, and the last query sees none. For that row your function returns NaN weights: every score is $-\infty$, so the softmax is $0/0$. PyTorch's function, in the version printed, returns an output of zeros for a row with no key left; versions before it give NaN as yours does. With your function that NaN would reach the loss at once; in PyTorch's attention nothing fails: the shapes fit, and with its zeros not even a NaN shows. A model trained with the flipped mask reads the words after each position, among them the word it has to predict, so its training loss falls far and fast; when it generates, those words do not exist yet and its captions are bad (notebook 08 measures a leaky mask). An error would have shown the bug at once; a model that trains and then fails at generation hides it. (b) Adding 1.0 to the allowed scores and 0.0 to the blocked ones shifts the scores, but a blocked key keeps a finite score and so a positive weight $e^{s}/Z$: the future still enters query 0's output, which is why it moved when the future values changed. An additive mask must hold 0 where attending is allowed and $-\infty$ (or a number so negative that its exponential is 0) where it is blocked, as `additive` does.
#
# **Rubric.** 1 point (a): the keys (the future only, the last query none), NaN from the softmax of all $-\infty$ against PyTorch's zeros (or NaN, by version), and why a silent leak is worse (it trains and fails at generation). 1 point (b): a finite added score keeps a positive weight; the blocked entries must be $-\infty$ and the allowed 0. Half a point for (b) without the reason.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_15", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6 · Attention does not know about order
#
# Attention treats its keys and values as an **unordered set**: the context vector is a sum, and a sum does not care about the order of its terms. Concretely, self-attention (queries, keys and values all computed from the same inputs $x$) is **permutation equivariant**: shuffle the inputs and the outputs are shuffled in exactly the same way, with the same values. So, for a model made only of attention, *"I eat apple"* and *"apple eat I"* contain the same information. Let's verify it with your function:

# %% nbgrader={"grade": false, "grade_id": "code_16", "locked": true, "schema_version": 3, "solution": false, "task": false}
x = torch.randn(6, 8)
perm = torch.randperm(6)
y, _ = scaled_dot_product_attention(x, x, x)
y_shuffled, _ = scaled_dot_product_attention(x[perm], x[perm], x[perm])
print("permutation:", perm.tolist())
print("outputs of the shuffled inputs == shuffled outputs:", torch.allclose(y_shuffled, y[perm], atol=1e-6))

# For one fixed query, shuffling keys and values together changes nothing at all (invariance):
query = torch.randn(1, 8)
same = torch.allclose(scaled_dot_product_attention(query, x, x)[0],
                      scaled_dot_product_attention(query, x[perm], x[perm])[0], atol=1e-6)
print("one query over shuffled keys/values gives the same context:", same)


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_17", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Great for sets (image regions have no natural reading order), a problem for language, where order carries grammar and meaning. Notebook 02 adds **positional encodings** to fix it.
#
# ## 7 · A self-attention layer
#
# So far the same vectors served as queries, keys and values. A **self-attention layer** gives each role its own learned linear map (weight matrices, no biases) of the inputs $x$ (shape $T \times D$):
#
# $$q = xW_q, \quad k = xW_k, \quad v = xW_v, \qquad y = \mathrm{softmax}\!\left(\frac{qk^\top}{\sqrt{d_k}}\right) v$$
#
# The layers are declared for you (`self.query`, `self.key`, `self.value`, each `nn.Linear(embed_dim, head_dim, bias=False)`); keep them exactly as given so that the stored test weights load into your module.
#
# ### Task 4 · `SelfAttention`
#
# Implement `forward`: project `x` to queries, keys and values, and reuse your `scaled_dot_product_attention` (with the mask, if given).

# %% nbgrader={"grade": false, "grade_id": "SelfAttention", "locked": false, "schema_version": 3, "solution": true, "task": false}
class SelfAttention(nn.Module):
    """Single-head self-attention: queries, keys and values are linear maps of the same input.

    Args:
        embed_dim: D, the size of each input vector.
        head_dim:  d_k, the size of the queries, keys, values and outputs (default: embed_dim).
    """

    def __init__(self, embed_dim, head_dim=None):
        super().__init__()
        head_dim = embed_dim if head_dim is None else head_dim
        self.query = nn.Linear(embed_dim, head_dim, bias=False)  # W_q
        self.key = nn.Linear(embed_dim, head_dim, bias=False)    # W_k
        self.value = nn.Linear(embed_dim, head_dim, bias=False)  # W_v

    def forward(self, x, mask=None):
        """
        Args:
            x:    (..., T, embed_dim) inputs.
            mask: optional bool tensor broadcastable to (..., T, T); True where attention is allowed.
        Returns:
            output:  (..., T, head_dim)
            weights: (..., T, T) attention weights.
        """
        ### BEGIN SOLUTION
        return scaled_dot_product_attention(self.query(x), self.key(x), self.value(x), mask=mask)
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_self_attention", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("selfattn/basic", SelfAttention)
### BEGIN HIDDEN TESTS
check("selfattn/causal", SelfAttention)
check("selfattn/unbatched", SelfAttention)
check("selfattn/grad", SelfAttention)
check("selfattn/mask_per_sequence", SelfAttention)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_18", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Debugging tip: `load_case("selfattn/basic")` returns the public test case (`.inputs`, `.params`, `.expected` as NumPy arrays) so you can compare intermediate values yourself.
#
# The layer is still permutation equivariant: the projections act on each position separately, so shuffling the words shuffles the outputs. Check it, and look at the weights of a randomly initialised layer on a short sentence:

# %% nbgrader={"grade": false, "grade_id": "code_19", "locked": true, "schema_version": 3, "solution": false, "task": false}
layer = SelfAttention(embed_dim=16, head_dim=8).eval()
words = ["I", "eat", "apple"]
x = torch.randn(3, 16)
perm = torch.tensor([2, 1, 0])                      # "apple eat I"
with torch.no_grad():
    y, w = layer(x)
    y_rev, _ = layer(x[perm])
print("self-attention output for 'apple eat I' == reordered output for 'I eat apple':",
      torch.allclose(y_rev, y[perm], atol=1e-6))
show_attention(w, queries=words, keys=words, title="untrained self-attention layer")
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("01_scaled_dot_product_attention", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_20", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - Attention computes a fresh context for every query: scores, a softmax over the keys, a weighted average of the values.
# - Dot-product scores have variance $d_k$; dividing by $\sqrt{d_k}$ keeps the softmax from saturating.
# - Masks are applied by setting scores to $-\infty$ before the softmax; the causal mask keeps $s \le t$.
# - PyTorch's `F.scaled_dot_product_attention` reads a boolean mask as you do (True = may attend) and adds a float mask to the scores (0 or $-\infty$); `nn.MultiheadAttention` reads a boolean mask the other way round (True = blocked). A flipped mask raises no error.
# - Self-attention is permutation equivariant: it needs positional information to read sequences, which is the topic of **02 · Positional encoding**.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
