# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 10 · Faster attention: a cache of keys and values, and attention in blocks
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/10_efficient_attention.ipynb)
#
# Your captioner is correct but wasteful in two ways that every current language model fixes.
#
# - **Decoding repeats itself.** Your `greedy_decode` of notebook 07 runs the whole prefix through the model at every step, so a caption of $L$ words costs $1 + 2 + \dots + L = L(L+1)/2$ word positions of work where $L$ would do: the keys and values of the earlier words never change. Keeping them, a **KV cache**, is how nanoGPT, Hugging Face's `generate` and every serving system decode.
# - **Attention holds a $T \times T$ matrix.** Notebook 01 computed every score at once. For long sequences that matrix is the memory bottleneck; **attention in blocks with an online softmax**, the idea behind FlashAttention (Dao et al., 2022), gives the exact same result while never holding more than one block of scores.
#
# You write four functions:
#
# - `attend_with_cache`: attention of new positions over the cached keys and values plus their own, and the cache after them;
# - `decode_step`: your notebook-05 model run on the next words only, with a cache;
# - `cached_greedy_decode`: greedy decoding with that step, the same captions as notebook 07's;
# - `blockwise_attention`: attention in blocks with an online softmax;
#
# and you measure what each saves, against caption length and against sequence length.
#
# **What you need.** The graded checks run on stand-ins and need no earlier notebook. Section 3 also compares your cached decoding with your `greedy_decode` on the model notebook 06 trained (your `CaptioningTransformer` from `05_captioning_model.ipynb`, `greedy_decode` from `07_generation_and_evaluation.ipynb` and `runs/captioning_transformer.pt`, next to this notebook; on Colab in the course folder); without them it says so in one line and the rest runs.
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
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from starter.checks import check
from starter.fast import CaptionerWeights, in_steps, largest_tensor, stepwise, with_toy_steps
from starter.layers import CAPTION_WORDS

torch.manual_seed(0)
# The measurements take a minute on a laptop. While nbgrader grades (NBGRADER_EXECUTION is set) they are
# skipped: no graded test depends on them.
RUN_MEASUREMENTS = not os.environ.get("NBGRADER_EXECUTION")
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")   # the measurements use a GPU if there is one


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_cache", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · A cache of keys and values
#
# In a decoder, position $t$ attends to positions $0 \ldots t$ only (the causal mask). So when word $t$ is added, the keys and values of positions $0 \ldots t-1$ are the ones computed at the step before: nothing later can change them. A decoding step therefore only needs the **query, key and value of the new word**; the earlier keys and values come from a cache, and the new ones are appended to it for the next step.
#
# The same holds for a block of $n$ new positions at once (a prompt fed in one call, "prefill"): they attend to the $s$ cached positions and, causally, to each other.
#
# ### Task 1 · `attend_with_cache(q, k, v, cache=None)`
#
# - `q`, `k`: `(..., n, d_k)`, `v`: `(..., n, d_v)`: the queries, keys and values of $n$ new positions (any leading axes, e.g. batch and heads).
# - `cache`: `None` (nothing before), or the pair `(K, V)` this function returned for the $s$ positions before: `(..., s, d_k)` and `(..., s, d_v)`.
# - Returns `(out, (K_new, V_new))`: `out` `(..., n, d_v)` is scaled dot-product attention (notebook 01) of the new queries over all $s + n$ keys, where new position $i$ (position $s + i$ of the sequence) may attend to positions $0 \ldots s + i$ and no later one; `K_new`, `V_new` are the earlier keys and values followed by the new ones along the position axis, `(..., s + n, d_k)` and `(..., s + n, d_v)`.
#
# Fed a sequence piece by piece, the outputs side by side must equal causal attention over the whole sequence; the check does exactly that (`in_steps` feeds it in the pieces the case names). Your attention of notebook 01 or PyTorch's `F.scaled_dot_product_attention` (with a boolean mask, True = may attend) may compute the attention itself.

# %% nbgrader={"grade": false, "grade_id": "attend_with_cache", "locked": false, "schema_version": 3, "solution": true, "task": false}
def attend_with_cache(q, k, v, cache=None):
    '''Causal attention of n new positions over the cached ones and themselves.

    Args:
        q, k: (..., n, d_k); v: (..., n, d_v).
        cache: None, or (K, V) of the s earlier positions, (..., s, d_k) and (..., s, d_v).
    Returns:
        out (..., n, d_v), and the cache (K, V) with the new positions appended, (..., s + n, d_k), (..., s + n, d_v).
    '''
    ### BEGIN SOLUTION
    if cache is not None:
        k = torch.cat([cache[0], k], dim=-2)
        v = torch.cat([cache[1], v], dim=-2)
    n, total = q.shape[-2], k.shape[-2]
    allowed = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(diagonal=total - n)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    return out, (k, v)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_attend_with_cache", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("cache/one_at_a_time", in_steps(attend_with_cache))
check("cache/prefill_then_steps", in_steps(attend_with_cache))
### BEGIN HIDDEN TESTS
check("cache/heads_float64", in_steps(attend_with_cache))
check("cache/uneven_pieces", in_steps(attend_with_cache))
check("cache/values_wider", in_steps(attend_with_cache))
check("cache/one_piece", in_steps(attend_with_cache))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_step", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2 · One decoding step of your captioner
#
# `decode_step(model, features, words, cache=None)` runs your captioner of notebook 05 on the **next words only**. `words` `(B, n)` are the words at positions $s \ldots s + n - 1$, where $s$ is the number of words the cache has seen ($0$ when `cache` is `None`). It returns `(logits, cache)`: `logits` `(B, n, V)` must equal what your model's forward gives at those positions when run on all $s + n$ words, and `cache` is what the next call needs. What the cache holds is yours to choose (a list per layer, a dict, …): the caller only passes it back. It must make the call's work independent of $s$ except for the attention over the cached keys, so keep in it each layer's self-attention keys and values (through your `attend_with_cache`), and whatever else you would otherwise recompute every step.
#
# The model is your `CaptioningTransformer` built with your own layers (notebook 05's `LAYERS = "mine"`): compute what its forward computes, in pieces, from these parts (in eval mode: no dropout):
#
# | part | what it is (notebooks 02, 03, 05) |
# |---|---|
# | `model.feature_proj`, `model.region_embed` | the image memory, as in your forward |
# | `model.word_embed` | the word embeddings |
# | `model.pos_encoding.pe` | the position table, `(max_len, d_model)`: row $t$ is added to the word at position $t$ |
# | `model.decoder_layers` | your pre-norm decoder layers, each with `norm1`, `self_attn`, `norm2`, `cross_attn`, `norm3`, `linear1`, `linear2` (ReLU between them) |
# | `layer.self_attn`, `layer.cross_attn` | each with `q_proj`, `k_proj`, `v_proj`, `out_proj` (`nn.Linear`s) and `num_heads`, heads split as in notebook 03 |
# | `model.final_norm`, `model.vocab_head` | the logits, as in your forward |
#
# A layer's forward recomputes every position and has no cache, so work from these parts, not by calling a decoder layer or an attention module: the checks' stand-in (`starter.fast.CaptionerWeights`, the same names with stored weights) holds weights only and raises if called. `torch.nn.functional`'s attention is fine for the cross-attention. The checks feed a caption in pieces (`stepwise` makes the calls) and compare all the logits with those the course's notebook-05 forward gives the whole caption with the same weights.
#
# ### Task 2 · `decode_step(model, features, words, cache=None)`

# %% nbgrader={"grade": false, "grade_id": "decode_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def decode_step(model, features, words, cache=None):
    '''Your captioner on the next words only, with a cache.

    Args:
        model: CaptioningTransformer of notebook 05 with your layers (eval mode).
        features: (B, R, D) image features.
        words: (B, n) int64, the words at positions s .. s + n - 1 (s: the words the cache has seen).
        cache: None for the first call, else what the previous call returned.
    Returns:
        logits (B, n, V) at those positions, and the cache for the next call.
    '''
    ### BEGIN SOLUTION
    def heads(x, attn):  # (B, T, d_model) -> (B, num_heads, T, head size)
        return x.unflatten(-1, (attn.num_heads, -1)).transpose(1, 2)

    if cache is None:  # the image's keys and values are the same at every step: computed once
        memory = model.feature_proj(features) + model.region_embed.weight[:features.shape[1]]
        cache = {"seen": 0, "self": [None] * len(model.decoder_layers),
                 "image": [(heads(l.cross_attn.k_proj(memory), l.cross_attn),
                            heads(l.cross_attn.v_proj(memory), l.cross_attn)) for l in model.decoder_layers]}
    s, n = cache["seen"], words.shape[1]
    x = model.word_embed(words) + model.pos_encoding.pe[s:s + n].to(features.dtype)
    kept = []
    for layer, kv, (image_k, image_v) in zip(model.decoder_layers, cache["self"], cache["image"]):
        h, attn = layer.norm1(x), layer.self_attn
        out, kv = attend_with_cache(heads(attn.q_proj(h), attn), heads(attn.k_proj(h), attn), heads(attn.v_proj(h), attn), kv)
        x = x + attn.out_proj(out.transpose(1, 2).flatten(2))
        h, attn = layer.norm2(x), layer.cross_attn
        out = F.scaled_dot_product_attention(heads(attn.q_proj(h), attn), image_k, image_v)
        x = x + attn.out_proj(out.transpose(1, 2).flatten(2))
        x = x + layer.linear2(torch.relu(layer.linear1(layer.norm3(x))))
        kept.append(kv)
    return model.vocab_head(model.final_norm(x)), {"seen": s + n, "self": kept, "image": cache["image"]}
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_decode_step", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("step/one_word_at_a_time", stepwise(decode_step))
check("step/prefill_then_steps", stepwise(decode_step))
### BEGIN HIDDEN TESTS
check("step/one_call", stepwise(decode_step))
check("step/three_layers_uneven", stepwise(decode_step))
check("step/one_region_float64", stepwise(decode_step))
check("step/long_caption", stepwise(decode_step))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_greedy", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 3 · `cached_greedy_decode(model, features, max_len, start_idx=1, end_idx=2, null_idx=0, step=decode_step)`
#
# Greedy decoding with a cached step: the same captions, in the same format, as your `greedy_decode` of notebook 07 (`(B, max_len)` int64, no `<START>`, `<END>` kept, `null_idx` after it; `max_len` counts every word, `<END>` included). Call `step(model, features, words, cache)` first with `<START>` and `cache=None`, then each time with only the words just chosen and the cache it returned: each call feeds one new position per caption, never the prefix again. A caption that has finished still takes part in the batch's calls; its words after `<END>` are `null_idx`, whatever the model says. As in notebook 07, stopping once every caption has finished is fine, and the candidates may be every word or every word but `<NULL>` and `<START>`.
#
# The check runs your function with `step` set to the cached step of a small stand-in model (`starter.fast.toy_step` on `starter.layers.ToyCaptioner`, whose "cache" is a running sum rather than keys and values), so it grades the decoding loop alone, whatever your `decode_step` does.

# %% nbgrader={"grade": false, "grade_id": "cached_greedy_decode", "locked": false, "schema_version": 3, "solution": true, "task": false}
@torch.no_grad()
def cached_greedy_decode(model, features, max_len, start_idx=1, end_idx=2, null_idx=0, step=decode_step):
    '''Greedy decoding that feeds one new word per caption and step, through a cache.

    Args:
        model, features: as for greedy_decode; features (B, R, D).
        max_len: number of words to generate at most.
        step: step(model, features, words (B, n), cache) -> (logits (B, n, V), cache).
    Returns:
        (B, max_len) int64, like greedy_decode.
    '''
    ### BEGIN SOLUTION
    B, device = features.shape[0], features.device
    words = torch.full((B, 1), start_idx, dtype=torch.long, device=device)
    out = torch.full((B, max_len), null_idx, dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    cache = None
    for t in range(max_len):
        logits, cache = step(model, features, words, cache)
        next_word = logits[:, -1].argmax(dim=-1).masked_fill(finished, null_idx)
        out[:, t] = next_word
        finished = finished | (next_word == end_idx)
        if finished.all():
            break
        words = next_word[:, None]
    return out
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_cached_greedy_decode", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("cached_greedy/basic", with_toy_steps(cached_greedy_decode))
### BEGIN HIDDEN TESTS
check("cached_greedy/one_image", with_toy_steps(cached_greedy_decode))
check("cached_greedy/all_end_early", with_toy_steps(cached_greedy_decode))
check("cached_greedy/other_special_tokens", with_toy_steps(cached_greedy_decode))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_saves", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3 · What the cache saves, measured
#
# Both decoders below are your `cached_greedy_decode`: once with your `decode_step`, and once with `without_cache(decode_step)`, a step that keeps no keys or values (its "cache" is the words so far) and runs the whole prefix through your `decode_step` every time, as notebook 07's `greedy_decode` does. Each writes captions of a fixed length, for a batch of images (the best of three runs), on a model the size of the course's (untrained: the cost of a step does not depend on what the weights learned), with an end word that never comes so that every caption has the full length. The first length is the course's caption length; the others are two, four and eight times it. The cell prints the time per caption and the word positions the model ran per caption, and plots both.

# %% nbgrader={"grade": false, "grade_id": "code_saves", "locked": true, "schema_version": 3, "solution": false, "task": false}
def without_cache(step):
    '''A step that keeps no keys or values: its cache is the words so far, and each call runs them all again.'''
    def uncached(model, features, words, cache=None):
        prefix = words if cache is None else torch.cat([cache, words], dim=1)
        logits, _ = step(model, features, prefix, None)
        return logits[:, -words.shape[1]:], prefix
    return uncached


def counted(step, positions):
    '''`step`, appending to `positions` the number of word positions each call runs through the model.'''
    def counting(model, features, words, cache=None):
        positions.append(words.numel())
        return step(model, features, words, cache)
    return counting


def cost_per_caption(model, features, length, cache=True):
    '''(seconds per caption, word positions run per caption) of cached_greedy_decode with your decode_step, or
    with a step that keeps no cache.'''
    positions, never = [], model.vocab_head.out_features   # an end word that is never chosen
    step = counted(decode_step, positions)
    if features.is_cuda:
        torch.cuda.synchronize()   # a GPU works asynchronously: wait for it before and after
    t0 = time.perf_counter()
    cached_greedy_decode(model, features, length, end_idx=never, step=step if cache else without_cache(step))
    if features.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / len(features), sum(positions) / len(features)


lengths = [CAPTION_WORDS * k for k in (1, 2, 4, 8)]
n_captions = 50   # a batch of images; more only adds time to the measurement
cost = {}
if RUN_MEASUREMENTS:
    bench = CaptionerWeights(vocab_size=31, feature_dim=64, num_regions=49, d_model=64, num_heads=4, num_layers=2,
                             dim_feedforward=256, max_len=max(lengths) + 1).eval().to(device)
    images = torch.randn(n_captions, 49, 64, device=device)
    print(f"on {device}:")
    try:
        for cache in (True, False):   # untimed: one-time costs of both
            cost_per_caption(bench, images[:2], 2, cache)
        for length in lengths:   # the best of three runs: the least disturbed by other work on the machine
            cost[length] = tuple(min((cost_per_caption(bench, images, length, cache) for _ in range(3)),
                                     key=lambda c: c[0]) for cache in (True, False))
    except NotImplementedError:
        print("not measured: finish decode_step and cached_greedy_decode first")
for length, ((cached_s, cached_n), (full_s, full_n)) in cost.items():
    print(f"{length:4d} words: {1e3 * full_s:7.2f} ms per caption without the cache, {1e3 * cached_s:6.2f} ms with it "
          f"({full_s / cached_s:4.1f}x faster) | positions run: {full_n:5.0f} against {cached_n:4.0f} "
          f"({full_n / cached_n:4.1f}x)")
if cost:
    fig, (ax_t, ax_n) = plt.subplots(1, 2, figsize=(10, 3.5))
    for i, label in enumerate(("with the cache", "without")):
        ax_t.plot(lengths, [1e3 * cost[L][i][0] for L in lengths], "o-", label=label)
        ax_n.plot(lengths, [cost[L][i][1] for L in lengths], "o-", label=label)
    ax_t.set(xlabel="words per caption", ylabel="ms per caption", title="time")
    ax_n.set(xlabel="words per caption", ylabel="word positions run", title="model work", yscale="log")
    ax_t.legend()
    plt.tight_layout()
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_trained", "locked": true, "schema_version": 3, "solution": false, "task": false}
# On your trained model: the captions of your `greedy_decode` (notebook 07) and of your `cached_greedy_decode` for the same validation images, which should be the same captions, and the time each took. Floating-point sums in another order can differ in the last digits, so on a very close call between two words the two decoders could in principle choose differently; the cell counts how many captions are the same.

# %% nbgrader={"grade": false, "grade_id": "code_trained", "locked": true, "schema_version": 3, "solution": false, "task": false}
trained = None
if RUN_MEASUREMENTS:
    from starter.notebook_loader import NotebookLoadError, load_trained_captioner
    try:
        trained = load_trained_captioner()
    except NotebookLoadError as exc:
        print(f"comparison on the trained model skipped: {exc}")
if trained is not None and not hasattr(trained.model.decoder_layers[0], "cross_attn"):
    print("comparison on the trained model skipped: it was trained with PyTorch's layers (LAYERS = \"torch\"), and "
          "decode_step is written for yours")
elif trained is not None:
    model, vocab = trained.model, trained.vocab
    images = trained.dataset.split("val").features(torch.arange(100)).float()
    special = dict(start_idx=vocab.start_idx, end_idx=vocab.end_idx, null_idx=vocab.null_idx)
    seconds = {}
    for name, decode in (("greedy_decode", trained.greedy_decode), ("cached_greedy_decode", cached_greedy_decode)):
        t0 = time.perf_counter()
        with torch.no_grad():
            seconds[name] = (decode(model, images, CAPTION_WORDS, **special), time.perf_counter() - t0)
    same = (seconds["greedy_decode"][0] == seconds["cached_greedy_decode"][0]).all(dim=1)
    print(f"the same caption for {int(same.sum())} of {len(same)} validation images; "
          + ", ".join(f"{name} {s:.3f} s" for name, (_, s) in seconds.items()))


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_cache", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 17 (2 points).** (a) The cache keeps each layer's keys and values of the earlier words, but not their queries. Why are the queries of earlier positions never needed again, while their keys and values are needed at every later step? (b) From the run above: how does the time saved grow with the caption length, and how does the time ratio compare with the ratio of word positions run? What does a step cost besides the work on its word positions?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_kv_cache", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) A query is used only to compute its own position's output: at step $t$ the new word's query is compared with the keys of positions $0 \ldots t$ and mixes their values. Later steps need the outputs of new positions only, and those read the *keys and values* of every earlier position (each new query attends to all of them), never an earlier query. With the causal mask an earlier position's output never changes, so its query has done its work once. (b) The time ratio grows with the length, as the positions ratio does ($L(L+1)/2$ against $L$, so about $(L+1)/2$): in the course's run it rises from the course's length to eight times it, and it stays below the positions ratio at every length. A step has a cost that does not depend on how many positions it runs (Python's and PyTorch's cost per operation, the cross-attention over the image, the calls themselves), and the cached step pays it at every step too; the longer the prefix, the more the work on it dominates. Timings on a busy machine are noisy, so an answer that reads its own run's figures, with this reason, is right.
#
# **Rubric.** 1 point: a query serves only its own output, while every later query reads all earlier keys and values (causality: earlier outputs never change). 1 point: the ratio grows with length, and a per-step cost that does not grow with the prefix as the reason it stays below the positions ratio.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_blocks", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4 · Attention in blocks, with an online softmax
#
# Scaled dot-product attention computes, for each query $i$, $\;\mathrm{out}_i = \sum_j \frac{e^{s_{ij}}}{\sum_{j'} e^{s_{ij'}}} v_j\;$ with $s_{ij} = q_i \cdot k_j / \sqrt{d_k}$. Notebook 01 held all the scores at once: a $T \times T$ matrix per batch and head. The softmax only needs, for each query, a running **maximum** $m$, a running **sum** $\ell = \sum_j e^{s_{ij} - m}$ and a running **weighted sum** $a = \sum_j e^{s_{ij} - m} v_j$, all updated one block of keys at a time:
#
# - for the next block of keys, compute that block's scores, $m' = \max(m, \text{the block's largest score})$;
# - rescale what you have to the new maximum, $\ell \leftarrow \ell\, e^{m - m'}$ and $a \leftarrow a\, e^{m - m'}$, then add the block: $\ell \mathrel{+}= \sum e^{s - m'}$, $a \mathrel{+}= \sum e^{s - m'} v$;
# - after the last block, $\mathrm{out} = a / \ell$.
#
# Subtracting the running maximum keeps every exponent at or below zero, so nothing overflows however large the scores: the trick of a numerically stable softmax, which subtracts the row's maximum. This is the **online softmax** (Milakov & Gimelshein, 2018), and with queries taken in blocks too it is the loop of FlashAttention.
#
# ### Task 4 · `blockwise_attention(q, k, v, block_size, causal=False, key_padding_mask=None)`
#
# - `q` `(B, h, T_q, d_k)`, `k` `(B, h, T_k, d_k)`, `v` `(B, h, T_k, d_v)`; `block_size`, a positive int (the last block may be shorter, and a block may be longer than the sequence).
# - `causal=True` (only with `T_q == T_k`): query $i$ may attend to keys $0 \ldots i$. `key_padding_mask`: `None`, or bool `(B, T_k)` with True at padding keys, which get no weight (the polarity of notebook 03's `key_padding_mask`); padding may be anywhere, at the start too. Every query may attend to at least one key, but not necessarily in every block: a block in which a query may attend to no key must add nothing to it (while its running maximum is still $-\infty$, $e^{-\infty - (-\infty)}$ is not a number).
# - Returns `(B, h, T_q, d_v)`: scaled dot-product attention, equal to `F.scaled_dot_product_attention` with the same masks to float32 rounding.
# - **What it may hold:** no tensor larger than an input or the output (padded to a whole number of blocks, if you pad), or than one block of `block_size` queries × `block_size` keys per batch and head. A full score matrix or a $T \times T$ mask is more; the check refuses any operation that makes one. PyTorch's attention and softmax functions are off limits here, under any name: the online softmax is the task.

# %% nbgrader={"grade": false, "grade_id": "blockwise_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def blockwise_attention(q, k, v, block_size, causal=False, key_padding_mask=None):
    '''Exact attention computed one block of queries against one block of keys at a time.

    Args:
        q: (B, h, T_q, d_k); k: (B, h, T_k, d_k); v: (B, h, T_k, d_v).
        block_size: queries and keys per block.
        causal: query i attends to keys 0..i (T_q == T_k).
        key_padding_mask: None or bool (B, T_k), True = padding.
    Returns:
        (B, h, T_q, d_v).
    '''
    ### BEGIN SOLUTION
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    for i in range(0, q.shape[-2], block_size):
        q_block = q[..., i:i + block_size, :] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + q_block.shape[-2], device=q.device)[:, None]
        m = torch.full((*q_block.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)  # running maximum
        total, acc = torch.zeros_like(m), 0.0  # running sum of weights, running weighted sum of values
        for j in range(0, k.shape[-2], block_size):
            scores = q_block @ k[..., j:j + block_size, :].transpose(-2, -1)
            if causal:
                scores = scores.masked_fill(torch.arange(j, j + scores.shape[-1], device=q.device) > rows, -math.inf)
            if key_padding_mask is not None:
                scores = scores.masked_fill(key_padding_mask[:, None, None, j:j + block_size], -math.inf)
            m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
            shift = m_new.masked_fill(m_new == -math.inf, 0.0)  # a query with no key so far adds nothing
            weights, rescale = torch.exp(scores - shift), torch.exp(m - shift)
            total = total * rescale + weights.sum(dim=-1, keepdim=True)
            acc = acc * rescale + weights @ v[..., j:j + block_size, :]
            m = m_new
        out[..., i:i + block_size, :] = acc / total
    return out
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_blockwise_attention", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("blocks/basic", blockwise_attention)
check("blocks/causal", blockwise_attention)
check("blocks/large_scores", blockwise_attention)
check("blocks/left_padding", blockwise_attention)
### BEGIN HIDDEN TESTS
check("blocks/padding", blockwise_attention)
check("blocks/causal_uneven", blockwise_attention)
check("blocks/one_block", blockwise_attention)
check("blocks/cross_lengths_float64", blockwise_attention)
check("blocks/causal_padding_many_heads", blockwise_attention)
check("blocks/large_scores_causal", blockwise_attention)
check("blocks/left_padding_heads", blockwise_attention)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_blocks_measured", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### What the blocks save, measured
#
# For one head and growing $T$, the cell below runs your `blockwise_attention` (blocks of 128), PyTorch's attention computed the plain way (its "math" kernel: every score at once, as in notebook 01), and PyTorch's default kernel for the device (a CPU unless a GPU is there). `largest_tensor` (from `starter.fast`) reports the most numbers any single tensor made during a call held; the cell prints it with the time and the largest difference from the plain result, and plots the memory.

# %% nbgrader={"grade": false, "grade_id": "code_blocks_measured", "locked": true, "schema_version": 3, "solution": false, "task": false}
def plain_attention(q, k, v):
    with sdpa_kernel(SDPBackend.MATH):   # every score at once
        return F.scaled_dot_product_attention(q, k, v)


def timed(fn, *args):
    '''(result, numbers held by the largest tensor, seconds) of fn(*args).'''
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    result, numbers = largest_tensor(fn, *args)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return result, numbers, time.perf_counter() - t0


block, held = 128, {}
if RUN_MEASUREMENTS:
    print(f"on {device}:")
    for T in (256, 512, 1024, 2048, 4096):
        q, k, v = (torch.randn(1, 1, T, 64, device=device) for _ in range(3))
        try:
            ours = timed(blockwise_attention, q, k, v, block)
        except NotImplementedError:
            print("not measured: finish blockwise_attention first")
            break
        plain, default = timed(plain_attention, q, k, v), timed(F.scaled_dot_product_attention, q, k, v)
        held[T] = (ours[1], plain[1], default[1])
        print(f"T = {T:5d}: largest tensor held, in numbers: blocks {ours[1]:9,d} ({ours[2]:.3f} s) | plain "
              f"{plain[1]:11,d} ({plain[2]:.3f} s) | PyTorch's default {default[1]:9,d} ({default[2]:.3f} s) | "
              f"largest difference from plain {(ours[0] - plain[0]).abs().max().item():.1e}")
if held:
    Ts = list(held)
    for i, label in enumerate(("your blockwise_attention", "plain (every score at once)", "PyTorch's default kernel")):
        plt.loglog(Ts, [held[T][i] for T in Ts], "o-", label=label)
    plt.xlabel("sequence length T")
    plt.ylabel("numbers in the largest tensor")
    plt.legend()
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_flash", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 18 (2 points).** (a) From the run: how does the largest tensor grow with $T$ for your blockwise attention and for the plain one, and what does PyTorch's default kernel appear to do? (b) FlashAttention computes exactly this loop on a GPU, and it is *faster* than the plain computation there, while your blockwise attention here is slower than the plain one. What does FlashAttention save on a GPU that this run cannot show, and why does a Python loop over blocks not get it?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_flash", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) The plain computation's largest tensor is the score matrix, $T^2$ numbers: it grows four times for every doubling of $T$. The blockwise one holds at most the inputs and one block of scores, so it grows only linearly with $T$ (the inputs and output, $T \times d$), and the score blocks stay $128 \times 128$. PyTorch's default kernel holds about as little as the blockwise one (on the course's run, a CPU): it also works in blocks (a flash-style kernel), with the same result. (b) On a GPU the cost of attention is mostly moving data between the large, slow memory (HBM) and the small, fast on-chip memory: the plain version writes the $T \times T$ scores out and reads them back for the softmax and again for the product with $V$. FlashAttention keeps each block of scores on the chip inside one fused kernel, so the scores never travel to HBM: far fewer memory reads and writes (and no $T^2$ memory), hence faster. A Python loop runs each block as several separate PyTorch operations, each writing its result to memory and paying interpreter and launch overhead, so it saves the memory but not the traffic, and it adds the overhead of many small operations.
#
# **Rubric.** 1 point: $T^2$ against linear growth read from the run (and the default kernel's small footprint). 1 point: FlashAttention's gain is memory traffic (HBM reads and writes avoided by fusing on-chip), which a loop of separate operations does not get.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_rope", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5 · Where this goes next
#
# - **Rotary positions in the captioner.** Notebook 02's `apply_rope` rotates queries and keys by their positions, so that scores depend only on the offset between two words. To use it here, each decoder layer would apply it to its self-attention's queries and keys, head by head, before the scores (in the forward and in `decode_step`, with the cache's length $s$ as the offset), and the word embeddings would get no position table. Measured by a benchmark of the course's authors, which trains the course's captioner both ways with notebook 06's settings and the same batches: with the sinusoidal table, a last validation loss of 0.132 and a greedy exact match of 94.4%; with rotary positions, 0.129 and 95.2%. On `shapes`, whose captions are short and follow fixed forms, the two do about equally well; what RoPE is for, scores that depend only on how far apart two words are, matters for long sequences and for positions beyond those seen in training.
# - **Caching across a beam.** Beam search (notebook 08) keeps $k$ hypotheses; with a cache, the kept hypotheses' caches are gathered along the batch axis at every step (the rows of the hypotheses that survive), which is what Hugging Face's `generate` does.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, pieces, masks), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("10_efficient_attention", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - With the causal mask, a position's key and value never change once computed: a **KV cache** keeps them, and each decoding step runs only the new word, so the work per caption grows with its length instead of with its square; the captions are the same.
# - The softmax can be computed **online**, one block of keys at a time, with a running maximum, sum and weighted sum rescaled as the maximum grows: attention then holds one block of scores, never the $T \times T$ matrix, and gives the same result.
# - What a GPU kernel like FlashAttention adds is keeping those blocks on the chip: less memory traffic, which a loop of separate operations cannot give.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
