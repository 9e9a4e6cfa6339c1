"""Every "section K" a notebook names exists, in the notebook it means.

When material moves between notebooks, the sentences that point at it are easy to miss ("COCO (notebook 05,
section 7)" outlived 05's seventh section). This reads every cell of every solution notebook (the student
copies are made from them), Markdown and code comments alike, and resolves each "section K" (or "sections
K, L and M"): to the notebook named last before it in the same sentence ("notebook 04, section 6", "notebook
05 printed in its section 2", "`reference_run/07_….md` (section 7)", whose sections are the notebook's), else
to the notebook it is written in. That notebook must have a heading `## K · …`.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from grading import notebooks

SECTION_REF = re.compile(r"\b[Ss]ections? (\d+)((?:, \d+)*(?:,? and \d+)?)")
NOTEBOOK_NAMED = re.compile(r"\bnotebook (0\d)\b|reference_run/(0\d)_|\b(0\d)_[a-z_]+\.ipynb")
SENTENCE_END = re.compile(r"[.!?](?:\s|$)|\n\s*\n|^#+ ", re.M)
HEADING = re.compile(r"^#{2} (\d+) · ", re.M)


def _stems() -> dict[str, Path]:
    return {p.name[:2]: p for p in notebooks.solution_notebooks()}


def _headings(path: Path) -> set[int]:
    return {int(m.group(1)) for cell in notebooks.read(path).cells if cell.cell_type == "markdown"
            for m in HEADING.finditer(cell.source)}


def references(text: str, here: str) -> list[tuple[str, int, str]]:
    """(notebook, section, the words around it) of each section `text` names; `here`: the notebook it is in."""
    found = []
    for m in SECTION_REF.finditer(text):
        start = max((e.end() for e in SENTENCE_END.finditer(text, 0, m.start())), default=0)
        named = [next(g for g in n.groups() if g) for n in NOTEBOOK_NAMED.finditer(text, start, m.start())]
        target = named[-1] if named else here
        context = text[max(0, m.start() - 60):m.end() + 20].replace("\n", " ")
        for number in re.findall(r"\d+", m.group(0)):
            found.append((target, int(number), context))
    return found


def test_references_resolve_as_a_reader_reads_them():
    """The resolver itself, on sentences of the kinds the notebooks use."""
    assert references("COCO (notebook 05, section 7) uses it.", "04") == [("05", 7, "COCO (notebook 05, section 7) uses it.")]
    assert [r[:2] for r in references("the floor notebook 05 printed in its section 2, and", "06")] == [("05", 2)]
    assert [r[:2] for r in references("see notebook 04. Then section 3 shows", "06")] == [("06", 3)]
    assert [r[:2] for r in references("so sections 4, 5 and 7 work unchanged", "07")] == [("07", 4), ("07", 5), ("07", 7)]
    assert [r[:2] for r in references("`reference_run/09_visualizing_attention.md` (section 9)", "08")] == [("09", 9)]
    assert references("no reference here", "01") == []


@pytest.mark.parametrize("stem", sorted(_stems()))
def test_every_section_a_notebook_names_exists(stem):
    stems = _stems()
    headings = {s: _headings(p) for s, p in stems.items()}
    wrong = []
    for index, cell in enumerate(notebooks.read(stems[stem]).cells):
        for target, number, context in references(cell.source, stem):
            if number not in headings.get(target, set()):
                wrong.append(f"cell {index}: section {number} of notebook {target}, which has sections "
                             f"{sorted(headings.get(target, set()))}: …{context}…")
    assert not wrong, "a sentence names a section that is not there:\n" + "\n".join(wrong)
