"""Notebook 05's trained-model mark measures what the checkpoint's weights do (grading/trained_model.py): the
hidden scenes never enter the sandbox, the grader captions them with the kit's own model class and greedy
decoding, and a checkpoint that is not a plain, bounded save_checkpoint file is one line, never a crash."""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import h5py
import nbformat
import pytest
import torch

from grading import judge, sandbox, trained_model
from grading import notebooks as nbs
from starter.cases import case_groups
from starter.compare import diagnose, load_case

NB05 = "07_generation_and_evaluation"  # the notebook whose test cell grades the trained model
DIRS = [nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES]


def hidden_trained_names() -> list[str]:
    return trained_model.outside_cases(NB05, DIRS, judge.public_case_names())


def test_the_hidden_trained_model_cases_are_known():
    names = hidden_trained_names()
    assert len(names) == 3 and all(n.startswith("trained/hidden_scenes_") for n in names), names
    assert "trained/new_scenes" not in names  # the public case runs in the student's notebook, as before


def test_the_hidden_scenes_never_enter_the_sandbox(tmp_path):
    """The sandbox's copy of the hidden cases has no trained-model case, and its copy of notebook 05 does not
    run (or name) them; every other hidden case is still there under an opaque id."""
    ids = sandbox.write_case_inputs(nbs.HIDDEN_REFERENCES, tmp_path / "inputs")
    outside = set(hidden_trained_names())
    assert not outside & set(ids), "a trained-model case was given to the sandbox"
    with h5py.File(nbs.HIDDEN_REFERENCES / f"{NB05}.h5", "r") as f:
        inside = {n for n, _ in case_groups(f)} - outside
    assert inside and inside <= set(ids), "the other hidden cases of notebook 05 are still given to the sandbox"
    for path in (tmp_path / "inputs").glob("*.h5"):  # not even under another id: no 100 scenes of 49 regions
        with h5py.File(path, "r") as f:
            shapes = [ds.shape for _, g in case_groups(f) for ds in g.get("inputs", {}).values()]
        assert (100, 49, 64) not in shapes, path
    nb = nbs.read(nbs.SOLUTIONS / f"{NB05}.ipynb")
    cell = next(c for c in nb.cells if nbs.nbgrader_meta(c).get("grade_id") == "test_trained_model")
    assert all(f'"{n}"' in cell.source for n in outside)  # the judge reads the cases from the full source
    copy = sandbox.hide_case_names(nb, ids)
    text = nbformat.writes(copy)
    assert not [n for n in outside if n in text], "a trained-model case's name reached the sandbox's copy"
    ran = next(c for c in copy.cells if nbs.nbgrader_meta(c).get("grade_id") == "test_trained_model")
    assert 'check("trained/new_scenes", trained_captioner(CaptioningTransformer, greedy_decode))' in ran.source
    assert any(v in text for v in ids.values()), "other hidden cases keep their opaque ids"


def fresh_checkpoint(path: Path, seed: int = 0) -> Path:
    """The solution's model as notebook 05 builds it, with freshly initialised weights, saved."""
    from starter.data import load_dataset
    from starter.layers import layers_from
    from starter.training import save_checkpoint

    ns = nbs.captioning_solution()
    ds = load_dataset("shapes")
    config = dict(vocab_size=len(ds.vocab), feature_dim=ds.feature_dim, num_regions=ds.num_regions,
                  max_len=ds.max_length, layers="mine", **nbs.shapes_config()["model"])
    torch.manual_seed(seed)
    with layers_from(nbs.SOLUTIONS):
        model = ns["CaptioningTransformer"](**config)
    return save_checkpoint(path, model, config, ds.vocab, dataset="shapes")


def verdicts(folder: Path) -> dict[str, str | None]:
    """Each hidden trained-model case's diagnosis (None: passed) for the checkpoint handed in in `folder`, as a
    worker that has not loaded any layers yet measures it."""
    from starter import layers

    layers._cache.clear()  # layers="mine" loaded for the first time in this process, as in a new worker
    observed = trained_model.measure_notebook(NB05, folder, DIRS, judge.public_case_names())
    assert set(observed) == set(hidden_trained_names())
    out = {}
    for name, obs in observed.items():
        found = diagnose(load_case(name, DIRS), obs)
        out[name] = None if found is None else found.message
    return out


def hand_in(folder: Path, checkpoint: Path) -> Path:
    (folder / "runs").mkdir(parents=True)
    (folder / nbs.TRAINED_CHECKPOINT).write_bytes(checkpoint.read_bytes())
    return folder


def test_the_mark_measures_the_trained_weights(tmp_path, trained_model_file):
    """The solution's trained checkpoint earns every hidden mark; the same model with freshly initialised
    weights, or trained one step, earns none: the scenes are captioned by the weights, nothing else."""
    assert verdicts(hand_in(tmp_path / "trained", trained_model_file)) == dict.fromkeys(hidden_trained_names())
    for student, checkpoint in (("fresh", fresh_checkpoint(tmp_path / "fresh.pt")),
                                ("one_step", nbs.trained_checkpoint(tmp_path / "one_step.pt", steps=1))):
        found = verdicts(hand_in(tmp_path / student, checkpoint))
        assert all(m and "captions 0% of these 100 images" in m and "the kit's greedy decoding" in m
                   for m in found.values()), (student, found)


def _zip_with(member: str, data: bytes, compression=zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as z:
        z.writestr(member, data)
    return buffer.getvalue()


class Gadget:  # a class in a pickle: torch.load(weights_only=True) refuses it
    def __reduce__(self):
        return (print, ("ran code from a checkpoint",))


def _saved(payload) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def honest_payload(tmp_path_factory):
    path = fresh_checkpoint(tmp_path_factory.mktemp("fresh") / "model.pt")
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("kind, expected", [
    ("missing", "no trained model was handed in"),
    ("not_a_zip", "not a file saved by torch.save"),
    ("zip_bomb", "unpacks to"),
    ("pickled_code", "torch.load(weights_only=True) refused it"),
    ("not_a_checkpoint", "not a checkpoint of save_checkpoint"),
    ("unknown_argument", "arguments CaptioningTransformer does not take: backdoor"),
    ("huge_positional_table", "max_len = 100000000 is not a whole number from 1 to 512"),
    ("too_many_weights", "over 32000000"),
    ("object_bomb", "its pickled part is"),
    ("extra_entries", "entries save_checkpoint does not write: zzjunk"),
    ("string_size", "d_model = '64' is not a whole number"),
])
def test_a_checkpoint_that_cannot_be_measured_is_one_line(tmp_path, honest_payload, kind, expected):
    """What the grader reads of a hostile checkpoint before building anything: each problem is every hidden
    case's error, in one line, and nothing large is allocated (the configurations here would ask for
    gigabytes)."""
    path = tmp_path / nbs.TRAINED_CHECKPOINT
    path.parent.mkdir()
    config = dict(honest_payload["config"])
    content = {
        "not_a_zip": b"\x80\x04 not a zip at all",
        "zip_bomb": _zip_with("archive/data.pkl", bytes(3 * trained_model.MAX_UNPACKED // 2)),
        "pickled_code": _saved({"config": config, "state_dict": {}, "vocab": [], "gadget": Gadget()}),
        "not_a_checkpoint": _saved([1, 2, 3]),
        "unknown_argument": _saved({**honest_payload, "config": {**config, "backdoor": 1}}),
        "huge_positional_table": _saved({**honest_payload, "config": {**config, "max_len": 10**8}}),
        "too_many_weights": _saved({**honest_payload, "config": {**config, "d_model": 1024, "num_heads": 8,
                                                                  "dim_feedforward": 8192, "num_layers": 12}}),
        "string_size": _saved({**honest_payload, "config": {**config, "d_model": "64"}}),
        # a small file whose pickle unpacks to many objects (an empty set or dict per few bytes)
        "object_bomb": _saved({**honest_payload, "extra": {"junk": [{} for _ in range(200_000)]}}),
        "extra_entries": _saved({**honest_payload, "zzjunk": 1}),
    }.get(kind)
    if content is not None:
        path.write_bytes(content)
    found = verdicts(tmp_path)
    assert all(m and expected in m and "\n" not in m and m.startswith("the trained model was not measured")
               for m in found.values()), found
    assert json.dumps(found)  # plain data, as the outcome stores it


def test_why_a_checkpoint_was_not_measured_is_said_in_full_and_only_for_the_graders_measure():
    """The grader's own message about the file handed in reaches the feedback page in full; the same words in
    an observation the sandbox recorded (which student code could have written) are said as a kind only."""
    from grading.feedback import case_message
    from starter.compare import Observation

    source = nbs.read(nbs.SOLUTIONS / f"{NB05}.ipynb")
    cell = next(c for c in source.cells if nbs.nbgrader_meta(c).get("grade_id") == "test_trained_model")
    why = "the trained model was not measured: no trained model was handed in (runs/captioning_transformer.pt ...)"
    names = hidden_trained_names()
    observations = {n: Observation(n, error=why) for n in names}
    graded = judge.judge_cell("test_trained_model", cell.source, 3.0, observations, DIRS, judge.public_case_names(),
                              "did not run", by_grader=frozenset(names))
    recorded = judge.judge_cell("test_trained_model", cell.source, 3.0, observations, DIRS,
                                judge.public_case_names(), "did not run")
    for case in (c for c in graded.cases if not c.public):
        assert case.diagnosis == judge.NOT_MEASURED and case_message(case) == why, case
    for case in (c for c in recorded.cases if not c.public):
        assert case.diagnosis != judge.NOT_MEASURED and why not in case_message(case), case
    assert graded.points == recorded.points == 0.0


def test_a_measurement_past_the_graders_limit_is_each_cases_error(tmp_path, honest_payload, monkeypatch):
    """The measurement runs in a child process within MEASURE_BOUND: past it, the worker goes on and each hidden
    case says why (here a limit no measurement meets)."""
    from grading.host_bounds import Bound

    folder = tmp_path / "student"
    (folder / "runs").mkdir(parents=True)
    torch.save(honest_payload, folder / nbs.TRAINED_CHECKPOINT)
    monkeypatch.setattr(trained_model, "MEASURE_BOUND", Bound(seconds=0.01, memory_mb=2048))
    found = verdicts(folder)
    assert all(m and "went past the grader's limit" in m for m in found.values()), found
