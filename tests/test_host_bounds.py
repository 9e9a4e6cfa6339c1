"""What a student wrote costs the grader's host bounded time and memory: intake refuses a notebook past a size
(its code, and what its feedback page highlights), and the review scan and the feedback pages run in a child
process within time and memory limits (grading.host_bounds); past them the notebook is still graded."""
from __future__ import annotations

import re
import resource
import time

import nbformat
import pytest
from conftest import filled_submission, write_nb
from traitlets.config import Config

from grading import notebooks as nbs
from grading import worker
from grading.feedback import FeedbackHTMLExporter
from grading.host_bounds import Bound, PastBound, each_bounded, run_bounded
from grading.intake import MAX_SHOWN_SOURCE, MAX_STUDENT_CODE, intake, oversized
from grading.submission import rebuild

NB, OTHER = "01_scaled_dot_product_attention", "02_positional_encoding"
LINE = "values = weights[index] * scale + offset  # a padding line\n"
FOUR_MB = LINE * (4 * 2**20 // len(LINE))  # the attack: one extra cell of 4 MB of code
SHORT = Bound(seconds=1, memory_mb=256)


def _rebuilt(stem: str, *extra_cells):
    nb = filled_submission(stem)
    nb.cells += extra_cells
    return rebuild(nb, nbs.read(nbs.RELEASE / f"{stem}.ipynb")).notebook


@pytest.mark.parametrize("stem", [p.stem for p in nbs.solution_notebooks()])
def test_honest_notebooks_are_far_under_the_size_limits(stem):
    nb = _rebuilt(stem)
    assert oversized(nb) is None
    assert sum(len(c.source) for c in nb.cells) * 8 < MAX_SHOWN_SOURCE


@pytest.mark.parametrize(("kind", "limit"), [("code", MAX_STUDENT_CODE), ("markdown", MAX_SHOWN_SOURCE)])
def test_intake_refuses_a_notebook_past_a_size_and_grades_the_others(tmp_path, kind, limit):
    """4 MB of code in an extra cell; a written answer (Markdown, which the feedback page renders) past its limit."""
    nb = filled_submission(NB)
    if kind == "code":
        nb.cells.append(nbformat.v4.new_code_cell(FOUR_MB))
    else:
        next(c for c in nb.cells if nbs.is_written_answer(c)).source = "x" * MAX_SHOWN_SOURCE
    write_nb(nb, tmp_path / "subs" / "alice" / f"{NB}.ipynb")
    write_nb(filled_submission(OTHER), tmp_path / "subs" / "alice" / f"{OTHER}.ipynb")
    [alice], _ = intake(tmp_path / "subs", tmp_path / "course")
    assert list(alice.notebooks) == [OTHER]
    [note] = [n for n in alice.notes if n.startswith(f"{NB}.ipynb: not graded: ")]
    size = re.search(r"not graded: ([\d,]+) characters of ", note)
    assert size and int(size.group(1).replace(",", "")) > limit and f"over the limit of {limit:,} " in note, note
    assert not (tmp_path / "course" / "submitted" / "alice" / nbs.ASSIGNMENT / f"{NB}.ipynb").exists()


def test_each_item_gets_its_own_time_and_the_next_goes_on():
    start = time.monotonic()
    found = each_bounded(lambda s: time.sleep(s) or s, [0, 60, 0], SHORT)
    assert found[0] == 0 and found[2] == 0 and isinstance(found[1], PastBound), found
    assert "still running after 1 s" in str(found[1])
    assert time.monotonic() - start < 10


def test_cpu_and_memory_past_the_bound_end_the_work_not_the_worker():
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(PastBound, match="MemoryError"):
        run_bounded(lambda: len(bytearray(4 * 2**30)), SHORT)
    with pytest.raises(PastBound):
        run_bounded(lambda: sum(range(10**12)), SHORT)
    with pytest.raises(PastBound, match="ValueError: invalid literal"):
        run_bounded(lambda: int("no"), SHORT)
    assert run_bounded(lambda: {"answer": [1, "two"]}, SHORT) == {"answer": [1, "two"]}
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 100 * 2**10  # KB: the 4 GB stayed in the child


@pytest.mark.parametrize("extra", [FOUR_MB, "out = !true\n" * 400], ids=["4 MB of code", "400 lines of !cmd"])
def test_a_notebook_too_large_for_the_scan_is_flagged_and_the_others_are_scanned(tmp_path, monkeypatch, extra):
    """Past intake's limits (as if it had let it in) or within them (IPython's transformer takes quadratic time on
    `!` lines: 400 of them, 5 KB, cost it 15 s): the scan of that notebook stops at its bound and says so."""
    monkeypatch.setattr(worker, "SCAN_BOUND", SHORT)
    folder = tmp_path / "submitted" / "s" / nbs.ASSIGNMENT
    write_nb(_rebuilt(NB, nbformat.v4.new_code_cell(extra)), folder / f"{NB}.ipynb")
    write_nb(_rebuilt(OTHER, nbformat.v4.new_code_cell("import builtins")), folder / f"{OTHER}.ipynb")
    start = time.monotonic()
    flags = worker.review_flags(tmp_path, "s", [])
    assert time.monotonic() - start < 10
    assert [f.split(":")[0] for f in flags] == [NB, OTHER], flags
    assert flags[0].startswith(f"{NB}: too large to scan: ") and "graded as usual" in flags[0]
    assert "imports builtins" in flags[1]


def slow_highlighting(api, grading, plain: bool) -> dict:
    """nbgrader's feedback as the worker calls it (`worker.generate_feedback`), taking a minute unless the code is
    plain text."""
    if not plain:
        time.sleep(60)
    return {"success": True, "log": ""}


def test_feedback_past_its_bound_is_made_again_with_plain_text_code(monkeypatch):
    monkeypatch.setattr(worker, "FEEDBACK_BOUND", SHORT)
    monkeypatch.setattr(worker, "generate_feedback", slow_highlighting)
    start = time.monotonic()
    notes = worker.feedback_pages(None, None)
    assert time.monotonic() - start < 10
    assert len(notes) == 1 and notes[0].startswith("the feedback pages show the code as plain text: "), notes


def test_plain_text_code_replaces_the_highlighting_in_the_feedback_exporter():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("def f(x):\n    return x < 1")])
    highlighted, _ = FeedbackHTMLExporter(template_name="lab").from_notebook_node(nb)
    config = Config()
    config.FeedbackHTMLExporter.filters = {"highlight_code": worker.plain_code}
    plain, _ = FeedbackHTMLExporter(config=config, template_name="lab").from_notebook_node(nb)
    assert '<span class="k">def</span>' in highlighted and '<span class="k">def</span>' not in plain
    assert "<pre>def f(x):\n    return x &lt; 1</pre>" in plain


def test_intake_reads_each_notebook_within_its_bound_and_grades_the_others(tmp_path, monkeypatch):
    """A notebook's JSON can be cheap to send and dear to read (21 MB of empty objects in its metadata, 20 KB
    zipped, took 400 s and 4 GB): intake reads it in a child within READ_BOUND. Past it (here 2 MB of metadata
    under a bound of 64 MB, which no such read fits in), that notebook is not graded, with the reason, and
    the student's others are."""
    from grading import intake as intake_module

    nb = filled_submission(NB)
    nb.metadata["junk"] = [{} for _ in range(2**20)]
    write_nb(nb, tmp_path / "subs" / "alice" / f"{NB}.ipynb")
    write_nb(filled_submission(OTHER), tmp_path / "subs" / "alice" / f"{OTHER}.ipynb")
    monkeypatch.setattr(intake_module, "READ_BOUND", Bound(seconds=30, memory_mb=64))
    [alice], _ = intake(tmp_path / "subs", tmp_path / "course")
    assert list(alice.notebooks) == [OTHER], alice.notes
    [note] = [n for n in alice.notes if n.startswith(f"{NB}.ipynb: not graded: ")]
    assert "reading it went past the grader's limit (30 s or 64 MB" in note, note
