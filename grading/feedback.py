"""Feedback that shows grades, the student's own code and outputs and the judge's lines, and nothing
hidden: no hidden-test source, no hidden case name (the student's code ran next to the hidden test
cells and could have printed them), no tracebacks in test cells, and at most MAX_OUTPUT characters
of outputs per notebook; and no markup of the student's (rich outputs dropped, written answers
shown as text)."""
from __future__ import annotations

import html
import re

from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from starter.checks import case_names

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*", re.S | re.M)
HIDDEN_ANYWHERE = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.S)  # e.g. printed as JSON
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MAX_OUTPUT = 1_000_000  # characters of outputs per feedback page
# output types a browser would run or render as markup: a student's script must not run in the page
# an instructor opens (and could carry text past the scrubbing, e.g. inside an SVG)
ACTIVE = ("text/html", "application/javascript", "image/svg+xml", "text/markdown")


def redact_source(source: str) -> str:
    return HIDDEN.sub("# (hidden tests ran here)", source)


def short_error(output) -> str:
    """The last line of an error, without a traceback that could quote hidden test code."""
    text = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
    return ANSI.sub("", text).strip().splitlines()[0] if text.strip() else "Error"


class RedactHiddenTests(NbGraderPreprocessor):
    """Hidden-test source out of test cells, hidden case names out of every output, outputs capped."""

    hidden_dir = Unicode("", help="folder of the hidden reference files (for their case names)").tag(config=True)

    def preprocess(self, nb, resources):
        names = sorted(case_names(self.hidden_dir), key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(n) for n in names)) if names else None
        self._budget = MAX_OUTPUT
        return super().preprocess(nb, resources)

    def _scrub(self, text):
        if not isinstance(text, str):
            text = "".join(text) if isinstance(text, list) else str(text)
        text = HIDDEN_ANYWHERE.sub("(hidden tests)", text)
        return self._pattern.sub("(hidden)", text) if self._pattern else text

    def preprocess_cell(self, cell, resources, cell_index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "markdown" and meta.get("solution"):
            # a written answer is the student's Markdown, which may hold HTML (a script, an SVG): shown as
            # text (entities, which Markdown prints as the characters), its attachments dropped
            cell.source = html.escape(self._scrub(cell.source), quote=False)
            cell.pop("attachments", None)
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            cell.source = redact_source(cell.source)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [short_error(output)]
        kept = []
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            for key in ("text", "evalue"):
                if key in output:
                    output[key] = self._scrub(output[key])
            if "traceback" in output:
                output["traceback"] = [self._scrub(line) for line in output["traceback"]]
            data = output.get("data", {})
            if any(mime in data for mime in ACTIVE):
                for mime in ACTIVE:
                    data.pop(mime, None)
                data.setdefault("text/plain", "[rich output (HTML, script or SVG) not shown in feedback]")
            for mime, value in list(data.items()):
                if mime.startswith("text/"):
                    data[mime] = self._scrub(value)
            size = len(str(output))
            if size > self._budget:
                kept.append({"output_type": "stream", "name": "stdout", "text": "[output removed: too long]\n"})
                self._budget = 0
                break
            self._budget -= size
            kept.append(output)
        if cell.cell_type == "code":
            cell.outputs = kept
        return cell, resources


IMG_WITHOUT_ALT = re.compile(r"<img(?![^>]*\balt=)")
FOCUSABLE = re.compile(r'(<div class="[^"]*\b(?:jp-Cell-inputWrapper|jp-OutputArea-output)\b[^"]*")(?![^>]*tabindex)')


class FeedbackHTMLExporter(HTMLExporter):
    """nbconvert's HTML exporter without its BeautifulSoup pass, which took a third of a feedback
    page's time: the same two accessibility edits (alternative text on images, focusable input and
    output areas) are made on the template's own markup. Safe with regular expressions because no
    markup of the student's reaches the page (RedactHiddenTests drops HTML and SVG outputs; text is
    escaped). `c.GenerateFeedback.exporter_class` points here."""

    def from_notebook_node(self, nb, resources=None, **kw):
        from nbconvert.filters.highlight import Highlight2HTML
        from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

        langinfo = nb.metadata.get("language_info", {})  # as HTMLExporter.from_notebook_node does
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        self.register_filter("highlight_code", self.filters.get(
            "highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self)))
        resources = self._init_resources(resources)
        self.register_filter("filter_data_type", WidgetsDataTypeFilter(
            notebook_metadata=self._nb_metadata, parent=self, resources=resources))
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        html = IMG_WITHOUT_ALT.sub('<img alt="No description has been provided for this image"', html)
        return FOCUSABLE.sub(r'\1 tabindex="0"', html), resources
