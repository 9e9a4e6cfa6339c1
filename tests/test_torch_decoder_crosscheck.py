"""Notebook 04's cross-check against PyTorch (`starter.layers.matches_torch_decoder`): True for the solution's
model, False for models with the usual bugs of its forward."""
from __future__ import annotations

import pytest
import torch

from starter.layers import matches_torch_decoder

STEM = "05_captioning_model"
FORWARD = "CaptioningTransformer"
MASK = "mask = torch.ones(T, T, dtype=torch.bool, device=captions.device).tril()"
BUGS = {
    "no mask": [("tgt_mask=mask", "tgt_mask=None")],
    "inverted mask": [(MASK, MASK.replace(".tril()", ".tril().logical_not()"))],
    "mask without the diagonal": [(MASK, MASK.replace(".tril()", ".tril(-1)"))],
    "no final norm": [("self.vocab_head(self.final_norm(x))", "self.vocab_head(x)")],
    "layers reversed": [("for layer in self.decoder_layers:", "for layer in list(self.decoder_layers)[::-1]:")],
}


def _model(ns, seed=0, **kw):
    torch.manual_seed(seed)
    return ns[FORWARD](11, 6, 4, num_layers=3, layers="torch", **kw).eval()


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 4, 6, generator=g), torch.randint(0, 11, (2, 7), generator=g)


def test_the_solution_matches_and_the_model_is_left_as_it_was():
    from conftest import mutated_namespace
    model = _model(mutated_namespace(STEM, {}), dropout=0.3).train()
    features, captions = _inputs()
    assert matches_torch_decoder(model, features, captions)
    assert model.training
    assert matches_torch_decoder(model.double(), features.double(), captions)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_broken_forward_does_not_match(bug):
    from conftest import mutated_namespace
    model = _model(mutated_namespace(STEM, {FORWARD: BUGS[bug]}))
    assert not matches_torch_decoder(model, *_inputs()), bug


def test_it_needs_the_pytorch_layers():
    from conftest import mutated_namespace
    ns = mutated_namespace(STEM, {})

    class Plain(torch.nn.Module):  # not an nn.TransformerDecoderLayer
        def forward(self, x, memory, tgt_mask=None):
            return x, None, None

    model = _model(ns)
    model.decoder_layers = torch.nn.ModuleList([Plain()])
    with pytest.raises(TypeError, match='layers="torch"'):
        matches_torch_decoder(model, *_inputs())
