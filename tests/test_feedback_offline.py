"""A feedback page holds nothing of what the grading run printed and loads nothing when opened.

What the student's code printed while graded could hold the hidden tests (a function reads the test cell that
calls it through its call stack), in any encoding: the page shows no output of that run, only the judge's lines
in the kit's words. Opened in Chromium, the page makes no request (no picture from elsewhere, no MathJax from a
CDN) and still shows its maths (MathML). Fast: pages made from notebooks built here; the same attack graded
for real is in tests/test_hostile_files.py.
"""
from __future__ import annotations

import base64
import binascii
import os
from types import SimpleNamespace

import nbformat
import pytest

from grading.feedback import (
    GRADING,
    POLICY_META,
    FeedbackHTMLExporter,
    RedactHiddenTests,
    case_message,
    feedback_lines,
    tex_to_mathml,
)
from grading.judge import NOT_RUN, CaseResult, CellResult, NotebookRecord

HIDDEN_LINES = ('### BEGIN HIDDEN TESTS\ncheck("hidden-5f0c2a9e71d4b386", attention_loop)\n'
                'check("hidden-9be07d13c25a46f8", attention_loop)\n### END HIDDEN TESTS')
TEST_CELL = f'check("loop/basic", attention_loop)\n{HIDDEN_LINES}'  # as the kernel has it: what the function reads
ENCODINGS = {
    "plain": TEST_CELL,
    "base64": base64.b64encode(TEST_CELL.encode()).decode(),
    "base32": base64.b32encode(TEST_CELL.encode()).decode(),
    "hex": binascii.hexlify(TEST_CELL.encode()).decode(),
    "reversed": TEST_CELL[::-1],
}
CLASS_NAME = "Y2hlY2soImhpZGRlbi01ZjBj"  # an exception class named with the lines, base64 (an identifier)


def _cases() -> list[CaseResult]:
    return [
        CaseResult("loop/basic", "loop/basic", True, True, ""),
        CaseResult("loop/rectangular", "hidden case 1", False, False,
                   f"`attention_loop(...)` raised ValueError: {ENCODINGS['base64']}", "raises ValueError"),
        CaseResult("loop/float64", "hidden case 2", False, False,
                   f"`attention_loop(...)` raised {CLASS_NAME}: {ENCODINGS['hex']}", f"raises {CLASS_NAME}"),
        CaseResult("loop/a", "hidden case 3", False, False,
                   f"`attention_loop`: `out` has dtype {ENCODINGS['base32']}, expected float32.", "wrong dtype"),
        CaseResult("loop/b", "hidden case 4", False, False,
                   "`attention_loop`: `out` differs from the reference at 40% of entries (largest error 0.25 at "
                   "index (0, 3)). Did you scale by sqrt(d)?", "wrong values"),
        CaseResult("loop/c", "hidden case 5", False, False, "`attention_loop`: the scores are not scaled.",
                   "known bug: unscaled"),
        CaseResult("loop/d", "hidden case 6", False, False, f"did not run: {ENCODINGS['plain']}", NOT_RUN),
    ]


def test_a_failure_is_said_in_the_kits_words():
    lines = feedback_lines(CellResult("loop_test", 0.2, 1.0, _cases()))
    assert lines == [
        "\u2713 loop/basic passed (public example, not scored)",
        "\u2717 hidden case 1: raises ValueError",
        "\u2717 hidden case 2: raises an exception",  # the class's name is the student's
        "\u2717 hidden case 3: wrong dtype",
        "\u2717 hidden case 4: `attention_loop`: `out` differs from the reference. Did you scale by sqrt(d)?",
        "\u2717 hidden case 5: `attention_loop`: the scores are not scaled.",
        "\u2717 hidden case 6: " + case_message(_cases()[-1]),
    ]
    assert "did not run" in lines[-1] and "hidden-" not in lines[-1]


def _graded_notebook():
    """Notebook 01's shape after grading: the student's cell printed what its function read of the test cell that
    called it (plain, encoded, in an error and a picture's text), and the test cell holds the judge's lines."""
    v4 = nbformat.v4
    answer = v4.new_code_cell("def attention_loop(query, keys, values):\n    return stash(inspect.stack())")
    answer.metadata["nbgrader"] = {"grade": False, "solution": True, "grade_id": "attention_loop", "locked": False}
    answer.outputs = [v4.new_output("stream", name="stdout", text=f"{name}: {text}\n") for name, text in ENCODINGS.items()]
    printer = v4.new_code_cell("print(stashed)")
    printer.outputs = [
        v4.new_output("error", ename="RuntimeError", evalue=ENCODINGS["plain"], traceback=[ENCODINGS["base64"]]),
        v4.new_output("display_data", data={"text/plain": ENCODINGS["base32"]}),
        v4.new_output("execute_result", data={"text/plain": ENCODINGS["hex"]}, execution_count=3),
    ]
    test = v4.new_code_cell(TEST_CELL)
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "loop_test", "points": 1.0}
    test.outputs = [v4.new_output("stream", name="stdout", text="\n".join(CellResult("loop_test", 0.2, 1.0, _cases())
                                                                          .lines()) + "\n")]
    return v4.new_notebook(cells=[answer, printer, test], metadata={"language_info": {"name": "python"}})


def _page(nb, records: list[NotebookRecord] | None) -> str:
    grading = SimpleNamespace(judged=list(records or []), missing_work=[], late_line="")  # as StudentFeedback gives it
    nb, resources = RedactHiddenTests().preprocess(nb, {"nbgrader": {"notebook": "01_scaled_dot_product_attention"},
                                                        GRADING: grading})
    page, _ = FeedbackHTMLExporter(template_name="lab").from_notebook_node(nb, resources)
    return page


def _record() -> NotebookRecord:
    return NotebookRecord("s", "01_scaled_dot_product_attention", "finished", "", True, 1.0, [],
                          [CellResult("loop_test", 0.2, 1.0, _cases())])


@pytest.mark.parametrize("with_record", [True, False])
def test_no_output_of_the_grading_run_reaches_the_page(with_record):
    page = _page(_graded_notebook(), [_record()] if with_record else None)
    for line in HIDDEN_LINES.splitlines():
        assert line not in page and line.replace('"', "&quot;") not in page and line[::-1] not in page, line
    for name, text in ENCODINGS.items():
        assert text[len(text) // 2:len(text) // 2 + 24] not in page, name
    assert "hidden-" not in page and CLASS_NAME not in page
    # what the student needs: their code, each case's line, what the page leaves out and why
    assert "attention_loop" in page and "stash" in page and "loop/basic passed" in page
    assert "hidden case 1: " + ("raises ValueError" if with_record else "failed") in page
    assert "(hidden tests ran here)" in page and "not shown (they ran next to the hidden tests)" in page


def test_maths_becomes_mathml_without_anything_that_fetches_or_runs():
    assert tex_to_mathml(r"\frac{a}{b}", display=False).startswith('<math xmlns="http://www.w3.org/1998/Math/MathML"')
    for tex in (r"\href{http://tracker.example/x}{y}", r"\style{background:url(http://tracker.example/x)}{y}",
                r"\text{<img src=x onerror=alert(1)>}", r"\mathrm{<script>alert(1)</script>}"):
        mathml = tex_to_mathml(tex, display=True)
        assert "<math" in mathml and "http://tracker" not in mathml and "<img" not in mathml \
            and "<script" not in mathml and "style=" not in mathml, mathml
    assert tex_to_mathml(r"\frac{a", display=False).startswith("<")  # unreadable TeX: shown, not an error


REMOTE_PICTURE = "http://tracker.example/beacon.png"


def _nbgrader_exporter() -> FeedbackHTMLExporter:
    """The exporter as nbgrader's generate_feedback sets it up: its feedback template and Bootstrap's CSS."""
    import nbgrader

    formgrader = os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader")
    return FeedbackHTMLExporter(template_name="feedback", extra_template_basedirs=[os.path.join(formgrader, "templates")],
                                extra_template_paths=[os.path.join(formgrader, "static", "node_modules", "bootstrap",
                                                                   "dist", "css")])


def _page_with_pictures_and_maths() -> str:
    v4 = nbformat.v4
    given = v4.new_markdown_cell("# Attention\n[![Open In Colab](https://colab.example/badge.svg)](https://colab.example/)"
                                 "\n\n$$\\mathrm{softmax}\\left(\\frac{QK^\\top}{\\sqrt{d_k}}\\right)V$$")
    answer = v4.new_markdown_cell(f"The scale keeps $\\sqrt{{d_k}} < 2$. ![seen]({REMOTE_PICTURE}) "
                                  f'<img src="{REMOTE_PICTURE}?raw"> \\begin{{align}}x &= 1\\end{{align}}')
    answer.metadata["nbgrader"] = {"grade": True, "solution": True, "grade_id": "q_scaling", "points": 2, "score": 2}
    nb = v4.new_notebook(cells=[given, answer], metadata={"language_info": {"name": "python"}})
    resources = {"nbgrader": {"notebook": "01_scaled_dot_product_attention", "score": 2, "max_score": 2,
                              "late_penalty": 0}}
    nb, resources = RedactHiddenTests().preprocess(nb, resources)
    page, _ = _nbgrader_exporter().from_notebook_node(nb, resources)
    return page


@pytest.mark.parametrize("policy", ["with", "without"])
def test_a_feedback_page_makes_no_request_and_shows_its_maths(chromium, tmp_path, policy):
    """Opened in Chromium, the page asks for nothing but itself (the policy is a second wall: the page without it
    asks for nothing either), logs no error (nothing refused), and its maths is laid out as MathML."""
    page = _page_with_pictures_and_maths()
    assert POLICY_META in page
    path = tmp_path / "feedback.html"
    path.write_text(page if policy == "with" else page.replace(POLICY_META, ""))
    requests: list[str] = []
    errors: list[str] = []
    tab = chromium.new_page()
    tab.on("request", lambda r: requests.append(r.url))
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.goto(path.as_uri(), wait_until="load")
    tab.wait_for_timeout(300)
    assert requests == [path.as_uri()] and not errors, (requests, errors)
    assert tab.locator("math").count() == 3
    box = tab.locator("math[display=block]").first.bounding_box()
    assert box is not None and box["width"] > 0 and box["height"] > 0
    text = tab.locator("body").inner_text()
    assert "[seen: a picture from elsewhere, not loaded]" in text and "[Open In Colab: a picture" in text
    assert f'<img src="{REMOTE_PICTURE}?raw"' in text  # the answer's HTML, shown as text
