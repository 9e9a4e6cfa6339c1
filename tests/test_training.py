"""Fast tests of starter.layers, starter.training and starter.metrics (no dataset build needed)."""
from __future__ import annotations

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
    return nbs.execute_definitions(nbs.SOLUTIONS / "04_captioning_transformer.ipynb")


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
    hist = training.train(model, ns["teacher_forcing_loss"], split, steps=40, batch_size=8, lr=3e-3, warmup=5,
                          val_split=split, val_every=20, progress=False)
    assert hist["steps_done"] == 40 and len(hist["loss"]) == 40 and len(hist["val_loss"]) == 2
    assert np.mean(hist["loss"][-5:]) < np.mean(hist["loss"][:5])
    res = training.overfit_small_batch(_model(ns), ns["teacher_forcing_loss"], split, batch_size=4, steps=80,
                                       target=0.2)
    assert res["passed"] and "passed" in capsys.readouterr().out


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
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
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
