"""Notebook 06's trained model (graded in notebook 07) on the hidden scenes, measured by the grader itself, outside the sandbox.

A student's code in the sandbox runs next to whatever inputs it is given, and the captioned scenes of
`data/shapes.py` can be drawn in unlimited numbers by public code: a decoder (or a model class) that
recognises the scenes and captions them some other way (a small classifier trained on public scenes captions
98 % of them) would earn the trained-model mark with a checkpoint that never learned anything. So the hidden
trained-model cases never enter the sandbox: their inputs are not given to it and their lines are left out
of its copy of the test cell (`grading.sandbox`). Here the checkpoint handed in is read as data (its size,
zip layout and configuration checked first, then `torch.load(weights_only=True)`, which refuses pickled
code), loaded into the kit's own `CaptioningTransformer` (the solution's, built with the layers the
checkpoint names) and decoded by the kit's own greedy decoding. No student code runs, so what is measured is
what the weights do: the same model with freshly initialised weights captions none of the scenes.

The student's own class and `greedy_decode` still caption the public case in their notebook; a model class
that passes notebook 05's checks computes what the kit's does with the same weights (those checks compare
it with the kit's on given weights), and the decoder has its own graded task, so a mistake there is not
counted twice.
"""
from __future__ import annotations

import contextlib
import functools
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np

from . import notebooks
from .host_bounds import Bound, PastBound, run_bounded

if TYPE_CHECKING:
    from starter.compare import Case, Observation

# the test cells' call of the trained-model cases; a hidden case with this target is measured here
TRAINED_TARGET = "trained_captioner(CaptioningTransformer, greedy_decode)"
NOTEBOOK = notebooks.TRAINED_MODEL_CELL[0]  # the notebook whose test cell measures the checkpoint
# What the checkpoint's configuration may ask the kit to build before any weight is read (an honest one:
# d_model 64, 2 layers, 0.15 M parameters; COCO's 256 and 3): a bound on the host's memory and time.
CONFIG_INTS = {"vocab_size": 50_000, "feature_dim": 4096, "num_regions": 1024, "d_model": 1024, "num_heads": 64,
               "num_layers": 12, "dim_feedforward": 8192, "max_len": 512}
MAX_PARAMETERS = 32_000_000  # counted on PyTorch's meta device (nothing allocated): 128 MB of float32
MAX_UNPACKED = 2 * notebooks.MAX_HANDED_IN  # the zip's members, uncompressed: no zip bomb reaches torch.load
# The pickle part of the file (the payload's structure, its config and vocabulary; the tensors' bytes are apart):
# a few KB for an honest one (COCO's 1004 words: about 12 KB). Its size bounds what unpickling can build: one
# byte of pickle can make a few hundred bytes of Python objects (an empty set or dict).
MAX_PICKLE = 256 * 2**10
PAYLOAD_KEYS = frozenset({"format", "model_class", "config", "state_dict", "vocab", "extra", "torch"})
# The whole measurement (both loads, the model, three decodings of 100 scenes: about 2 s here) runs in a child
# process within this (grading.host_bounds), so no checkpoint can hold the worker.
MEASURE_BOUND = Bound(seconds=120, memory_mb=2048)


def not_measured(name: str, why: str) -> Observation:
    """Case `name`'s observation when the trained model could not be measured, saying why in one line."""
    from starter.compare import Observation

    return Observation(name, error=f"the trained model was not measured: {why}")


class UnusableCheckpoint(ValueError):
    """The checkpoint handed in cannot be measured; the message is one line that says why."""


def measured_outside(target: str, public: bool) -> bool:
    """Whether a case is measured here instead of in the sandbox: the hidden trained-model cases."""
    return target == TRAINED_TARGET and not public


def outside_cases(stem: str, reference_dirs: list[Path], public: frozenset[str]) -> list[str]:
    """The names of notebook `stem`'s cases measured here, from its reference files in `reference_dirs`."""
    from starter.cases import case_groups

    names = []
    for folder in reference_dirs:
        path = Path(folder) / f"{stem}.h5"
        if path.is_file():
            with h5py.File(path, "r") as f:
                names += [n for n, g in case_groups(f) if measured_outside(str(g.attrs["target"]), n in public)]
    return names


def _checked_config(config) -> dict:
    if not isinstance(config, dict):
        raise UnusableCheckpoint("its `config` is not a dict of the model's constructor arguments")
    unknown = sorted(str(k) for k in config if k not in {*CONFIG_INTS, "dropout", "layers"})
    if unknown:
        raise UnusableCheckpoint(f"its config has arguments CaptioningTransformer does not take: {', '.join(unknown)}")
    for key, value in config.items():
        if key in CONFIG_INTS and (type(value) is not int or not 1 <= value <= CONFIG_INTS[key]):
            raise UnusableCheckpoint(f"its config's {key} = {value!r} is not a whole number from 1 to {CONFIG_INTS[key]}")
    if "dropout" in config and (type(config["dropout"]) not in (int, float) or not 0 <= config["dropout"] < 1):
        raise UnusableCheckpoint(f"its config's dropout = {config['dropout']!r} is not a probability")
    if config.get("layers", "torch") not in ("torch", "mine"):
        raise UnusableCheckpoint(f"its config's layers = {config['layers']!r} is neither \"mine\" nor \"torch\"")
    return config


def read_checkpoint(path: Path) -> dict:
    """The checkpoint at `path` as plain data, checked before anything is built from it; raises
    UnusableCheckpoint with the reason."""
    import torch

    if path.is_symlink() or not path.is_file():
        raise UnusableCheckpoint(f"no trained model was handed in ({notebooks.TRAINED_CHECKPOINT}, saved by "
                                 "notebook 06's training cell, belongs in your submission, in a runs/ folder)")
    if path.stat().st_size > notebooks.MAX_HANDED_IN:
        raise UnusableCheckpoint(f"it is over {notebooks.MAX_HANDED_IN // 2**20} MB")
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise UnusableCheckpoint(f"it is not a file saved by torch.save ({exc})") from None
    unpacked = sum(info.file_size for info in members)
    if unpacked > MAX_UNPACKED:
        raise UnusableCheckpoint(f"it unpacks to {unpacked} bytes, over {MAX_UNPACKED}")
    pickled = max((info.file_size for info in members if info.filename.endswith(".pkl")), default=0)
    if pickled > MAX_PICKLE:
        raise UnusableCheckpoint(f"its pickled part is {pickled} bytes, over {MAX_PICKLE} (a checkpoint's is a few KB)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnusableCheckpoint(f"torch.load(weights_only=True) refused it ({type(exc).__name__}: {first})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("state_dict"), dict) \
            or not isinstance(payload.get("vocab"), list):
        raise UnusableCheckpoint("it is not a checkpoint of save_checkpoint (a dict with config, state_dict, vocab)")
    unknown = sorted(str(k)[:40] for k in payload if k not in PAYLOAD_KEYS)
    if unknown:
        raise UnusableCheckpoint(f"it holds entries save_checkpoint does not write: {', '.join(unknown[:5])}")
    _checked_config(payload.get("config"))
    return payload


@functools.cache
def _kit() -> dict:
    """The kit's CaptioningTransformer and greedy decoding (the solution's), once per worker process."""
    ns = notebooks.captioning_solution()
    return {"model_class": ns["CaptioningTransformer"], "decode": ns["greedy_decode"]}


@contextlib.contextmanager
def _kit_layers():
    """While it lasts, layers="mine" are the solution's notebooks 02-03, loaded (and checked, on the CPU) before
    the body runs: a model built on PyTorch's meta device finds them ready."""
    from starter.layers import get_layers, layers_from

    with layers_from(notebooks.SOLUTIONS):
        get_layers("mine")
        yield


def warm() -> None:
    """Load the kit's model, decoding and layers in this process, so that each bounded child forked from it
    finds them ready instead of loading them again; and touch PyTorch's "meta" device once (`read_measurable` counts
    a model's weights there), whose first use imports torch._dynamo: 2.2 s in every child otherwise, where a
    student's whole measurement takes 0.75 s."""
    import torch

    _kit()
    with _kit_layers():
        pass
    (torch.zeros(2, device="meta") + 1).sum()


def read_measurable(checkpoint: Path) -> dict:
    """`read_checkpoint`, and the model its configuration builds within MAX_PARAMETERS (counted on PyTorch's
    meta device, so nothing is allocated)."""
    import torch

    payload = read_checkpoint(checkpoint)
    try:
        with _kit_layers(), torch.device("meta"):
            model = _kit()["model_class"](**payload["config"])
    except Exception as exc:
        raise UnusableCheckpoint(f"its config does not build the model ({type(exc).__name__}: {exc})") from None
    size = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    if size > MAX_PARAMETERS:
        raise UnusableCheckpoint(f"its config asks for {size} weights, over {MAX_PARAMETERS}")
    return payload


def kit_captioner(checkpoint: Path):
    """The kit's captions of images by the model saved at `checkpoint`: a function of (features, words) as the
    trained-model cases call it (`starter.layers.trained_captioner` with the kit's model class and greedy
    decoding, layers="mine" from the solution's notebooks 02-03). Check the file with `read_measurable` first."""
    from starter.layers import trained_captioner

    kit = _kit()
    return trained_captioner(kit["model_class"], kit["decode"], path=checkpoint, layers_folder=notebooks.SOLUTIONS)


def measure(checkpoint: Path, cases: list[Case]) -> dict[str, Observation]:
    """Each case's observation of the model saved at `checkpoint`, captioned by the kit (`kit_captioner`); a
    checkpoint that cannot be measured is each case's error, in one line. In this process: see
    `measure_bounded`."""
    from starter.compare import observe

    try:
        read_measurable(checkpoint)
    except UnusableCheckpoint as exc:
        return {c.name: not_measured(c.name, str(exc)) for c in cases}
    kit = kit_captioner(checkpoint)
    decoded: dict[bytes, object] = {}

    def captioner(features, words):  # the hidden cases share their scenes: each set is decoded once
        key = features.numpy().tobytes() + repr(words).encode()
        if key not in decoded:
            decoded[key] = kit(features, words)
        return decoded[key]

    captioner.__name__ = kit.__name__
    found = {}
    for case in cases:
        obs = observe(case, captioner)
        if obs.error:  # it loaded but would not caption (weights that do not fit the model, another dataset)
            obs = not_measured(case.name, obs.error)
        found[case.name] = obs
    return found


def measure_bounded(checkpoint: Path, cases: list[Case]) -> dict[str, Observation]:
    """`measure` in a child process within MEASURE_BOUND; past it, each case's error says so."""
    from starter.compare import Observation

    warm()

    def as_data() -> dict:
        import torch

        # a child forked from a process whose torch has run threads: more than one would wait for the parent's
        # thread pool, which the fork did not copy (as in a DataLoader's workers)
        torch.set_num_threads(1)
        return {name: {"error": obs.error, "captions": obs.outputs["captions"].tolist() if "captions" in obs.outputs
                       else None, "dtype": obs.dtypes.get("captions", "")}
                for name, obs in measure(checkpoint, cases).items()}

    try:
        found = run_bounded(as_data, MEASURE_BOUND)
    except PastBound as exc:
        why = f"measuring it went past the grader's limit ({MEASURE_BOUND}: {exc})"
        return {c.name: not_measured(c.name, why) for c in cases}
    out = {}
    for case in cases:
        got = found.get(case.name, {}) if isinstance(found, dict) else {}
        if got.get("captions") is None:
            out[case.name] = Observation(case.name, error=str(got["error"])) if got.get("error") \
                else not_measured(case.name, "the measurement gave no captions")
        else:
            out[case.name] = Observation(case.name, outputs={"captions": np.asarray(got["captions"], dtype=np.int64)},
                                         dtypes={"captions": got["dtype"]})
    return out


def measure_notebook(stem: str, folder: Path | None, reference_dirs: list[Path],
                     public: frozenset[str]) -> dict[str, Observation]:
    """The observations of notebook `stem`'s cases measured here (none but notebook 07's hidden trained-model
    cases), from the checkpoint handed in beside it in `folder`, within MEASURE_BOUND."""
    from starter.compare import load_case

    names = outside_cases(stem, reference_dirs, public) if stem == NOTEBOOK else []
    if not names:
        return {}
    cases = [load_case(n, [Path(d) for d in reference_dirs]) for n in names]
    checkpoint = (folder if folder is not None else Path(".")) / notebooks.TRAINED_CHECKPOINT
    return measure_bounded(checkpoint, cases)
