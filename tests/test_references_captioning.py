"""Cross-checks of the stored references of notebooks 04-06 (the captioner) against independent implementations."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grading import notebooks as nbs
from starter.checks import CheckFailed, check, load_case
from starter.layers import BigramCaptioner, ToyCaptioner, with_model

STEMS = nbs.CAPTIONING  # the captioner's notebooks: data and model, training and evaluation, decoding


def _stored(folder):
    return [folder / f"{stem}.h5" for stem in STEMS]


def _all_case_names():
    from conftest import case_names
    return [n for stem in STEMS for n in case_names(stem)]


def _hidden_case_names():
    from conftest import case_names_in
    return {n for path in _stored(nbs.HIDDEN_REFERENCES) for n in case_names_in(path)}


def _mutant(grade_id, edits):
    """The solution namespaces of 04-06 with one solution cell edited (in whichever notebook holds it)."""
    from conftest import mutated_namespace
    stem = next(s for s in STEMS if grade_id in nbs.solution_sources(s))
    ns = mutated_namespace(stem, {grade_id: edits})
    for name, value in nbs.captioning_solution().items():
        ns.setdefault(name, value)
    return ns


@pytest.fixture(scope="module", autouse=True)
def hidden(monkeypatch_module):
    monkeypatch_module.setenv("COURSE_HIDDEN_REFERENCES", str(nbs.HIDDEN_REFERENCES))


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _names(prefix, bad_input=False):
    """The cases of `prefix`; those of bad input (which expect an error, and store no values) only if asked."""
    out = []
    for path in _stored(nbs.PUBLIC_REFERENCES) + _stored(nbs.HIDDEN_REFERENCES):
        with h5py.File(path, "r") as f:
            out += [f"{prefix}/{n}" for n, g in f.get(prefix, {}).items()
                    if bad_input or '"raises"' not in g.attrs.get("properties", "")]
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
    logits, targets = _t(case.inputs["logits"]).double().requires_grad_(), _t(case.inputs["targets"])
    want = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=case.const_kwargs["null_idx"])
    np.testing.assert_allclose(want.item(), case.expected["loss"], rtol=1e-5)
    if case.grad_wrt:  # d(loss * w)/d logits, by PyTorch's autograd
        (want * float(case.grad_weights["loss"])).backward()
        np.testing.assert_allclose(logits.grad.numpy(), case.grads["logits"], rtol=1e-4, atol=1e-6, err_msg=name)


def _toy(case, dtype=torch.float64):
    model = (BigramCaptioner if "probabilities" in case.init else ToyCaptioner)(**case.init)
    model.load_state_dict({k.removeprefix("model."): _t(v) for k, v in case.params.items()})
    return model.to(dtype).eval()


@pytest.mark.parametrize("name", _names("teacher"))
def test_teacher_forcing_matches_independent_loss(name):
    case = load_case(name)
    model = _toy(case)
    caps = _t(case.inputs["captions"])
    logits = model(_t(case.inputs["features"]).double(), caps[:, :-1])
    want = F.cross_entropy(logits.transpose(1, 2), caps[:, 1:], ignore_index=case.const_kwargs["null_idx"])
    np.testing.assert_allclose(want.item(), case.expected["loss"], rtol=1e-5)
    if case.grad_wrt:  # d(loss * w)/d weights, by PyTorch's autograd
        (want * float(case.grad_weights["loss"])).backward()
        named = dict(model.named_parameters())
        for key in case.grad_wrt:
            np.testing.assert_allclose(named[key.removeprefix("model.")].grad.numpy(), case.grads[key], rtol=1e-4,
                                       atol=1e-6, err_msg=f"{name}: {key}")


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


def _drawn_one_caption_at_a_time(model, feats, k):
    """Sampling as the text states it, written with explicit lists: at each step every caption's next word is drawn
    by one torch.multinomial call over the batch (finished ones too, their draw dropped)."""
    g = torch.Generator().manual_seed(k["seed"])
    B = feats.shape[0]
    captions, finished = [[k["start_idx"]] for _ in range(B)], [False] * B
    for _ in range(k["max_len"]):
        with torch.no_grad():
            logits = model(feats, torch.tensor(captions))[:, -1].double()
        probs = torch.exp(logits / k["temperature"] - torch.logsumexp(logits / k["temperature"], -1, keepdim=True))
        drawn = torch.multinomial(probs.float(), 1, generator=g)[:, 0].tolist()
        for b in range(B):
            word = k["null_idx"] if finished[b] else drawn[b]
            captions[b].append(word)
            finished[b] = finished[b] or word == k["end_idx"]
    return np.array([c[1:] for c in captions])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", _names("sample"))
def test_sample_matches_independent_draws(name, dtype):
    """Also in float32 features: the stored draws do not hinge on a probability that float32 would move."""
    case = load_case(name)
    got = _drawn_one_caption_at_a_time(_toy(case, dtype), _t(case.inputs["features"]).to(dtype), case.const_kwargs)
    np.testing.assert_array_equal(got, case.expected["tokens"])


def test_sampling_cases_tell_the_temperature_apart():
    """The cases away from temperature 1 (the public one too) store the captions of a decoder that ignores the
    temperature or multiplies by it, each with its own message; every case stores the greedy captions as a bug of
    its own."""
    variants = {name: load_case(name).variants for name in _names("sample")}
    for name in ("sample/basic", "sample/low_temperature", "sample/high_temperature"):
        assert {"no_temperature", "temperature_multiplied", "argmax"} <= variants[name].keys(), name
    assert all("argmax" in v for v in variants.values()), variants.keys()


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


# ---- beam search: the width rules and the length conventions -------------------------------------------
# Look-alike beam searches, written here independently of grading/cases/captioning/decoding.py's `_beam`, for the bugs
# that a correct-looking beam search hides: each must be named by its own message on some hidden case.

def _hidden_names(prefix):
    out = []
    for path in _stored(nbs.HIDDEN_REFERENCES):
        with h5py.File(path, "r") as f:
            out += [f"{prefix}/{n}" for n in f.get(prefix, {})]
    return sorted(out)


@torch.no_grad()
def _beam_keeping_k_live(model, features, beam_width, max_len, start_idx=1, end_idx=2, null_idx=0,
                         length_penalty=0.7):
    """The other width convention: the beam never narrows. Each step keeps the best beam_width candidates that
    go on; the <END> candidates ranked among them are set aside; stop once beam_width have finished."""
    out = torch.full((features.shape[0], max_len), null_idx, dtype=torch.long)
    for b in range(features.shape[0]):
        seqs = torch.tensor([[start_idx]])
        scores = torch.zeros(1, dtype=features.dtype)
        finished = []
        for t in range(max_len):
            lp = F.log_softmax(model(features[b:b + 1].expand(len(seqs), -1, -1), seqs)[:, -1], -1)
            V = lp.shape[1]
            total = (scores[:, None] + lp).flatten()
            live = []
            for j in total.argsort(descending=True).tolist():
                seq = torch.cat([seqs[j // V], torch.tensor([j % V])])
                if j % V == end_idx:
                    finished.append((total[j].item() / (t + 1) ** length_penalty, seq[1:]))
                else:
                    live.append((seq, total[j]))
                if len(live) == beam_width:
                    break
            if t == max_len - 1:
                finished += [(s.item() / max_len ** length_penalty, q[1:]) for q, s in live]
            if t == max_len - 1 or len(finished) >= beam_width:
                break
            seqs, scores = torch.stack([q for q, _ in live]), torch.stack([s for _, s in live])
        best = max(finished, key=lambda f: f[0])[1]
        out[b, :len(best)] = best
    return out


@torch.no_grad()
def _beam_own_best_word(model, features, beam_width, max_len, start_idx=1, end_idx=2, null_idx=0,
                        length_penalty=0.7):
    """The beam_width best first words, then each hypothesis extended by its own best word only (side-by-side
    greedy captions), the best by the normalised score."""
    out = torch.full((features.shape[0], max_len), null_idx, dtype=torch.long)
    for b in range(features.shape[0]):
        f = features[b:b + 1]
        first = F.log_softmax(model(f, torch.tensor([[start_idx]]))[0, -1], -1)
        top, words = first.topk(beam_width)
        finished = []
        for score, w in zip(top.tolist(), words.tolist()):
            seq = [w]
            while seq[-1] != end_idx and len(seq) < max_len:
                lp = F.log_softmax(model(f, torch.tensor([[start_idx] + seq]))[0, -1], -1)
                seq.append(int(lp.argmax()))
                score += float(lp[seq[-1]])
            finished.append((score / len(seq) ** length_penalty, seq))
        best = max(finished, key=lambda x: x[0])[1]
        out[b, :len(best)] = torch.tensor(best)
    return out


@torch.no_grad()
def _beam_length_without_end(model, features, beam_width, max_len, start_idx=1, end_idx=2, null_idx=0,
                             length_penalty=0.7):
    """The right search (the best beam_width - finished of all hypotheses x words), but a finished caption's
    length counts its words only, not <END>."""
    out = torch.full((features.shape[0], max_len), null_idx, dtype=torch.long)
    for b in range(features.shape[0]):
        f = features[b:b + 1]
        hyps, scores, finished = [[]], torch.zeros(1, dtype=features.dtype), []
        for t in range(max_len):
            lp = F.log_softmax(model(f.expand(len(hyps), -1, -1), torch.tensor([[start_idx] + h for h in hyps]))[:, -1],
                               -1)
            V = lp.shape[1]
            top, idx = (scores[:, None] + lp).flatten().topk(beam_width - len(finished))
            going = []
            for s, j in zip(top, idx.tolist()):
                h = hyps[j // V] + [j % V]
                if h[-1] == end_idx or t == max_len - 1:
                    words = len(h) - (h[-1] == end_idx)
                    finished.append((s.item() / max(1, words) ** length_penalty, h))
                else:
                    going.append((h, s))
            if not going:
                break
            hyps, scores = [h for h, _ in going], torch.stack([s for _, s in going])
        best = max(finished, key=lambda x: x[0])[1]
        out[b, :len(best)] = torch.tensor(best)
    return out


BEAM_LOOKALIKES = {  # known bug -> (look-alike search, words its message must contain)
    "keep_k_live": (_beam_keeping_k_live, "live hypotheses"),
    "per_hypothesis_best": (_beam_own_best_word, "own best word"),
    "length_without_end": (_beam_length_without_end, "leaves out <END>"),
}


def test_beam_bug_messages_name_their_own_bug():
    """One line each; no two known beam bugs share a message or the advice after its first colon, and only the
    missing normalisation is told to divide by length ** length_penalty."""
    from grading.cases.captioning.decoding import BEAM_BUGS
    assert set(BEAM_LOOKALIKES) <= set(BEAM_BUGS)
    for k, m in BEAM_BUGS.items():
        assert m and "\n" not in m and ": " in m, k
    assert len(set(BEAM_BUGS.values())) == len(BEAM_BUGS), "two beam bugs share a message"
    advice = [m.split(": ", 1)[1] for m in BEAM_BUGS.values()]
    assert len(set(advice)) == len(advice), "two beam bugs are given the same advice"
    assert [k for k, m in BEAM_BUGS.items() if "divide" in m and "length ** length_penalty" in m] == ["raw_final"]
    for k, (_, words) in BEAM_LOOKALIKES.items():
        assert [o for o, m in BEAM_BUGS.items() if words in m] == [k], words


def test_the_worked_example_of_beam_search_is_what_the_text_says():
    """Notebook 06 works beam search out by hand on the public case beam/worked_example: its answer, the
    keep-k-alive beam's other answer, and the length-normalised scores it states are those of this file's
    searches on the stored model."""
    from grading.cases.captioning.decoding import WORKED_NEXT, WORKED_WORDS
    text = "".join(c.source for c in nbs.read(nbs.SOLUTIONS / "08_decoding.ipynb").cells
                   if nbs.nbgrader_meta(c).get("grade_id") == "md_28")
    case = load_case("beam/worked_example")
    model, feats = _toy(case), _t(case.inputs["features"]).double()
    k = case.const_kwargs
    words = lambda tokens: " ".join(WORKED_WORDS[t] for t in tokens if t not in (0, 2))  # noqa: E731
    narrowing = words(_exhaustive_best(model, feats, case))
    alive = words(_beam_keeping_k_live(model, feats, k["beam_width"], k["max_len"],
                                       length_penalty=k["length_penalty"])[0].tolist())
    assert narrowing == "a" and alive == "a cat"
    assert f"the answer is **{narrowing}**" in text and f"returns *{alive}*" in text
    log_p = {cap: sum(math.log(WORKED_NEXT[w][v]) for w, v in zip(["<START>", *cap.split()], cap.split()))
             for cap in ("a <END>", "big dog <END>", "a cat <END>")}
    for cap, total in log_p.items():
        normalised = total / len(cap.split()) ** k["length_penalty"]
        assert f"{total:.3f}".replace("-", "−") in text and f"{normalised:.3f}" in text, (cap, total, normalised)


def test_width_rules_and_length_conventions_are_stored_by_hidden_cases():
    stored = {k: [n for n in _hidden_names("beam") if k in load_case(n).variants] for k in BEAM_LOOKALIKES}
    assert all(stored.values()), f"no hidden beam case stores: {[k for k, v in stored.items() if not v]}"


@pytest.mark.parametrize("bug", sorted(BEAM_LOOKALIKES))
def test_beam_lookalikes_are_named(bug, hidden_references):
    """The look-alike fails some hidden beam case with a one-line message naming its bug, and is never told
    another of these bugs' words."""
    search, words = BEAM_LOOKALIKES[bug]
    messages = []
    for name in _hidden_names("beam"):
        try:
            check(name, with_model(search))
        except CheckFailed as failed:
            messages.append(str(failed))
    named = [m for m in messages if words in m]
    assert named, f"{bug}: no hidden beam case names it; the messages: {messages}"
    assert all("\n" not in m for m in named), named
    others = [w for k, (_, w) in BEAM_LOOKALIKES.items() if k != bug]
    assert not [m for m in messages if any(w in m for w in others)], messages


# ---- the data pipeline, training step and evaluation: each stored answer against another implementation ----

def test_vocab_references_match_a_counter():
    """Stored positions = where a plain Counter, sorted by (-count, word) after the special tokens, puts each
    probe word."""
    for name in _names("vocab"):
        case = load_case(name)
        kw = case.const_kwargs
        counts = Counter(w for c in kw["captions"] for w in _tok(c))
        kept = sorted((w for w, n in counts.items() if n >= kw["min_count"]), key=lambda w: (-counts[w], w))
        words = ["<NULL>", "<START>", "<END>", "<UNK>", *kept]
        assert case.expected["size"] == len(words), name
        want = [words.index(w) if w in words else -1 for w in kw["probe"]]
        np.testing.assert_array_equal(case.expected["positions"], want, err_msg=name)


def test_encode_references_match_a_hand_written_encoder():
    for name in _names("encode"):
        case = load_case(name)
        kw = case.const_kwargs
        np.testing.assert_array_equal(case.expected["captions"],
                                      _encode_with()(kw["captions"], kw["word_to_idx"], kw["max_len"]), err_msg=name)
        assert case.expected["captions"].dtype == np.int64


def test_dataset_references_index_the_features_by_image():
    for name in _names("dataset"):
        case = load_case(name)
        feats, caps, idxs = (case.inputs[k] for k in ("features", "captions", "image_idxs"))
        np.testing.assert_array_equal(case.expected["item_features"], feats.astype(np.float16).astype(np.float32)[idxs])
        for i, row in enumerate(caps):
            n = list(row).index(2) + 1
            assert case.expected["item_lengths"][i] == n, name
            np.testing.assert_array_equal(case.expected["item_captions"][i, :n], row[:n])
            assert (case.expected["item_captions"][i, n:] == -1).all()


def test_collate_references_match_pad_sequence():
    for name in _names("collate"):
        case = load_case(name)
        caps, lengths = case.inputs["captions"], case.inputs["lengths"]
        items = [_t(caps[b, :lengths[b]]) for b in range(len(caps))]
        padded = nn.utils.rnn.pad_sequence(items, batch_first=True, padding_value=case.const_kwargs["null_idx"])
        np.testing.assert_array_equal(case.expected["captions"], padded.numpy())
        np.testing.assert_array_equal(case.expected["features"], case.inputs["features"])


def _schedule(s, total, warmup, peak):
    """The task's schedule written out: linear warm-up to `peak` over `warmup` steps, then a half cosine from
    `peak` down to peak / 10 at `total`, flat after it."""
    if warmup and s < warmup:
        return peak * min(1.0, (s + 1) / warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, total - warmup)))))


def test_schedule_references_match_the_schedule_written_out():
    for name in _names("schedule"):
        case = load_case(name)
        kw = case.const_kwargs
        want = [_schedule(s, kw["total_steps"], kw["warmup_steps"], kw["peak_lr"]) for s in case.inputs["steps"]]
        np.testing.assert_allclose(case.expected["lr"], want, rtol=1e-12, err_msg=name)


@pytest.mark.parametrize("name", _names("step"))
def test_train_step_references_match_a_hand_written_update(name):
    """Plain SGD / AdamW formulas, written out, with the gradient clipped by hand."""
    from starter.pipeline import _toy_loss
    case = load_case(name)
    kw = case.const_kwargs
    model = ToyCaptioner(**case.init).double()
    model.load_state_dict({k.removeprefix("model."): _t(v).double() for k, v in case.params.items()})
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    feats, caps = _t(case.inputs["features"]).double(), _t(case.inputs["captions"])
    losses = []
    for t, lr in enumerate(kw["lrs"], start=1):
        for p in params:
            p.grad = None
        loss = _toy_loss(model, feats, caps)
        loss.backward()
        losses.append(loss.item())
        grads = [p.grad for p in params]
        if kw["grad_clip"] is not None:
            norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
            grads = [g * min(1.0, kw["grad_clip"] / (float(norm) + 1e-6)) for g in grads]
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads)):
                if kw["optimizer"] in ("sgd", "sgd_two_groups"):  # every group gets lr
                    p -= lr * g
                else:  # AdamW: decoupled weight decay 0.01, betas (0.9, 0.999), eps 1e-8
                    p *= 1 - lr * 0.01
                    m[i] = 0.9 * m[i] + 0.1 * g
                    v[i] = 0.999 * v[i] + 0.001 * g * g
                    p -= lr * (m[i] / (1 - 0.9 ** t)) / ((v[i] / (1 - 0.999 ** t)).sqrt() + 1e-8)
    np.testing.assert_allclose(case.expected["losses"], losses, rtol=1e-5)
    flat = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    np.testing.assert_allclose(case.expected["parameters"], flat, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", _names("optimizer"))
def test_optimizer_references_match_adamw_written_out(name):
    """AdamW written out (decoupled weight decay on the parameters of 2 or more dimensions only, betas (0.9, 0.999),
    eps 1e-8), with the gradients the adapter draws, on the stored weights."""
    from starter.pipeline import ParameterKinds
    case = load_case(name)
    kw = case.const_kwargs
    model = ParameterKinds(**case.init)
    model.load_state_dict({k.removeprefix("model."): _t(v) for k, v in case.params.items()})
    params = [p.detach().clone().double() for p in model.parameters()]
    decay = [kw["weight_decay"] if p.dim() >= 2 else 0.0 for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    g = torch.Generator().manual_seed(kw["grad_seed"])
    for t in range(1, kw["steps"] + 1):
        for i, p in enumerate(params):
            grad = torch.randn(p.shape, generator=g, dtype=torch.float64).float().double()
            p *= 1 - kw["lr"] * decay[i]
            m[i] = 0.9 * m[i] + 0.1 * grad
            v[i] = 0.999 * v[i] + 0.001 * grad * grad
            p -= kw["lr"] * (m[i] / (1 - 0.9 ** t)) / ((v[i] / (1 - 0.999 ** t)).sqrt() + 1e-8)
    np.testing.assert_allclose(case.expected["groups"], [[d, kw["lr"], 1.0] for d in decay], rtol=1e-6)
    np.testing.assert_allclose(case.expected["parameters"], torch.cat([p.reshape(-1) for p in params]).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_evaluate_references_match_an_evaluation_written_here():
    """An evaluation written in this file (`_evaluate_with`: its own decoding of the indices, its own exact
    match, the given caption_scores) on the same stored captions and references."""
    from starter.pipeline import SCORE_NAMES, _Probe, _stored_decoder, _StoredSplit, _StoredWords
    for name in _names("evaluate"):
        case = load_case(name)
        kw = case.const_kwargs
        scores, _ = _evaluate_with()(_Probe(), _stored_decoder(_t(case.inputs["tokens"])),
                                     _StoredSplit(kw["references"]), _StoredWords(kw["idx_to_word"]),
                                     max_len=kw["max_len"], batch_size=kw["batch_size"])
        np.testing.assert_allclose(case.expected["scores"], [scores[k] for k in SCORE_NAMES], rtol=1e-6, err_msg=name)
        assert 0 < case.expected["scores"][-1] < 1, f"{name}: exact match should be a fraction strictly inside (0, 1)"


# ---- the pipeline tasks: look-alike bugs are named, correct alternatives keep full marks --------------------
import math
import re
from collections import Counter

from starter import pipeline as P

SPECIALS = ["<NULL>", "<START>", "<END>", "<UNK>"]


def _tok(s):
    return [w for w in re.split(r"[^a-z0-9]+", s.lower()) if w]


def _encode_with(cut_end=False, drop_unknown=False):
    def encode(captions, word_to_idx, max_len):
        rows = []
        for c in captions:
            ids = [word_to_idx[w] if w in word_to_idx else 3 for w in _tok(c) if w in word_to_idx or not drop_unknown]
            row = [1] + ids + [2] if cut_end else [1] + ids[: max_len - 2] + [2]
            rows.append((row + [0] * max_len)[:max_len])
        return np.array(rows, dtype=np.int64)  # NumPy is fine: the check converts it, keeping int64
    return encode


class _WholeFile(torch.utils.data.Dataset):
    """An alternative Dataset: reads the whole feature array when first used."""

    def __init__(self, path, key, captions, image_idxs, row_of=None, trim=True):
        self.path, self.key, self.captions, self.image_idxs = path, key, captions, image_idxs
        self.features, self.row_of, self.trim = None, row_of, trim

    def __len__(self):
        return len(self.captions)

    def __getitem__(self, i):
        if self.features is None:
            with h5py.File(self.path, "r") as f:
                self.features = torch.tensor(f[self.key][:], dtype=torch.float32)
        row = i if self.row_of == "caption" else self.image_idxs[i]
        cap = self.captions[i]
        keep = cap.tolist().index(2) + 1 if self.trim else len(cap)
        return self.features[row], cap[:keep]


def _step_with(zero=True, clip_first=True, set_lr=True):
    def step(model, loss_fn, optimizer, features, captions, lr, grad_clip=1.0):
        if set_lr:
            for g in optimizer.param_groups:
                g["lr"] = lr
        model.train()
        if zero:
            optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(model, features, captions)
        loss.backward()
        if grad_clip is not None and clip_first:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=grad_clip)
        optimizer.step()
        if grad_clip is not None and not clip_first:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=grad_clip)
        return float(loss.detach())
    return step


def _evaluate_with(eval_mode=True, all_refs=True, keep_end=False):
    from itertools import takewhile

    from starter.metrics import caption_scores

    def evaluate(model, decode_fn, split, vocab, max_len, batch_size=250):
        if eval_mode:
            model.eval()
        out = []
        with torch.inference_mode():
            for idx in torch.arange(split.num_images).split(batch_size):
                for row in decode_fn(model, split.features(idx.tolist()), max_len).tolist():
                    words = list(takewhile(lambda t: t != vocab.end_idx, row)) + ([2] if keep_end else [])
                    out.append(" ".join(vocab.idx_to_word[t] for t in words if t > 1 or (keep_end and t == 2)))
        refs = {i: split.references(i) if all_refs else split.references(i)[:1] for i in range(len(out))}
        scores = caption_scores(refs, out)
        scores["exact_match"] = float(np.mean([_tok(out[i]) in [_tok(r) for r in refs[i]] for i in refs]))
        return scores, out
    return evaluate


def _extract_alternative(cnn, images, size=224):
    """Correct, written differently: NumPy in, einops-style reshape out."""
    from torchvision.transforms import functional as TF
    if len(np.shape(images)) != 4 or np.shape(images)[3] != 3:
        raise ValueError(f"not a batch of RGB images: {np.shape(images)}")
    cnn.train(False)
    x = torch.from_numpy(np.ascontiguousarray(np.asarray(images).transpose(0, 3, 1, 2))).float().div(255)
    x = TF.normalize(TF.resize(x, [size, size], antialias=True), P.IMAGENET_MEAN, P.IMAGENET_STD)
    with torch.inference_mode():
        fmap = cnn(x)
    return fmap.permute(0, 2, 3, 1).reshape(fmap.shape[0], -1, fmap.shape[1]).clone()


def _extract_without_eval(cnn, images, size=224):
    cnn.train()  # a student who thinks "train mode" is the default for a pretrained net
    with torch.no_grad():
        x = torch.as_tensor(images).permute(0, 3, 1, 2).float() / 255
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
        x = (x - torch.tensor(P.IMAGENET_MEAN)[:, None, None]) / torch.tensor(P.IMAGENET_STD)[:, None, None]
        return cnn(x).flatten(2).transpose(1, 2)



def _validation_with(eval_mode=True, restore=True):
    def validation(model, loss_fn, batches):
        before = model.training
        if eval_mode:
            model.train(False)
        with torch.inference_mode():
            total = torch.stack([loss_fn(model, f, c) for f, c in batches]).mean()
        if restore:
            model.train(before)
        return total.item()
    return validation


def _fit_with(batches="fresh_epochs", val_at="end_of_every"):
    """A training loop written differently from the solution: epochs as an outer loop over the loader, the plan
    as an iterator. `batches`: "fresh_epochs" (correct), "cycle" (itertools.cycle: repeats the first epoch),
    "zip" (zip(plan, loader): one epoch only). `val_at`: "end_of_every" (correct) or "start_of_every"."""
    import itertools

    def fit(model, loss_fn, optimizer, loader, plan, config):
        history = {key: [] for key in ("step", "loss", "lr", "val_step", "val_loss")}
        step_fn, val_fn, val_batches, val_every, device = (config.step_fn, config.val_fn, config.val_batches,
                                                            config.val_every, config.device)
        steps = iter(plan)

        def epochs():
            if batches == "cycle":
                yield from itertools.cycle(loader)
            elif batches == "zip":
                yield from loader
            else:
                while True:
                    yield from loader

        for (step, lr), (features, captions) in zip(steps, epochs()):
            history["loss"].append(step_fn(model, loss_fn, optimizer, features.to(device), captions.to(device), lr))
            history["step"].append(step + 1)
            history["lr"].append(lr)
            if (step if val_at == "start_of_every" else step + 1) % val_every == 0:
                history["val_step"].append(step + 1)
                history["val_loss"].append(val_fn(model, loss_fn, val_batches))
        if history["val_step"][-1:] != history["step"][-1:]:
            history["val_step"].append(history["step"][-1])
            history["val_loss"].append(val_fn(model, loss_fn, val_batches))
        return history
    return fit


ALTERNATIVES = {  # correct, written differently from the solution: every case passes
    "features": P.with_cnn(_extract_alternative),
    "validation": P.with_batches(_validation_with()),
    "vocab": P.with_probe_words(lambda caps, min_count=1: SPECIALS + [w for w, n in sorted(
        Counter(w for c in caps for w in _tok(c)).items(), key=lambda kv: (-kv[1], kv[0])) if n >= min_count]),
    "encode": P.with_long_output(_encode_with()),
    "dataset": P.with_h5_file(_WholeFile),
    "collate": P.with_items(lambda batch, null_idx=0: (torch.stack([f for f, _ in batch]), nn.utils.rnn.pad_sequence(
        [c for _, c in batch], batch_first=True, padding_value=null_idx))),
    "schedule": P.over_steps(lambda s, total, warm, peak: peak * min(1.0, (s + 1) / warm) if s < warm else
                             0.1 * peak + 0.9 * peak * (1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, total - warm)))) / 2),
    "step": P.with_optimizer(_step_with()),
    "optimizer": P.with_param_groups(lambda model, lr, weight_decay: torch.optim.AdamW(
        [{"params": [p for _, p in model.named_parameters() if p.ndim < 2], "weight_decay": 0.0},
         {"params": [p for _, p in model.named_parameters() if p.ndim > 1], "weight_decay": weight_decay}], lr=lr)),
    "evaluate": P.with_split(_evaluate_with()),
    "fit": P.with_loader(_fit_with()),
}


@pytest.mark.parametrize("task", sorted(ALTERNATIVES))
def test_correct_alternatives_pass_every_case(task):
    for name in _names(task, bad_input=True):
        check(name, ALTERNATIVES[task])


PIPELINE_BUGS = [  # (case, look-alike buggy answer, words the one-line message must contain)
    ("validation/basic", P.with_batches(_validation_with(eval_mode=False)), "measured in eval mode"),
    ("validation/one_batch", P.with_batches(_validation_with(restore=False)), "the mode it came in"),
    ("features/basic", P.with_cnn(_extract_without_eval), "extracted in eval mode"),
    ("features/resize", P.with_cnn(lambda cnn, images, size=224: cnn.eval()(
        (F.interpolate(torch.as_tensor(images).permute(0, 3, 1, 2).float(), size=(size, size), mode="bilinear",
                       antialias=True) - torch.tensor(P.IMAGENET_MEAN)[:, None, None])
        / torch.tensor(P.IMAGENET_STD)[:, None, None]).flatten(2).transpose(1, 2).detach()), "divide the uint8"),
    ("vocab/ties", P.with_probe_words(lambda caps, min_count=1: SPECIALS + [w for w, n in Counter(
        w for c in caps for w in _tok(c)).most_common() if n >= min_count]), "break ties alphabetically"),
    ("vocab/punctuation_and_case", P.with_probe_words(lambda caps, min_count=1: SPECIALS + sorted(
        Counter(w for c in caps for w in c.lower().split()), key=lambda w: (-Counter(
            x for c in caps for x in c.lower().split())[w], w))), "punctuation"),
    ("vocab/min_count", P.with_probe_words(lambda caps, min_count=1: SPECIALS + sorted(
        (w for w, n in Counter(w for c in caps for w in _tok(c)).items() if n > min_count),
        key=lambda w: (-Counter(x for c in caps for x in _tok(c))[w], w))), "AT LEAST"),
    ("encode/too_long", P.with_long_output(_encode_with(cut_end=True)), "loses its <END>"),
    ("encode/unknown_words", P.with_long_output(_encode_with(drop_unknown=True)), "<UNK>"),
    ("dataset/full_length", P.with_h5_file(lambda *a: _WholeFile(*a, row_of="caption")), "image_idxs[i]"),
    ("dataset/basic", P.with_h5_file(lambda *a: _WholeFile(*a, trim=False)), "padding"),
    ("collate/other_null_idx", P.with_items(lambda batch, null_idx=0: (torch.stack([f for f, _ in batch]),
                                                                      nn.utils.rnn.pad_sequence([c for _, c in batch], batch_first=True))),
     "null_idx"),
    ("schedule/basic", P.over_steps(lambda s, total, warm, peak: peak * s / warm if s < warm else
                                    peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1, (s - warm) / (total - warm)))))),
     "starts at 0"),
    ("schedule/past_the_end", P.over_steps(lambda s, total, warm, peak: peak * (s + 1) / warm if s < warm else
                                           peak * (0.1 + 0.45 * (1 + math.cos(math.pi * (s - warm) / (total - warm))))),
     "rises again"),
    ("optimizer/basic", P.with_param_groups(lambda model, lr, weight_decay: torch.optim.Adam(
        [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
         {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}], lr=lr)), "use torch.optim.AdamW"),
    ("optimizer/strong_decay", P.with_param_groups(lambda model, lr, weight_decay: torch.optim.AdamW(
        model.parameters(), lr=lr, weight_decay=weight_decay)), "weight_decay 0.0"),
    ("optimizer/wider", P.with_param_groups(lambda model, lr, weight_decay: torch.optim.AdamW(
        [{"params": [m.weight for m in model.modules() if isinstance(m, nn.Linear)], "weight_decay": weight_decay},
         {"params": [p for n, p in model.named_parameters() if not (n.endswith("weight") and n not in
                                                                    ("norm.weight", "embed.weight"))],
          "weight_decay": 0.0}], lr=lr)), "embedding tables"),
    # the Transformer paper's Adam settings (betas=(0.9, 0.98), eps=1e-9): the text keeps AdamW's defaults
    ("optimizer/basic", P.with_param_groups(lambda model, lr, weight_decay: torch.optim.AdamW(
        [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
         {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98),
        eps=1e-9)), "keep AdamW's defaults for betas and eps"),
    ("optimizer/basic", P.with_param_groups(lambda model, lr, weight_decay: torch.optim.AdamW(
        [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
         {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}], lr=lr, betas=(0.8, 0.99))),
     "AdamW's other settings (betas, eps, amsgrad) at their defaults"),
    ("step/sgd", P.with_optimizer(_step_with(zero=False)), "accumulate"),
    ("step/sgd_clipped", P.with_optimizer(_step_with(clip_first=False)), "unclipped"),
    ("step/adamw", P.with_optimizer(_step_with(set_lr=False)), "`lr` is not used"),
    ("evaluate/basic", P.with_split(_evaluate_with(eval_mode=False)), "train mode"),
    ("evaluate/many_references", P.with_split(_evaluate_with(all_refs=False)), "one reference only"),
    ("evaluate/uneven_batches", P.with_split(_evaluate_with(keep_end=True)), "<END>"),
    ("fit/basic", P.with_loader(_fit_with(batches="cycle")), "a new pass over the loader"),
    ("fit/whole_epochs", P.with_loader(_fit_with(batches="zip")), "loader runs out"),
    ("fit/every_step", P.with_loader(_fit_with(batches="zip")), "loader runs out"),
    ("fit/basic", P.with_loader(_fit_with(val_at="start_of_every")), "(step + 1) % config.val_every"),
]


@pytest.mark.parametrize("name,answer,words", PIPELINE_BUGS, ids=[f"{b[0]}-{b[2]}" for b in PIPELINE_BUGS])
def test_pipeline_bugs_are_named(name, answer, words):
    with pytest.raises(CheckFailed) as info:
        check(name, answer)
    message = str(info.value)
    assert words in message and "\n" not in message, message


def test_feature_references_match_torchvisions_transforms():
    """torchvision's resize (antialiased bilinear) and normalize, then the stand-in CNN in eval mode."""
    from torchvision.transforms import functional as TF

    for name in _names("features"):
        case = load_case(name)
        size = case.const_kwargs["size"]
        x = TF.convert_image_dtype(_t(case.inputs["images"]).permute(0, 3, 1, 2), torch.float32)
        x = TF.normalize(TF.resize(x, [size, size], antialias=True), P.IMAGENET_MEAN, P.IMAGENET_STD)
        with torch.no_grad():
            fmap = P.TinyCNN().eval()(x)
        want = fmap.permute(0, 2, 3, 1).reshape(len(x), -1, fmap.shape[1])
        np.testing.assert_allclose(case.expected["features"], want.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)




def test_validation_references_match_a_hand_written_mean():
    """The mean of the batches' losses, measured in eval mode without gradients; the model back in the mode it
    was handed over in."""
    for name in _names("validation"):
        case = load_case(name)
        model = ToyCaptioner(**case.init).double()
        model.load_state_dict({k.removeprefix("model."): _t(v).double() for k, v in case.params.items()})
        feats, caps = _t(case.inputs["features"]).double(), _t(case.inputs["captions"])
        bounds = np.cumsum([0, *case.const_kwargs["sizes"]])
        model.eval()
        with torch.no_grad():
            losses = [P._toy_loss(model, feats[a:b], caps[a:b]).item() for a, b in zip(bounds[:-1], bounds[1:])]
        came_in = float(case.const_kwargs.get("handed_over_training", True))
        np.testing.assert_allclose(case.expected["loss_and_modes"], [np.mean(losses), 0.0, 0.0, came_in], rtol=1e-5,
                                   err_msg=name)
    assert any(not c.get("handed_over_training", True) for c in (load_case(n).const_kwargs for n in _names("validation")))


@pytest.mark.parametrize("name", _names("fit"))
def test_fit_references_match_a_hand_written_run(name):
    """The batch order worked out from the stand-in loader's rule (epoch e starts at batch e mod n), the
    stand-in step's rule (the loss, then every weight w -> 0.9 w + lr (mean of the features + mean of the
    captions / 100)), the stand-in validation's (the sum of the weights, plus the sums of the validation
    batch's features and captions / 100) and the validation steps from the task's rule."""
    from starter.pipeline import _toy_loss
    case = load_case(name)
    kw = case.const_kwargs
    model = ToyCaptioner(**case.init).double().eval()
    model.load_state_dict({k.removeprefix("model."): _t(v).double() for k, v in case.params.items()})
    params = list(model.parameters())
    feats, caps = _t(case.inputs["features"]).double(), _t(case.inputs["captions"])
    bounds = np.cumsum([0, *kw["sizes"]])
    n = len(kw["sizes"])
    val_f, val_c = feats[bounds[-1]:], caps[bounds[-1]:]
    losses, val_steps, val_losses = [], [], []
    start = kw.get("start", 0)  # a resumed run's part: the steps are counted from the run's start
    with torch.no_grad():
        for s, lr in enumerate(kw["lrs"]):
            b = (s % n + s // n) % n  # position s % n of epoch s // n, which starts at batch (s // n) % n
            f, c = feats[bounds[b]:bounds[b + 1]], caps[bounds[b]:bounds[b + 1]]
            losses.append(_toy_loss(model, f, c).item())
            for p in params:
                p.copy_(0.9 * p + lr * (f.mean() + c.double().mean() / 100))
            done = start + s + 1
            if done % kw["val_every"] == 0 or s + 1 == len(kw["lrs"]):
                val_losses.append(float(sum(p.sum() for p in params) + val_f.sum() + val_c.double().sum() / 100))
                val_steps.append(done)
    np.testing.assert_array_equal(case.expected["steps"], np.arange(start + 1, start + len(kw["lrs"]) + 1))
    np.testing.assert_allclose(case.expected["lrs"], kw["lrs"], rtol=1e-7)  # stored as float32
    np.testing.assert_allclose(case.expected["losses"], losses, rtol=1e-5, err_msg=name)
    np.testing.assert_array_equal(case.expected["val_steps"], val_steps)
    np.testing.assert_allclose(case.expected["val_losses"], val_losses, rtol=1e-5, err_msg=name)
    flat = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    np.testing.assert_allclose(case.expected["parameters"], flat, rtol=1e-4, atol=1e-6, err_msg=name)

# ---- the parts of the spec a case once did not reach: each bug written as an edit of the solution ----
# (grade_id, [(old, new)], words the message of a failing hidden case must contain)
SPEC_POINT_BUGS = {
    "the attention of the last layer only": ("CaptioningTransformer", [
        ('attention["self"].append(self_w)', 'attention["self"] = [self_w]'),
        ('attention["cross"].append(cross_w)', 'attention["cross"] = [cross_w]')], "self_attn_weights` has shape"),
    "greedy decoding from index 1": ("greedy_decode", [
        ("words = torch.full((B, 1), start_idx,", "words = torch.full((B, 1), 1,")], "not from start_idx"),
    "beam search from index 1": ("beam_search", [
        ("words = torch.full((1, 1), start_idx,", "words = torch.full((1, 1), 1,")], "not from start_idx"),
    "a beam that keeps beam_width candidates whatever finished": ("beam_search", [
        ("min(beam_width - len(finished),", "min(beam_width,")], "whatever finished before"),
    "the learning rate of the first parameter group only": ("train_step", [
        ('    for group in optimizer.param_groups:\n        group["lr"] = lr',
         '    optimizer.param_groups[0]["lr"] = lr')], "first parameter group only"),
    "<UNK> dropped with the special tokens": ("evaluate_captions", [
        ("if t not in (vocab.null_idx, vocab.start_idx)]",
         "if t not in (vocab.null_idx, vocab.start_idx, vocab.unk_idx)]")], "<UNK> is left out"),
    "the model left in train mode after validation": ("validation_loss", [
        ("model.train(was_training)", "model.train()")], "came in eval mode"),
    "features extracted with gradients on": ("extract_grid_features", [
        ("with torch.no_grad():", "if True:")], "torch.no_grad()"),
    "sampling at temperature 1 whatever the temperature": ("sample_decode", [
        ("[:, -1].float() / temperature, dim=-1)", "[:, -1].float(), dim=-1)")], "divide the logits"),
    "sampling that draws only for the captions still running": ("sample_decode", [
        ("        next_word = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(device)\n"
         "        next_word = next_word.masked_fill(finished, null_idx)\n",
         "        next_word = torch.full((B,), null_idx, dtype=torch.long, device=device)\n"
         "        next_word[~finished] = torch.multinomial(probs[~finished].cpu(), 1, generator=generator)[:, 0]"
         ".to(device)\n")], "finished ones too"),
}


def _answer(ns: dict, target: str):
    """The object a test cell checks, e.g. `with_model(greedy_decode)`, built from the namespace `ns`."""
    from grading.cases.captioning import PIPELINE_ADAPTERS
    from starter.layers import with_attention, with_bigram, with_sampler
    adapters = {**{a.__name__: a for a in PIPELINE_ADAPTERS.values()}, "with_model": with_model,
                "with_bigram": with_bigram, "with_sampler": with_sampler, "with_attention": with_attention}
    if "(" not in target:
        return ns[target]
    adapter, inner = target[:-1].split("(", 1)
    return adapters[adapter](ns[inner])


@pytest.mark.parametrize("bug", sorted(SPEC_POINT_BUGS))
def test_each_part_of_the_spec_is_seen_by_a_hidden_case(bug):
    grade_id, edits, words = SPEC_POINT_BUGS[bug]
    ns = _mutant(grade_id, edits)
    hidden = _hidden_case_names()
    failed = {}
    for name in _all_case_names():
        target = load_case(name).target
        if name.startswith("trained/") or grade_id not in target:
            continue
        try:
            check(name, _answer(ns, target))
        except CheckFailed as failure:
            failed[name] = str(failure)
    assert failed.keys() & hidden, f"{bug}: no hidden case fails, so no point is lost ({sorted(failed)} fail)"
    assert all(words in failed[n] and "\n" not in failed[n] for n in failed.keys() & hidden), failed


# ---- what decoding may produce: the text allows a decoder that never writes <NULL> or <START> --------------
# (grade_id, [(old, new)]): the solution edited to leave those two words out, as common practice does
NO_SPECIAL_WORDS = {
    "greedy decoding": ("07_generation_and_evaluation", "greedy_decode", [
        ("model(features, words)[:, -1].argmax(dim=-1)",
         "model(features, words)[:, -1].index_fill(-1, torch.tensor([null_idx, start_idx], device=device), "
         "float('-inf')).argmax(dim=-1)")]),
    "beam search, renormalised without them": ("08_decoding", "beam_search", [
        ("model(features[b:b + 1].expand(n, -1, -1), words)[:, -1], dim=-1)",
         "model(features[b:b + 1].expand(n, -1, -1), words)[:, -1].index_fill(-1, torch.tensor([null_idx, start_idx], "
         "device=device), float('-inf')), dim=-1)")]),
    "sampling": ("08_decoding", "sample_decode", [
        ("model(features, words)[:, -1].float() / temperature",
         "model(features, words)[:, -1].float().index_fill(-1, torch.tensor([null_idx, start_idx], device=device), "
         "float('-inf')) / temperature")]),
}


@pytest.mark.parametrize("reading", sorted(NO_SPECIAL_WORDS))
def test_a_decoder_that_never_writes_null_or_start_earns_full_marks(reading):
    """The text lets a decoder take whatever word ranks highest or leave <NULL> and <START> out: the stand-in
    models give those two no probability, so both readings earn every point of the test cell, scored by the
    judge on every public and hidden case."""
    from grading.judge import judge_cell
    from starter.compare import observe

    stem, grade_id, edits = NO_SPECIAL_WORDS[reading]
    ns = _mutant(grade_id, edits)
    assert ns[grade_id] is not nbs.captioning_solution()[grade_id], "the edit was not made"
    cell = next(c for c in nbs.test_cells(nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb"))
                if nbs.nbgrader_meta(c)["grade_id"] == f"test_{grade_id}")
    names = [m.group("case") for m in nbs.CHECK_CALL.finditer(cell.source)]
    assert set(names) & _hidden_case_names(), "the cell runs hidden cases"
    observations = {name: observe(load_case(name), _answer(ns, load_case(name).target)) for name in names}
    points = float(nbs.nbgrader_meta(cell)["points"])
    result = judge_cell(f"test_{grade_id}", cell.source, points, observations,
                        [nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES], nbs.public_case_names(), "did not run")
    assert result.points == points, [(c.case, c.message) for c in result.cases if not c.passed]
    assert all(c.passed for c in result.cases), [(c.case, c.message) for c in result.cases if not c.passed]


def test_the_decoding_stand_ins_give_null_and_start_no_probability():
    """What the text says of the checks' stand-in models: <NULL> and <START> have probability 0 after any prefix."""
    for name in _names("greedy") + _names("beam"):
        case = load_case(name)
        if "probabilities" in case.init:  # the worked example's bigram table: a probability of 1e-13 at most
            continue
        k = case.const_kwargs
        model, feats = _toy(case), _t(case.inputs["features"]).double()
        prefix = torch.randint(case.init["vocab_size"], (feats.shape[0], 5), generator=torch.Generator().manual_seed(0))
        probs = model(feats, prefix).softmax(-1)
        assert (probs[..., [k["null_idx"], k["start_idx"]]] == 0).all(), name


# Bugs that give the same captions as a known bug on some case, though their cause is another: what the check
# says of them must be true of them, so the decoding messages say what the captions are like and what to check
# ("the captions are those a beam search gives when ..."), never that a given line is wrong.
UNNAMED_LOOKALIKES = {
    "greedy decoding that reads a fixed position": ("greedy_decode", [
        ("model(features, words)[:, -1]", "model(features, words)[:, min(t, 1)]")]),
    "beam search that adds probabilities": ("beam_search", [
        ("candidates = (scores[:, None] + log_probs).flatten()",
         "candidates = (scores[:, None].exp() + log_probs.exp()).log().flatten()")]),
    "beam search that multiplies by the length penalty": ("beam_search", [
        ("top[j].item() / (step + 1) ** length_penalty", "top[j].item() * (step + 1) ** length_penalty")]),
}
OBSERVED = ("the captions are", "every caption repeats", "differs from the reference")


@pytest.mark.parametrize("bug", sorted(UNNAMED_LOOKALIKES))
def test_a_bug_that_looks_like_another_is_told_what_was_seen(bug):
    grade_id, edits = UNNAMED_LOOKALIKES[bug]
    ns = _mutant(grade_id, edits)
    hidden = _hidden_case_names()
    failed = {}
    for name in _all_case_names():
        target = load_case(name).target
        if grade_id in target and not name.startswith("trained/"):
            try:
                check(name, _answer(ns, target))
            except CheckFailed as failure:
                failed[name] = str(failure)
    assert failed.keys() & hidden, f"{bug}: no hidden case fails ({sorted(failed)} fail)"
    for message in failed.values():
        assert any(words in message for words in OBSERVED), f"{bug} is told a cause, not what was seen: {message}"


def test_decoding_messages_say_what_was_seen():
    """Every message of a decoding bug whose captions another mistake can give describes the captions."""
    from grading.cases.captioning.decoding import BEAM_BUGS, GREEDY_BUGS
    feed = ["start_only", "start_only_raw", "no_feedback", "last_token_only", "first_position", "start_ignored"]
    for message in [*BEAM_BUGS.values(), *(GREEDY_BUGS[k] for k in feed)]:
        assert any(words in message for words in OBSERVED[:2]), message
