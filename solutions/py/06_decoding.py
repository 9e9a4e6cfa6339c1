# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 06 · Decoding: beam search and sampling
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/06_decoding.ipynb)
#
# The model of notebook 05 writes a caption one word at a time, and `greedy_decode` took the most likely word at every step. That is one way to choose; here you write a second, **beam search**, which keeps several partial captions and returns the most likely whole caption it finds, then compare both with a third, **sampling**, which draws each word at random from the model's distribution.
#
# **What you need.** The graded task needs nothing from earlier notebooks: its checks run your `beam_search` on a tiny stand-in model. The comparisons use your trained model: your `CaptioningTransformer` from `04_captioning_data_and_model.ipynb`, your `greedy_decode` and `evaluate_captions` from `05_training_and_evaluation.ipynb`, and the checkpoint notebook 05 saved (`runs/captioning_transformer.pt`), all kept next to this notebook (on Colab: in the course folder or in `My Drive/Colab Notebooks`). Without one of them, the comparisons say in one line what is missing. While the notebook is being graded they are skipped.
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
import os
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from starter.checks import check
from starter.layers import with_model
from starter.metrics import format_scores

torch.manual_seed(0)
# The comparisons need the model trained in notebook 05. While nbgrader grades (NBGRADER_EXECUTION is set)
# they are skipped: no graded test depends on them.
RUN_MODEL = not os.environ.get("NBGRADER_EXECUTION")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_load", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · Your trained model
#
# The next cell loads your `CaptioningTransformer` (notebook 04), your `greedy_decode` and `evaluate_captions` (notebook 05) and the checkpoint notebook 05 saved, then the dataset the model was trained on (recorded in the checkpoint). Your `evaluate_captions` is used once it passes its public check.

# %% nbgrader={"grade": false, "grade_id": "code_load", "locked": true, "schema_version": 3, "solution": false, "task": false}
device = torch.device("cpu")   # beam search here decodes one image at a time: a CPU is enough
trained = evaluate = None
if RUN_MODEL:
    from starter.notebook_loader import NotebookLoadError, load_trained_captioner
    from starter.pipeline import yours_if_it_passes
    try:
        trained = load_trained_captioner(device=device, also=("evaluate_captions",))
    except NotebookLoadError as exc:
        print(f"comparisons skipped: {exc}")
if trained is not None:
    model, ds, vocab, greedy_decode = trained.model, trained.dataset, trained.vocab, trained.greedy_decode
    val_split = ds.split("val")
    evaluate = yours_if_it_passes("evaluate_captions", trained.defs["evaluate_captions"],
                                  instead="no comparison until it passes")
elif not RUN_MODEL:
    print("comparisons skipped while grading (NBGRADER_EXECUTION is set)")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_28", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2 · Beam search
#
# Greedy decoding commits to the best word at each step, but the best caption need not start with the best first word. **Beam search** keeps the `beam_width` ($k$) best partial captions ("hypotheses") instead of one. Its score is the sum of the log-probabilities of its words. At each step:
#
# 1. run the model on every live hypothesis ($n$ of them; one, `<START>`, at the first step) and take the log-probabilities of the next word: $n \times V$ candidates, each scored by the hypothesis' score + the word's log-probability;
# 2. keep the best $k - f$ candidates **over all of them** (not the best word of each hypothesis), $f$ being the number of hypotheses finished so far: `topk` over the flattened scores, then `index // V` is the hypothesis and `index % V` the word;
# 3. a kept candidate whose word is `<END>`, or that has reached `max_len` words, is **finished**: set it aside with its score; the others live on. Stop when no hypothesis is alive. The beam narrows as hypotheses finish, and there are at most `max_len` steps.
#
# **The graded variant is this narrowing beam.** A common variant keeps $k$ hypotheses alive at every step until $k$ have finished; it finds other captions on some of the checks' cases and loses points there.
#
# **A worked example** (the public case `beam/worked_example`). A stand-in model whose next word depends only on the word before it, over the words `<NULL> <START> <END> a big cat dog`: after `<START>`, *a* 0.6, *big* 0.4; after *a*, `<END>` 0.55, *cat* 0.45; after *big*, *dog* 0.9, `<END>` 0.1; after *dog*, `<END>` 0.6, *cat* 0.4; after *cat*, `<END>` 1. Beam width $k = 2$, at most 3 words, $\alpha = 0.7$ (scores are sums of natural logs):
#
# | step | candidates, best first | kept |
# |---|---|---|
# | 1 | *a* −0.511, *big* −0.916 | both live |
# | 2 | *big dog* −1.022, *a* `<END>` −1.109, *a cat* −1.309, *big* `<END>` −3.219 | the best $k - 0 = 2$: *big dog* lives on; *a* `<END>` is finished |
# | 3 | *big dog* `<END>` −1.532, *big dog cat* −1.938 | the best $k - 1 = 1$: *big dog* `<END>`, finished (the last step finishes every kept one) |
#
# The finished hypotheses, by their length-normalised score: *a* `<END>` $-1.109 / 2^{0.7} = -0.682$ and *big dog* `<END>` $-1.532 / 3^{0.7} = -0.710$, so the answer is **a**. A beam that keeps two alive at step 2 also keeps *a cat* and finishes it at step 3 with $-1.309 / 3^{0.7} = -0.607$, and returns *a cat*: another caption, which this check marks wrong.
#
# **Length handling.** A sum of log-probabilities only goes down with every word, so raw scores prefer short captions. Finished hypotheses are compared by their **length-normalised** score $\frac{\sum \log p}{L^{\alpha}}$, with $L$ the number of words including `<END>` and $\alpha$ = `length_penalty`: $\alpha = 0$ is the raw sum, $\alpha = 1$ the mean log-probability per word. Only this final comparison is normalised; during the search hypotheses are ranked by their raw sum (they all have the same length at a given step).
#
# With $k = 1$ this is greedy decoding (your `greedy_decode` of notebook 05).
#
# ### Task 1 · `beam_search(model, features, beam_width, max_len, start_idx=1, end_idx=2, null_idx=0, length_penalty=0.7)`
#
# `features` is `(B, R, D)`; handle one image at a time (a loop over the batch is fine) and its hypotheses as a batch: `features[b:b+1].expand(n, -1, -1)` for $n$ live hypotheses. Return the best finished caption of each image in the format of `greedy_decode`: `(B, max_len)` int64, no `<START>`, `<END>` kept, `null_idx` after it. As there, `max_len` counts every word, `<END>` included (a hypothesis of `max_len` words is finished, with or without `<END>`), and the candidates may be every word of the vocabulary or every word but `<NULL>` and `<START>` (their log-probabilities set to `-inf`): the checks' stand-in models give those two no probability, so both give the same captions.

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
from starter.layers import with_bigram
check("beam/worked_example", with_bigram(beam_search))
check("beam/basic", with_model(beam_search))
### BEGIN HIDDEN TESTS
check("beam/width_one_is_greedy", with_model(beam_search))
check("beam/raw_scores", with_model(beam_search))
check("beam/batch_wide", with_model(beam_search))
check("beam/other_special_tokens", with_model(beam_search))
check("beam/narrowing_beam", with_model(beam_search))
check("beam/end_in_length", with_model(beam_search))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_23", "locked": true, "schema_version": 3, "solution": false, "task": false}
# *How the decoding checks work:* `with_model(beam_search)` runs your function on a tiny stand-in model (`starter.layers.ToyCaptioner`, not a Transformer) with stored weights, so these checks test the decoding alone, whatever your model does.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_29", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3 · Greedy against beam search
#
# Greedy and beam search on the same validation images, with the time each spent decoding (the scoring, the same for both, left out) and how many times each called the model. Beam search scores $k$ hypotheses per image where greedy scores one, and this simple version decodes one image at a time, so it calls the model once per step for each image where greedy calls it once per step for a whole batch:

# %% nbgrader={"grade": false, "grade_id": "code_30", "locked": true, "schema_version": 3, "solution": false, "task": false}
n_compare = 100


def timed_evaluation(decode_fn):
    """(scores with the seconds spent decoding and the calls of the model made, generated captions) of your
    evaluate_captions on the first n_compare images. The seconds leave out the scoring, the same work for both."""
    calls, seconds = [], []

    def timed_decode(*args, **kwargs):
        t0 = time.perf_counter()
        tokens = decode_fn(*args, **kwargs)
        seconds.append(time.perf_counter() - t0)
        return tokens

    counter = model.register_forward_hook(lambda *_: calls.append(1))   # counts each model(...) call
    try:
        scores, captions = evaluate(model, timed_decode, compare_split, vocab, max_len=ds.max_length - 1)
    finally:
        counter.remove()
    return dict(scores, seconds=sum(seconds), model_calls=len(calls)), captions


if evaluate is not None:
    compare_split = val_split.head(n_compare)
    evaluate(model, greedy_decode, val_split.head(2), vocab, max_len=ds.max_length - 1)  # untimed: one-time costs
    greedy_scores, _ = timed_evaluation(greedy_decode)
    beam_scores, beam_captions = timed_evaluation(lambda m, f, n: beam_search(m, f, 3, n))
    print(f"first {n_compare} validation images")
    for name, s in (("greedy", greedy_scores), ("beam, k = 3", beam_scores)):
        print(f"{name:11} ({s['seconds']:5.2f} s decoding, {s['model_calls']:4d} calls of the model): "
              f"{format_scores(s)}  exact match {s['exact_match']:.1%}")
    print(f"beam search called the model {beam_scores['model_calls'] / max(greedy_scores['model_calls'], 1):.0f} "
          f"times as often as greedy and took {beam_scores['seconds'] / greedy_scores['seconds']:.0f} times "
          "its time to decode (times depend on the machine and on what else it runs)")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_sampling", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4 · A third decoder: sampling
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
# **Question 6 (2 points).** Use the numbers and the plot above. (a) Why can beam search find a caption that greedy decoding misses? Say what it gained and what it cost here, from the printed scores and times. (b) What does the temperature do to accuracy and diversity, as measured, and for what kind of use would you pick sampling over beam search?
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_decoding", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) Greedy commits to the single most likely word at each step; a caption whose first word is slightly less likely can still be the most likely caption overall, and beam search keeps $k$ prefixes so such a caption survives until its later words make up for it. Here (first 100 validation images) the beam raised the exact match and every score, at a cost: it called the model many times as often as greedy, because this version runs the model once per step for each image's live hypotheses, one image at a time, while greedy runs it once per step for the whole batch, and it took longer (the run prints how much; the ratio of times depends on the machine). (b) Lower temperature sharpens each word's distribution: exact match rises to about greedy's; higher temperature flattens it: more different captions but more wrong words, so exact match falls (the plot). Even at the lowest temperature the 3 samples of an image are about 2 different captions, not 1: each scene has three phrasings that are about equally likely (the phrasing floor of notebook 05), sharpening keeps equally likely phrasings equally likely, so the samples still pick different phrasings, each of them correct. Sampling suits uses that want variety (several different captions for one image, dialogue, creative text, data augmentation); beam search suits one best, accurate caption.
#
# **Rubric.** 1 point: beam keeps alternatives whose joint probability wins later, with the measured gain and cost. 1 point: the direction of the trade-off as measured (accuracy down, diversity up with temperature) and a sensible use for sampling.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_exposure_bias", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 7 (2 points).** Even with a correct mask, teacher forcing trains on the *true* previous words while generation feeds back the model's *own*. (a) What is this mismatch called, and how can one wrong word early in a caption spoil the words after it? Look for an example among your model's wrong captions (notebook 05's evaluation, or notebook 07's failure cases) and quote it if you find one. (b) Name one way to reduce it and say why it helps.
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
check_public("06_decoding", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - Generation feeds back the model's own words: **greedy** takes the argmax at every step; **beam search** keeps the $k$ best hypotheses, ranks every hypothesis × word together, narrows as hypotheses finish, and compares finished ones by length-normalised log-probability; **sampling** draws each word from the softmax at a temperature.
# - Beam search looks for the most likely caption at about $k$ times greedy's computation; sampling trades accuracy for diversity, steered by the temperature.
# - Teacher forcing trains on true prefixes, generation runs on the model's own: **exposure bias**.
#
# Next, **07 · Visualising attention** loads the same checkpoint and looks inside the trained model.
#
# ## Handing in
#
# Hand in your seven notebooks, `01_scaled_dot_product_attention.ipynb` to `07_visualizing_attention.ipynb`, and notebook 05's trained model, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 05's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
