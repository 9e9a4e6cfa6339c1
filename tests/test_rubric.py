"""The graders' sheet of the written questions (`python -m grading rubric`): every written question once, in
formgrader's order, with its points, the question as students read it and the model answer with its rubric, in
one page that fetches nothing."""
from __future__ import annotations

import re

from grading import notebooks as nbs
from grading import rubric


def test_every_written_question_with_its_question_and_rubric_in_order():
    questions = rubric.written_questions()
    assert [(q.notebook, q.grade_id, q.points) for q in questions] == nbs.written_columns()
    for q in questions:
        where = f"{q.notebook}:{q.grade_id}"
        assert re.search(r"\*\*Question \d+ \(\d+ points?\)\.\*\*", q.question), f"{where}: not its question: {q.question[:80]!r}"
        assert f"({q.points:g} point" in q.question, f"{where}: the question's points are not the cell's {q.points:g}"
        assert q.answer and "BEGIN SOLUTION" not in q.answer and "END SOLUTION" not in q.answer, where
        release = nbs.read(nbs.RELEASE / f"{q.notebook}.ipynb")
        assert any(c.source == q.question for c in release.cells), f"{where}: the students read another question"
        assert not any(q.answer in c.source for c in release.cells), f"{where}: the model answer is in the release"


def test_the_page_holds_each_section_and_fetches_nothing(tmp_path, capsys):
    from grading.__main__ import main

    dest = tmp_path / "sheet" / "rubric.html"
    assert main(["rubric", str(dest)]) == 0
    assert f"wrote {dest}: {len(nbs.written_columns())} written questions" in capsys.readouterr().out
    page = dest.read_text(encoding="utf-8")
    ids = re.findall(r"<section id='([^']+)'>", page)
    assert ids == [grade_id for _, grade_id, _ in nbs.written_columns()], ids
    assert "<strong>Rubric.</strong>" in page and "for graders only, never for students" in page
    assert not re.search(r"<script|\bsrc=|<link|@import|url\(", page), "the page loads something"
