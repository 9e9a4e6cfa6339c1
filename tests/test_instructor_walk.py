"""docs/instructors.md's term, step by step, is what `benchmarks/instructor_walk.py --docs` ran and printed: each
command shown is one the grading command takes as it stands (a renamed option would leave the page telling
instructors to type something that fails), the walk covers the term in its order, and the block is the script's."""
from __future__ import annotations

import shlex
import sys

from grading import notebooks as nbs
from grading.__main__ import command_line

sys.path.insert(0, str(nbs.ROOT / "benchmarks"))
import instructor_walk

DOC = nbs.ROOT / "docs" / "instructors.md"


def _walk() -> str:
    text = DOC.read_text(encoding="utf-8")
    start, end = text.find(instructor_walk.MARKERS[0]), text.find(instructor_walk.MARKERS[1])
    assert 0 <= start < end, f"{DOC} has no term walk: run python benchmarks/instructor_walk.py --docs"
    return text[start:end]


def test_each_command_of_the_walk_is_one_the_grader_takes_in_the_terms_order():
    shown = [line.strip()[2:] for line in _walk().splitlines() if line.strip().startswith("$ python -m grading ")]
    ran = [f"python -m grading {shlex.join(argv)}" for _, commands in instructor_walk.STEPS for argv in commands]
    assert [shlex.split(c) for c in shown] == [shlex.split(c) for c in ran], "the walk is stale: run the script"
    parser = command_line()
    for command in shown:
        parser.parse_args(shlex.split(command)[3:])  # exits (SystemExit) on an option the command no longer has
    order = [shlex.split(c)[3] for c in shown]
    assert order == ["publish", "autograde", "rubric", "report", "report", "export", "autograde"], order
    assert "--student" in shown[-1], "the walk ends with a re-grade of one student"


def test_each_step_of_the_script_is_on_the_page():
    walk = _walk()
    for text, _ in instructor_walk.STEPS:
        assert text in walk, f"a step of the script is not on the page: {text[:60]}"
