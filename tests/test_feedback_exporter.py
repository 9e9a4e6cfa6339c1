"""The feedback pages' exporter makes the same page as nbconvert's HTMLExporter (with its maths and offline
edits), only faster."""
from __future__ import annotations

import base64

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbconvert.exporters import HTMLExporter

from grading.feedback import FeedbackHTMLExporter, self_contained

PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")).decode()


def _notebook():
    v4 = nbformat.v4
    return v4.new_notebook(cells=[
        v4.new_markdown_cell("# Title\n\nSome *text* with `code` and $x^2$.\n\n![an image](data:image/png;base64," + PNG + ")"),
        v4.new_code_cell("print('<img src=x>')", outputs=[v4.new_output("stream", name="stdout", text="<img src=x>\n")]),
        v4.new_code_cell("show()", outputs=[v4.new_output("display_data", data={"image/png": PNG, "text/plain": "fig"})]),
        v4.new_code_cell("1/0", outputs=[v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero",
                                                           traceback=["ZeroDivisionError: division by zero"])]),
    ], metadata={"language_info": {"name": "python", "pygments_lexer": "ipython3"}})


@pytest.mark.parametrize("template", ["lab", "classic"])
def test_the_page_is_the_same_as_nbconverts(template):
    nb = _notebook()
    ours_exporter = FeedbackHTMLExporter(template_name=template)
    theirs, _ = HTMLExporter(template_name=template, extra_loaders=ours_exporter.extra_loaders,
                             filters={"markdown2html": ours_exporter.markdown2html}).from_notebook_node(nb)
    theirs = self_contained(theirs)
    ours, _ = ours_exporter.from_notebook_node(nb)
    assert ours != theirs  # not the same text (no re-serialisation) ...
    parse = lambda page: str(BeautifulSoup(page, features="html.parser"))  # noqa: E731
    assert parse(ours) == parse(theirs)  # ... but the same document
    assert 'tabindex="0"' in ours or template == "classic"
    assert "No description has been provided for this image" in ours


def test_a_written_answer_is_shown_as_text_not_as_markup():
    """A written answer is the student's Markdown: HTML in it (a script, an SVG) must not reach the page an
    instructor or student opens; the words, and LaTeX, stay."""
    from grading.feedback import RedactHiddenTests

    answer = nbformat.v4.new_markdown_cell("The variance is $16$. <script>alert(1)</script><svg onload=alert(2)>")
    answer.metadata["nbgrader"] = {"grade": True, "solution": True, "grade_id": "q_scaling", "points": 2}
    answer["attachments"] = {"x.svg": {"image/svg+xml": "<svg onload=alert(3)>"}}
    nb = _notebook()
    nb.cells.append(answer)
    nb, _ = RedactHiddenTests().preprocess(nb, {})
    page, _ = FeedbackHTMLExporter(template_name="lab").from_notebook_node(nb)
    assert "<script>alert(1)" not in page and "<svg onload" not in page and "attachments" not in nb.cells[-1]
    assert "&lt;script&gt;alert(1)" in page and 'The variance is <math xmlns="http://www.w3.org/1998/Math/MathML" ' \
        'display="inline"><mrow><mn>16</mn></mrow></math>.' in page
