"""The graders' sheet of the written questions: for each one, in notebook order, its notebook, id and points, the
question as the students read it, and the model answer with its rubric, from the solution notebooks. A teaching
assistant grading written answers in formgrader reads it beside formgrader instead of opening `solutions/`.

    python -m grading rubric [DEST]     (default grading/work/rubric.html)

One self-contained HTML page (no script, nothing fetched; math as the notebooks write it, in TeX). It holds the
model answers: it is for graders, never for students (it is not part of `publish`'s student copy)."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

from nbconvert.filters import markdown2html_mistune

from . import notebooks

DEFAULT = notebooks.ROOT / "grading" / "work" / "rubric.html"
SOLUTION = re.compile(r"^\s*### BEGIN SOLUTION\s*\n(.*?)\n\s*### END SOLUTION\s*$", re.S)
STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}
section{border-top:1px solid #ccc;padding:.5rem 0 1rem}h2{font-size:1.1rem;margin:.6rem 0}
.q{background:#f5f7fa;padding:.2rem .8rem;border-left:4px solid #7a8ca3}.a{padding:.2rem .8rem;border-left:4px solid #3c8c4c}
.warn{background:#fff3cd;padding:.5rem .8rem}code{background:#eee;padding:0 .2em}"""


@dataclass(frozen=True)
class WrittenQuestion:
    notebook: str  # the notebook's stem
    grade_id: str  # as formgrader lists it
    points: float
    question: str  # Markdown: the cell before the answer cell, as the students read it
    answer: str  # Markdown: the model answer and its rubric (the solution cell's content)


def written_questions() -> list[WrittenQuestion]:
    """Every written question of the solution notebooks, in notebook order (as `notebooks.written_columns`)."""
    found = []
    for path in notebooks.solution_notebooks():
        cells = notebooks.read(path).cells
        for i, cell in enumerate(cells):
            if notebooks.is_written_answer(cell):
                meta = notebooks.nbgrader_meta(cell)
                match = SOLUTION.match(cell.source)
                question = cells[i - 1].source if i and cells[i - 1].cell_type == "markdown" else ""
                found.append(WrittenQuestion(path.stem, meta["grade_id"], float(meta.get("points", 0)), question,
                                             match.group(1).strip() if match else cell.source.strip()))
    return found


def page(questions: list[WrittenQuestion]) -> str:
    total = sum(q.points for q in questions)
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Written questions: the graders' "
             f"sheet</title><style>{STYLE}</style></head><body>",
             "<h1>Written questions: the graders' sheet</h1>",
             "<p class='warn'>It holds the model answers: for graders only, never for students.</p>",
             f"<p>{len(questions)} questions, {total:g} points, in the order formgrader lists them.</p>"]
    for q in questions:
        parts.append(f"<section id='{html.escape(q.grade_id)}'><h2>{html.escape(q.notebook)} · "
                     f"<code>{html.escape(q.grade_id)}</code> · {q.points:g} points</h2>"
                     f"<div class='q'>{markdown2html_mistune(q.question)}</div>"
                     f"<div class='a'>{markdown2html_mistune(q.answer)}</div></section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write(dest: Path = DEFAULT, questions: list[WrittenQuestion] | None = None) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(page(written_questions() if questions is None else questions), encoding="utf-8")
    return dest
