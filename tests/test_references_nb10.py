"""Notebook 10's references against independent implementations, and its mutation suite.

- `attend_with_cache` fed in pieces against PyTorch's causal attention over the whole sequence;
- `decode_step` fed in pieces against the solution of notebook 05's `CaptioningTransformer` with the solutions'
  own layers of notebooks 02-03 (`layers="mine"`), run on the whole caption with the stand-in's weights;
- `cached_greedy_decode` on the toy model's cached step against notebook 07's uncached `greedy_decode`;
- `blockwise_attention` against `F.scaled_dot_product_attention` with the same masks;
then plausible bugs, each an edit of the solution, lose points with a message that names them, and correct
answers written another way keep full marks.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import case_names, case_names_in, case_results, load_any_case, mutated_namespace

from grading import notebooks as nbs
from starter.checks import CheckFailed, check
from starter.compare import _load_params
from starter.fast import in_steps, largest_tensor, stepwise, with_toy_steps
from starter.layers import ToyCaptioner, layers_from

STEM = "10_efficient_attention"


def _cases(prefix):
    return [n for n in case_names(STEM) if n.startswith(prefix)]


def _t(a):
    return torch.from_numpy(np.array(a)).double() if np.asarray(a).dtype.kind == "f" else torch.from_numpy(np.array(a))


@pytest.mark.parametrize("name", _cases("cache/"))
def test_cache_cases_are_causal_attention_over_the_whole_sequence(name):
    case = load_any_case(name)
    q, k, v = (_t(case.inputs[x]) for x in ("q", "k", "v"))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert np.allclose(case.expected["out"], want.numpy(), atol=1e-5)
    assert np.allclose(case.expected["keys"], k.numpy()) and np.allclose(case.expected["values"], v.numpy())


@pytest.mark.parametrize("name", _cases("step/"))
def test_step_cases_are_the_forward_of_notebook_05_on_the_whole_caption(name):
    case = load_any_case(name)
    stand_in = stepwise(None)(**case.init)
    _load_params(case, stand_in)
    weights = stand_in.model
    CaptioningTransformer = nbs.solution("05_captioning_model")["CaptioningTransformer"]
    sizes = {k: v for k, v in case.init.items() if k != "dropout"}
    with layers_from(nbs.SOLUTIONS):
        model = CaptioningTransformer(layers="mine", dropout=0.0, **sizes)
    model.load_state_dict(weights.state_dict())
    model.pos_encoding.pe.copy_(weights.pos_encoding.pe)  # a buffer outside the state dict: the stand-in's table
    model = model.double().eval()
    with torch.no_grad():
        want = model(_t(case.inputs["features"]), _t(case.inputs["captions"]))
    assert np.allclose(case.expected["logits"], want.numpy(), atol=1e-5)


@pytest.mark.parametrize("name", _cases("cached_greedy/"))
def test_cached_greedy_cases_are_the_uncached_greedy_of_notebook_07(name):
    case = load_any_case(name)
    torch.manual_seed(0)
    toy = ToyCaptioner(**case.init).eval()
    toy.load_state_dict({k.removeprefix("model."): torch.from_numpy(v) for k, v in case.params.items()})
    greedy = nbs.solution("07_generation_and_evaluation")["greedy_decode"]
    with torch.no_grad():
        want = greedy(toy, torch.from_numpy(case.inputs["features"]), **case.const_kwargs)
    assert np.array_equal(case.expected["tokens"], want.numpy())


@pytest.mark.parametrize("name", _cases("blocks/"))
def test_block_cases_are_pytorchs_attention(name):
    case = load_any_case(name)
    q, k, v = (_t(case.inputs[x]) for x in ("q", "k", "v"))
    allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
    if case.const_kwargs["causal"]:
        allowed = allowed.tril()
    if "pad" in case.inputs:
        allowed = allowed & ~torch.from_numpy(case.inputs["pad"])[:, None, None, :]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    assert np.allclose(case.expected["out"], want.numpy(), atol=1e-6)


def test_the_checks_refuse_a_full_score_matrix_and_the_measure_sees_it():
    ns = nbs.solution(STEM)
    q = k = v = torch.randn(1, 1, 256, 8)
    _, blocks = largest_tensor(ns["blockwise_attention"], q, k, v, 16)
    _, full = largest_tensor(lambda *a: torch.softmax(q @ k.transpose(-2, -1), -1) @ v, q, k, v)
    assert blocks == 256 * 8 and full == 256 * 256  # the output, against the score matrix

    def full_matrix(q, k, v, block_size, causal=False, key_padding_mask=None):
        return ns["blockwise_attention"](q, k, v, q.shape[-2], causal, key_padding_mask)  # one block: all of it

    with pytest.raises(CheckFailed, match="made a tensor of .* numbers"):
        check("blocks/basic", full_matrix)


# ---- mutations ---------------------------------------------------------------------------------------------

ADAPTERS = {"in_steps(attend_with_cache)": lambda ns: in_steps(ns["attend_with_cache"]),
            "stepwise(decode_step)": lambda ns: stepwise(ns["decode_step"]),
            "with_toy_steps(cached_greedy_decode)": lambda ns: with_toy_steps(ns["cached_greedy_decode"]),
            "blockwise_attention": lambda ns: ns["blockwise_attention"]}


def _results(namespace: dict, prefix: str) -> dict[str, str | None]:
    return case_results(_cases(prefix), lambda case: ADAPTERS[case.target](namespace))


ALLOWED = "allowed = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(diagonal=total - n)"
POSITIONS = "model.pos_encoding.pe[s:s + n]"
PASS_BACK = "        words = next_word[:, None]"
RESCALE = "weights, rescale = torch.exp(scores - shift), torch.exp(m - shift)"

# (case prefix, {grade_id: [(old, new)]}, words the message of a failing hidden case must contain)
BUGS = {
    "cache: the own key left out (off by one)": (
        "cache/", {"attend_with_cache": [(ALLOWED, ALLOWED.replace("total - n)", "total - n - 1)"))]},
        "own key"),
    "cache: new keys not appended": (
        "cache/", {"attend_with_cache": [("    return out, (k, v)", "    return out, cache if cache is not None else (k, v)")]},
        "does not grow"),
    "step: positions from zero in every call (off by one position and more)": (
        "step/", {"decode_step": [(POSITIONS, "model.pos_encoding.pe[:n]")]}, "positions s .. s + n - 1"),
    "step: the cache not updated": (
        "step/", {"decode_step": [('{"seen": s + n, "self": kept,', '{"seen": s + n, "self": cache["self"] if s else kept,')]},
        "first call only"),
    "step: the region embeddings forgotten": (
        "step/", {"decode_step": [(" + model.region_embed.weight[:features.shape[1]]", "")]}, "region embeddings"),
    "greedy: the cache dropped at every step": (
        "cached_greedy/", {"cached_greedy_decode": [("step(model, features, words, cache)",
                                                     "step(model, features, words, None)")]},
        "the cache the call before returned"),
    "greedy: the whole prefix fed again at every step, with no cache": (
        "cached_greedy/", {"cached_greedy_decode": [
            ("logits, cache = step(model, features, words, cache)",
             "prefix = words if t == 0 else torch.cat([prefix, words], 1)\n"
             "        logits, cache = step(model, features, prefix, None)")]}, "one word per caption"),
    "blocks: PyTorch's attention under an alias": (
        "blocks/", {"blockwise_attention": [("    out = torch.empty(",
                                             "    from torch.nn.functional import scaled_dot_product_attention as sdpa\n"
                                             "    mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]\n"
                                             "    return sdpa(q, k, v, attn_mask=mask, is_causal=causal and mask is None)\n"
                                             "    out = torch.empty(")]}, "calls `"),
    "greedy: finished captions left out of the step, their cache rows kept": (
        "cached_greedy/", {"cached_greedy_decode": [("logits, cache = step(model, features, words, cache)",
                                                     "live = ~finished\n        logits_live, cache = step(model, "
                                                     "features[live], words[live], cache)\n        logits = "
                                                     "logits_live.new_zeros(len(words), *logits_live.shape[1:])\n"
                                                     "        logits[live] = logits_live")]}, "raised RuntimeError"),
    "greedy: finished captions keep their words": (
        "cached_greedy/", {"cached_greedy_decode": [(".masked_fill(finished, null_idx)", "")]}, "null_idx"),
    "blocks: no running maximum": (
        "blocks/", {"blockwise_attention": [(RESCALE, "weights, rescale = torch.exp(scores), torch.ones_like(m)")]},
        "running maximum"),
    "blocks: the sums not rescaled": (
        "blocks/", {"blockwise_attention": [(RESCALE, "weights, rescale = torch.exp(scores - shift), 1.0")]},
        "exp(m_old - m_new)"),
    "blocks: a block with no key for a query gives NaN": (
        "blocks/", {"blockwise_attention": [("shift = m_new.masked_fill(m_new == -math.inf, 0.0)", "shift = m_new")]},
        "add nothing"),
    "blocks: padding polarity flipped": (
        "blocks/", {"blockwise_attention": [("key_padding_mask[:, None, None, j:j + block_size]",
                                             "~key_padding_mask[:, None, None, j:j + block_size]")]}, "padding keys"),
    "blocks: every score at once": (
        "blocks/", {"blockwise_attention": [("for j in range(0, k.shape[-2], block_size):",
                                             "for j in range(0, k.shape[-2], k.shape[-2]):"),
                                            ("k[..., j:j + block_size, :]", "k[..., j:, :]"),
                                            ("v[..., j:j + block_size, :]", "v[..., j:, :]"),
                                            ("key_padding_mask[:, None, None, j:j + block_size]",
                                             "key_padding_mask[:, None, None, j:]")]}, "made a tensor of"),
}

ALTERNATIVES = {
    "cache: softmax written out, the cache as a list": (
        "cache/", {"attend_with_cache": [(
            "out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)\n    return out, (k, v)",
            "scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float('-inf'))\n"
            "    return scores.softmax(-1) @ v, [k, v]")]}),
    "step: the image's keys and values recomputed at every call": (
        "step/", {"decode_step": [("for layer, kv, (image_k, image_v) in zip(model.decoder_layers, cache[\"self\"], cache[\"image\"]):",
                                   "memory = model.feature_proj(features) + model.region_embed.weight[:features.shape[1]]\n"
                                   "    for layer, kv in zip(model.decoder_layers, cache[\"self\"]):\n"
                                   "        image_k, image_v = heads(layer.cross_attn.k_proj(memory), layer.cross_attn), "
                                   "heads(layer.cross_attn.v_proj(memory), layer.cross_attn)")]}),
    "blocks: causal key blocks after the diagonal skipped": (
        "blocks/", {"blockwise_attention": [("            scores = q_block @ k[",
                                             "            if causal and j > rows.max():\n                break\n"
                                             "            scores = q_block @ k[")]}),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_loses_points_with_a_message_naming_it(bug, hidden_references):
    prefix, edits, words = BUGS[bug]
    results = _results(mutated_namespace(STEM, edits), prefix)
    failed = {name: message for name, message in results.items() if message}
    hidden = set(case_names_in(nbs.HIDDEN_REFERENCES / f"{STEM}.h5"))
    assert failed.keys() & hidden, f"{bug}: no hidden case fails ({sorted(failed)} fail)"
    assert any(words in message for message in failed.values()), f"{bug}: {failed}"


@pytest.mark.parametrize("alternative", sorted(ALTERNATIVES))
def test_each_correct_alternative_passes_every_case(alternative, hidden_references):
    prefix, edits = ALTERNATIVES[alternative]
    results = _results(mutated_namespace(STEM, edits), prefix)
    assert results and not any(results.values()), {k: v for k, v in results.items() if v}


def test_a_step_without_a_cache_is_named(hidden_references):
    """A decode_step whose "cache" is the words so far and which runs them all again gives the right logits: the
    check counts the word positions that go through the embeddings and names it."""
    decode_step = nbs.solution(STEM)["decode_step"]

    def no_cache(model, features, words, cache=None):
        prefix = words if cache is None else torch.cat([cache, words], 1)
        return decode_step(model, features, prefix, None)[0][:, -words.shape[1]:], prefix

    results = case_results(_cases("step/"), lambda case: stepwise(no_cache))
    failed = {name: message for name, message in results.items() if message}
    assert failed.keys() & set(case_names_in(nbs.HIDDEN_REFERENCES / f"{STEM}.h5")), results
    assert all("each call runs only its new words" in m for m in failed.values()), failed


def test_work_sent_to_another_thread_is_refused():
    """The rules' watch of torch's operations is per thread: a case with rules refuses to start one."""
    from concurrent.futures import ThreadPoolExecutor

    def in_a_thread(q, k, v, block_size, causal=False, key_padding_mask=None):
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(lambda: torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1) @ v).result()

    with pytest.raises(CheckFailed, match="starts a thread or a process"):
        check("blocks/basic", in_a_thread)
