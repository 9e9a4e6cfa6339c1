"""Cross-checks of notebook 04's stored references against independent implementations."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grading import notebooks as nbs
from starter.checks import load_case
from starter.layers import ToyCaptioner

STEM = "04_captioning_transformer"


@pytest.fixture(scope="module", autouse=True)
def hidden(monkeypatch_module):
    monkeypatch_module.setenv("COURSE_HIDDEN_REFERENCES", str(nbs.HIDDEN_REFERENCES))


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _names(prefix):
    out = []
    for d in (nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES):
        with h5py.File(d / f"{STEM}.h5", "r") as f:
            out += [f"{prefix}/{n}" for n in f.get(prefix, {})]
    return sorted(out)


def _t(a):
    return torch.from_numpy(np.array(a))


@pytest.mark.parametrize("name", [n for n in _names("captioner") if "attention" not in n])
def test_forward_matches_torch_transformer_decoder(name):
    """Logits = vocab_head(nn.TransformerDecoder(norm_first layers, final LayerNorm)(words, memory))."""
    case = load_case(name)
    i, p = case.init, {k: _t(v).double() for k, v in case.params.items()}
    d, L = i["d_model"], i["num_layers"]
    layer = nn.TransformerDecoderLayer(d, i["num_heads"], i["dim_feedforward"], dropout=0.0, batch_first=True,
                                       norm_first=True, activation="relu")
    dec = nn.TransformerDecoder(layer, L, norm=nn.LayerNorm(d)).double().eval()
    dec.load_state_dict({k.replace("decoder_layers.", "layers."): v for k, v in p.items() if k.startswith("decoder_layers.")}
                        | {"norm.weight": p["final_norm.weight"], "norm.bias": p["final_norm.bias"]})
    feats, caps = _t(case.inputs["features"]).double(), _t(case.inputs["captions"])
    R, T = feats.shape[1], caps.shape[1]
    memory = feats @ p["feature_proj.weight"].T + p["feature_proj.bias"] + p["region_embed.weight"][:R]
    x = p["word_embed.weight"][caps] + p["pos_encoding.embedding.weight"][:T]
    mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    with torch.no_grad():
        logits = dec(x, memory, tgt_mask=mask) @ p["vocab_head.weight"].T + p["vocab_head.bias"]
    np.testing.assert_allclose(logits.numpy(), case.expected["logits"], rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("name", _names("loss"))
def test_loss_matches_cross_entropy_ignore_index(name):
    case = load_case(name)
    logits, targets = _t(case.inputs["logits"]).double(), _t(case.inputs["targets"])
    want = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=case.const_kwargs["null_idx"])
    np.testing.assert_allclose(want.item(), case.expected["loss"], rtol=1e-5)


def _toy(case, dtype=torch.float64):
    model = ToyCaptioner(**case.init)
    model.load_state_dict({k.removeprefix("model."): _t(v) for k, v in case.params.items()})
    return model.to(dtype).eval()


@pytest.mark.parametrize("name", _names("teacher"))
def test_teacher_forcing_matches_independent_loss(name):
    case = load_case(name)
    model = _toy(case)
    caps = _t(case.inputs["captions"])
    with torch.no_grad():
        logits = model(_t(case.inputs["features"]).double(), caps[:, :-1])
    want = F.cross_entropy(logits.transpose(1, 2), caps[:, 1:], ignore_index=case.const_kwargs["null_idx"])
    np.testing.assert_allclose(want.item(), case.expected["loss"], rtol=1e-5)


def _loop_greedy(model, feats, max_len, start_idx, end_idx, null_idx):
    """One image at a time, plain Python lists."""
    out = []
    for b in range(feats.shape[0]):
        words = [start_idx]
        while len(words) - 1 < max_len:
            with torch.no_grad():
                w = int(model(feats[b:b + 1], torch.tensor([words]))[0, -1].argmax())
            words.append(w)
            if w == end_idx:
                break
        gen = words[1:]
        out.append(gen + [null_idx] * (max_len - len(gen)))
    return np.array(out)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", _names("greedy"))
def test_greedy_matches_independent_loop(name, dtype):
    """Also in float32: the stored answer does not hinge on a near-tie that float32 would flip."""
    case = load_case(name)
    k = case.const_kwargs
    got = _loop_greedy(_toy(case, dtype), _t(case.inputs["features"]).to(dtype), k["max_len"], k["start_idx"],
                       k["end_idx"], k["null_idx"])
    np.testing.assert_array_equal(got, case.expected["tokens"])


def _exhaustive_best(model, feat, case):
    """Reference beam search written with explicit hypothesis lists (float32 run checks near-ties)."""
    k = case.const_kwargs
    hyps, done = [([], 0.0)], []
    for step in range(k["max_len"]):
        with torch.no_grad():
            lp = F.log_softmax(model(feat.expand(len(hyps), -1, -1),
                                     torch.tensor([[k["start_idx"]] + h for h, _ in hyps]))[:, -1], -1)
        cands = sorted(((s + float(lp[i, w]), h + [w]) for i, (h, s) in enumerate(hyps) for w in range(lp.shape[1])),
                       key=lambda c: -c[0])[:k["beam_width"] - len(done)]
        hyps = []
        for s, h in cands:
            if h[-1] == k["end_idx"] or step == k["max_len"] - 1:
                done.append((s / len(h) ** k["length_penalty"], h))
            else:
                hyps.append((h, s))
        if not hyps:
            break
    best = max(done, key=lambda d: d[0])[1]
    return best + [k["null_idx"]] * (k["max_len"] - len(best))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", _names("beam"))
def test_beam_matches_independent_search(name, dtype):
    case = load_case(name)
    model, feats = _toy(case, dtype), _t(case.inputs["features"]).to(dtype)
    got = np.array([_exhaustive_best(model, feats[b:b + 1], case) for b in range(feats.shape[0])])
    np.testing.assert_array_equal(got, case.expected["tokens"])
    if case.const_kwargs["beam_width"] == 1:  # width 1 is greedy
        k = case.const_kwargs
        np.testing.assert_array_equal(got, _loop_greedy(model, feats, k["max_len"], k["start_idx"], k["end_idx"],
                                                        k["null_idx"]))
