"""Notebook 09's attention explorer (starter/explorer.py): one self-contained HTML output that draws each word's
stored attention, in a real browser (Debian's Chromium through Playwright), with nothing asked of the network.

The browser tests read what the page drew: the explorer keeps the chosen map on a small canvas, one pixel per region,
whose opacity is the region's weight over the map's peak; each test recomputes that from the stored weights (the
mean of the heads with NumPy) and compares. The executed notebook's own page is tested in
tests/test_explorer_page.py, on the Colab walk's run.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from conftest import ROOT

from starter.explorer import MAX_ALPHA, MAX_BYTES, SCALE, AttentionExplorer, explorer_from_run, reference_explorer

SHIPPED = ROOT / "reference_run" / "09_visualizing_attention" / "explorer.json"


def _softmax(*shape, g, causal=False):
    scores = torch.randn(*shape, generator=g, dtype=torch.float64) * 2
    if causal:
        scores = scores.masked_fill(torch.ones(shape[-1], shape[-1], dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


def synthetic(batch=3, layers=2, heads=4, T=9, grid=(7, 7), seed=0, views=True) -> AttentionExplorer:
    """An explorer of a made-up run: random causal self-attention and cross-attention, drawn images."""
    g = torch.Generator().manual_seed(seed)
    R = grid[0] * grid[1]
    attn = {"self": [_softmax(batch, heads, T, T, g=g, causal=True) for _ in range(layers)],
            "cross": [_softmax(batch, heads, T, R, g=g) for _ in range(layers)]}
    words = [["a", "red", "circle", "above", "a", "blue", "square"], ["a", "cross"], ["a", "large", "green", "circle"]][:batch]
    images = [np.full((112, 112, 3), 40 * (b + 2), dtype=np.uint8) for b in range(batch)]
    extra = {"rollout": _softmax(batch, T, R, g=g) * 0.5} if views else None
    return explorer_from_run(words, attn, grid, images=images, views=extra, titles=[" ".join(w) for w in words])


def expected_alpha(ex: AttentionExplorer, caption: int, word: int, layer, head) -> np.ndarray:
    """The opacity of each region for the chosen map: round(MAX_ALPHA * weight / peak), from the stored weights."""
    c = ex.data["captions"][caption]
    if isinstance(layer, str):
        w = np.asarray(c["views"][layer][word]) / SCALE
    else:
        per_head = np.asarray(c["cross"][layer])[:, word] / SCALE          # (heads, R)
        w = per_head.mean(0) if head == "mean" else per_head[head]
    return np.rint(MAX_ALPHA * w / w.max())


# ---- the HTML itself -----------------------------------------------------------------------------------

def test_the_output_loads_nothing_from_elsewhere():
    page = synthetic().html()
    found = re.search(r"https?:|<[^>]*\s(?:src|href)\s*=|@import|url\(|fetch\(|XMLHttpRequest", page, re.I)
    assert found is None, f"a reference to another resource: {found and found.group(0)}"
    assert page.count("<script") == 2 and "data:image/png;base64," in page


def test_json_round_trip_keeps_every_weight(tmp_path):
    ex = synthetic()
    again = AttentionExplorer.from_json(ex.to_json(tmp_path / "e.json"))
    assert again.data == ex.data
    cross, self_attn = again.attention(0)
    n = len(ex.data["captions"][0]["tokens"]) - 1
    assert cross.shape == (2, 4, n, 49) and self_attn.shape == (2, 4, n, n)
    assert np.allclose(cross.sum(-1), 1, atol=49 / SCALE)  # stored to 4 decimals, rows still distributions


def test_bad_input_is_refused_with_the_reason():
    g = torch.Generator().manual_seed(1)
    attn = {"self": [_softmax(1, 2, 4, 4, g=g)], "cross": [_softmax(1, 2, 4, 10, g=g)]}
    with pytest.raises(ValueError, match="does not fit"):
        explorer_from_run([["a", "b"]], attn, (3, 3))
    with pytest.raises(ValueError, match="need 5 steps"):
        explorer_from_run([["a", "b", "c", "d"]], attn, (2, 5))
    with pytest.raises(ValueError, match="at least one caption"):
        AttentionExplorer([], (7, 7))
    ex = synthetic(views=False)
    with pytest.raises(ValueError, match="maps for 3 captions"):
        ex.add_view("v", [np.zeros((9, 49))])


def test_the_shipped_reference_run_is_small_and_has_no_views():
    """What a student whose model does not train explores: the reference run's attention, with no rollout of the
    course's (the notebook adds the student's own), within the stated size."""
    ex = reference_explorer(ROOT)
    assert SHIPPED.stat().st_size < MAX_BYTES and len(ex.html()) < MAX_BYTES
    assert len(ex) == 12 and ex.data["grid"] == [7, 7]
    assert ex.data["title"].startswith("the course's reference run"), ex.data["title"]  # not "your model"
    assert all(c["views"] == {} and c["image"].startswith("data:image/png") for c in ex.data["captions"])
    assert json.loads(SHIPPED.read_text())["version"] == 1


# ---- in the browser ------------------------------------------------------------------------------------

def open_offline(chromium, path, allowed=()):
    """The page at `path` in Chromium, every request but the file itself refused, and recorded unless it starts with
    one of `allowed` (what the page's template asks for, not the explorer); (page, requests, errors)."""
    page = chromium.new_page(viewport={"width": 1100, "height": 900})
    page.set_default_timeout(20_000)
    requests, errors = [], []

    def refuse(route):
        if route.request.url != path.as_uri() and not route.request.url.startswith("data:"):
            if not route.request.url.startswith(allowed):
                requests.append(route.request.url)
            return route.abort()
        return route.continue_()

    page.route("**/*", refuse)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a refused request of the template is reported on the console as a failed load, which is not the explorer's
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not allowed else None)
    page.goto(path.as_uri())
    return page, requests, errors


def drawn_alpha(root) -> np.ndarray:
    return np.asarray(root.evaluate("r => { const c = r.querySelector('.ae-cells'); "
                                    "return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)"
                                    ".filter((x, i) => i % 4 === 3); }"), dtype=float)


def explore(root, caption, word, layer, head):
    """Choose a caption, a word, a map and a head as a user does (select, clicks); return the drawn opacities."""
    root.locator(".ae-caption").select_option(str(caption))
    root.locator(".ae-token").nth(word + 1).click()
    root.locator(".ae-layers button", has_text=layer if isinstance(layer, str) else f"layer {layer}").click()
    if not isinstance(layer, str):
        root.locator(".ae-heads button", has_text="mean" if head == "mean" else f"head {head}").click()
    drawn = root.get_attribute("data-drawn").split("|")   # caption|map|head|word, set when the page has drawn
    assert drawn[0] == str(caption) and drawn[1] == str(layer) and drawn[3] == str(word), drawn
    assert isinstance(layer, str) or drawn[2] == str(head), drawn
    return drawn_alpha(root)


def check_explorer(root, ex: AttentionExplorer, choices) -> None:
    """For each (caption, word, layer or view, head), choose it in the explorer `root` (a Playwright locator) and check
    the drawn map against the stored weights, and the self-attention shading of the earlier words."""
    root.locator(".ae-ui").wait_for(state="visible")
    assert not root.locator(".ae-nojs").is_visible()
    before = None
    for caption, word, layer, head in choices:
        alpha = explore(root, caption, word, layer, head)
        want = expected_alpha(ex, caption, word, layer, head)
        assert np.abs(alpha - want).max() <= 1, (caption, word, layer, head, alpha, want)
        assert before is None or not np.array_equal(alpha, before), "a new choice left the picture as it was"
        before = alpha
        if not isinstance(layer, str):
            c = ex.data["captions"][caption]
            row = np.asarray(c["self"][layer])[:, word, : word + 1] / SCALE
            row = row.mean(0) if head == "mean" else row[head]
            shown = [float(root.locator(".ae-token").nth(j).get_attribute("data-weight")) for j in range(word + 1)]
            np.testing.assert_allclose(shown, row, atol=1e-4)


def check_explorer_page(chromium, path, ex: AttentionExplorer, choices, allowed=()) -> None:
    """Open `path` offline, check the first explorer on it (`check_explorer`): no error, no request."""
    page, requests, errors = open_offline(chromium, path, allowed)
    check_explorer(page.locator(".attention-explorer").first, ex, choices)
    assert not errors, errors
    assert not requests, f"the page asked the network for {requests}"


CHOICES = [(0, 2, 1, "mean"), (0, 2, 1, 2), (0, 4, 0, 2), (0, 4, "rollout", None), (2, 1, 1, 0), (1, 2, 0, "mean")]


def test_a_click_draws_that_words_stored_attention(chromium, tmp_path):
    ex = synthetic()
    check_explorer_page(chromium, ex.save(tmp_path / "explorer.html"), ex, CHOICES)


def test_two_explorers_on_one_page_stay_apart(chromium, tmp_path):
    """A notebook shows an explorer per run of the cell: each draws its own data."""
    first, second = synthetic(seed=1), synthetic(seed=2)
    path = tmp_path / "two.html"
    path.write_text(f"<!DOCTYPE html><html><body>{first.html()}{second.html()}</body></html>")
    page, requests, errors = open_offline(chromium, path)
    roots = page.locator(".attention-explorer")
    for k, ex in enumerate((first, second)):
        alpha = explore(roots.nth(k), 0, 3, 1, 1)
        assert np.abs(alpha - expected_alpha(ex, 0, 3, 1, 1)).max() <= 1
    assert not errors and not requests


def test_the_reference_explorer_in_the_browser(chromium, tmp_path):
    """The shipped reference run, as a student without a model sees it, with a view added the notebook's way."""
    ex = reference_explorer(ROOT)
    ex.add_view("rollout", [np.asarray(ex.attention(i)[0][-1].mean(0)) for i in range(len(ex))])
    check_explorer_page(chromium, ex.save(tmp_path / "reference.html"), ex,
                        [(0, 1, 1, "mean"), (0, 1, 0, 3), (3, 2, "rollout", None)])


def test_without_a_model_the_notebook_explores_the_reference_run_with_the_students_rollout(capsys):
    """Notebook 09's explorer cell where the student's model is not loaded: the reference run's attention, the line
    saying so, and the rollout view computed by the student's own function from the stored weights."""
    import os

    from grading import notebooks as nbs

    solution = nbs.read(nbs.SOLUTIONS / "09_visualizing_attention.ipynb")
    source = {nbs.nbgrader_meta(c).get("grade_id"): c.source for c in solution.cells}
    calls = []

    def students_rollout(self_layers, cross_layers, residual=0.5):
        calls.append((tuple(self_layers.shape), tuple(cross_layers.shape)))
        return cross_layers[-1].mean(1) * 0.5  # any (B, T, R) map: the view must be this function's output

    ns = {"RUN_MODEL": False, "os": os, "torch": torch, "rollout_to_regions": students_rollout}
    exec(compile(source["code_explorer"], "code_explorer", "exec"), ns)
    assert "shows the course's reference run" in capsys.readouterr().out
    ex, shipped = ns["explorer"], reference_explorer(ROOT)
    assert len(calls) == len(ex) == len(shipped) and all(len(s) == 5 and s[1] == 1 for s, _ in calls)
    for i in range(len(ex)):
        cross, _ = shipped.attention(i)
        want = np.rint(cross[-1].mean(0) * 0.5 * SCALE)
        np.testing.assert_allclose(ex.data["captions"][i]["views"]["rollout"], want, atol=1)
