# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 02 · Positional encoding
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/02_positional_encoding.ipynb)
#
# Notebook 01 ended with a problem: attention treats its inputs as an unordered **set**. In this notebook you give a Transformer a sense of order by adding a **positional encoding** to every input vector:
#
# 1. what a good position code must satisfy, and the **binary counter** that inspires the sinusoidal one;
# 2. `sinusoidal_encoding(max_len, d_model)`: the fixed sine/cosine table of *Attention is all you need*;
# 3. **relative positions**: a $2\times 2$ rotation $M(\phi)$ turns the code of position $pos$ into the code of $pos+\phi$; you write it and verify it for every frequency;
# 4. what the dot product between two codes says about their **distance**;
# 5. a `PositionalEncoding` layer that precomputes the table once and adds it to a batch of embeddings;
# 6. adding versus concatenating, and **learned** position embeddings as the alternative.
# 7. **rotary positions** (RoPE), section 4's rotation applied to each head's queries and keys, as current language models do.
#
# **How to work.** Fill in the cells marked `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line). After each one, run the test cell below it: it prints `✓ … passed`, or one line saying what is wrong and the likely cause. The graded version of each test cell also runs hidden cases (other sizes, an odd `d_model`, float64 inputs, gradients), so make your code general. Don't edit or delete test cells. This notebook stands alone: it needs nothing from notebook 01.

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
from starter.plotting import show_matrix, show_similarity_vs_distance

torch.manual_seed(0)

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · Self-attention cannot see order
#
# Recall the experiment at the end of notebook 01. In self-attention every output is a weighted **sum** over all inputs, and a sum does not care about the order of its terms. Shuffling the inputs only shuffles the outputs (permutation *equivariance*), and for one fixed query, shuffling the keys together with their values changes nothing at all (*invariance*). So *"I eat apple"* and *"apple eat I"* look identical to an attention layer: the query of "eat" receives the same context in both sentences. Here is the same check again with PyTorch's built-in attention:

# %% nbgrader={"grade": false, "grade_id": "code_05", "locked": true, "schema_version": 3, "solution": false, "task": false}
words = ["I", "eat", "apple"]
emb = {w: torch.randn(16) for w in words}             # a made-up embedding per word
x = torch.stack([emb[w] for w in words])              # "I eat apple"
x_rev = x.flip(0)                                     # "apple eat I"
y = F.scaled_dot_product_attention(x, x, x)
y_rev = F.scaled_dot_product_attention(x_rev, x_rev, x_rev)
print("context of 'eat' is the same in both sentences:", torch.allclose(y[1], y_rev[1], atol=1e-6))

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_06", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Word order carries grammar and meaning, so we must put it into the inputs themselves. The plan: a function $pos: \mathbb{N} \to \mathbb{R}^{d}$ maps position $t$ to a vector $p_t$, and each input becomes $x_t + p_t$. The same word then looks different at different places.
#
# ## 2 · What a good position code looks like
#
# Which function $pos(t)$? Some natural wishes:
#
# 1. **Unique**: every position gets its own code.
# 2. **Consistent distances**: the relation between positions $t$ and $t+k$ should not depend on how long the sentence is.
# 3. **Bounded, and extends to longer inputs**: values stay in a fixed range, and positions never seen in training still get sensible codes.
# 4. **Deterministic**: the same position always gets the same code.
#
# The simplest ideas fail: $p_t = t$ is unbounded (a position in the hundreds would swamp the word embedding); $p_t = t / T$ is bounded, but the code of "the third word" then depends on the sentence length $T$, so distances are not consistent.
#
# ### The binary-counter intuition
#
# Write the position in binary, one bit per dimension. The lowest bit flips at every step, the next every 2 steps, the next every 4, and so on: each dimension is a square wave, and the frequencies *decrease* from the first dimension to the last. Every position has a unique code, and all values are bounded by 1.

# %% nbgrader={"grade": false, "grade_id": "code_07", "locked": true, "schema_version": 3, "solution": false, "task": false}
positions = torch.arange(32)
bits = (positions[:, None] >> torch.arange(6)) & 1           # bit k of each position
show_matrix(bits, title="binary code of positions 0-31 (bit 0 flips fastest)",
            xlabel="bit k (period 2^(k+1))", ylabel="position", cmap="Greys", symmetric=False,
            colorbar_label="bit value")
plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_08", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Bits are wasteful in a world of floats, and they jump: position 7 (`0111`) and position 8 (`1000`) differ in every bit although they are neighbours. The sinusoidal encoding keeps the idea (many "clocks" running at geometrically decreasing frequencies) but replaces the square waves with smooth sines and cosines.
#
# ## 3 · The sinusoidal encoding
#
# For a model dimension $d$ (`d_model`), the encoding of position $pos$ fills **interleaved** columns: the even column $2i$ holds a sine, the odd column $2i+1$ the cosine **of the same frequency**:
#
# $$PE(pos, 2i) = \sin\!\left(\frac{pos}{10000^{2i/d}}\right), \qquad PE(pos, 2i+1) = \cos\!\left(\frac{pos}{10000^{2i/d}}\right).$$
#
# Writing $\omega_i = 1 / 10000^{2i/d}$, column pair $i$ is the point $(\sin \omega_i pos, \cos \omega_i pos)$ on the unit circle: a clock hand that turns by $\omega_i$ radians per position. The first pair turns by 1 radian per position (period $2\pi$), the last one so slowly that its period is almost $10000 \cdot 2\pi$ positions. Worked example: position 0 is $(0, 1, 0, 1, \dots)$ because $\sin 0 = 0$ and $\cos 0 = 1$; position 1 starts with $(\sin 1, \cos 1) \approx (0.841, 0.540)$.
#
# All values lie in $[-1, 1]$ (bounded), the formula is fixed (deterministic), and it can be evaluated at any position (extends to any length). The pairs of columns share one frequency, which is what makes relative positions easy (section 4).
#
# **Odd `d_model`.** The formula defines every column on its own: column $j$ uses the exponent $2\lfloor j/2 \rfloor / d$ and a sine if $j$ is even, a cosine if $j$ is odd. With an odd $d$ the last column is simply a sine whose cosine partner would be column $d$, which does not exist. We support that case (the hidden tests use an odd $d$), and keep $d$ itself in the exponent. In practice $d$ is even: multi-head attention (notebook 03) needs it divisible by the number of heads anyway.
#
# ### Task 1 · `sinusoidal_encoding(max_len, d_model)`
#
# Return the whole `(max_len, d_model)` table for positions $0, \dots, \text{max\_len}-1$, as float32. Vectorise: positions as a column `(max_len, 1)` times the frequencies as a row gives every angle at once; then fill the even columns with `sin` and the odd ones with `cos` (slicing `pe[:, 0::2]` and `pe[:, 1::2]` helps). Compute the angles in float64 and convert at the end if you want the last digits right for long tables.

# %% nbgrader={"grade": false, "grade_id": "sinusoidal_encoding", "locked": false, "schema_version": 3, "solution": true, "task": false}
def sinusoidal_encoding(max_len, d_model):
    """The sinusoidal positional-encoding table of Vaswani et al. (2017).

    Args:
        max_len: number of positions (rows), positions 0 .. max_len - 1.
        d_model: size of each code (columns); may be odd (the last column is then a sine).
    Returns:
        (max_len, d_model) float32 tensor pe with
            pe[pos, 2i]     = sin(pos / 10000 ** (2i / d_model))
            pe[pos, 2i + 1] = cos(pos / 10000 ** (2i / d_model))
    """
    ### BEGIN SOLUTION
    position = torch.arange(max_len, dtype=torch.float64)[:, None]             # (max_len, 1)
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (ceil(d/2),)
    angles = position * omega                                                   # (max_len, ceil(d/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.float()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_sinusoidal_encoding", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("sinusoidal/8x16", sinusoidal_encoding)
check("sinusoidal/odd_5", sinusoidal_encoding)
### BEGIN HIDDEN TESTS
check("sinusoidal/odd", sinusoidal_encoding)
check("sinusoidal/one_position", sinusoidal_encoding)
check("sinusoidal/long", sinusoidal_encoding)
check("sinusoidal/d2", sinusoidal_encoding)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_09", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The whole table for 100 positions and $d = 128$, one row per position. The left columns (high frequencies) change quickly from row to row, the right columns (low frequencies) barely change over these 100 positions and stay near $(0, 1)$: the same pattern as the binary counter, where the low bits flip fastest.

# %% nbgrader={"grade": false, "grade_id": "code_10", "locked": true, "schema_version": 3, "solution": false, "task": false}
pe = sinusoidal_encoding(100, 128)
show_matrix(pe, title="sinusoidal positional encoding (100 positions, d_model = 128)",
            xlabel="dimension (even: sin, odd: cos)", ylabel="position", colorbar_label="PE value")
plt.show()
print("all values in [-1, 1]:", bool(pe.abs().max() <= 1), "| rows all different:",
      len({tuple(r.tolist()) for r in pe}) == len(pe))


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_11", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4 · Relative positions are a rotation
#
# The authors of the Transformer chose sines and cosines because *for any fixed offset $\phi$, $PE(pos + \phi)$ is a linear function of $PE(pos)$*. Take one frequency $\omega$ and its pair of columns. By the angle-addition formulas,
#
# $$\sin(\omega(pos+\phi)) = \cos(\omega\phi)\sin(\omega\, pos) + \sin(\omega\phi)\cos(\omega\, pos),$$
# $$\cos(\omega(pos+\phi)) = -\sin(\omega\phi)\sin(\omega\, pos) + \cos(\omega\phi)\cos(\omega\, pos),$$
#
# which is one matrix product:
#
# $$\begin{bmatrix} \sin(\omega(pos+\phi)) \\ \cos(\omega(pos+\phi)) \end{bmatrix} = \underbrace{\begin{bmatrix} \cos(\omega\phi) & \sin(\omega\phi) \\ -\sin(\omega\phi) & \cos(\omega\phi) \end{bmatrix}}_{M(\omega, \phi)} \begin{bmatrix} \sin(\omega\, pos) \\ \cos(\omega\, pos) \end{bmatrix}.$$
#
# $M$ is a rotation by the angle $\omega\phi$, and it does **not depend on $pos$**: shifting by $\phi$ positions is the same linear map wherever you start. A layer that learns one such map can therefore learn "look 3 words back" once, for every position.
#
# ### Task 2 · `relative_shift_matrix(omega, phi)`
#
# Build $M(\omega, \phi)$ for a whole tensor of frequencies at once: the result has shape `omega.shape + (2, 2)`. Stack the four entries along a new last axis and reshape, rather than building Python lists of numbers (the hidden tests use a 0-d `omega`, a 2-D `omega`, float64 and gradients).

# %% nbgrader={"grade": false, "grade_id": "relative_shift_matrix", "locked": false, "schema_version": 3, "solution": true, "task": false}
def relative_shift_matrix(omega, phi):
    """Rotation matrices that shift sinusoidal codes by phi positions.

    Args:
        omega: tensor of frequencies, any shape (...).
        phi:   the offset, a Python number (may be negative or fractional).
    Returns:
        (..., 2, 2) tensor M with the dtype of omega, such that for every frequency
            M[...] @ [sin(omega * pos), cos(omega * pos)] = [sin(omega * (pos + phi)), cos(omega * (pos + phi))]
        i.e. M = [[cos(omega * phi), sin(omega * phi)], [-sin(omega * phi), cos(omega * phi)]].
    """
    ### BEGIN SOLUTION
    c, s = torch.cos(omega * phi), torch.sin(omega * phi)
    return torch.stack([c, s, -s, c], dim=-1).reshape(*omega.shape, 2, 2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_relative_shift_matrix", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("shiftmat/basic", relative_shift_matrix)
### BEGIN HIDDEN TESTS
check("shiftmat/scalar", relative_shift_matrix)
check("shiftmat/2d_float64", relative_shift_matrix)
check("shiftmat/grad", relative_shift_matrix)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_12", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 3 · `shift_encoding(pe, omega, phi)`
#
# Now apply the rotations to whole encodings. Column pair $i$ of a code is the 2-vector (column $2i$, column $2i+1$); rotate pair $i$ by $M(\omega_i, \phi)$ and put the results back in the same interleaved order. Reshape the last axis into pairs, `(..., d) -> (..., d/2, 2)`, use your `relative_shift_matrix`, and multiply every pair by its own matrix in one operation (`torch.einsum` or broadcasting `@` over a trailing axis of size 1). Here `d` is even.

# %% nbgrader={"grade": false, "grade_id": "shift_encoding", "locked": false, "schema_version": 3, "solution": true, "task": false}
def shift_encoding(pe, omega, phi):
    """Rotate every (sin, cos) column pair of positional codes by its own M(omega_i, phi).

    Args:
        pe:    (..., d) tensor of codes, d even; columns (2i, 2i + 1) form pair i.
        omega: (d / 2,) tensor, omega[i] is the frequency of pair i.
        phi:   the offset, a Python number.
    Returns:
        (..., d) tensor, same dtype as pe: pair i of each code replaced by
        relative_shift_matrix(omega[i], phi) @ pair i. For sinusoidal codes this is PE(pos + phi).
    """
    ### BEGIN SOLUTION
    pairs = pe.unflatten(-1, (-1, 2))                       # (..., d/2, 2)
    m = relative_shift_matrix(omega, phi).to(pe.dtype)      # (d/2, 2, 2)
    return (m @ pairs.unsqueeze(-1)).squeeze(-1).flatten(-2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_shift_encoding", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("shift/basic", shift_encoding)
### BEGIN HIDDEN TESTS
check("shift/batched", shift_encoding)
check("shift/float64", shift_encoding)
check("shift/grad", shift_encoding)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_13", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now the numerical check of the identity $PE(pos+\phi) = M(\phi)\, PE(pos)$ over **all frequency pairs at once**: rotate the codes of positions $0..L-1-\phi$ and compare them with the stored codes of positions $\phi..L-1$, for many offsets. The frequencies are read off your table itself: the angle of pair $i$ turns by $\omega_i$ from each position to the next.

# %% nbgrader={"grade": false, "grade_id": "code_14", "locked": true, "schema_version": 3, "solution": false, "task": false}
L, d = 200, 64
pe64 = sinusoidal_encoding(L, d).double()
angles = torch.atan2(pe64[:, 0::2], pe64[:, 1::2])                 # each pair's angle at each position
turns = torch.remainder(angles.diff(dim=0) + math.pi, 2 * math.pi) - math.pi   # the turn per position step
omega = turns.sum(0) / (L - 1)                                    # the pairs' frequencies, read off the table
worst = 0.0
for phi in range(1, 50):
    predicted = shift_encoding(pe64[: L - phi], omega, phi)      # M(phi) . PE(pos)
    error = (predicted - pe64[phi:]).abs().max().item()          # against PE(pos + phi), every pair
    worst = max(worst, error)
print(f"largest error over {d // 2} frequency pairs, {L} positions and offsets 1..49: {worst:.1e}")
back = (shift_encoding(pe64[7:], omega, -7) - pe64[:-7]).abs().max().item()   # M(-7) . PE(pos) = PE(pos - 7)
print(f"backwards, phi = -7: largest error {back:.1e}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_15", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Both errors are at the scale of float32 rounding, because the table is float32: one computed in float64 and then rounded is off by less than $10^{-7}$, one computed in float32 throughout by up to about $10^{-5}$ (rounding the angle $\omega_i \cdot pos$ for positions up to 200). The identity itself is exact: it holds for every pair and every offset, forwards and backwards.
#
# ## 5 · Similarity depends only on distance
#
# The dot product of two codes is a sum over the pairs: $PE(p)\cdot PE(q) = \sum_i \left[\sin\omega_i p \sin\omega_i q + \cos\omega_i p \cos\omega_i q\right] = \sum_i \cos(\omega_i (q-p))$. It depends only on the **distance** $q-p$, not on where the two positions are, and it is largest ($= d/2$) at distance 0 and falls off, symmetrically and not quite monotonically, with distance. Nearby words look similar, distant words less so, wherever they are in the sentence: the "consistent distances" wish of section 2.

# %% nbgrader={"grade": false, "grade_id": "code_16", "locked": true, "schema_version": 3, "solution": false, "task": false}
pe = sinusoidal_encoding(100, 128)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.4]})
show_matrix(pe @ pe.T, title="PE(p) · PE(q) for all pairs of positions", xlabel="position q",
            ylabel="position p", ax=ax1, cmap="viridis", symmetric=False, colorbar_label="dot product")
show_similarity_vs_distance(pe, anchors=(10, 50, 80), ax=ax2)
plt.tight_layout()
plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_17", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The three curves lie on top of each other: the similarity is a function of the distance alone. (The dot product cannot tell $+k$ from $-k$; attention layers recover the direction through their learned projections $W_q$, $W_k$, which can implement the rotations of section 4.)

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_offset", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 4 (2 points).** The plot above shows the similarity $PE(p) \cdot PE(p+k)$ as the same curve for every start $p$. (a) Show it from the formula: write the dot product as a sum over the frequency pairs $(\sin \omega_i t, \cos \omega_i t)$ and simplify it. (b) That sum is the same for $+k$ and $-k$, yet a head can attend to the word *before* rather than the word after. A head's score is $q \cdot k = (W_q x_p) \cdot (W_k x_{p+k})$, not $PE \cdot PE$: explain, with section 4's rotation, how the projections can make the score depend on the sign of the offset.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_offset", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) With $PE(t) = (\sin \omega_1 t, \cos \omega_1 t, \ldots)$: $PE(p) \cdot PE(p+k) = \sum_i [\sin \omega_i p \, \sin \omega_i (p+k) + \cos \omega_i p \, \cos \omega_i (p+k)] = \sum_i \cos(\omega_i (p+k) - \omega_i p) = \sum_i \cos \omega_i k$, by $\cos(a-b) = \cos a \cos b + \sin a \sin b$. The start $p$ cancels: the similarity depends on the offset alone. (b) The cosine is even, so $\sum_i \cos \omega_i k$ cannot tell $+k$ from $-k$. The projections put a matrix between the two codes: the positional part of the score is $PE(p)^\top W_q^\top W_k \, PE(p+k)$. If $W_q^\top W_k$ acts on a frequency pair as the rotation $M(\phi)$ of section 4, then $M(\phi) PE(p+k) = PE(p+k+\phi)$ in that pair and the term becomes $\cos \omega_i (k + \phi)$, largest at $k = -\phi$ and different for $+k$ and $-k$: a head can learn to score the word $\phi$ positions back highest. A symmetric matrix could not do this; a rotation, which is not symmetric, can.
#
# **Rubric.** 1 point: the sum of $\cos \omega_i k$ (the identity, $p$ cancels). 1 point: the matrix $W_q^\top W_k$ between the codes can rotate (or otherwise act non-symmetrically on) the frequency pairs, which shifts the peak to a signed offset. Half a point for "the projections can learn it" without saying how.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_17b", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6 · A `PositionalEncoding` layer
#
# The table does not depend on the data, so it is **computed once**, up to a maximum length, and reused for every batch, during training and generation: adding it costs one slice and one addition. We store it in the module with `register_buffer("pe", table, persistent=False)`. A **buffer** is a tensor that belongs to the module but is not a parameter: the optimiser leaves it alone, and `module.to(device)` moves it together with the weights, so the layer works on CPU and GPU inputs without any `.to()` in `forward`. (`persistent=False` keeps it out of `state_dict()`: it can always be recomputed.)
#
# The layer adds the codes of positions $0..T-1$ to a batch of embeddings `x` of shape `(B, T, d_model)` (batch first, as everywhere in this course), then applies dropout, as in the original Transformer. If `T` exceeds the precomputed `max_len`, slicing would silently return fewer rows and fail later with a confusing broadcasting error: raise a **`ValueError`** that says what happened and what to do (e.g. build the layer with a larger `max_len`).
#
# ### Task 4 · `PositionalEncoding`
#
# Fill in the two marked places: build and register the buffer in `__init__` (use your `sinusoidal_encoding`), and write `forward`. Keep the given `self.dropout`. The result has `x`'s dtype, whatever the table's.

# %% nbgrader={"grade": false, "grade_id": "PositionalEncoding", "locked": false, "schema_version": 3, "solution": true, "task": false}
class PositionalEncoding(nn.Module):
    """Adds fixed sinusoidal position codes to a batch of embeddings, then applies dropout.

    Args:
        d_model: size of the embeddings.
        max_len: longest sequence the layer accepts (the table is precomputed up to this length).
        dropout: dropout probability applied after the addition.
    """

    def __init__(self, d_model, max_len=5000, dropout=0.1):
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # Precompute the (max_len, d_model) table once and register it as a buffer named "pe"
        # (persistent=False), so that it moves with the module between devices.
        ### BEGIN SOLUTION
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
        ### END SOLUTION

    def forward(self, x):
        """
        Args:
            x: (B, T, d_model) embeddings.
        Returns:
            (B, T, d_model) tensor, dropout(x + pe[:T]), with x's dtype and device.
        Raises:
            ValueError if T > max_len.
        """
        ### BEGIN SOLUTION
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} exceeds max_len={self.max_len} of this PositionalEncoding; "
                             f"create it with max_len >= {T}")
        return self.dropout(x + self.pe[:T].to(x.dtype))
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_positional_encoding", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.layers import follows_module
check("posenc/basic", PositionalEncoding)
check("posenc/train_dropout", PositionalEncoding)
check("posenc/follows_module", follows_module(PositionalEncoding))
### BEGIN HIDDEN TESTS
check("posenc/full_length", PositionalEncoding)
check("posenc/odd_float64", PositionalEncoding)
check("posenc/grad", PositionalEncoding)
check("posenc/train_dropout_long", PositionalEncoding)
check("posenc/follows_module_float64", follows_module(PositionalEncoding))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_positional_encoding_too_long", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("posenc/too_long", PositionalEncoding)
### BEGIN HIDDEN TESTS
check("posenc/too_long_by_one", PositionalEncoding)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_18", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The buffer follows the module, and with positions added the word order is visible to attention again: the context of "eat" now differs between the two sentences.

# %% nbgrader={"grade": false, "grade_id": "code_19", "locked": true, "schema_version": 3, "solution": false, "task": false}
layer = PositionalEncoding(d_model=16, max_len=50, dropout=0.1).eval()   # eval: dropout off
print("buffers:", [name for name, _ in layer.named_buffers()], "| parameters:", len(list(layer.parameters())))
if torch.cuda.is_available():
    print("pe moved to", layer.to("cuda").pe.device)
    layer = layer.cpu()

with torch.no_grad():
    xp, xp_rev = layer(x[None])[0], layer(x_rev[None])[0]
    y, y_rev = (F.scaled_dot_product_attention(z, z, z) for z in (xp, xp_rev))
print("with positions, context of 'eat' is the same in both sentences:", torch.allclose(y[1], y_rev[1], atol=1e-6))

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_20", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7 · Adding or concatenating? Fixed or learned?
#
# **Adding** $x_t + p_t$ needs the code to have the embedding's size $d$, and costs no extra memory or compute downstream. It may look as if the two signals get mixed up, but in a high-dimensional space the model can learn to keep them in nearly separate subspaces, and since the codes are bounded by 1 they do not swamp the word embeddings. **Concatenating** $[x_t; p_t]$ keeps the two apart and allows any code size, but every later layer becomes wider, which costs memory and compute. The Transformer, and this course, add.
#
# **Learned position embeddings** are the main alternative: a lookup table `nn.Embedding(max_len, d)` with one trainable vector per position ($\text{max\_len} \times d$ parameters), trained like word embeddings. They work well (BERT and GPT-2 use them), but a position never seen in training has no trained vector, and positions beyond the table do not exist at all: **they cannot handle sequences longer than those seen in training**. The sinusoidal formula, on the other hand, is evaluated at any position:

# %% nbgrader={"grade": false, "grade_id": "code_21", "locked": true, "schema_version": 3, "solution": false, "task": false}
learned = nn.Embedding(20, 16)                         # trained on captions of at most 20 tokens
try:
    learned(torch.arange(25))
except IndexError as exc:
    print("learned table, position 24:", type(exc).__name__, "-", exc)
print("sinusoidal formula, position 24:", sinusoidal_encoding(25, 16)[24, :4].numpy().round(3), "...")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_rope", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 8 · Rotary positions: rotate the queries and keys
#
# Added to the inputs, a position code is mixed with the word's content in one vector, and a head reaches relative positions only through its projections (Question 4). **Rotary position embeddings** (RoPE; Su et al., 2021), the scheme of most current language models, put the position where the score is computed instead: after the projections and before the dot product, each head's query and key vectors are rotated pair by pair, by angles proportional to their position. Nothing is added to the inputs, and the values are not rotated.
#
# ### Task 5 · `apply_rope(x, offset=0)`
#
# `x` holds the query (or the key) vectors of one head, shape `(..., T, d)`: any leading axes (batch, heads), `d` even. Row `t` is at position `pos = offset + t`; a decoder that writes one word at a time and keeps the rotated keys of the earlier words passes just the new row, with `offset` the number of positions before it.
#
# Return a tensor of `x`'s shape, dtype and device in which each column pair $(x_{2i}, x_{2i+1})$ of a row, the pairs of section 4, is rotated by the angle $\theta_i = \omega_i \cdot pos$, with $\omega_i = 10000^{-2i/d}$, the frequencies of the sinusoidal code:
#
# $$(a, b) \mapsto (a\cos\theta_i - b\sin\theta_i,\; a\sin\theta_i + b\cos\theta_i).$$
#
# This is the direction of the RoFormer paper and of the usual implementations; as a matrix it is $M(\omega_i\,pos)^\top$, section 4's matrix transposed. The angles must stay accurate at positions in the hundreds of thousands, as long-context models use, where `pos * omega` in float32 has lost its digits. An odd `d` leaves a column without a partner: raise a `ValueError` that names `d`.

# %% nbgrader={"grade": false, "grade_id": "apply_rope", "locked": false, "schema_version": 3, "solution": true, "task": false}
def apply_rope(x, offset=0):
    """Rotary position embedding of the rows of `x`.

    Args:
        x:      (..., T, d) tensor, d even: the query or key vectors of one head; row t is at position offset + t.
        offset: the position of row 0, a Python int (0 for a whole sequence).
    Returns:
        (..., T, d) tensor, same dtype and device as x: column pair (2i, 2i + 1) of row t rotated by the angle
        omega_i * (offset + t), omega_i = 10000 ** (-2i / d).
    """
    ### BEGIN SOLUTION
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"apply_rope rotates column pairs: d must be even, got d = {d}")
    pos = torch.arange(offset, offset + x.shape[-2], dtype=torch.float64)
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = (pos[:, None] * omega[None, :]).to(x.device)             # (T, d/2), in float64
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_apply_rope", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("rope/basic", apply_rope)
check("rope/offset", apply_rope)
check("rope/far", apply_rope)
check("rope/odd_d", apply_rope)
### BEGIN HIDDEN TESTS
check("rope/heads", apply_rope)
check("rope/one_cached_step", apply_rope)
check("rope/long_float64", apply_rope)
check("rope/d2", apply_rope)
check("rope/grad", apply_rope)
check("rope/far_float32", apply_rope)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_rope_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Two properties, measured: the score of one query and one key depends on where they are only through their offset, and rotating the last row alone, with its offset, gives what rotating the whole sequence gives for that row.

# %% nbgrader={"grade": false, "grade_id": "code_rope", "locked": true, "schema_version": 3, "solution": false, "task": false}
q, k = torch.randn(1, 16), torch.randn(1, 16)   # a query and a key vector of one head, d = 16


def rope_score(m, n):
    """The score of the query at position m with the key at position n, both rotated."""
    return float(apply_rope(q, offset=m) @ apply_rope(k, offset=n).T)


for m in (3, 10, 100, 2000):
    print(f"query at {m:4d}: key 3 after it {rope_score(m, m + 3):8.4f} | key 3 before it {rope_score(m, m - 3):8.4f}")
x = torch.randn(2, 6, 16)
print("the last row rotated alone (offset 5) equals the last row of the whole sequence rotated:",
      torch.allclose(apply_rope(x)[:, -1:], apply_rope(x[:, -1:], offset=5), atol=1e-6))

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_rope", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 5 (2 points).** The cell above printed the score of one query and one key at four places, with the key 3 positions after the query and 3 before. (a) Write the rotation of pair $i$ at position $p$ as a matrix $R(\omega_i p)$ and show that the score of a query at position $m$ and a key at position $n$ depends only on $n - m$ (section 4's $M$ has the property you need). Why do the scores at $+3$ and $-3$ differ, when $PE(p) \cdot PE(p+k)$ of section 5 is the same for $+k$ and $-k$? (b) A decoder that has written $T$ words and keeps their rotated keys writes word $T + 1$: which vectors does it rotate, and with what offset? Why does it not rotate the values?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_rope", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) Pair $i$ of the query becomes $R(\omega_i m)\, q_i$ and pair $i$ of the key $R(\omega_i n)\, k_i$, so the score is $\sum_i (R(\omega_i m) q_i)^\top R(\omega_i n) k_i = \sum_i q_i^\top R(\omega_i m)^\top R(\omega_i n)\, k_i = \sum_i q_i^\top R(\omega_i (n - m))\, k_i$: a rotation's transpose is the rotation by the opposite angle, and rotations add their angles (section 4's $M$ does the same, $M(\phi)^\top M(\psi) = M(\psi - \phi)$). Only the offset $n - m$ is left, which is why each column of scores printed is the same at every place. With $\phi = \omega_i (n - m)$ a pair contributes $(q_i \cdot k_i)\cos\phi + (q_{i,1} k_{i,2} - q_{i,2} k_{i,1})\sin\phi$ (with the first and second entries of each pair): the sine term changes sign with the offset, so $+3$ and $-3$ give other scores. For $PE(p) \cdot PE(p + k)$ the two vectors of a pair are the same point of the circle at angle 0, so the sine term is 0 and only the cosine, even in $k$, is left. (b) Only the new word's query and key, each rotated with offset $T$ (the positions $0 \ldots T-1$ come before it): the keys kept were rotated for their own positions, which do not change when a word is added, as the printed check shows for the last row. The values are not rotated because position should enter only through the scores, which decide where a word looks; the output is a weighted average of values, which then carry the words' content alone.
#
# **Rubric.** 1 point (a): the transposes combine to $R(\omega_i (n - m))$, and the sign of the offset matters through the sine term (or an equivalent argument that $R(\phi) \ne R(-\phi)$ unless $q_i$ and $k_i$ are parallel), against $PE \cdot PE$ where it cancels. 1 point (b): only the new query and key, offset $T$; the values carry content, position enters through the scores. Half a point for (a) without the sign.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("02_positional_encoding", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_22", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Other families exist and are active research: relative position encodings (Shaw et al., 2018), rotary embeddings (section 8), and conditional position encodings for vision Transformers (Chu et al., 2023).
#
# ## Summary
#
# - Attention is blind to order; adding a position code $p_t$ to each input fixes that.
# - The sinusoidal code interleaves $\sin(\omega_i\, pos)$ and $\cos(\omega_i\, pos)$ with $\omega_i = 10000^{-2i/d}$: unique, bounded, deterministic, defined for any length, like a smooth binary counter.
# - A shift by $\phi$ positions is a rotation $M(\omega_i\phi)$ of every column pair, independent of the position, and the dot product of two codes depends only on their distance.
# - The table is computed once and registered as a buffer; `PositionalEncoding` adds its first $T$ rows and refuses sequences longer than `max_len` with a `ValueError`.
# - Learned embeddings are the alternative, but they cannot extend past the lengths seen in training.
# - Rotary embeddings rotate each head's queries and keys instead, pair by pair, by angles proportional to their position: the score then depends only on the offset between them, with its sign, and a cached key never needs rotating again.
#
# Next, **03 · Multi-head attention** runs several attention heads in parallel and assembles the Transformer decoder block.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
