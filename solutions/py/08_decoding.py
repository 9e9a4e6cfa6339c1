# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 08 · Decoding: beam search, sampling, and teacher forcing against generation
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/08_decoding.ipynb)
#
# The model of notebooks 05 and 06 writes a caption one word at a time, and `greedy_decode` took the most likely word at every step. That is one way to choose; here you write a second, **beam search**, which keeps several partial captions and returns the most likely whole caption it finds, and a third, **sampling**, which draws each word at random from the model's distribution. Then you compare the three on your model, sort its mistakes by kind, and measure what the causal mask of its training was for: a model trained with teacher forcing writes its captions in another way than it was trained.
#
# **What you need.** The graded tasks need nothing from earlier notebooks: their checks run your `beam_search` and `sample_decode` on a tiny stand-in model. The comparisons use your trained model: your `CaptioningTransformer`, `teacher_forcing_loss` and `make_optimizer` from `05_captioning_model.ipynb`, your training pieces from `06_training.ipynb` (with its `train_captioner.py`), your `greedy_decode` and `evaluate_captions` from `07_generation_and_evaluation.ipynb`, and the checkpoint notebook 06 saved (`runs/captioning_transformer.pt`), all kept next to this notebook (on Colab: in the course folder or in `My Drive/Colab Notebooks`). Without one of them, the comparisons say in one line what is missing. While the notebook is being graded they are skipped. If your model does not train, the written questions can be answered from the course's reference run (`reference_run/`): each question says where.
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
from collections import Counter

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from starter.checks import check
from starter.layers import with_model, with_sampler
from starter.metrics import format_scores
from starter.pipeline import yours_if_it_passes
from starter.scripts import read_log

torch.manual_seed(0)
# The comparisons need the model trained in notebook 06. While nbgrader grades (NBGRADER_EXECUTION is set)
# they are skipped: no graded test depends on them.
RUN_MODEL = not os.environ.get("NBGRADER_EXECUTION")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_load", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · Your trained model
#
# The next cell loads your `CaptioningTransformer` and `make_optimizer` (notebook 05), your training pieces (notebook 06), your `greedy_decode` and `evaluate_captions` (notebook 07) and the checkpoint notebook 06 saved, then the dataset the model was trained on (recorded in the checkpoint). Your `evaluate_captions` is used once it passes its public check.

# %% nbgrader={"grade": false, "grade_id": "code_load", "locked": true, "schema_version": 3, "solution": false, "task": false}
device = torch.device("cpu")   # beam search here decodes one image at a time: a CPU is enough
TRAINING_PIECES = ("fit", "train_step", "lr_at_step", "validation_loss")   # for section 5, with 05's make_optimizer
trained = evaluate = None
if RUN_MODEL:
    from starter.notebook_loader import NotebookLoadError, load_trained_captioner
    from starter.runtime import GENERATION_NOTEBOOK, MODEL_NOTEBOOK, TRAINING_NOTEBOOK
    try:
        trained = load_trained_captioner(device=device, also={MODEL_NOTEBOOK: ("make_optimizer",),
                                                              TRAINING_NOTEBOOK: TRAINING_PIECES,
                                                              GENERATION_NOTEBOOK: ("evaluate_captions",)})
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
# With $k = 1$ this is greedy decoding (your `greedy_decode` of notebook 07).
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
    greedy_scores, greedy_captions = timed_evaluation(greedy_decode)
    beam_scores, beam_captions = timed_evaluation(lambda m, f, n: beam_search(m, f, 3, n))
    print(f"first {n_compare} validation images")
    for name, s in (("greedy", greedy_scores), ("beam, k = 3", beam_scores)):
        print(f"{name:11} ({s['seconds']:5.2f} s decoding, {s['model_calls']:4d} calls of the model): "
              f"{format_scores(s)}  exact match {s['exact_match']:.1%}")
    print(f"beam search called the model {beam_scores['model_calls'] / max(greedy_scores['model_calls'], 1):.0f} "
          f"times as often as greedy and took {beam_scores['seconds'] / greedy_scores['seconds']:.0f} times "
          "its time to decode (times depend on the machine and on what else it runs)")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_error_kinds", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### What kind of mistakes?
#
# BLEU-4 and exact match say how often the captions are wrong; on `shapes` we can also say *how*. Each wrong caption is compared with its image's references (`starter.metrics.shapes_error`): an object left out (`missing_object`) or one too many (`extra_object`), the relation between two objects reversed, a wrong colour, shape, size or position (of a single object), several of these at once, or other wording. The cell counts the kinds among greedy's and beam search's captions of the comparison above, plots them side by side, and shows one wrong greedy caption of each kind that occurs.

# %% nbgrader={"grade": false, "grade_id": "code_error_kinds", "locked": true, "schema_version": 3, "solution": false, "task": false}
if evaluate is not None and ds.name == "shapes":
    from starter.metrics import SHAPES_ERRORS, shapes_error
    from starter.plotting import show_captions
    kinds = {name: [shapes_error(caps[i], compare_split.references(i)) for i in range(len(caps))]
             for name, caps in (("greedy", greedy_captions), ("beam, k = 3", beam_captions))}
    counts = {name: Counter(k) for name, k in kinds.items()}
    for name, c in counts.items():
        print(f"{name:11}: " + ", ".join(f"{k} {c[k]}" for k in SHAPES_ERRORS if c[k]))
    two = [i for i in range(n_compare) if len(compare_split.objects(i)) == 2]
    reversed_ = sum(kinds["greedy"][i] == "relation" for i in two)
    print(f"greedy reversed the relation in {reversed_} of the {len(two)} two-object images")
    wrong = [k for k in SHAPES_ERRORS[1:] if any(c[k] for c in counts.values())]
    if wrong:
        plt.figure(figsize=(6.5, 2.6))
        for j, (name, c) in enumerate(counts.items()):
            plt.bar([x + 0.4 * j for x in range(len(wrong))], [c[k] for k in wrong], width=0.4, label=name)
        plt.xticks([x + 0.2 for x in range(len(wrong))], wrong)
        plt.ylabel("captions"); plt.legend(); plt.title(f"wrong captions by kind (first {n_compare} validation images)")
        plt.show()
        examples = [kinds["greedy"].index(k) for k in wrong if k in kinds["greedy"]][:6]
        if examples:
            show_captions([compare_split.image(i) for i in examples],
                          [f"[{kinds['greedy'][i]}] {greedy_captions[i]}" for i in examples],
                          [compare_split.references(i) for i in examples],
                          title="one wrong greedy caption of each kind (generated in bold)")
            plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_bleu_exact", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 11 (2 points).** The comparison above printed a BLEU-4 and an exact-match rate for the same captions. (a) How can a caption that matches none of its image's references still score a high BLEU-4? Name a kind of mistake on `shapes` that BLEU barely punishes (the counts above show them), and say why, in terms of the n-grams it keeps. (b) Exact match is the stricter number here; why would it be useless on COCO?
#
# If your own model does not train, answer from the course's reference run: section 3 of `reference_run/08_decoding.md`, in the course repository (on Colab under `/content/attention-transformers/`), has its scores and its counts of mistake kinds.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_bleu_exact", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) BLEU-4 is a (geometric mean of) n-gram precisions against *any* reference: a caption whose pieces each appear in some reference scores high even if the whole is wrong. Swapping the two objects of a relation ("a red circle to the left of a blue square" for "a blue square to the left of a red circle") keeps every 1- to 3-gram inside each noun phrase and most 4-grams, and the other phrasing of the same scene ("a blue square to the right of a red circle") supplies more of them; a wrong colour or size changes only the few n-grams that contain that word. (b) COCO captions are free text written by different people: there are many correct captions per image and the five references cover few of them, so almost no generated caption, however good, equals a reference word for word; exact match would be near zero for every model and would not rank them.
#
# **Rubric.** 1 point: n-gram overlap with any reference explains it, with a concrete shapes error (relation swap, or colour/size/shape) and what happens to its n-grams. 1 point: COCO has many valid phrasings, so exact match is near zero for all models.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_sampling", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4 · A third decoder: sampling
#
# Greedy and beam search both look for the most likely caption. **Sampling** draws each word at random from the model's distribution instead, with a **temperature** $\tau$: $p_\tau(w) \propto \exp(\text{logit}_w / \tau)$. $\tau < 1$ sharpens the distribution (as $\tau \to 0$ all of it goes to the most likely word: greedy), $\tau > 1$ flattens it (towards every word equally likely).
#
# ### Task 2 · `sample_decode(model, features, max_len, temperature=1.0, generator=None, start_idx=1, end_idx=2, null_idx=0)`
#
# Like your `greedy_decode`, with the same output: `(B, max_len)` int64, no `<START>`, `<END>` kept, `null_idx` after it and wherever decoding stopped early; `max_len` counts every word, `<END>` included. The difference: at each step the next word of each caption is **drawn** from the softmax of its last position's logits divided by `temperature`, instead of taken by `argmax`.
#
# So that one `generator` always gives the same captions (the checks seed it and compare captions), draw in one way: at each step, **one** call of `torch.multinomial` with `num_samples=1` and `generator=generator` (no other sampler: `torch.distributions.Categorical` takes no generator), on the `(B, V)` probabilities of **every** caption, finished ones included (a finished caption's draw is replaced by `null_idx`). Whether you stop once every caption has finished or run all `max_len` steps gives the same captions. A `torch.Generator()` lives on the CPU and draws only there: compute the probabilities in float32, draw from them on the CPU, and put the words back on `features.device`. As for greedy, the candidates may be every word or every word but `<NULL>` and `<START>`: the checks' stand-in model gives those two no probability. Run it under `torch.no_grad()`.

# %% nbgrader={"grade": false, "grade_id": "sample_decode", "locked": false, "schema_version": 3, "solution": true, "task": false}
@torch.no_grad()
def sample_decode(model, features, max_len, temperature=1.0, generator=None, start_idx=1, end_idx=2, null_idx=0):
    """Batched sampling: like greedy_decode, but each word is drawn from softmax(logits / temperature).

    Args:
        model: maps (features (B, R, D), words (B, t)) to logits (B, t, V).
        features: (B, R, D).
        max_len: number of words to generate at most.
        temperature: tau > 0; below 1 sharper, above 1 flatter than the model's distribution.
        generator: a torch.Generator (on the CPU) for every draw, or None for PyTorch's default one.
    Returns:
        (B, max_len) int64: the generated words (no <START>), <END> kept, null_idx after it.
    """
    ### BEGIN SOLUTION
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
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_sample_decode", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.layers import with_sampler
check("sample/basic", with_sampler(sample_decode))
### BEGIN HIDDEN TESTS
check("sample/low_temperature", with_sampler(sample_decode))
check("sample/high_temperature", with_sampler(sample_decode))
check("sample/batch_wide", with_sampler(sample_decode))
check("sample/other_special_tokens", with_sampler(sample_decode))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_sampling_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# *How the sampling checks work:* `with_sampler(sample_decode)` runs your function on the stand-in model with `generator=torch.Generator().manual_seed(seed)`, a seed stored with each case, so the captions your draws give are compared with the captions the text's rule gives.
#
# The cell below draws 3 captions per image with your `sample_decode` at several temperatures, on the same images as the comparison above, and measures accuracy (exact match, averaged over the samples) against diversity (how many different captions the 3 samples of an image give, 1 to 3).

# %% nbgrader={"grade": false, "grade_id": "code_sampling", "locked": true, "schema_version": 3, "solution": false, "task": false}
sampler = yours_if_it_passes("sample_decode", sample_decode, instead="no sampling comparison until it passes")
if evaluate is not None and sampler is not None:
    g = torch.Generator().manual_seed(0)
    temperatures, accuracy, diversity = [0.5, 1.0, 1.5, 2.0], [], []
    for tau in temperatures:
        def sample(m, f, n, tau=tau):
            return sampler(m, f, n, temperature=tau, generator=g)
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
# **Question 12 (2 points).** Use the numbers and the plot above. (a) Why can beam search find a caption that greedy decoding misses? Say what it gained and what it cost here, from the printed scores and times. (b) What does the temperature do to accuracy and diversity, as measured, and for what kind of use would you pick sampling over beam search?
#
# If your own model does not train, answer from the course's reference run: sections 3 and 4 of `reference_run/08_decoding.md`, in the course repository (on Colab under `/content/attention-transformers/`), have its printed numbers and its plot.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_decoding", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) Greedy commits to the single most likely word at each step; a caption whose first word is slightly less likely can still be the most likely caption overall, and beam search keeps $k$ prefixes so such a caption survives until its later words make up for it. Here (first 100 validation images) the beam raised the exact match and every score, at a cost: it called the model many times as often as greedy, because this version runs the model once per step for each image's live hypotheses, one image at a time, while greedy runs it once per step for the whole batch, and it took longer (the run prints how much; the ratio of times depends on the machine). (b) Lower temperature sharpens each word's distribution: exact match rises to about greedy's; higher temperature flattens it: more different captions but more wrong words, so exact match falls (the plot). Even at the lowest temperature the 3 samples of an image are about 2 different captions, not 1: each scene has three phrasings that are about equally likely (the phrasing floor of notebook 06), sharpening keeps equally likely phrasings equally likely, so the samples still pick different phrasings, each of them correct. Sampling suits uses that want variety (several different captions for one image, dialogue, creative text, data augmentation); beam search suits one best, accurate caption.
#
# **Rubric.** 1 point: beam keeps alternatives whose joint probability wins later, with the measured gain and cost. 1 point: the direction of the trade-off as measured (accuracy down, diversity up with temperature) and a sensible use for sampling.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_leaky", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5 · Teacher forcing against generation: what the causal mask is for
#
# Your model was trained with **teacher forcing**: at every position the input holds the true caption's words, and the causal mask keeps position $t$ from seeing the words after it. Generation has no true words: the model reads its own. The cell below measures what the mask does for generation. It trains a fresh copy of your model with your training pieces and notebook 06's settings (on the dataset's stored captions), but for 150 steps and with a **leaky mask**: before each of your decoder layers runs, the mask your `forward` passes it is replaced by one that allows everything, so every word may attend to every word of the input, later ones included (your model's code is unchanged; `allow_every_word` swaps the mask on its way into each layer). It prints the leaky model's teacher-forced validation loss and its greedy exact match on the comparison's images, next to your model's (its last validation loss, as its checkpoint recorded it).

# %% nbgrader={"grade": false, "grade_id": "code_leaky", "locked": true, "schema_version": 3, "solution": false, "task": false}
def allow_every_word(model):
    """`model` with the self-attention mask of each of its decoder layers replaced, as the layer is called, by one
    that allows everything: position t also sees the words after it. Nothing else changes."""
    def leak(layer, args, kwargs):
        if kwargs.get("tgt_mask") is not None:
            kwargs["tgt_mask"] = torch.ones_like(kwargs["tgt_mask"], dtype=torch.bool)
        elif len(args) > 2 and args[2] is not None:   # the mask passed by position
            args = (*args[:2], torch.ones_like(args[2], dtype=torch.bool), *args[3:])
        return args, kwargs

    for layer in model.decoder_layers:
        layer.register_forward_pre_hook(leak, with_kwargs=True)
    return model


leaky_captions = None
if evaluate is not None and ds.name == "shapes":
    from starter.notebook_loader import load_or_none
    from starter.training import TrainConfig, TrainingPieces, seed_everything, train
    pieces = TrainingPieces(**{name: yours_if_it_passes(name, trained.defs[name], instead="no leaky model")
                               for name in (*TRAINING_PIECES, "make_optimizer")})
    loss_fn = yours_if_it_passes("teacher_forcing_loss",
                                 load_or_none("05_captioning_model.ipynb", ["teacher_forcing_loss"])["teacher_forcing_loss"],
                                 instead="no leaky model")
    if not pieces.missing() and loss_fn is not None:
        seed_everything(0)
        config = dict(trained.info["config"], vocab_size=len(ds.vocab))   # your model's settings, the stored vocabulary
        leaky = allow_every_word(trained.defs["CaptioningTransformer"](**config))
        leaky_history = train(leaky, loss_fn, ds.split("train"),
                              TrainConfig(steps=150, batch_size=64, lr=2e-3, warmup=50, weight_decay=0.01),
                              pieces, val_data=val_split, device=device)
        leaky_scores, leaky_captions = evaluate(leaky, greedy_decode, compare_split, ds.vocab, max_len=ds.max_length - 1)
        log = trained.path.with_suffix(".csv")   # the training script's log, next to its checkpoint
        yours = read_log(log) if log.is_file() else {}
        own_loss = f"{yours['val_loss'][-1]:.4f}" if yours.get("val_loss") else "not recorded"
        own_steps = (trained.info["extra"] or {}).get("step", "?")
        print(f"your model ({own_steps} steps): teacher-forced val loss {own_loss}, "
              f"greedy exact match {greedy_scores['exact_match']:.1%}")
        print(f"leaky mask ({leaky_history['steps_done']} steps):  teacher-forced val loss "
              f"{leaky_history['val_loss'][-1]:.4f}, greedy exact match {leaky_scores['exact_match']:.1%}")
        print(f"leaky model: {len(set(leaky_captions))} different captions for {len(leaky_captions)} images, "
              "the first three:", leaky_captions[:3])
elif evaluate is None:
    print("skipped: it trains with your training pieces and evaluates with your evaluate_captions")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_causal_mask", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 13 (2 points).** Explain the two numbers of the leaky model printed above: (a) why its teacher-forced validation loss is what it is, compared with your model's (look at the teacher-forcing table of notebook 05, section 5: which input word does position $t$ have to predict?), and (b) why its generated captions are what they are.
#
# If your own model does not train, answer from the course's reference run: section 5 of `reference_run/08_decoding.md`, in the course repository (on Colab under `/content/attention-transformers/`), has the leaky model's printed numbers next to the reference model's.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_causal_mask", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) With teacher forcing the target at position $t$ is the input word at position $t+1$. Without the causal mask position $t$ can attend to position $t+1$ and simply copy that word, so the loss drops far below what predicting the next word honestly allows (below the phrasing floor notebook 06 printed in its section 2), without the model learning the language or looking at the image much. (b) At generation time there is no word $t+1$ yet: the prefix ends at $t$, so the copying shortcut has nothing to copy, and the model never learned to predict a word from the image and the words before it. What it writes then is fluent but blind: a handful of captions whatever the image (the run prints how many different ones it wrote for 100 images), so its exact match is close to zero. The low loss measured a different, easier task than captioning.
#
# **Rubric.** 1 point: position $t$ sees its own target (the next input word) and copies it. 1 point: at generation there is no future word, so the learned shortcut fails; the teacher-forced loss does not measure generation.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_exposure_bias", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 14 (2 points).** Even with a correct mask, teacher forcing trains on the *true* previous words while generation feeds back the model's *own*. (a) How can one wrong word early in a caption spoil the words after it, when the model was only ever trained on true prefixes? Look among your model's wrong captions (notebook 07's evaluation, or notebook 09's failure cases): quote one if you find one, or, if none shows it, say what kinds of mistake section 3 counted instead and why a model this well trained on `shapes` may show none. (b) Name one way to reduce it and say why it helps.
#
# If your own model does not train, look in the course's reference run, in the course repository (on Colab under `/content/attention-transformers/`): the failure cases of `reference_run/09_visualizing_attention.md` (section 9) or the wrong captions of `reference_run/08_decoding.md` (section 3, its second figure).
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_exposure_bias", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) Exposure bias: during training the model only ever sees prefixes from the data; at test time a wrong word puts it on a prefix it never saw, where its predictions are less reliable, so errors compound (e.g. after a wrong colour it may describe the wrong object, or after choosing the 'there is a ... and a ...' phrasing with the wrong first object it cannot recover). In the course's run the wrong captions are almost all a relation reversed, the right objects in the wrong order: one decision, not a cascade, so an answer that says the run shows no spoiled caption, and why, is right. (b) Scheduled sampling (feed some of the model's own predictions during training, more as training goes on), sequence-level training on the model's own samples (e.g. self-critical training with CIDEr as the reward), or beam search at test time (keeps alternatives, so one bad word is less often fatal); each exposes the model to, or protects it from, its own mistakes.
#
# **Rubric.** 1 point: the compounding mechanism (prefixes never seen in training; naming it exposure bias is welcome, not required). 1 point: one remedy with a correct reason. An example from the student's own output is welcome but not required.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("08_decoding", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - Generation feeds back the model's own words: **greedy** takes the argmax at every step; **beam search** keeps the $k$ best hypotheses, ranks every hypothesis × word together, narrows as hypotheses finish, and compares finished ones by length-normalised log-probability; **sampling** draws each word from the softmax at a temperature.
# - Beam search looks for the most likely caption, at the cost of many more calls of the model (the comparison printed how many); sampling trades accuracy for diversity, steered by the temperature.
# - BLEU and exact match measure different things; on `shapes` the kinds of mistakes can be counted.
# - Teacher forcing trains on true prefixes, generation runs on the model's own: what the causal mask is for, measured in section 5, and what the mismatch between the two does, Question 14.
#
# Next, **09 · Visualising attention** loads the same checkpoint and looks inside the trained model.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
