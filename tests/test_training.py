"""Fast tests of starter.layers, starter.training and starter.metrics (no dataset build needed)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from grading import notebooks as nbs
from starter import layers, metrics, training
from starter.data import Vocab


class TinySplit:
    """Just enough of starter.data.Split for the training loop: 24 captions of 6 images."""

    def __init__(self, V=9, T=7, R=4, D=5, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.feats = torch.randn(6, R, D, generator=g)
        caps = torch.zeros(24, T, dtype=torch.long)
        for i in range(24):
            n = 2 + i % 4
            caps[i, 0], caps[i, n + 1] = 1, 2
            caps[i, 1:n + 1] = 4 + (torch.arange(n) + i // 4) % (V - 4)
        self.captions, self.image_idxs = caps, torch.arange(24) // 4
        self.num_images = 6

    def __len__(self):
        return len(self.captions)

    def sample_batch(self, batch_size, generator=None, device=None):
        rows = torch.randperm(len(self), generator=generator if isinstance(generator, torch.Generator)
                              else torch.Generator().manual_seed(generator or 0))[:batch_size]
        return self.captions[rows], self.feats[self.image_idxs[rows]], self.image_idxs[rows]


@pytest.fixture(scope="module")
def ns():
    return nbs.captioning_solution()


def _train(model, loss_fn, data, val_split=None, device=None, progress=True, **settings):
    """starter.training.train with the settings given here (a TrainConfig) and the solution's training pieces
    (the kit has none of its own)."""
    return training.train(model, loss_fn, data, training.TrainConfig(**settings),
                          nbs.solution_training(nbs.captioning_solution()), val_data=val_split, device=device,
                          progress=progress)


def _model(ns, **kw):
    torch.manual_seed(0)
    return ns["CaptioningTransformer"](vocab_size=9, feature_dim=5, num_regions=4, d_model=16, num_heads=2,
                                       num_layers=1, dim_feedforward=32, max_len=8, **kw)


def test_torch_decoder_layer_matches_plain_pytorch():
    torch.manual_seed(0)
    ours = layers.TorchDecoderLayer(8, 2, 16, dropout=0.1).eval()
    ref = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.1, batch_first=True, norm_first=True).eval()
    ref.load_state_dict(ours.state_dict())
    tgt, mem = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    pad = torch.tensor([[False] * 3, [False, False, True]])
    out, sw, cw = ours(tgt, mem, tgt_mask=causal, memory_key_padding_mask=pad)
    assert torch.allclose(out, ref(tgt, mem, tgt_mask=~causal, memory_key_padding_mask=pad), atol=1e-6)
    assert sw.shape == (2, 2, 5, 5) and cw.shape == (2, 2, 5, 3)
    assert sw.triu(1).abs().max() == 0 and cw[1, :, :, 2].abs().max() == 0
    assert torch.allclose(sw.sum(-1), torch.ones(2, 2, 5))


def test_learned_positional_encoding():
    pe = layers.LearnedPositionalEncoding(4, max_len=6, dropout=0.0)
    x = torch.zeros(2, 5, 4)
    assert torch.equal(pe(x), pe.embedding.weight[:5].expand(2, 5, 4))
    with pytest.raises(ValueError):
        pe(torch.zeros(1, 7, 4))


def test_get_layers(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert layers.get_layers("torch") == (layers.TorchDecoderLayer, layers.LearnedPositionalEncoding)
    with pytest.raises(ValueError):
        layers.get_layers("yours")
    layer, posenc = layers.get_layers("mine", folder=nbs.SOLUTIONS)  # the solutions pass their checks
    assert layer.__name__ == "TransformerDecoderLayer" and posenc.__name__ == "PositionalEncoding"
    layers._cache.clear()
    with pytest.raises(layers.LayerLoadError, match='LAYERS = "torch"'):  # the release is unfinished
        layers.get_layers("mine", folder=nbs.RELEASE)
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert layers.get_layers("mine")[0] is layers.TorchDecoderLayer


def test_training_reduces_loss_and_overfit_check(ns, capsys):
    split = TinySplit()
    model = _model(ns, layers="torch")
    hist = _train(model, ns["teacher_forcing_loss"], split, steps=40, batch_size=8, lr=3e-3, warmup=5,
                          val_split=split, val_every=20, progress=False)
    assert hist["steps_done"] == 40 and len(hist["loss"]) == 40 and len(hist["val_loss"]) == 2
    assert np.mean(hist["loss"][-5:]) < np.mean(hist["loss"][:5])
    res = training.overfit_small_batch(_model(ns), ns["teacher_forcing_loss"], split, ns["train_step"], batch_size=4,
                                       steps=80, target=0.2)
    assert res["passed"] and "passed" in capsys.readouterr().out


class SlowMachine:
    """A fake clock for starter.training: each training step (a loss computed in train mode) takes
    `first` seconds the first time and `per_step` seconds afterwards; validation and everything else
    take no time. The time budget's behaviour is then exact and independent of the real machine."""

    def __init__(self, per_step, first=None):
        self.now, self.per_step, self.first, self.calls = 1000.0, per_step, first, 0

    def __call__(self):
        return self.now

    def loss_fn(self, model, features, captions):
        if model.training:
            self.now += self.first if (self.calls == 0 and self.first is not None) else self.per_step
            self.calls += 1
        return model(features).pow(2).mean() + 0.0 * captions.sum()


def _linear():
    torch.manual_seed(0)
    return nn.Linear(5, 3)


def _expected_lr(s, steps, warmup, lr):
    """The schedule written out: linear warm-up to `lr` over `warmup` steps, then a half cosine from `lr`
    down to lr/10 at `steps` (s = the schedule's step, fractional when a time budget compresses it)."""
    if s < warmup:
        return lr * min(1.0, (s + 1) / warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (steps - warmup)))))


def test_binding_time_budget_completes_the_schedule_in_fewer_steps(monkeypatch, capsys):
    # 100 steps planned, 40 s budget, 1 s per step: 40 steps fit, and the schedule must still finish
    clock = SlowMachine(per_step=1.0)
    monkeypatch.setattr(training, "_clock", clock)
    split = TinySplit()
    steps, warmup, lr = 100, 8, 1e-2
    hist = _train(_linear(), clock.loss_fn, split, steps=steps, batch_size=8, lr=lr, warmup=warmup,
                          time_limit=40, val_split=split, progress=True)
    out, err = capsys.readouterr()
    assert hist["steps_done"] == len(hist["lr"]) == 40 and hist["planned_steps"] == 100
    assert hist["shortened"] is True and hist["seconds"] == pytest.approx(40.0)
    # the (compressed) warm-up reached the peak, then the cosine ran to (almost) its end, lr/10, at the last step
    peak = hist["lr"].index(max(hist["lr"]))
    assert max(hist["lr"]) == lr and 0 < peak < warmup  # (a schedule step of 7.7 must not give 8.7 / 8 of lr)
    assert all(a < b for a, b in zip(hist["lr"][:peak], hist["lr"][1:peak + 1]))
    assert all(a > b for a, b in zip(hist["lr"][peak:], hist["lr"][peak + 1:]))
    assert hist["lr"][-1] == pytest.approx(0.1 * lr, rel=0.03)
    # exactly the compressed schedule: step k (k >= 1) is at the fraction (k - 1) / 39 of the budget left
    # after the first step, i.e. at schedule step max(k, 100 (k - 1) / 39)
    expected = [_expected_lr(max(k, steps * (k - 1) / 39) if k else 0, steps, warmup, lr) for k in range(40)]
    assert hist["lr"] == pytest.approx(expected, rel=1e-9)
    assert hist["val_step"][-1] == 40  # the validation loss of the final model is recorded
    assert out == hist["summary"] + "\n" and "40 of 100 steps" in out and "time budget 40 s" in out
    assert "training on cpu" in out and "completed" in out
    bar_updates = [part for part in err.replace("\r", "\n").split("\n") if part.strip()]
    assert bar_updates and all(part.startswith("training") for part in bar_updates)  # only the bar on stderr
    assert bar_updates[-1].startswith("training (time budget): 100%") and "40/40" in bar_updates[-1]  # ends full
    with pytest.raises(ValueError, match="time_limit"):
        _train(_linear(), clock.loss_fn, split, steps=5, time_limit=0, progress=False)


def test_time_budget_that_does_not_bind_changes_nothing(monkeypatch):
    split = TinySplit()
    steps, warmup, lr = 100, 10, 1e-2
    reference = _train(_linear(), SlowMachine(0.0).loss_fn, split, steps=steps, batch_size=8, lr=lr,
                               warmup=warmup, val_split=split, progress=False)
    expected = [_expected_lr(k, steps, warmup, lr) for k in range(steps)]
    assert reference["lr"] == expected  # exactly the step-based schedule
    assert reference["lr"][warmup] == lr and reference["lr"][-1] > 0.1 * lr
    # a 100 s budget on a machine whose first step is slow (5 s of start-up) but which then keeps pace
    # (0.5 s per step): all steps, the same learning rates and the same losses as without a budget
    clock = SlowMachine(per_step=0.5, first=5.0)
    monkeypatch.setattr(training, "_clock", clock)
    hist = _train(_linear(), clock.loss_fn, split, steps=steps, batch_size=8, lr=lr, warmup=warmup,
                          time_limit=100, val_split=split, progress=False)
    assert hist["steps_done"] == hist["planned_steps"] == steps and hist["shortened"] is False
    assert hist["seconds"] == pytest.approx(54.5)
    assert hist["lr"] == expected
    assert hist["loss"] == reference["loss"] and hist["val_loss"] == reference["val_loss"]
    assert hist["summary"].endswith(f"{steps} steps in 54 s") and "time budget" not in hist["summary"]


def _shapes_training_config() -> training.TrainConfig:
    """The TrainConfig of notebook 06's `shapes` run, read from its settings cell (CONFIGS)."""
    return nbs.shapes_config()["train"]


def test_the_bottleneck_runs_use_notebook_06s_settings_but_the_steps():
    """Notebook 07's two short runs (section 4) are notebook 06's shapes settings, 150 steps long."""
    import ast
    from dataclasses import replace
    source = next(c.source for c in nbs.read(nbs.SOLUTIONS / "07_generation_and_evaluation.ipynb").cells
                  if nbs.nbgrader_meta(c).get("grade_id") == "code_bottleneck")
    assignment = next(n for n in ast.parse(source).body if isinstance(n, ast.Assign)
                      and getattr(n.targets[0], "id", "") == "SHORT_RUN")
    short = eval(compile(ast.Expression(assignment.value), "SHORT_RUN", "eval"), {"TrainConfig": training.TrainConfig})
    assert short == replace(_shapes_training_config(), steps=150)


def test_the_graded_run_trains_the_same_on_a_slow_machine(monkeypatch):
    """Notebook 05's shapes run has no time budget, so a machine 50 times slower (10 s a step) trains the
    same steps with the same rates and losses as a fast one: the trained-model mark does not depend on it."""
    config = _shapes_training_config()
    assert config.time_limit is None, "the graded run must not be cut by the machine's speed"
    args = {k: v for k, v in vars(config).items() if k != "batch_size"}
    split = TinySplit()
    fast = _train(_linear(), SlowMachine(0.2).loss_fn, split, batch_size=8, val_split=split, progress=False,
                  **args)
    clock = SlowMachine(per_step=10.0)
    monkeypatch.setattr(training, "_clock", clock)
    slow = _train(_linear(), clock.loss_fn, split, batch_size=8, val_split=split, progress=False, **args)
    assert slow["steps_done"] == fast["steps_done"] == args["steps"] and slow["shortened"] is False
    assert slow["lr"] == fast["lr"] and slow["loss"] == fast["loss"] and slow["val_loss"] == fast["val_loss"]
    assert slow["seconds"] == pytest.approx(10.0 * args["steps"])


def test_lambdalr_applies_the_same_schedule_step_by_step():
    """Notebook 05 says PyTorch's LambdaLR, given the schedule divided by the peak and stepped once per step,
    applies the rates of the training loop (on whole steps: the time budget needs fractional ones)."""
    split = TinySplit()
    steps, warmup, lr = 30, 5, 1e-2
    hist = _train(_linear(), SlowMachine(0.0).loss_fn, split, steps=steps, batch_size=8, lr=lr,
                          warmup=warmup, progress=False)
    opt = torch.optim.SGD(_linear().parameters(), lr=lr)
    lr_at_step = nbs.captioning_solution()["lr_at_step"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at_step(s, steps, warmup, lr) / lr)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert rates == pytest.approx(hist["lr"], rel=1e-12)


def test_summary_names_the_device_and_pick_device_order(monkeypatch, capsys):
    split = TinySplit()
    hist = _train(_linear(), SlowMachine(0.0).loss_fn, split, steps=3, batch_size=4, warmup=1,
                          device="cpu", progress=True)
    out = capsys.readouterr().out
    assert out == hist["summary"] + "\n"
    assert out.startswith(f"training on cpu (CPU, {torch.get_num_threads()} threads): 3 steps in ")
    assert hist["device"] == f"cpu (CPU, {torch.get_num_threads()} threads)"
    assert _train(_linear(), SlowMachine(0.0).loss_fn, split, steps=2, progress=False)["summary"]
    assert capsys.readouterr() == ("", "")  # progress=False: silent

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert training.pick_device().type == "cuda"  # CUDA first
    assert capsys.readouterr().out == "device: cuda (Fake GPU)\n"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert training.pick_device(verbose=False).type == "mps"  # then Apple's MPS
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert training.pick_device().type == "cpu"  # else the CPU
    assert capsys.readouterr().out.startswith("device: cpu (CPU, ")


def test_checkpoint_round_trip(ns, tmp_path):
    model = _model(ns, layers="torch").eval()
    config = dict(vocab_size=9, feature_dim=5, num_regions=4, d_model=16, num_heads=2, num_layers=1,
                  dim_feedforward=32, max_len=8, layers="torch")
    vocab = Vocab(["<NULL>", "<START>", "<END>", "<UNK>"] + [f"w{i}" for i in range(5)])
    path = training.save_checkpoint(tmp_path / "runs" / "m.pt", model, config, vocab, history={"loss": [1.0]})
    restored, info = training.load_checkpoint(path, ns["CaptioningTransformer"])
    feats, caps = torch.randn(2, 4, 5), torch.randint(1, 9, (2, 6))
    with torch.no_grad():
        assert torch.equal(restored(feats, caps), model(feats, caps))
    assert info["vocab"].idx_to_word == vocab.idx_to_word and info["extra"]["history"]["loss"] == [1.0]
    with pytest.raises(FileNotFoundError, match="no trained model at"):
        training.load_checkpoint(tmp_path / "missing.pt", ns["CaptioningTransformer"])


def test_metrics_on_known_strings():
    refs = {0: ["a red circle in the top left", "in the top left there is a red circle"],
            1: ["a small blue square", "there is a small blue square"]}
    perfect = metrics.caption_scores(refs, {0: "A red circle, in the top left.", 1: "a small blue square"})
    assert perfect["BLEU-4"] == pytest.approx(1.0, abs=1e-6) and perfect["ROUGE-L"] == pytest.approx(1.0)
    assert perfect["CIDEr"] > 1
    one = metrics.caption_scores({0: ["a red square"]}, {0: "a red circle"})
    assert one["BLEU-1"] == pytest.approx(2 / 3, abs=1e-6) and one["BLEU-2"] == pytest.approx(0.5 ** 0.5 * (2 / 3) ** 0.5, abs=1e-6)
    assert metrics.tokenize("A red-ish Circle!") == "a red ish circle"
    with pytest.raises(ValueError):
        metrics.caption_scores(refs, {0: "x"})


@pytest.mark.budget(240, reason="40 steps trained twice, once under a third of a core: 38 s alone on 2 cores")
def test_a_machine_a_third_as_fast_trains_the_same_model():
    """The notebook's `shapes` run (shortened to 40 steps) trained on the whole machine and under a CPU quota of a
    third of a core gives the same weights, so the same trained-model mark: `benchmarks/bench_cpu_quota.py`, run
    as it is run by hand (root and the cgroup CPU controller, or skipped)."""
    import subprocess
    import sys

    from conftest import ROOT

    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cpu_quota.py"), "--steps", "40"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    if run.returncode == 3:
        pytest.skip(run.stdout.strip())
    assert run.returncode == 0, run.stderr[-2000:]
    assert "40 of 40 steps" in run.stdout and "same weights: True; same shares: True" in run.stdout, run.stdout
