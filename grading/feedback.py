"""Feedback that shows grades, the student's own code and outputs and the judge's lines, and nothing
hidden: no hidden-test source, no hidden case name (the student's code ran next to the hidden test
cells and could have printed them), no tracebacks in test cells, and at most MAX_OUTPUT characters
of outputs per notebook; and nothing of the student's making that a browser would run: of an output only
its text and PNG/JPEG pictures (with whole-number sizes) are kept, whatever JSON the kernel sent; written
answers are shown as text, with links to the web only."""
from __future__ import annotations

import html
import re

import nbformat
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from starter.compare import case_names

from .notebooks import nbgrader_meta

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*", re.S | re.M)
HIDDEN_ANYWHERE = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.S)  # e.g. printed as JSON
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MAX_OUTPUT = 1_000_000  # characters of outputs per feedback page
# What a feedback page shows of an output: text, and pictures as base64 PNG or JPEG. Every other type (HTML,
# scripts, SVG, Markdown, Mermaid, widgets, ...) a browser would run or render as markup, in the page an
# instructor opens, and could carry text past the scrubbing (e.g. inside an SVG).
IMAGES = ("image/png", "image/jpeg")
NOT_SHOWN = "[rich output (HTML, script, SVG or other markup) not shown in feedback]"
BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
MAX_IMAGE_SIDE = 10_000  # pixels: the largest width or height a picture may be given


def redact_source(source: str) -> str:
    return HIDDEN.sub("# (hidden tests ran here)", source)


def short_error(output) -> str:
    """The last line of an error, without a traceback that could quote hidden test code."""
    text = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
    return ANSI.sub("", text).strip().splitlines()[0] if text.strip() else "Error"


def _text(value) -> str:
    """Text of an output field: a string, or nbformat's list of lines; anything else is no text."""
    if isinstance(value, str):
        return value
    return "".join(v for v in value if isinstance(v, str)) if isinstance(value, list) else ""


def _side(value) -> int | None:
    """An image's width or height as the page may use it: a whole number of pixels, else none. (The template
    writes it into an unquoted attribute: `1 onerror=alert(1)` would be script.)"""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_IMAGE_SIDE
    return value if ok else None


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def safe_output(output) -> dict:
    """An output as a feedback page may show it, rebuilt from what the student's kernel sent (any JSON: a
    kernel can forge its answers): one of nbformat's four output types with every field the template reads
    of the type it expects; only text and base64 PNG/JPEG data, and of the metadata only whole-number image
    sizes. Everything else is dropped (a note says a rich output was not shown)."""
    kind = output.get("output_type") if isinstance(output, dict) else None
    if kind == "stream":
        name = output.get("name")
        return {"output_type": "stream", "name": name if name in ("stdout", "stderr") else "stdout",
                "text": _text(output.get("text"))}
    if kind == "error":
        traceback = output.get("traceback")
        return {"output_type": "error", "ename": _text(output.get("ename")) or "Error",
                "evalue": _text(output.get("evalue")),
                "traceback": [_text(line) for line in traceback] if isinstance(traceback, list) else []}
    if kind not in ("display_data", "execute_result"):
        return {"output_type": "stream", "name": "stdout", "text": "[an output of no known type, not shown]\n"}
    data, metadata, shown, sizes = output.get("data"), output.get("metadata"), {}, {}
    data = data if isinstance(data, dict) else {}
    metadata = metadata if isinstance(metadata, dict) else {}
    if "text/plain" in data:
        shown["text/plain"] = _text(data["text/plain"])
    for mime in IMAGES:
        picture = _text(data.get(mime))
        if picture and BASE64.fullmatch(picture):
            shown[mime] = picture
            own = metadata.get(mime)
            own = own if isinstance(own, dict) else {}
            size = {key: _side(own.get(key, metadata.get(key))) for key in ("width", "height")}
            if any(v is not None for v in size.values()):
                sizes[mime] = {key: v for key, v in size.items() if v is not None}
    if not shown or set(data) - set(shown):
        shown.setdefault("text/plain", NOT_SHOWN)
    safe = {"output_type": kind, "data": shown, "metadata": sizes}
    if kind == "execute_result":
        safe["execution_count"] = _count(output.get("execution_count"))
    return safe


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
        meta = nbgrader_meta(cell)
        if cell.cell_type == "markdown" and meta.get("solution"):
            # a written answer is the student's Markdown, which may hold HTML (a script, an SVG): shown as
            # text (entities, which Markdown prints as the characters), its attachments dropped; its links
            # lose any scheme but the web's (FeedbackHTMLExporter)
            cell.source = html.escape(self._scrub(cell.source), quote=False)
            cell.pop("attachments", None)
        test_cell = cell.cell_type == "code" and meta.get("grade") and not meta.get("solution")
        if test_cell:
            cell.source = redact_source(cell.source)
        kept = []
        outputs = cell.get("outputs") if cell.cell_type == "code" else None
        for output in outputs if isinstance(outputs, list) else []:
            output = safe_output(output)
            if test_cell and output["output_type"] == "error":
                output["traceback"] = [short_error(output)]
            for key in ("text", "evalue"):
                if key in output:
                    output[key] = self._scrub(output[key])
            if "traceback" in output:
                output["traceback"] = [self._scrub(line) for line in output["traceback"]]
            data = output.get("data", {})
            if "text/plain" in data:
                data["text/plain"] = self._scrub(data["text/plain"])
            output = nbformat.from_dict(output)
            size = len(str(output))
            if size > self._budget:
                kept.append({"output_type": "stream", "name": "stdout", "text": "[output removed: too long]\n"})
                self._budget = 0
                break
            self._budget -= size
            kept.append(output)
        if cell.cell_type == "code":
            cell.outputs = kept
            cell.execution_count = _count(cell.get("execution_count"))  # written into the page as it is
        return cell, resources


# The page's links and picture sources (a written answer's Markdown makes them: `[x](javascript:...)`): the
# web's schemes, fragments, relative addresses and inline PNG/JPEG/GIF pictures only; any other scheme
# (`javascript:`, `data:text/html`, ...) would run when an instructor clicks, and becomes "#".
URL_ATTRIBUTE = re.compile(r"""(\s(?:href|src|xlink:href|action|formaction|srcset|poster|background)\s*=\s*)"""
                           r"""("[^"]*"|'[^']*')""", re.I)
SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*):")
WEB_SCHEMES = {"http", "https", "mailto"}
INLINE_PICTURE = re.compile(r"data:image/(?:png|jpeg|gif);base64,", re.I)


def safe_url(value: str) -> bool:
    """Whether an attribute's URL (as written in the page: entities not yet decoded) runs nothing."""
    url = re.sub(r"[\x00-\x20\x7f]", "", html.unescape(value))  # browsers drop tabs and newlines in a URL
    scheme = SCHEME.match(url)
    return scheme is None or scheme.group(1).lower() in WEB_SCHEMES or INLINE_PICTURE.match(url) is not None


def defuse_urls(page: str) -> str:
    return URL_ATTRIBUTE.sub(lambda m: m.group(0) if safe_url(m.group(2)[1:-1]) else f'{m.group(1)}"#"', page)


IMG_WITHOUT_ALT = re.compile(r"<img(?![^>]*\balt=)")
FOCUSABLE = re.compile(r'(<div class="[^"]*\b(?:jp-Cell-inputWrapper|jp-OutputArea-output)\b[^"]*")(?![^>]*tabindex)')


class FeedbackHTMLExporter(HTMLExporter):
    """nbconvert's HTML exporter without its BeautifulSoup pass, which took a third of a feedback
    page's time: the same two accessibility edits (alternative text on images, focusable input and
    output areas) are made on the template's own markup. Safe with regular expressions because no
    markup of the student's reaches the page (RedactHiddenTests keeps only text and pictures of the
    outputs; text is escaped). Links and picture sources that are not the web's are defused
    (`defuse_urls`). `c.GenerateFeedback.exporter_class` points here."""

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
        page, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        page = IMG_WITHOUT_ALT.sub('<img alt="No description has been provided for this image"', defuse_urls(page))
        return FOCUSABLE.sub(r'\1 tabindex="0"', page), resources
