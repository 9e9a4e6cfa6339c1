"""The kit's side of notebook 04's data pipeline: the stored batches the notebook trains on while a student's
Dataset or collate function does not pass, seeded loaders in the training loop, the switch that uses a
piece only once it passes, and clear errors."""
from __future__ import annotations

import re
from dataclasses import replace

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from grading import notebooks
from starter.data import StoredBatches, load_dataset, write_caption_file
from starter.layers import ToyCaptioner
from starter.pipeline import PUBLIC_CASES, yours_if_it_passes
from starter.training import TrainConfig, train

WORDS = ["<NULL>", "<START>", "<END>", "<UNK>", "a", "b", "c", "d", "e"]


def _solution() -> dict:
    return notebooks.captioning_solution()


def _file(tmp_path, n=6, r=3, d=4):
    path = tmp_path / "feats.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train/features", data=np.arange(n * r * d, dtype=np.float16).reshape(n, r, d))
    return path


def _captions(m=10, t=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    caps = torch.zeros((m, t), dtype=torch.long)
    for i in range(m):
        n = int(torch.randint(1, t - 1, (1,), generator=g))
        caps[i, 0], caps[i, 1:n + 1], caps[i, n + 1] = 1, torch.randint(4, 9, (n,), generator=g), 2
    return caps


def _split(tmp_path, n=6, r=3, d=4):
    """The train split of a small course-format file: n images, 10 captions (caption i of image i % n)."""
    feats = np.arange(n * r * d, dtype=np.float32).reshape(n, r, d)
    parts = {name: (feats, _captions(), np.arange(10) % n) for name in ("train", "val")}
    return load_dataset(write_caption_file(tmp_path / "tiny.h5", "tiny", WORDS, (1, r), parts)).split("train")


def test_stored_batches_give_every_caption_once_an_epoch_with_its_images_features(tmp_path):
    split = _split(tmp_path)
    captions = split.captions.flip(0)  # any captions, one row per caption of the split
    seen = []
    for features, caps in StoredBatches(split, captions, batch_size=3, shuffle=True):
        assert features.dtype == torch.float32 and features.shape == (len(caps), 3, 4) and caps.shape[1] == 7
        for f, c in zip(features, caps):
            row = next(i for i in range(len(captions)) if torch.equal(captions[i], c) and i not in seen)
            seen.append(row)
            assert torch.equal(f, split.features([int(split.image_idxs[row])])[0]), row
    assert sorted(seen) == list(range(10))
    assert len(list(StoredBatches(split, captions, 3, shuffle=True, drop_last=True))) == 3
    with pytest.raises(ValueError, match=r"one row per caption"):
        StoredBatches(split, captions[:4], 3, shuffle=False)


@pytest.mark.parametrize("loader_kind", ["DataLoader", "StoredBatches"])
def test_same_seed_same_batches_in_the_training_loop(tmp_path, loader_kind):
    """A loader's generator is re-seeded by train(): two runs with one seed see the same batches and end
    with the same weights; another seed sees other batches."""
    ns = _solution()
    if loader_kind == "DataLoader":
        data = ns["CaptionFeatures"](_file(tmp_path), "train/features", _captions(), torch.arange(10) % 6)
        loader = DataLoader(data, batch_size=3, shuffle=True, collate_fn=ns["collate_captions"], drop_last=True,
                            generator=torch.Generator().manual_seed(123))
    else:
        split = _split(tmp_path)
        loader = StoredBatches(split, split.captions, 3, shuffle=True, drop_last=True, seed=123)
    runs = []
    for seed in (0, 0, 1):
        batches = []

        def loss_fn(model, features, captions, batches=batches):
            batches.append(captions.clone())
            logits = model(features, captions[:, :-1])
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), captions[:, 1:].reshape(-1))

        torch.manual_seed(0)
        model = ToyCaptioner(9, 4, hidden=8, max_len=16)
        train(model, loss_fn, loader, TrainConfig(steps=7, warmup=2, seed=seed),  # 7 steps: over two epochs
              notebooks.solution_training(ns), progress=False)
        runs.append((batches, torch.cat([p.detach().reshape(-1) for p in model.parameters()])))
    (b0, w0), (b1, w1), (b2, _) = runs
    assert all(torch.equal(x, y) for x, y in zip(b0, b1)) and torch.equal(w0, w1)
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(b0, b2))


def test_an_unfinished_piece_is_not_used_and_one_line_says_what_happens_instead(capsys):
    def build_vocab(captions, min_count=1):
        raise NotImplementedError()

    assert yours_if_it_passes("build_vocab", build_vocab, instead="the stored vocabulary is used") is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "build_vocab: yours does not pass vocab/basic yet" in out
    assert out.rstrip().endswith("; the stored vocabulary is used")


def test_the_line_of_a_failing_piece_names_its_bug_in_whole_words(capsys):
    """A student's make_optimizer that picks the decayed parameters by name (every `weight`, so the LayerNorm
    gain too): the one line names that bug, and a long message is cut between words, never inside one."""
    def make_optimizer(model, lr, weight_decay):
        named = list(model.named_parameters())
        return torch.optim.AdamW([{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": weight_decay},
                                  {"params": [p for n, p in named if not n.endswith("weight")], "weight_decay": 0.0}],
                                 lr=lr)

    from starter.compare import load_case, observe, verdict
    from starter.pipeline import PUBLIC_CASES

    assert yours_if_it_passes("make_optimizer", make_optimizer, instead="plain AdamW is used") is None
    out = capsys.readouterr().out
    assert "LayerNorm gain is decayed" in out, out
    said = out[out.index("yet (") + 5:out.rindex("); plain AdamW is used")].removesuffix(" …").split()
    case_name, adapter = PUBLIC_CASES["make_optimizer"]
    case = load_case(case_name)
    message = verdict(case, observe(case, adapter(make_optimizer))).splitlines()[0].split()
    assert said == message[:len(said)], f"not the message's first {len(said)} words: {said}"


def test_every_finished_piece_is_used(capsys):
    """Each piece of the solution passes its public case and is handed back as it is."""
    ns = _solution()
    for name in PUBLIC_CASES:
        assert yours_if_it_passes(name, ns[name], instead="-") is ns[name], name
        assert capsys.readouterr().out == f"using your {name}\n"


def test_train_needs_the_students_training_pieces():
    """The kit has no training step, schedule, validation loss or loop: train() names what is missing."""
    model = ToyCaptioner(9, 4, hidden=8, max_len=16)
    pieces = notebooks.solution_training(_solution())
    with pytest.raises(TypeError, match=r"train_step is not \(TrainingPieces\(fit=fit, train_step=train_step"):
        train(model, lambda *a: None, [], TrainConfig(steps=2), replace(pieces, train_step=None), progress=False)


def test_bad_input_cases_fail_a_pipeline_that_does_not_check_its_input(hidden_references):
    """The bad-input cases of notebook 04 (images that are not RGB, a caption without <END>): an answer that
    computes without looking fails them with a message asking for a clear ValueError."""
    from starter import pipeline as P
    from starter.checks import CheckFailed, check

    def extract(cnn, images, size=224):  # the recipe, without the shape check
        x = torch.as_tensor(images).permute(0, 3, 1, 2).float() / 255
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
        x = (x - torch.tensor(P.IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(P.IMAGENET_STD).view(1, 3, 1, 1)
        with torch.no_grad():
            return cnn.eval()(x).flatten(2).transpose(1, 2)

    class Items(torch.utils.data.Dataset):  # the item rule, without the <END> check
        def __init__(self, path, key, captions, image_idxs):
            self.features = h5py.File(path, "r")[key]
            self.captions, self.image_idxs = captions, image_idxs

        def __len__(self):
            return len(self.captions)

        def __getitem__(self, i):
            caption = self.captions[i]
            return (torch.from_numpy(self.features[int(self.image_idxs[i])]).float(),
                    caption[: int((caption == 2).nonzero()[0]) + 1])

    check("features/basic", P.with_cnn(extract))  # the recipe itself is right
    check("dataset/basic", P.with_h5_file(Items))
    for name, answer in (("features/rgba_images", P.with_cnn(extract)),
                         ("features/grayscale_images", P.with_cnn(extract)),
                         ("dataset/caption_without_end", P.with_h5_file(Items))):
        with pytest.raises(CheckFailed, match="expected a clear ValueError") as err:
            check(name, answer)
        assert "\n" not in str(err.value)


def test_a_loop_that_returns_no_history_is_a_clear_error():
    model = ToyCaptioner(9, 4, hidden=8, max_len=16)
    loader = [(torch.randn(2, 3, 4), _captions(2))]

    def loss_fn(model, features, captions):
        return model(features, captions[:, :-1]).square().mean()

    with pytest.raises(TypeError, match="must return a dict of lists"):
        train(model, loss_fn, loader, TrainConfig(steps=2, warmup=1),
              replace(notebooks.solution_training(_solution()), fit=lambda *a: None), progress=False)


def test_readme_points_table_matches_the_notebooks():
    import json
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    table = {m.group(1): (int(m.group(2)), m.group(3)) for m in
             re.finditer(r"^\| (0\d) \| (\d+) \| (.*) \|$", (root / "README.md").read_text(), flags=re.M)}
    for path in sorted((root / "solutions").glob("0*.ipynb")):
        cells = [c["metadata"].get("nbgrader", {}) for c in json.loads(path.read_text())["cells"]]
        graded = [(m["grade_id"].removeprefix("test_"), m["points"]) for m in cells if m.get("grade") and "points" in m]
        total, text = table[path.name[:2]]
        assert total == sum(p for _, p in graded), path.name
        assert re.findall(r"(\w+) (\d+)", text) == [(g, str(p)) for g, p in graded], path.name


# the pieces of each notebook that the notebook uses only once they pass (PUBLIC_CASES has them all)
PIPELINE_PIECES = {"04_captioning_data": ["extract_grid_features", "build_vocab", "encode_captions", "CaptionFeatures",
                                           "collate_captions"],
                   "05_captioning_model": ["make_optimizer"],
                   "06_training": ["lr_at_step", "train_step", "validation_loss", "fit"]}
DATA_NB, MODEL_NB = "04_captioning_data", "05_captioning_model"


def _released(stem: str, pieces: list[str]):
    """Notebook `stem` filled in with the solution, but for `pieces`, left as released."""
    release = {notebooks.nbgrader_meta(c)["grade_id"]: c.source
               for c in notebooks.read(notebooks.RELEASE / f"{stem}.ipynb").cells if notebooks.is_solution(c)}
    return notebooks.filled_submission(stem, {k: release[k] for k in pieces})


@pytest.mark.parametrize("stem", sorted(PIPELINE_PIECES))
def test_a_notebook_runs_to_the_end_without_its_pipeline_pieces(stem, tmp_path, monkeypatch):
    """A student who wrote the model, its loss and the decoders but none of the pipeline pieces (their answer
    cells as released): every cell that is not a test cell runs, each piece is reported in one line, the
    notebooks go on with the dataset's stored vocabulary, captions, features and batches, 05 memorises a batch
    with AdamW in one group, and 06 trains nothing and saves nothing (it loads the student's 04 and 05, pieces
    missing too). Run as the student runs it: while graded (NBGRADER_EXECUTION set) no notebook trains anything."""
    import nbformat
    from nbclient import NotebookClient

    for earlier in (DATA_NB, MODEL_NB):
        nbformat.write(_released(earlier, PIPELINE_PIECES[earlier]), str(tmp_path / f"{earlier}.ipynb"))
    for layers_nb in ("02_positional_encoding", "03_multi_head_attention"):  # "your layers", finished
        nbformat.write(notebooks.filled_submission(layers_nb), str(tmp_path / f"{layers_nb}.ipynb"))
    nb = _released(stem, PIPELINE_PIECES[stem])
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setenv("COURSE_NOTEBOOKS_DIR", str(tmp_path))
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = ""
    for index, cell in enumerate(nb.cells):
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if notebooks.nbgrader_meta(cell).get("grade"):
            continue  # the pieces' test cells fail, as they should
        assert not errors, f"cell {index} ({notebooks.nbgrader_meta(cell).get('grade_id')}): {errors[0].ename}: " \
                           f"{errors[0].evalue[:300]}"
        printed += "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")
    loaded = {DATA_NB: [], MODEL_NB: PIPELINE_PIECES[DATA_NB][1:], "06_training": PIPELINE_PIECES[DATA_NB][1:]
              + PIPELINE_PIECES[MODEL_NB]}[stem]  # the earlier notebooks' pieces this one loads
    missing = PIPELINE_PIECES[stem] + loaded
    for piece in missing:
        assert f"{piece}: yours does not pass {PUBLIC_CASES[piece][0]} yet" in printed, piece
        assert f"using your {piece}\n" not in printed, piece
    if stem == DATA_NB:
        assert "the loaders give the stored batches" in printed
    elif stem == MODEL_NB:
        assert re.search(r"^8 captions, 150 steps: loss ", printed, re.M), "the finished model and loss were not trained " \
            "on a batch of the stored data"
    else:
        assert "using your CaptioningTransformer\n" in printed and "using your teacher_forcing_loss\n" in printed
        assert "not trained: the model and loss of notebook 05 and the training pieces above do not all pass yet" \
            in printed
        assert not re.search(r"^saved ", printed, re.M), "a model the student did not train was saved"
