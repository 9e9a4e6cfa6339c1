"""Feedback that shows grades, the student's own code and written answers and the judge's lines, and nothing
hidden: no hidden-test source, no hidden case name, no tracebacks in test cells; and nothing of the student's
making that a browser would run or fetch. What the page shows of the grading run is structural: code the
student's notebook ran next to the hidden tests (a test cell's caller can read the cell through its call
stack) and could have put them in any output, in any encoding, so no output of that run reaches the page: a
test cell shows the judge's lines, rebuilt from its record in the kit's words (`feedback_lines`), and every
other code cell its code only. Written answers are shown as text, with links to the web only and no picture
from elsewhere; maths becomes MathML in the page (`tex_to_mathml`); a Content-Security-Policy lets the page
load nothing (`PAGE_POLICY`): it renders offline and makes no request when opened."""
from __future__ import annotations

import builtins
import dataclasses
import html
import re
from collections.abc import Sequence
from html.parser import HTMLParser

import jinja2
import latex2mathml.converter
import nbformat
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbgrader.preprocessors import GetGrades, NbGraderPreprocessor
from traitlets import Unicode, default

from starter.compare import case_names

from .judge import NOT_MEASURED, NOT_RUN, CaseResult, CellResult, NotebookRecord, public_case_names
from .notebooks import HIDDEN_REFERENCES, nbgrader_meta

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*", re.S | re.M)
HIDDEN_ANYWHERE = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.S)  # e.g. pasted into an answer
GRADING_RUN_NOT_SHOWN = (
    "*This page shows your code and written answers, your scores, and under each test cell the grader's line for "
    "each case. What your cells printed while they were graded is not shown (they ran next to the hidden tests), "
    "nor the message of an error your code raised in a case: run your notebook to see them.*")


# The seam between the kit's apps and their steps: nbconvert's `resources`, the dict every step of a notebook's
# pipeline receives, which nbgrader's converters make per notebook (`init_single_notebook_resources`). The kit's
# apps (grading.worker.StudentAutograde, StudentFeedback) put the student's grading there under this key; a step
# run by nbgrader's own apps finds none.
GRADING = "grading"


def submission_cell(missing: Sequence[str], late: str) -> str:
    """The page's note of what the student did not hand in and how late (the kit's words, the assignment's names,
    times and the instructor's rule only)."""
    parts = []
    if missing:
        parts.append("**Not in your submission:**\n\n" + "\n".join(f"- {html.escape(m, quote=False)}" for m in missing))
    if late:
        parts.append(f"**Late work:** {html.escape(late, quote=False)}")
    return "\n\n".join(parts)


def redact_source(source: str) -> str:
    return HIDDEN.sub("# (hidden tests ran here)", source)


# A failed case's line on the page: the judge's message where the judge makes it of the kit's words and the case's
# own figures only, else the kind of failure (a closed list of the kit's phrases): the message may quote what the
# student's code produced (an exception's text, a dtype's name, a shape), and that code ran in a test cell whose
# source, hidden lines included, it could read.
KIT_WORDED = frozenset({"does not raise", "output missing", "transposed output", "wrong gradient",
                        "trained model below its mark",  # its figures: a share of scenes, the grader's measure
                        NOT_MEASURED})  # the grader's words about the file handed in, read outside the sandbox
KNOWN_BUG = "known bug: "
# how far and where the student's outputs differ, in a "wrong values" message: figures of their making, left out
DIFFERENCE = re.compile(r"differs from the reference at (?:\d+% of entries \(largest error [^ ()]+ at index "
                        r"\([\d, ]*\)\)|\d+ entries, first at index \([\d, ]*\))")
RAISES = re.compile(r"raises (\w+)")
BUILTIN_EXCEPTIONS = frozenset(name for name, value in vars(builtins).items()
                               if isinstance(value, type) and issubclass(value, BaseException))


def case_message(case: CaseResult) -> str:
    """What the page says of a failed case: the kit's words only (the instructor's records keep the full message)."""
    kind = case.diagnosis
    if kind in KIT_WORDED or kind.startswith(KNOWN_BUG):
        return case.message
    if kind == "wrong values":
        shown, found = DIFFERENCE.subn("differs from the reference", case.message)
        return shown if found == 1 else kind
    if kind == NOT_RUN:
        return "did not run (the notebook stopped before this test, or the test cell raised before checking)"
    raised = RAISES.fullmatch(kind)
    if raised and raised.group(1) not in BUILTIN_EXCEPTIONS:  # a class the student's code may have named
        return "raises an exception"
    return kind


def feedback_lines(cell: CellResult) -> list[str]:
    """A test cell's lines on the page: the judge's, each failure said in the kit's words (`case_message`)."""
    cases = [c if c.passed else dataclasses.replace(c, message=case_message(c)) for c in cell.cases]
    return dataclasses.replace(cell, cases=cases).lines()


JUDGE_LINE = re.compile(r"(?P<mark>[\u2713\u2717]) (?P<label>hidden case \d+|\S+)")


def lines_without_record(text: str) -> list[str]:
    """A test cell's lines from the judge's output alone (feedback made outside a grading run, which has no
    record): each case's mark and label, where the label is a hidden case's number or a public case's name."""
    public = public_case_names()
    lines = []
    for line in text.splitlines():
        m = JUDGE_LINE.match(line)
        if m and (m["label"].startswith("hidden case ") or m["label"] in public):
            lines.append(f"{m['mark']} {m['label']}" + (" passed" if m["mark"] == "\u2713" else ": failed"))
    return lines


def _stream(text: str):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


NOT_GRADED_YET = "not graded yet"  # a score the page shows for a cell nobody has graded (nbgrader's shows 0.0)


class GetGradesNotYet(GetGrades):
    """nbgrader's GetGrades, except that a cell with neither an automatic nor a person's score (a written answer
    before formgrader) gets NaN, which the page shows as NOT_GRADED_YET (FeedbackHTMLExporter): not a 0 it never
    got. The notebook's total is nbgrader's (the scores given so far)."""

    def _get_score(self, cell, resources):
        grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"], self.notebook_id, self.assignment_id,
                                          self.student_id)
        ungraded = grade.manual_score is None and grade.auto_score is None
        cell.metadata.nbgrader["score"] = float("nan") if ungraded else grade.score
        cell.metadata.nbgrader["points"] = grade.max_score


class RedactHiddenTests(NbGraderPreprocessor):
    """The page's cells: hidden-test source out of test cells, whose outputs become the judge's lines in the kit's
    words (from the judge's records of the student's notebooks, in the student's grading that
    grading.worker.StudentFeedback puts in `resources`; without them, as under nbgrader's own generate_feedback, a test
    cell shows each case's mark and label), no output of any other code cell, written answers as text, hidden case
    names out of them; and what the student did not hand in, and how late, at the top."""

    # the hidden cases' names are taken from here, so that nbgrader's own generate_feedback hides them too
    hidden_dir = Unicode(str(HIDDEN_REFERENCES), help="folder of the hidden reference files (for their case names)"
                         ).tag(config=True)
    def preprocess(self, nb, resources):
        names = sorted(case_names(self.hidden_dir), key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(n) for n in names)) if names else None
        notebook = (resources.get("nbgrader") or {}).get("notebook")
        # the student's grading (`grading.worker.JudgedStudent`), which the kit's feedback app puts in `resources`
        grading = resources.get(GRADING)
        judged: Sequence[NotebookRecord] = grading.judged if grading is not None else ()
        self._cells = {c.grade_id: c for r in judged if r.notebook == notebook for c in r.cells}
        nb, resources = super().preprocess(nb, resources)
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(GRADING_RUN_NOT_SHOWN))
        if grading is not None and (grading.missing_work or grading.late_line):
            nb.cells.insert(1, nbformat.v4.new_markdown_cell(submission_cell(grading.missing_work, grading.late_line)))
        return nb, resources

    def _scrub(self, text):
        if not isinstance(text, str):
            text = "".join(text) if isinstance(text, list) else str(text)
        text = HIDDEN_ANYWHERE.sub("(hidden tests)", text)
        return self._pattern.sub("(hidden)", text) if self._pattern else text

    def _judge_outputs(self, cell, grade_id) -> list:
        result = self._cells.get(grade_id)
        if result is not None:
            return [_stream("\n".join(feedback_lines(result)) + "\n"),
                    nbformat.v4.new_output("execute_result", data={"text/plain": repr(result.points)})]
        outputs = cell.get("outputs")
        text = "".join(o.get("text", "") for o in outputs if isinstance(o, dict) and isinstance(o.get("text"), str)
                       and o.get("output_type") == "stream") if isinstance(outputs, list) else ""
        lines = lines_without_record(text)
        return [_stream("\n".join(lines) + "\n")] if lines else []

    def preprocess_cell(self, cell, resources, cell_index):
        meta = nbgrader_meta(cell)
        if cell.cell_type == "markdown" and meta.get("solution"):
            # a written answer is the student's Markdown, which may hold HTML (a script, an SVG): shown as
            # text (entities, which Markdown prints as the characters), its attachments dropped; its links
            # lose any scheme but the web's and its pictures any source but the page (FeedbackHTMLExporter)
            cell.source = html.escape(self._scrub(cell.source), quote=False)
            cell.pop("attachments", None)
        if cell.cell_type == "code":
            test_cell = meta.get("grade") and not meta.get("solution")
            if test_cell:
                cell.source = redact_source(cell.source)
            # what the grading run printed came from code that could read the hidden tests: only the judge's
            # lines, made outside the sandbox, reach the page
            cell.outputs = self._judge_outputs(cell, meta.get("grade_id")) if test_cell else []
            cell.execution_count = None
        return cell, resources


# The page's links and picture sources (a written answer's Markdown makes them: `[x](javascript:...)`): links keep
# the web's schemes, fragments and relative addresses; any other scheme (`javascript:`, `data:text/html`, ...)
# would run when an instructor clicks, and becomes "#". What the browser fetches as the page opens (a picture's
# source, ...) is an inline PNG/JPEG/GIF picture or nothing: a picture from elsewhere is a beacon on the reader.
URL_ATTRIBUTE = re.compile(r"""(\s(?P<name>href|src|xlink:href|action|formaction|srcset|poster|background)\s*=\s*)"""
                           r"""("[^"]*"|'[^']*')""", re.I)
FETCHED = frozenset({"src", "srcset", "poster", "background"})
SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*):")
WEB_SCHEMES = {"http", "https", "mailto"}
INLINE_PICTURE = re.compile(r"data:image/(?:png|jpeg|gif);base64,", re.I)


def _url(value: str) -> str:
    return re.sub(r"[\x00-\x20\x7f]", "", html.unescape(value))  # browsers drop tabs and newlines in a URL


def safe_url(value: str) -> bool:
    """Whether a link's URL (as written in the page: entities not yet decoded) runs nothing."""
    url = _url(value)
    scheme = SCHEME.match(url)
    return scheme is None or scheme.group(1).lower() in WEB_SCHEMES or INLINE_PICTURE.match(url) is not None


def defuse_urls(page: str) -> str:
    def defused(m: re.Match) -> str:
        value = m.group(3)[1:-1]
        if m["name"].lower() in FETCHED:
            return m.group(0) if INLINE_PICTURE.match(_url(value)) else f'{m.group(1)}""'
        return m.group(0) if safe_url(value) else f'{m.group(1)}"#"'
    return URL_ATTRIBUTE.sub(defused, page)


# A feedback page loads nothing: no script (maths is MathML, which Chromium and Firefox render), no picture but
# its own inline ones, no font, frame or form target; its styles are its own <style> blocks.
PAGE_POLICY = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'")
POLICY_META = f'<meta http-equiv="Content-Security-Policy" content="{PAGE_POLICY}">'
SCRIPT = re.compile(r"<script\b.*?</script\s*>", re.S | re.I)  # the template's own (require.js, MathJax's settings)
STYLE = re.compile(r"<style\b.*?</style\s*>", re.S | re.I)
FONT_FACE = re.compile(r"@font-face\s*\{[^}]*\}")  # Bootstrap's icon font, a file beside the page it never has


def self_contained(page: str) -> str:
    """The page with the policy first in its head and without what the template's own markup would load (scripts
    from a CDN, fonts from files), which the policy would refuse with an error."""
    page = STYLE.sub(lambda m: FONT_FACE.sub("", m.group(0)), SCRIPT.sub("", page))
    return page.replace("<head>", f"<head>\n{POLICY_META}", 1)


# MathML as latex2mathml writes it, rebuilt from these elements and attributes only: it passes some TeX through
# unchecked (`\href` becomes an href, `\style` a style, `\text{<img ...>}` a tag), and none of these fetches.
MATHML_ELEMENTS = frozenset(
    "math mi mn mo ms mtext mspace mrow mfrac msqrt mroot mstyle merror mpadded mphantom menclose msub msup msubsup "
    "munder mover munderover mmultiscripts mprescripts none mtable mtr mtd semantics annotation".split())
MATHML_ATTRIBUTES = frozenset(
    "display mathvariant stretchy fence separator lspace rspace accent accentunder movablelimits largeop symmetric "
    "minsize maxsize form columnalign rowalign columnspacing rowspacing columnlines rowlines frame displaystyle "
    "scriptlevel linethickness notation width height depth voffset mathcolor mathbackground xmlns".split())


class _MathML(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.kept: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in MATHML_ELEMENTS:
            kept = "".join(f' {k}="{html.escape(v or "")}"' for k, v in attrs if k in MATHML_ATTRIBUTES)
            self.kept.append(f"<{tag}{kept}>")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag in MATHML_ELEMENTS:
            self.kept.append(f"</{tag}>")

    def handle_data(self, data):
        self.kept.append(html.escape(data, quote=False))


def tex_to_mathml(tex: str, display: bool) -> str:
    """TeX as MathML the browser renders itself, without a script or a CDN: the page reads offline. TeX that
    latex2mathml cannot read is shown as it was written."""
    try:
        written = latex2mathml.converter.convert(tex, display="block" if display else "inline")
    except Exception:  # latex2mathml's errors have no common class
        return f'<code class="tex">{html.escape(tex)}</code>'
    cleaner = _MathML()
    cleaner.feed(written)
    cleaner.close()
    return "".join(cleaner.kept)


class FeedbackMarkdown(IPythonRenderer):
    """nbconvert's Markdown renderer with maths as MathML and pictures from the page only: a picture from
    elsewhere becomes a line of text (fetching it would tell its host who opened the page, and when)."""

    def inline_math(self, body: str) -> str:
        return tex_to_mathml(html.unescape(body), display=False)  # a written answer reaches here escaped

    def block_math(self, body: str) -> str:
        return tex_to_mathml(html.unescape(body), display=True)

    def latex_environment(self, name: str, body: str) -> str:
        return tex_to_mathml(html.unescape(f"\\begin{{{name}}}{body}\\end{{{name}}}"), display=True)

    def image(self, text: str, url: str, title: str | None = None) -> str:
        url = self._embed_image_or_attachment(url)
        if INLINE_PICTURE.match(url):
            return super().image(text, url, title)
        alt = html.escape(html.unescape(re.sub(r"<[^>]*>", "", text))) or "a picture"
        return f'<span class="picture-not-shown">[{alt}: a picture from elsewhere, not loaded]</span>'


IMG_WITHOUT_ALT = re.compile(r"<img(?![^>]*\balt=)")
FOCUSABLE = re.compile(r'(<div class="[^"]*\b(?:jp-Cell-inputWrapper|jp-OutputArea-output)\b[^"]*")(?![^>]*tabindex)')
NO_MATHJAX = "{%- macro mathjax(url='') -%}{%- endmacro %}"  # replaces the templates' MathJax (from a CDN)


class FeedbackHTMLExporter(HTMLExporter):
    """nbconvert's HTML exporter made self-contained, and without its BeautifulSoup pass, which took a third of a
    feedback page's time: the same two accessibility edits (alternative text on images, focusable input and
    output areas) are made on the template's own markup. Safe with regular expressions because no markup of
    the student's reaches the page (RedactHiddenTests shows no output of the grading run; text is escaped).
    Maths is MathML (`FeedbackMarkdown`), links and picture sources that are not the web's are defused
    (`defuse_urls`), and the page loads nothing (`self_contained`). `c.GenerateFeedback.exporter_class` points
    here."""

    @default("extra_loaders")
    def _offline_templates(self):
        return [jinja2.DictLoader({"mathjax.html.j2": NO_MATHJAX})]

    @jinja2.pass_context
    def markdown2html(self, context, source):
        cell = context.get("cell", {})
        renderer = FeedbackMarkdown(escape=False, attachments=cell.get("attachments", {}), embed_images=False,
                                    anchor_link_text=self.anchor_link_text,
                                    exclude_anchor_links=self.exclude_anchor_links)
        return MarkdownWithMath(renderer=renderer).render(source)

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
        page = page.replace("Score: nan / ", f"Score: {NOT_GRADED_YET} / ")  # the template's `| float | round(2)` of NaN
        page = IMG_WITHOUT_ALT.sub('<img alt="No description has been provided for this image"', defuse_urls(page))
        return self_contained(FOCUSABLE.sub(r'\1 tabindex="0"', page)), resources
