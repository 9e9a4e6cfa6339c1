"""Every number the notebooks' Markdown (model answers included) and the README's prose state is true of the run
beside it, and every Markdown table renders.

A number stated in prose (a percentage, a decimal, a count with a unit: "39 s", "700 steps", "1 of 500") passes
when it is one of:

(a) a given constant of its notebook: a numeric literal of the notebook's own code cells (1e-3 is 0.001; a
    percentage p also as p/100);
(b) printed by the executed notebook (README: by any executed notebook), within the tolerance of rounding: a
    stated x with d decimals matches a printed y with e decimals when |x - y| <= 0.5 * 10^-d + 10^-e (the same
    rounding, give or take one in the printed last digit); a percentage also matches a printed fraction;
(c) a benchmark figure cited with its command: in the README, a sentence naming the command (`python ...`,
    `benchmarks/...`, `kit.py ...`); in a notebook (whose student copy ships without the benchmarks), a cell that
    says the figure was measured by the course's authors, and the figure appears in such a README sentence;
(d) grading metadata: "N point(s)", a table row of graded cells and their points, checked against the nbgrader
    metadata of the solution notebooks;
(e) on ALLOWED below: a definition or a fact, not a run result, each with its reason;
(f) a threshold of the notebook's own grading cases, public or hidden: a number among the arguments of a stored
    case's properties ("exact_match_at_least captions 0.55" backs "55 % right earn a point").

Not stated numbers, by rule: cross-references (notebook 05, question 4, section 4, tasks 1-2, layer names, a
notebook's title "06 · Training the captioner"),
heading and list numbering, numbers joined to a word (BLEU-4, GPT-2, float32, 7x7, d_k), file names and links,
inline code and code blocks (code, run by the notebooks' tests), years of cited papers ("Xiong et al., 2020").

Math: in $...$ and $$...$$ the integers of a formula (indices, exponents, sizes like 7 \\times 7) are its
symbols; a decimal, and a value after "=" or "\\approx" that is not a plain integer definition, is stated and
passes (a)-(e) or as the value of the arithmetic just before it (\\ln 16 \\approx 2.77, 4 \\cdot 4 = 16, 1/31).

The executed notebooks are those of `python -m grading execute` (`python3 kit.py run`) in build/executed/ when
their code is the solutions' code; else the Colab walk's (a session fixture other tests share) where this machine
simulates Colab; else the solution notebooks are executed here once (about two minutes).
"""
from __future__ import annotations

import io
import math
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import colab

from grading import execute
from grading import notebooks as nbs

sys.path.insert(0, str(nbs.ROOT / "benchmarks"))
from instructor_walk import MARKERS as WALK

ROOT = nbs.ROOT
README = ROOT / "README.md"
STEMS = [p.stem for p in nbs.solution_notebooks()]


@dataclass(frozen=True)
class Allowed:
    where: str  # a notebook stem, or "README"
    numbers: tuple[str, ...]  # as written
    phrase: str  # a fragment of their sentence
    reason: str


# The worked example of beam search in notebook 06 (the public case beam/worked_example): the toy model's
# next-word probabilities, and the sums of natural logs the text states (test_the_worked_example_adds_up).
WORKED_EXAMPLE = {"<START>": {"a": 0.6, "big": 0.4}, "a": {"<END>": 0.55, "cat": 0.45},
                  "big": {"dog": 0.9, "<END>": 0.1}, "dog": {"<END>": 0.6, "cat": 0.4}}
WORKED_SCORES = {"a": "−0.511", "big": "−0.916", "big dog": "−1.022", "a <END>": "−1.109", "a cat": "−1.309",
                 "big <END>": "−3.219", "big dog <END>": "−1.532", "big dog cat": "−1.938"}

# (e): definitions and facts, not results of a run, one entry per sentence. Keep it short: a number that a run
# could print belongs in what the run prints.
ALLOWED: list[Allowed] = [
    Allowed("01_scaled_dot_product_attention", ("0.45", "0.05"), "e.g. $a_{1,1}",
            "invented attention weights that illustrate the definition (they sum to 1), not a run"),
    Allowed("06_training", ("0.243", "0.250", "0.391", "1.312"), "reports BLEU-4",
            "figures quoted from the cited papers (Xu et al. 2015; Cornia et al. 2020), not this kit's run"),
    Allowed("07_generation_and_evaluation", ("10",), "it is scaled by 10",
            "CIDEr's definition (CIDEr-D is 10 times the mean TF-IDF cosine similarity), not a run"),
    Allowed("08_decoding", ("0.6", "0.4", "0.55", "0.45", "0.9", "0.1"), "A stand-in model whose next word",
            "the worked example's toy probabilities: a definition of the example (WORKED_EXAMPLE)"),
    *[Allowed("08_decoding", (score,), "", "a sum of natural logs of the worked example's toy probabilities, "
              "recomputed by test_the_worked_example_adds_up") for score in sorted(set(WORKED_SCORES.values()))],
    Allowed("09_visualizing_attention", ("0.9", "0.05"), "whether its attention is peaked",
            "invented maxima that say what peaked and spread-out weights look like, not a run"),
    Allowed("README", ("3.10", "3.11"), "Python 3.10+", "Python versions the kit supports and pins, not a run"),
    Allowed("README", ("16 000", "32 767"), "a cell longer than 16 000 characters",
            "grading/spreadsheet.py's MAX_TEXT (16_000) and a spreadsheet cell's limit (32 767): definitions"),
    Allowed("README", ("30",), "class of 30",
            "the size of tests/test_class_report.py's synthetic class (its BUGS counts): a fixture, not a run"),
]

# --- reading Markdown -----------------------------------------------------------------------------------------

NUMBER = re.compile(r"(?<![\w.\-−/#@^_'’\\])((?:[-−](?=\d))?(?:\d{1,3}(?:[,  ]\d{3})+(?![\d.])|\d+(?:\.\d+)?(?:e[-−]?\d+)?))"
                    r"(\s?%| M\b)?(?![\w]|\.\d|-\w)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$\n]+?)\$", re.S)
LINK_TARGET = re.compile(r"\]\([^)]*\)|<!--.*?-->|https?://\S+|<img[^>]*>", re.S)
REFERENCE = re.compile(r"(?:\bnotebooks?|\bquestions?|\bQ|\bsections?|§|\btasks?|\bparts?|\bcells?|\bcases?|\bimages?"
                       r"|\bcommit|\brows?|\bcolumns?|\bheads?|\blayers?)"
                       r"\s*(?:\d+\s*(?:[–,-]|and|or|to)\s*)*$", re.I)
CITATION_YEAR = re.compile(r"(?:et al\.,?|[A-Z][\w-]+,)\s*(?:[A-Z]{2,}\s+)?\(?$")
POINTS_AFTER = re.compile(r"^\s*(?:more\s+|written\s+)?points?\b")
SENTENCE_END = re.compile(r"(?<=[.;!?])\s+(?=[A-Z(*\"“])|\n\s*\n|\n(?=\s*(?:[-*] |\d+\. |\|))")
COMMAND = re.compile(r"`[^`]*(?:python3?\s|benchmarks/|kit\.py)[^`]*`")
AUTHORS_MEASURED = re.compile(r"measured by (?:a benchmark of )?the course's authors|benchmark of the course's authors",
                              re.I)
ARITH = re.compile(r"(?:\\(?:ln|log)\s*\{?(?P<log>\d+(?:\.\d+)?)\}?|\\sqrt\{(?P<sqrt>\d+(?:\.\d+)?)\}"
                   r"|(?P<a>\d+(?:\.\d+)?)\s*(?P<op>\\times|\\cdot|/|\^|\*)\s*\{?(?P<b>\d+(?:\.\d+)?)\}?)\s*(?:=|\\approx)\s*$")


@dataclass
class Stated:
    where: str
    cell: str
    number: str
    value: float
    percent: bool
    sentence: str
    math: bool
    start: int  # offset in the cleaned text, for the sentence it belongs to
    before: str
    after: str
    math_before: str = ""  # the math span up to the number


def _decimals(s: str) -> int:
    s = re.sub(r"[,  ]", "", s).replace("−", "-")
    mantissa, _, exponent = s.lower().partition("e")
    return (len(mantissa.split(".")[1]) if "." in mantissa else 0) - int(exponent or 0)


def _value(s: str) -> float:
    return float(re.sub(r"[,  ]", "", s).replace("−", "-"))


def _clean(text: str) -> str:
    """Code, link targets, comments and URLs turned into spaces (offsets kept); math kept."""
    text = LINK_TARGET.sub(lambda m: " " * len(m.group(0)), text)
    return CODE.sub(lambda m: "`" + " " * (len(m.group(0)) - 2) + "`" if len(m.group(0)) > 1 else m.group(0), text)


def _sentences(text: str) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for m in SENTENCE_END.finditer(text):
        bounds.append((start, m.start()))
        start = m.end()
    bounds.append((start, len(text)))
    return bounds


def _fragment(text: str, start: int, end: int, radius: int = 60) -> str:
    return re.sub(r"\s+", " ", text[max(0, start - radius):end + radius]).strip()


def stated_numbers(where: str, cell: str, source: str) -> list[Stated]:
    """The numbers `source` states, less those that are no claim by rule (see the module's docstring)."""
    raw = source
    text = _clean(source)
    maths = [(m.start(), m.end()) for m in MATH.finditer(text)]
    out = []
    sentences = _sentences(text)
    for m in NUMBER.finditer(text):
        s, e = m.span(1)
        number = m.group(1)
        line_start = text.rfind("\n", 0, s) + 1
        before_line = text[line_start:s]
        after = text[m.end(1):m.end(1) + 40]
        in_math = next(((a, b) for a, b in maths if a <= s < b), None)
        sentence = next((text[a:b] for a, b in sentences if a <= s < b), text)
        if re.fullmatch(r"\s*#+\s*", before_line) or re.fullmatch(r"\s*\d+\.\s", text[line_start:m.end(1) + 2]):
            continue  # heading or list numbering
        if re.fullmatch(r"\s*(?:[-*]\s+)?", before_line) and re.match(r"\.\s", after):
            continue
        if REFERENCE.search(text[max(line_start, s - 60):s]) or after.startswith(" · "):
            continue  # a cross-reference, or a notebook's title
        if 1900 <= _value(number) <= 2099 and "." not in number and CITATION_YEAR.search(text[max(0, s - 40):s]):
            continue
        if in_math:
            body_before = text[in_math[0]:s]
            if "." not in number and not re.search(r"(?:=|\\approx)\s*$", body_before):
                continue  # a formula's integer: an index, an exponent, a size
            if "." not in number and re.search(r"(?<![=<>])=\s*$", body_before) and not ARITH.search(body_before) \
                    and re.search(r"[A-Za-z}]\s*=\s*$", body_before):
                continue  # a definition: $h = 8$, $d_{model} = 512$ (a size, given by the text)
        unit = (m.group(2) or "").strip()
        value = _value(number) * (1e6 if unit == "M" else 1)
        out.append(Stated(where, cell, number + (" M" if unit == "M" else unit), value, unit == "%",
                          _fragment(raw, s, e) if sentence is None else re.sub(r"\s+", " ", sentence).strip(),
                          in_math is not None, s, text[max(0, s - 60):s], after,
                          text[in_math[0]:s].lstrip("$") if in_math else ""))
    return out


# --- what the run printed, what the code gives ---------------------------------------------------------------

PRINTED_NUMBER = re.compile(r"(?<![\w.])(\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?)(\s?%)?")


def printed_numbers(text: str) -> list[tuple[float, int, bool]]:
    """(value, decimals, is a percentage) of every number in printed text."""
    return [(_value(m.group(1).replace("e+", "e")), _decimals(m.group(1)), bool(m.group(2)))
            for m in PRINTED_NUMBER.finditer(text)]


def code_literals(nb) -> set[float]:
    values = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type == tokenize.NUMBER:
                    try:
                        values.add(float(eval(tok.string)))  # a literal: 1e-3, 0x10, 1_000
                    except (SyntaxError, ValueError, TypeError):
                        pass
        except (tokenize.TokenError, IndentationError, SyntaxError):
            pass
    return values


def file_literals(path: Path) -> set[float]:
    import nbformat
    return code_literals(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(path.read_text(encoding="utf-8"))]))


def _close(x: float, d: int, y: float, e: int) -> bool:
    """x, stated with d decimals, is y, printed with e: y rounded to d decimals, or (a decimal stated to the
    printed digits) one off in the last digit. An integer is exact."""
    if e < d:
        return False
    return abs(x - y) <= (10 ** -d if e == d and d > 0 else 0.5 * 10 ** -d if e > d else 0) + 1e-12


def _stated_decimals(stated: Stated) -> int:
    return _decimals(stated.number.rstrip("% M")) - (6 if stated.number.endswith(" M") else 0)


def printed_match(stated: Stated, printed: list[tuple[float, int, bool]]) -> bool:
    d = _stated_decimals(stated)
    for y, e, pct in printed:
        if _close(stated.value, d, y, e):
            return True
        if stated.percent and not pct and y <= 1 and _close(stated.value, d, 100 * y, max(e - 2, 0)):
            return True
        if not stated.percent and pct and stated.value <= 1 and _close(100 * stated.value, max(d - 2, 0), y, e):
            return True
    return False


def literal_match(stated: Stated, literals: set[float]) -> bool:
    v = stated.value
    return any(math.isclose(v, x, rel_tol=1e-9) or (stated.percent and math.isclose(v / 100, x, rel_tol=1e-9))
               for x in literals)


MATH_FUNCTIONS = {"ln": math.log, "log": math.log, "sin": math.sin, "cos": math.cos, "tan": math.tan,
                  "exp": math.exp, "sqrt": math.sqrt}
RELATION = re.compile(r"(?:=|\\approx|<|>|\\le|\\ge)")


def evaluate_tex(tex: str):
    """The value of a small LaTeX expression of numbers (a number, or a tuple of them), or None."""
    e = tex.replace("−", "-").replace("\\left", "").replace("\\right", "").replace("\\,", " ").replace("\\%", "")
    for _ in range(3):
        e = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", e)
        e = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", e)
    e = re.sub(r"\\(ln|log|sin|cos|tan|exp)\s*\{?(\d+(?:\.\d+)?)\}?", r"\1(\2)", e)
    e = e.replace("\\times", "*").replace("\\cdot", "*").replace("^", "**").replace("{", "(").replace("}", ")")
    if not e.strip() or re.search(r"[A-Za-z_\\]", re.sub(r"\b(?:ln|log|sin|cos|tan|exp|sqrt)\(", "(", e)):
        return None
    try:
        value = eval(e, {"__builtins__": {}}, MATH_FUNCTIONS)  # digits, operators and the functions above only
    except Exception:
        return None
    return value if isinstance(value, tuple) else (value,)


def arithmetic_match(stated: Stated) -> bool:
    """A value stated after = or \\approx in math, as the arithmetic just before it gives it to its rounding."""
    if not stated.math:
        return False
    before = re.sub(r"\((?:[^()]*,)?\s*$", "", stated.math_before)  # inside a tuple: (0.841, 0.540)
    relation = re.search(r"(?:=|\\approx)\s*$", before)
    if not relation:
        return False
    before = RELATION.split(before[:relation.start()])[-1]
    values = evaluate_tex(before)
    if not values:
        return False
    d = _stated_decimals(stated)
    want = stated.value / 100 if stated.percent else stated.value
    # one unit of the last stated digit: the operands before it are rounded too
    return any(isinstance(v, (int, float)) and abs(want - v) <= 10 ** -(d + 2 * stated.percent) + 1e-12
               for v in values)


def allowed(stated: Stated) -> Allowed | None:
    for a in ALLOWED:
        if a.where == stated.where and stated.number.replace("-", "−") in a.numbers and a.phrase in stated.sentence:
            return a
    return None


# --- grading metadata ---------------------------------------------------------------------------------------

def grading_numbers() -> set[float]:
    """Every points figure the nbgrader metadata gives: each graded cell's, each notebook's, automatic and
    written sums, the course's total."""
    cells = [(p.stem, nbs.nbgrader_meta(c)) for p in nbs.solution_notebooks() for c in nbs.read(p).cells]
    graded = [(stem, m) for stem, m in cells if m.get("grade")]
    values = {float(m.get("points", 0)) for _, m in graded}
    values |= {float(execute.notebook_points(p)) for p in nbs.solution_notebooks()}
    total = sum(m.get("points", 0) for _, m in graded)
    written = [m for _, m in graded if m.get("grade_id", "").startswith("q_") and m.get("points")]
    values |= {float(total), float(sum(m["points"] for m in written)), float(total - sum(m["points"] for m in written))}
    return values


def case_thresholds(stem: str) -> set[float]:
    """(f): the numbers among the property arguments of the notebook's stored cases, public and hidden."""
    import json

    import h5py

    from starter.compare import case_groups

    values = set()
    for folder in (nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES):
        path = folder / f"{stem}.h5"
        if not path.exists():
            continue
        with h5py.File(path, "r") as f:
            for _, group in case_groups(f):
                for prop in json.loads(str(group.attrs.get("properties", "[]"))):
                    for arg in prop[1:]:
                        try:
                            values.add(float(arg))
                        except (TypeError, ValueError):
                            pass
    return values


def points_match(stated: Stated, points: set[float]) -> bool:
    if stated.value in points and POINTS_AFTER.match(stated.after):
        return True
    # a table row "grade_id N" or "| NN | N |" of the README's points table
    return stated.where == "README" and stated.value in points and bool(
        re.search(r"(?:\b[a-z][a-z0-9_]+_?[a-z0-9]*\s|\|\s*)$", stated.before)) and "points" in stated.sentence


# --- executed notebooks -------------------------------------------------------------------------------------

def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


@pytest.fixture(scope="module")
def executed(request, tmp_path_factory) -> dict[str, object]:
    """stem -> the executed solution notebook (see the module's docstring for where it comes from)."""
    built = {}
    for path in nbs.solution_notebooks():
        copy = execute.BUILD / "executed" / path.name
        if copy.exists():
            nb = nbs.read(copy)
            if _code(nb) == _code(nbs.read(path)):
                built[path.stem] = nb
    if len(built) == len(STEMS):
        return built
    if colab.available():
        return dict(request.getfixturevalue("colab_walk")["executed"])
    out = tmp_path_factory.mktemp("executed")
    assert execute.execute_all(None, out, out / "figures", out / "index.md"), "a solution notebook failed"
    return {stem: nbs.read(out / f"{stem}.ipynb") for stem in STEMS}


# --- the checks ---------------------------------------------------------------------------------------------

def _cell_name(cell) -> str:
    return nbs.nbgrader_meta(cell).get("grade_id") or cell.get("id", "?")


# the README's first page and the documents it sends each reader to: their numbers are held to the README's rules
README_PAGES = [README] + [ROOT / "docs" / f"{reader}.md" for reader in ("students", "instructors", "maintainers")]


def readme_prose() -> str:
    """The README less its generated block of run figures (checked on its own), and the pages it sends students,
    instructors and maintainers to, less the instructors' generated walk (what a run printed)."""
    text = README.read_text(encoding="utf-8")
    start, end = text.find(execute.RUN_FIGURES[0]), text.find(execute.RUN_FIGURES[1])
    text = text[:start] + " " * (end + len(execute.RUN_FIGURES[1]) - start) + text[end + len(execute.RUN_FIGURES[1]):]
    for page in README_PAGES[1:]:
        doc = page.read_text(encoding="utf-8")
        start, end = doc.find(WALK[0]), doc.find(WALK[1])
        if 0 <= start < end:
            doc = doc[:start] + doc[end + len(WALK[1]):]
        text += "\n\n" + doc
    return text


def benchmark_sentences() -> list[str]:
    """The README's paragraphs (and list items) that name the command whose figures they quote."""
    text = _clean_keep_commands(readme_prose())
    blocks = re.split(r"\n\s*\n|\n(?=\s*[-*] )", text)
    return [block for block in blocks if COMMAND.search(block)]


def _clean_keep_commands(text: str) -> str:
    return LINK_TARGET.sub(lambda m: " " * len(m.group(0)), text)


def benchmark_numbers() -> list[tuple[float, int, bool]]:
    found = []
    for s in benchmark_sentences():
        found += printed_numbers(CODE.sub(" ", s))
    return found


def failures(executed) -> tuple[list[str], set[Allowed]]:
    problems, used = [], set()
    points = grading_numbers()
    bench = benchmark_numbers()
    runs = {stem: printed_numbers(execute.printed_text(nb)) for stem, nb in executed.items()}
    for path in nbs.solution_notebooks():
        nb = nbs.read(path)
        literals = code_literals(nb)
        thresholds = case_thresholds(path.stem)
        cites_benchmark = any(AUTHORS_MEASURED.search(c.source) for c in nb.cells if c.cell_type == "markdown")
        for cell in nb.cells:
            if cell.cell_type != "markdown":
                continue
            for st in stated_numbers(path.stem, _cell_name(cell), cell.source):
                if (literal_match(st, literals) or literal_match(st, thresholds) or printed_match(st, runs[path.stem])
                        or arithmetic_match(st)
                        or points_match(st, points) or (cites_benchmark and printed_match(st, bench))):
                    continue
                if (a := allowed(st)) is not None:
                    used.add(a)
                    continue
                problems.append(f"{st.where} {st.cell}: {st.number} in “{_short(st)}”")
    readme = readme_prose()
    cleaned = _clean_keep_commands(readme)
    blocks = [(m.start(), m.end()) for m in re.finditer(r"(?:[^\n]|\n(?!\s*\n|\s*[-*] ))+", readme)]
    every_run = [n for numbers in runs.values() for n in numbers]
    benchmarks_doc = printed_numbers((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"))
    for st in stated_numbers("README", "prose", readme):
        sentence = next(cleaned[a:b] for a, b in _sentences(cleaned) if a <= st.start < b)
        paragraph = next((readme[a:b] for a, b in blocks if a <= st.start < b), sentence)
        named = {ROOT / f for f in re.findall(r"\b((?:[\w-]+/)+[\w-]+\.py)\b", sentence) if (ROOT / f).exists()}
        if (COMMAND.search(_clean_keep_commands(paragraph))  # (c): a benchmark's figures, its command beside them
                or ("docs/benchmarks.md" in paragraph and printed_match(st, benchmarks_doc))  # (c): their record
                or any(literal_match(st, file_literals(f)) for f in named)  # (a): a constant of the file it names
                or printed_match(st, every_run) or arithmetic_match(st) or points_match(st, points)):
            continue
        if (allowed_entry := allowed(st)) is not None:
            used.add(allowed_entry)
            continue
        problems.append(f"README {_section(readme, st.start)}: {st.number} in “{_short(st)}”")
    return problems, used


def _section(text: str, offset: int) -> str:
    headings = re.findall(r"^#+ (.+)$", text[:offset], re.M)
    return f"§“{headings[-1].strip()}”" if headings else "§top"


def _short(st: Stated, radius: int = 70) -> str:
    s = st.sentence
    i = s.find(st.before[-15:] + st.number.rstrip("% ")) if st.before.strip() else -1
    i = i + len(st.before[-15:]) if i >= 0 else s.find(st.number)
    i = max(i, 0)
    a, b = max(0, i - radius), min(len(s), i + len(st.number) + radius)
    return ("…" if a else "") + s[a:b] + ("…" if b < len(s) else "")


@pytest.fixture(scope="module")
def checked(executed) -> tuple[list[str], set[Allowed]]:
    return failures(executed)


def test_every_stated_number_is_true_of_the_run(checked):
    problems, _ = checked
    assert not problems, (f"{len(problems)} numbers that neither the run, the code, a cited benchmark nor the "
                          "allow-list gives:\n" + "\n".join(problems))


def _still_written(entry: Allowed) -> bool:
    """Whether the sentence an allow-list entry is for is still there, with its numbers (an entry may go unused in
    a run whose printed numbers happen to give one of them, as a README number may match any notebook's print)."""
    if entry.where == "README":
        text = readme_prose()
    else:
        text = "\n".join(c.source for c in nbs.read(nbs.SOLUTIONS / f"{entry.where}.ipynb").cells
                         if c.cell_type == "markdown")
    return entry.phrase in text and all(n in text for n in entry.numbers)


def test_the_allow_list_is_short_and_used(checked):
    _, used = checked
    assert len(ALLOWED) <= 16, "the allow-list is for definitions and facts: move run results into what the run prints"
    unused = [f"{a.where}: {a.numbers} ({a.phrase!r})" for a in ALLOWED if a not in used and not _still_written(a)]
    assert not unused, "allow-list entries that match nothing any more:\n" + "\n".join(unused)
    assert all(a.reason for a in ALLOWED)


def test_the_readme_run_figures_are_those_of_the_executed_notebooks(executed):
    """Each row's key numbers in the README's generated block are what that notebook printed, with its labels: those
    of the trained model within what another machine's run may differ by (`execute.TRAINED_NUMBERS_VARY`, which the
    block states), the others exactly."""
    text = README.read_text(encoding="utf-8")
    block = text[text.index(execute.RUN_FIGURES[0]):text.index(execute.RUN_FIGURES[1])]
    assert f"within {execute.trained_numbers_vary()}" in " ".join(block.split()), \
        "the README's run figures do not say how much another machine's trained figures may differ: run python3 kit.py run"
    problems = []
    for line in block.splitlines():
        if not line.startswith("| `"):
            continue
        stem = line.split("|")[1].strip().strip("`")
        shown = line.split("|")[5].strip()
        numbers = execute.key_numbers(execute.printed_text(executed[stem]))
        problems += [f"README run figures {stem}: {p}" for p in execute.figures_disagree(shown, numbers)]
    assert not problems, "\n".join(problems)


def test_a_row_of_several_decoders_names_them():
    """Notebook 06 prints greedy's scores, then beam search's: its row of run figures once gave greedy's BLEU-4
    unlabelled, in a notebook about beam search."""
    text = ("first 100 validation images\n"
            "greedy      ( 0.14 s decoding,   13 calls of the model): BLEU-1 0.991  BLEU-4 0.972  CIDEr 7.542\n"
            "beam, k = 3 ( 3.20 s decoding, 1189 calls of the model): BLEU-1 1.000  BLEU-4 0.996  CIDEr 7.715\n")
    assert execute.format_numbers(execute.key_numbers(text)) == \
        "greedy BLEU-4 0.972, CIDEr 7.542; beam (k = 3) BLEU-4 0.996 (100 val images)"


# --- tables ---------------------------------------------------------------------------------------------------

def _cells_of(row: str) -> list[str]:
    row = CODE.sub(lambda m: m.group(0).replace("|", "¦"), row.strip())
    row = re.sub(r"\\\|", "¦", row)
    parts = row.split("|")
    if parts and parts[0].strip() == "":
        parts = parts[1:]
    if parts and parts[-1].strip() == "":
        parts = parts[:-1]
    return parts


def table_problems(where: str, cell: str, source: str) -> list[str]:
    lines = CODE.sub(lambda m: m.group(0) if "\n" not in m.group(0) else "\n" * m.group(0).count("\n"),
                     source).split("\n")
    problems = []
    i = 0
    while i < len(lines) - 1:
        header, rule = lines[i], lines[i + 1]
        if header.lstrip().startswith("|") and re.fullmatch(r"\s*\|?(\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*\|?\s*", rule):
            width = len(_cells_of(header))
            if len(_cells_of(rule)) != width:
                problems.append(f"{where} {cell}: table “{header.strip()[:60]}”: its rule line has "
                                f"{len(_cells_of(rule))} cells, its header {width}")
            j = i + 2
            while j < len(lines) and lines[j].strip():
                row = lines[j]
                n = len(_cells_of(row))
                if not row.lstrip().startswith("|"):
                    problems.append(f"{where} {cell}: table “{header.strip()[:60]}”: a paragraph line joins the "
                                    f"table as a row (leave a blank line after it): “{row.strip()[:80]}”")
                elif header.rstrip().endswith("|") and not row.rstrip().endswith("|"):
                    problems.append(f"{where} {cell}: table “{header.strip()[:60]}”: text after the last cell of "
                                    f"row “{row.strip()[:100]}” (a paragraph on the row's line)")
                elif n != width:
                    problems.append(f"{where} {cell}: table “{header.strip()[:60]}”: row “{row.strip()[:80]}” has "
                                    f"{n} cells, the header {width}")
                j += 1
            i = j
        else:
            i += 1
    return problems


def test_every_markdown_table_renders():
    problems = []
    for path in nbs.solution_notebooks():
        for cell in nbs.read(path).cells:
            if cell.cell_type == "markdown":
                problems += table_problems(path.stem, _cell_name(cell), cell.source)
    for page in README_PAGES:
        problems += table_problems(page.name, "", page.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_the_table_check_catches_a_paragraph_on_the_last_row():
    """Notebook 03's pre/post-norm table once lost its 0.003 row to a paragraph begun on that row's line."""
    broken = ("| lr | pre | post |\n|---|---:|---:|\n| 0.001 | 0.10 | 0.26 |\n| 0.003 | 0.52 | 2.07 | Two consequences: "
              "the output is not normalised.\n\nNext.")
    (problem,) = table_problems("03", "md_13", broken)
    assert "0.003" in problem and "Two consequences" in problem
    assert table_problems("03", "md_13", broken.replace("| Two", "|\n\nTwo")) == []
    assert table_problems("x", "y", "| a | b |\n|---|---|\n| 1 |\n") != []
    assert table_problems("x", "y", "| a | b |\n|---|---|\n| 1 | 2 |\nmore text\n") != []


def test_the_number_check_catches_the_known_contradictions():
    """Notebook 05 once said 700 steps take about 15 s on a 2-core CPU while its run printed 39 s."""
    run = printed_numbers("training on cpu (CPU, 2 threads): 700 steps in 39 s\n")
    (fifteen,) = [s for s in stated_numbers("05", "md_step_2", "A small model trains 700 steps in about 15 s on a "
                                            "2-core CPU.") if s.number == "15"]
    assert not printed_match(fifteen, run)
    (thirty_nine,) = [s for s in stated_numbers("05", "md_step_2", "It trains 700 steps in 39 s here.")
                      if s.number == "39"]
    assert printed_match(thirty_nine, run)
    (ln,) = stated_numbers("03", "md", r"guessing scores $\ln 10 \approx 2.30$")
    assert arithmetic_match(ln) and ln.number == "2.30"
    (wrong,) = stated_numbers("03", "md", r"guessing scores $\ln 10 \approx 2.40$")
    assert not arithmetic_match(wrong)
    assert [s.number for s in stated_numbers("x", "y", "BLEU-4 of notebook 05, question 4, (Xiong et al., 2020), "
                                                       "`x = 15`, $a_{t,i}$")] == []


def test_a_hidden_threshold_is_backed_by_its_case_alone():
    """Notebook 07 states its hidden cases' thresholds; a run may or may not print the same figures, so they pass
    by the stored cases' properties, and a threshold no case asks for does not."""
    sentence = "While grading, the same is asked: 40 %, 55 % and 45 % right earn a point each."
    stated = {s.number.rstrip("% "): s for s in stated_numbers("07_generation_and_evaluation", "md", sentence)}
    thresholds = case_thresholds("07_generation_and_evaluation")
    assert literal_match(stated["40"], thresholds) and literal_match(stated["55"], thresholds)
    assert not literal_match(stated["45"], thresholds)


def test_the_worked_example_adds_up():
    """The scores notebook 08's worked example states are the sums of natural logs of its toy probabilities."""
    (cell,) = [c for c in nbs.read(nbs.SOLUTIONS / "08_decoding.ipynb").cells
               if c.cell_type == "markdown" and "A stand-in model whose next word" in c.source]
    for words, stated in WORKED_SCORES.items():
        previous, total = "<START>", 0.0
        for word in words.split():
            total += math.log(WORKED_EXAMPLE[previous][word])
            previous = word
        assert f"{total:.3f}".replace("-", "−") == stated, (words, total, stated)
        assert stated in cell.source, f"08_decoding: the worked example no longer states {words} {stated}"
    for before, following in WORKED_EXAMPLE.items():
        for word, p in following.items():
            assert re.search(rf"{re.escape(word)}\W*\s+{p:g}\b", cell.source.replace("`", "")), (before, word, p)
