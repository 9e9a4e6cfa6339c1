"""Notebook 09's explorer in the executed notebook's HTML page, as `kit.py run` writes it, on the Colab walk's run
(the student's own trained model): it opens in Chromium with the network refused, a click on a word draws that
word's stored attention for the chosen layer, head or the student's rollout, and the page stays within its size."""
from __future__ import annotations

from conftest import SOLUTION_STEMS
from test_explorer import check_explorer_page

from grading import execute, reference_run
from starter.explorer import MAX_BYTES, AttentionExplorer

STEM = "09_visualizing_attention"
PAGE_BYTES = 6_000_000  # notebook 09's executed page, its fourteen figures and the explorer (docs/students.md)
# what nbconvert's page template itself asks for (its scripts, MathJax) and the notebook's Colab badge: refused here,
# and the explorer draws all the same
TEMPLATE_HOSTS = ("https://cdnjs.cloudflare.com/", "https://colab.research.google.com/assets/")


def test_the_executed_page_explores_offline(colab_walk, chromium, tmp_path):
    assert STEM in SOLUTION_STEMS
    nb = colab_walk["executed"][STEM]
    (cell,) = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "code_explorer"]
    assert any("shows your model" in o.get("text", "") for o in cell.outputs), "not the student's own model"
    data = reference_run.explorer_data(cell, keep_views=True)
    assert data is not None, "no explorer in the cell's output"
    ex = AttentionExplorer(data["captions"], tuple(data["grid"]), data["title"])
    assert all("rollout" in c["views"] for c in data["captions"]), "the student's rollout is not in the explorer"
    page = execute.write_html(nb, tmp_path / f"{STEM}.html", tmp_path)
    assert len(ex.html()) < MAX_BYTES and page.stat().st_size < PAGE_BYTES, page.stat().st_size
    last = data["layers"] - 1
    check_explorer_page(chromium, page, ex, [(0, 2, last, "mean"), (0, 2, last, 1), (0, 2, 0, 1), (5, 3, "rollout", None),
                                              (11, 1, 0, "mean")], allowed=TEMPLATE_HOSTS)
