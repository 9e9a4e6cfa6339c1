# %% [markdown] nbgrader={"grade": false, "grade_id": "md_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # 07 · Generating captions, and measuring them
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/attention-course-kit/attention-transformers/blob/main/notebooks/07_generation_and_evaluation.ipynb)
#
# Notebook 06 trained your model and saved it. Here the model writes captions, and you measure them:
#
# - `greedy_decode`: the model writes a caption word by word, taking its most likely word each time;
# - `evaluate_captions`: BLEU, CIDEr, ROUGE-L and the share of captions exactly right, on images the model never trained on;
# - the evaluation script, `evaluate_captioner.py`: `evaluate_checkpoint`, what it measures for a checkpoint.
#
# Then your trained model is graded on new scenes, and an experiment measures what attention over the regions buys. Notebook 08 goes on with the same model: other decoders, the kinds of mistakes it makes, and what the causal mask is for.
#
# Given: the evaluation script's command line and files (`starter/scripts.py`), the driver that trains section 4's two models with your loop (`starter.training.train`: device moves, a progress bar with the time left), the metric implementations (BLEU, CIDEr, ROUGE-L from `pycocoevalcap`, in `starter/metrics.py`) and the plots. The kit has no version of your pieces: while one does not pass its public check yet, the notebook says so in one line and skips what needs it (the scores).
#
# **What you need.** The graded checks run on stand-ins and use no earlier notebook, except the trained-model cell, which measures the checkpoint notebook 06 saved (`runs/captioning_transformer.pt`). The other cells load that checkpoint into your `CaptioningTransformer` from `05_captioning_model.ipynb`; section 4's experiment also trains, with your `teacher_forcing_loss` and `make_optimizer` (notebook 05) and your training pieces from `06_training.ipynb` and its `train_captioner.py`, all next to this notebook (on Colab: in the course folder or in `My Drive/Colab Notebooks`). Without one of them, a cell says in one line what is missing. If your model does not train, Question 10 can be answered from the course's reference run (`reference_run/`).
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
import itertools
import json
import math
import os
import re
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from starter.checks import check
from starter.data import load_dataset
from starter.layers import with_model
from starter.metrics import caption_scores, shapes_error
from starter.notebook_loader import load_or_none
from starter.pipeline import yours_if_it_passes
from starter.plotting import show_attention, show_captions
from starter.runtime import MODEL_NOTEBOOK, TRAINING_NOTEBOOK, checkpoint_file, missing_checkpoint
from starter.scripts import load_script, read_log, run_command, script_if_it_passes
from starter.training import (GRADING, TrainConfig, TrainingPieces, count_parameters, load_checkpoint, pick_device,
                              seed_everything, train)

torch.manual_seed(0)

# %% nbgrader={"grade": false, "grade_id": "code_prep_2", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["setup"]
SPECIAL_TOKENS = ["<NULL>", "<START>", "<END>", "<UNK>"]

def tokenize(caption):
    """"A dog's ball." -> ["a", "dog", "s", "ball"]: lower case, maximal runs of letters a-z and digits 0-9."""
    return re.findall(r"[a-z0-9]+", caption.lower())


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_load", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1 · Your trained model
#
# The dataset is chosen here, in one line: `shapes`, or the COCO dataset notebook 06 trained on. Then the cell loads the checkpoint notebook 06 saved for it into your `CaptioningTransformer`, with the vocabulary it was trained with.

# %% nbgrader={"grade": false, "grade_id": "code_load", "locked": true, "schema_version": 3, "solution": false, "task": false}
DATASET = "shapes"   # the dataset notebook 06 trained on (or "coco-fc7", "coco-grid": notebook 06, section 3)

ds = load_dataset(DATASET)
val_split = ds.split("val")
mine = load_or_none(MODEL_NOTEBOOK, ["CaptioningTransformer", "teacher_forcing_loss", "make_optimizer"])
CaptioningTransformer = mine["CaptioningTransformer"]
CHECKPOINT = Path(checkpoint_file(DATASET))   # where notebook 06 saved it, in the course folder
device = pick_device()
model, vocab = None, ds.vocab
if GRADING:  # the trained-model cell measures the checkpoint handed in; no other cell needs it
    print("grading run: the trained model is not loaded")
elif CaptioningTransformer is None:
    print("no trained model: it needs your CaptioningTransformer of notebook 05")
elif not CHECKPOINT.is_file():
    print(f"no trained model: {missing_checkpoint(CHECKPOINT, TRAINING_NOTEBOOK)}")
else:
    model, info = load_checkpoint(CHECKPOINT, CaptioningTransformer, device=device)   # in eval mode
    vocab = info["vocab"]   # the vocabulary the model was trained with, saved beside its weights
    steps = read_log(CHECKPOINT.with_suffix(".csv"))["step"][-1] if CHECKPOINT.with_suffix(".csv").is_file() else "?"
    print(f"{count_parameters(model):,} parameters, trained {steps} steps, from {CHECKPOINT}; {vocab}; "
          f"{ds.num_regions} regions per image")


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_22", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2 · Generating captions
#
# At test time there is no caption to feed: the model writes its own. Start from `<START>`, ask the model for the distribution of the next word, choose a word, **append it to the input**, and repeat until `<END>` (or a length limit). Each step runs the model on the whole prefix written so far and uses the logits of its **last** position.
#
# ### Greedy decoding
#
# Choose the most likely word at every step (`argmax`). Do it for the whole batch at once: every caption advances by one word per step; a caption that has produced `<END>` is finished, and everything after its `<END>` is `<NULL>`. Stop as soon as every caption has finished (or after `max_len` words).
#
# ### Task 1 · `greedy_decode(model, features, max_len, start_idx=1, end_idx=2, null_idx=0)`
#
# Return a `(B, max_len)` int64 tensor of generated words, **without** the `<START>` token, with the `<END>` token kept, and `null_idx` after it (and in every position not generated because decoding stopped early). `max_len` counts every generated word, `<END>` included: a caption that has not ended after `max_len` words stops there, without `<END>`. The words you may generate: whichever the model ranks highest, or every word but `<NULL>` and `<START>` (a common practice: set their logits to `-inf` before the `argmax`); either is right, and the checks' stand-in model gives those two no probability, so both give the same captions. Create new tensors on `features.device`. Run it under `torch.no_grad()` (a decorator is fine); the model is assumed to be in eval mode already.

# %% nbgrader={"grade": false, "grade_id": "greedy_decode", "locked": false, "schema_version": 3, "solution": true, "task": false}
@torch.no_grad()
def greedy_decode(model, features, max_len, start_idx=1, end_idx=2, null_idx=0):
    """Batched greedy decoding.

    Args:
        model: maps (features (B, R, D), words (B, t)) to logits (B, t, V).
        features: (B, R, D).
        max_len: number of words to generate at most.
    Returns:
        (B, max_len) int64: the generated words (no <START>), <END> kept, null_idx after it.
    """
    ### BEGIN SOLUTION
    B, device = features.shape[0], features.device
    words = torch.full((B, 1), start_idx, dtype=torch.long, device=device)
    out = torch.full((B, max_len), null_idx, dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    for t in range(max_len):
        next_word = model(features, words)[:, -1].argmax(dim=-1)
        next_word = next_word.masked_fill(finished, null_idx)
        out[:, t] = next_word
        finished = finished | (next_word == end_idx)
        if finished.all():
            break
        words = torch.cat([words, next_word[:, None]], dim=1)
    return out
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_greedy_decode", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
check("greedy/basic", with_model(greedy_decode))
### BEGIN HIDDEN TESTS
check("greedy/one_image", with_model(greedy_decode))
check("greedy/all_end_early", with_model(greedy_decode))
check("greedy/other_special_tokens", with_model(greedy_decode))
check("greedy/float64", with_model(greedy_decode))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_23", "locked": true, "schema_version": 3, "solution": false, "task": false}
# *How the decoding checks work:* `with_model(greedy_decode)` runs your function on a tiny stand-in model (`starter.layers.ToyCaptioner`, not a Transformer) with stored weights, so these checks test the decoding alone, whatever your model does.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_eval_0", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3 · Evaluation on held-out images
#
# BLEU-$n$ measures the overlap of $n$-grams (1 to 4 words) between the generated caption and all the reference captions of the image (precision, with a penalty for captions that are too short); BLEU-4 is the usual headline number. CIDEr weighs $n$-grams by how specific they are (TF-IDF over the references), so a correct rare word counts more than "a"; it is scaled by 10, and on `shapes` values far above 1 are normal because every scene's captions share most words. ROUGE-L is based on the longest common subsequence. All three are computed by `pycocoevalcap` (tokenised in Python, so no Java is needed) on the **validation** images, which the model never trained on.

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_eval_1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2 · the evaluation: `evaluate_captions(model, decode_fn, split, vocab, max_len, batch_size=250)`
#
# Caption every image of `split` and score the captions against **all** the reference captions of each image:
#
# - the model writes its captions in eval mode (dropout off) and without gradients (no graph is built: faster, and less memory);
# - every image `0 .. split.num_images - 1` is captioned, `batch_size` images at a time (the last batch may be smaller): `split.features(idx)` gives the features of a list of image indices, on the CPU (the model may be on a GPU), and `decode_fn(model, features, max_len)` an `(n, max_len)` tensor of word indices;
# - a caption is a string: the words of its row up to its first `vocab.end_idx`, without `vocab.null_idx` and `vocab.start_idx`, looked up in `vocab.idx_to_word` and joined with single spaces;
# - the scores: `caption_scores(references, generated)` (given, from `starter.metrics`; two dicts, image index → list of reference strings, from `split.references(i)`, and image index → generated string) returns BLEU-1..4, CIDEr and ROUGE-L; add `"exact_match"`, the fraction of images whose caption equals one of its references word for word (compared as `tokenize`d words).
#
# Return `(scores, generated)`: the dict of scores and the list of generated strings, in image order.
#
# BLEU counts the n-grams of a generated caption that appear in *any* reference of its image: with all references, a caption that says the same thing in another valid phrasing is not punished, which is why COCO gives five references per image. CIDEr weights n-grams by how rare they are across the references of all evaluated images, so it rewards the specific words ("red", "left") over the ubiquitous ones ("a", "the").

# %% nbgrader={"grade": false, "grade_id": "evaluate_captions", "locked": false, "schema_version": 3, "solution": true, "task": false}
def evaluate_captions(model, decode_fn, split, vocab, max_len, batch_size=250):
    """Caption every image of `split` with decode_fn(model, features, max_len) and score the captions.

    Returns:
        (scores, generated): scores is caption_scores' dict plus "exact_match"; generated the list of
        caption strings, generated[i] for image i.
    """
    ### BEGIN SOLUTION
    device = next(model.parameters()).device
    model.eval()
    generated = []
    with torch.no_grad():
        for start in range(0, split.num_images, batch_size):
            idx = list(range(start, min(split.num_images, start + batch_size)))
            for row in decode_fn(model, split.features(idx).to(device), max_len).tolist():
                words = itertools.takewhile(lambda t: t != vocab.end_idx, row)
                kept = [t for t in words if t not in (vocab.null_idx, vocab.start_idx)]
                generated.append(" ".join(vocab.idx_to_word[t] for t in kept))
    references = {i: split.references(i) for i in range(split.num_images)}
    scores = caption_scores(references, dict(enumerate(generated)))
    hits = [tokenize(generated[i]) in [tokenize(r) for r in refs] for i, refs in references.items()]
    scores["exact_match"] = sum(hits) / len(hits)
    return scores, generated
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_evaluate_captions", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.pipeline import with_split
check("evaluate/basic", with_split(evaluate_captions))
### BEGIN HIDDEN TESTS
check("evaluate/uneven_batches", with_split(evaluate_captions))
check("evaluate/many_references", with_split(evaluate_captions))
check("evaluate/words_after_end", with_split(evaluate_captions))
check("evaluate/one_batch", with_split(evaluate_captions))
check("evaluate/unknown_words", with_split(evaluate_captions))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_eval_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 3 · the evaluation script, `evaluate_captioner.py`
#
# Evaluation is a script too: it loads a checkpoint, captions a split and writes the scores to a file, so that every model is measured the same way. Its command line, files and messages are given (`evaluate_main` in `starter/scripts.py`; `python evaluate_captioner.py --help`): it reads the checkpoint, opens the experiment of the dataset the checkpoint names, takes the images (`--split`, `--images`) and writes the scores, the captions and, on `shapes`, the count of each kind of mistake to a JSON file beside the checkpoint.
#
# Yours is the part that decides what is measured: `evaluate_checkpoint(saved, experiment, split, beam=None)` returns `(scores, generated)` as your `evaluate_captions` does, for the model that checkpoint `saved` holds, decoded greedily (`beam=None`) or by beam search of width `beam`. The weights and the vocabulary come from the checkpoint, never from this notebook: a script must measure the file it is given. The `experiment` has what you need: its methods and attributes are documented in `starter/scripts.py` (`class Experiment`, or `help(Experiment)`), among them your Task 2 and the decoders.

# %% nbgrader={"grade": false, "grade_id": "eval_script", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%writefile evaluate_captioner.py
"""Evaluate a checkpoint of train_captioner.py: python evaluate_captioner.py [CHECKPOINT] [--beam K] [--images N]"""
from starter.scripts import evaluate_main, run_script


def evaluate_checkpoint(saved, experiment, split, beam=None):
    """(scores, generated), as evaluate_captions returns them, for the model checkpoint `saved` holds on `split`,
    decoded greedily (beam None) or by beam search of width `beam`."""
    ### BEGIN SOLUTION
    model, vocab = experiment.model_from(saved), experiment.vocab_of(saved)
    return experiment.evaluate_captions(model, experiment.decoder(beam), split, vocab, max_len=experiment.max_len)
    ### END SOLUTION


def main(argv=None, experiment=None):
    """The script (given): its command line, the checkpoint, the metrics file."""
    evaluate_main(argv, experiment, evaluate_checkpoint=evaluate_checkpoint)


if __name__ == "__main__":
    run_script(main)

# %% nbgrader={"grade": true, "grade_id": "test_eval_script", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.scripts import load_script, with_eval_script
eval_script = load_script("evaluate_captioner.py")   # the file, as a module, without running main
check("eval_script/greedy", with_eval_script(eval_script))
### BEGIN HIDDEN TESTS
check("eval_script/beam", with_eval_script(eval_script))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_eval_run", "locked": true, "schema_version": 3, "solution": false, "task": false}
# *How this check works:* `with_eval_script(eval_script)` saves a checkpoint of a tiny stand-in model and calls your script's `main` on it with a stand-in experiment: stored captions for greedy decoding and for a beam of 3, stored references, and a stand-in evaluation (not Task 2) whose numbers tell which model, decoder, images and vocabulary it was given. It compares the JSON file's scores and image count with the stored ones.
#
# Your evaluation of the trained model, with greedy decoding, on the validation images (all of them for `shapes`, the first 5000 for COCO), by the script. BLEU-4 alone hides failures: on `shapes` a caption with the two objects swapped still shares most of its 4-grams with the references, so the exact-match rate, the share of captions that are *fully* right, is printed too. Save this notebook first: the script loads your `evaluate_captions` and `greedy_decode` from the saved file.

# %% nbgrader={"grade": false, "grade_id": "code_24", "locked": true, "schema_version": 3, "solution": false, "task": false}
evaluate = yours_if_it_passes("evaluate_captions", evaluate_captions,
                              instead="no scores and no generated captions until it passes")
eval_script = script_if_it_passes("eval_script", load_script("evaluate_captioner.py"),
                                 instead="the evaluation script does not run until it passes")  # Task 3
eval_images = None if DATASET == "shapes" else 5000
generated = metrics = None
if GRADING:
    print("grading run: the scripts do not run")
elif evaluate is not None and eval_script is not None and model is not None:
    t0 = time.perf_counter()
    command = f"evaluate_captioner.py {CHECKPOINT}" + (f" --images {eval_images}" if eval_images else "")
    if run_command(command):
        metrics = json.loads(CHECKPOINT.with_suffix(".json").read_text())
        generated = metrics["captions"]
        print(f"exact match: {metrics['scores']['exact_match']:.1%} of the captions equal one of their image's "
              f"references ({time.perf_counter() - t0:.1f} s, start-up included)")

# %% nbgrader={"grade": false, "grade_id": "code_25", "locked": true, "schema_version": 3, "solution": false, "task": false}
if generated is not None:
    show = [0, 1, 2, 3, 4, 5]
    images = [val_split.image(i) for i in show] if DATASET != "coco-fc7" else None
    show_captions(images, [generated[i] for i in show], [val_split.references(i) for i in show],
                  title="validation images: generated caption (bold) and the ground truth")
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_trained_model", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Graded: your trained model
#
# The next test cell measures the model you trained in notebook 06, as it was saved: it loads `runs/captioning_transformer.pt` (the checkpoint of your `shapes` run) into your `CaptioningTransformer` (from notebook 05), captions images with your `greedy_decode`, and counts the captions that are exactly one of their image's references. Its images are 100 new scenes, drawn like the validation images (combinations never seen in training); the public case asks for 65 % of them right. While grading, the same is asked on 100 scenes nobody has seen: 40 %, 55 % and 65 % right earn a point each. Those scenes never reach your notebook: the grader loads the checkpoint's weights into the kit's own `CaptioningTransformer` (the model notebook 05 specifies, with the layers your checkpoint names) and decodes them greedily itself, so the mark measures what your trained weights do, and a mistake in `greedy_decode` costs its own points only. A model class that passes notebook 05's checks computes exactly what the kit's computes with the same weights. Compare with the exact match your evaluation printed above.
#
# **Hand in the checkpoint with your notebooks** (the `runs/` folder next to them): the grader does not train your model again, it loads that file. Retraining or changing the model after saving does not change what is graded until you save again.

# %% nbgrader={"grade": true, "grade_id": "test_trained_model", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check
from starter.layers import trained_captioner
check("trained/new_scenes", trained_captioner(CaptioningTransformer, greedy_decode))
### BEGIN HIDDEN TESTS
# measured by the grader itself, outside the sandbox: the checkpoint's weights in the kit's model, decoded by the
# kit's greedy decoding (grading/trained_model.py); these lines are not in the sandbox's copy of the cell
check("trained/hidden_scenes_40", trained_captioner(CaptioningTransformer, greedy_decode))
check("trained/hidden_scenes_55", trained_captioner(CaptioningTransformer, greedy_decode))
check("trained/hidden_scenes_65", trained_captioner(CaptioningTransformer, greedy_decode))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_26", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Where does the model look? The cross-attention of the last layer, averaged over heads, for each generated word of the first validation image, over the $7 \times 7$ regions (notebook 09 studies this in detail):

# %% nbgrader={"grade": false, "grade_id": "code_27", "locked": true, "schema_version": 3, "solution": false, "task": false}
if ds.num_regions > 1 and model is not None:
    model.eval()
    feats = val_split.features([0]).to(device)
    words = greedy_decode(model, feats, ds.max_length - 1)[0]
    length = int((words != vocab.null_idx).sum())
    inputs = torch.cat([torch.tensor([vocab.start_idx], device=device), words[:length - 1]])[None]
    with torch.no_grad():
        _, att = model(feats, inputs, return_attention=True)
    cross = att["cross"][-1][0].mean(0).cpu()                 # (T, R), averaged over heads
    labels = [vocab.idx_to_word[int(w)] for w in words[:length]]
    show_attention(cross, queries=labels, keys=[f"{r // ds.grid_shape[1]},{r % ds.grid_shape[1]}" for r in range(ds.num_regions)],
                   title=f"last layer cross-attention: '{vocab.decode(words)}'", annotate=False)
    plt.gcf().set_size_inches(13, 3.6)
    plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "md_bottleneck", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4 · What attention over the regions buys, measured
#
# The classic encoder–decoder squeezes the image into **one vector**, and every word has to come from that summary: the bottleneck that attention removes (notebook 01). The cell trains two fresh copies of your decoder (with your checkpoint's settings), the same way and on the same batches (the dataset's stored captions, through your training loop and pieces of notebook 06): one attends over the 49 regions, the other is given the image as one memory vector, the mean of its 49 region features ($R = 1$: cross-attention then has a single key and gives it weight 1, so every word gets the same context). Both get the same short run of 150 steps (fewer than a quarter of the 700 steps of notebook 06's run): it measures how far each gets on an equal, small budget, not how far either could go. The cell prints both models' greedy exact match on the first 100 validation images and their validation losses, plots the two validation curves, and shows the first captions of the one-vector model.

# %% nbgrader={"grade": false, "grade_id": "code_bottleneck", "locked": true, "schema_version": 3, "solution": false, "task": false}
class PooledCaptioner(nn.Module):
    """Your model given the image as one vector: the mean of its region features, a single memory token."""

    def __init__(self, **config):
        super().__init__()
        self.inner = CaptioningTransformer(**dict(config, num_regions=1))

    def forward(self, features, captions, return_attention=False):
        return self.inner(features.mean(dim=1, keepdim=True), captions, return_attention=return_attention)


# notebook 06's shapes settings, for one short run: the same for both models
SHORT_RUN = TrainConfig(steps=150, batch_size=64, lr=2e-3, warmup=50, weight_decay=0.01)
pieces = None
if model is not None and evaluate is not None and ds.num_regions > 1:
    skipped = "no comparison until it passes"
    from06 = load_or_none(TRAINING_NOTEBOOK, ["lr_at_step", "train_step", "validation_loss"])
    pieces = TrainingPieces(fit=yours_if_it_passes("fit", load_script("train_captioner.py", "fit"), instead=skipped),
                            **{name: yours_if_it_passes(name, fn, instead=skipped) for name, fn in from06.items()},
                            make_optimizer=yours_if_it_passes("make_optimizer", mine["make_optimizer"], instead=skipped))
    loss_fn = yours_if_it_passes("teacher_forcing_loss", mine["teacher_forcing_loss"], instead=skipped)
    pieces = None if pieces.missing() or loss_fn is None else pieces
if pieces is not None:
    compare_split = val_split.head(100)
    runs = {}
    for name, model_class in (("attention over the regions", CaptioningTransformer), ("one mean-pooled vector", PooledCaptioner)):
        seed_everything(0)   # both start from the same seed, and train on the dataset's stored captions
        candidate = model_class(**dict(info["config"], vocab_size=len(ds.vocab))).to(device)
        run = train(candidate, loss_fn, ds.split("train"), SHORT_RUN, pieces, val_data=val_split, device=device)
        scores, captions = evaluate(candidate, greedy_decode, compare_split, ds.vocab, max_len=ds.max_length - 1)
        runs[name] = (run, scores, captions)
    print(f"{SHORT_RUN.steps} steps each, the same batches and learning rates; greedy on {compare_split.num_images} "
          "validation images:")
    for name, (run, scores, _) in runs.items():
        print(f"  {name:<27} exact match {scores['exact_match']:6.1%}, teacher-forced val loss "
              f"{run['val_loss'][-1]:.4f}")
    pooled_captions = runs["one mean-pooled vector"][2]
    for i, caption in enumerate(pooled_captions[:3]):  # "correct", or the kind of mistake (notebook 08)
        print(f"  one vector: {caption:<50} | {shapes_error(caption, compare_split.references(i))}")
    plt.figure(figsize=(6, 2.5))
    for name, (run, _, _) in runs.items():
        plt.plot(run["val_step"], run["val_loss"], marker=".", label=name)
    plt.xlabel("step"); plt.ylabel("validation loss"); plt.legend(); plt.title("the same decoder, the same steps")
    plt.tight_layout(); plt.show()
else:
    print("skipped: it trains and evaluates with your pieces of notebooks 05-07 and your trained model's settings, "
          "on a dataset with more than one region")

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_q_bottleneck", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 10 (2 points).** Section 4 printed the exact match and the validation loss of the two models, trained the same way, and the first captions of the one-vector model with the kind of each mistake. (a) Which model does better, and by how much? Which kinds of mistake does the one-vector model make? Explain them from what the mean of the 49 region features keeps of the image and what it loses. (b) Would a full run, as long as notebook 06's, close the gap? Argue from the information the one vector holds, not from the loss curve alone.
#
# If your own model does not train, answer from the course's reference run: section 4 of `reference_run/07_generation_and_evaluation.md`, in the course repository (on Colab under `/content/attention-transformers/`), has both models' numbers and the one-vector model's captions.
#
# Write your answer in the cell below.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q_bottleneck", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) The model that attends over the regions is far ahead on both measures: in the reference run it gets several times as many captions exactly right as the one-vector model, and a clearly lower validation loss (the student's numbers differ; the gap is what matters). The one-vector model's captions name shapes and colours that are in the scene but get the layout wrong: in the reference run, objects in the wrong position and an object added. The mean of the region features keeps *what* is in the image, the features summed over the grid, but not *where*: every region's feature enters the sum the same way, so which region held which object, and with two objects which colour went with which shape, is lost. The model over the regions keeps each region as its own memory token with its region embedding, so a word can look up the region it is about. (b) No, not fully: more steps cannot bring back what the input no longer holds. The one-vector model can learn the contents better, and it can guess the most frequent layouts, but what the mean lost (where each object is) it can recover only as far as the CNN features themselves carry position; the gap in exact match on captions that name a position or a relation stays.
#
# **Rubric.** 1 point (a): the comparison with the printed numbers, and the loss of *where* (position, which colour goes with which shape) by averaging, tied to the mistake kinds printed. 1 point (b): the information is not in the pooled input, so training longer cannot close the gap (a partial recovery through position in the features is a bonus, not required). Half a point for "more training helps both" without the argument.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Check everything
#
# Every public case of this notebook, on your answers as they are now: one line each. Hidden cases, which grade your work, vary the same situations (sizes, dtypes, masks, training mode), so a ✓ on every line is the best sign you can get here.

# %% nbgrader={"grade": false, "grade_id": "code_check_public", "locked": true, "schema_version": 3, "solution": false, "task": false}
from starter.checks import check_public
check_public("07_generation_and_evaluation", globals());

# %% [markdown] nbgrader={"grade": false, "grade_id": "md_summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Summary
#
# - Generation feeds back the model's own words: **greedy** decoding takes the argmax and stops each caption at `<END>`.
# - An evaluation script: BLEU, CIDEr and ROUGE-L against all references of held-out images, and the share of captions exactly right, which BLEU alone hides.
# - The bottleneck, measured: the same decoder given one mean-pooled vector instead of the regions (section 4) loses where things are.
#
# Next, **08 · Decoding** writes beam search and sampling for the model trained in notebook 06, compares three decoders, sorts the model's mistakes and measures what the causal mask is for.
#
# ## Handing in
#
# Hand in your ten notebooks, `01_scaled_dot_product_attention.ipynb` to `10_efficient_attention.ipynb`, and the model notebook 06 trained, `runs/captioning_transformer.pt`, with that file name, in a `runs/` folder or next to the notebooks. Notebook 07's trained-model cell (3 points) grades that file: without it, those points are lost.
#
# - **Locally**, all of them are in the course folder, the folder of your notebooks; the model is in its `runs/` folder.
# - **On Colab**, the course folder is `My Drive/attention-course` (or the `COURSE_DIR` you chose): your notebooks, and the model in `My Drive/attention-course/runs/`. A notebook you opened from its Colab badge and saved with *File → Save a copy in Drive* is in `My Drive/Colab Notebooks` instead, as `Copy of 0N_….ipynb`: hand in that file as it is (the grader knows a notebook by its number).
