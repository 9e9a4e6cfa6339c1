"""No message a student can read writes out a graded answer.

What the checks say is read by students: each stored case's hint and its known bugs' messages (the public cases'
in the notebooks, the hidden cases' on the feedback pages), and every string of the copy's `starter/` package (the
messages of the checks and loaders). Each is compared with every answer (the code between `### BEGIN SOLUTION`
and `### END SOLUTION`, as `tests/test_student_copy.py` reads it), token by token: identifiers, numbers and
operators, both kinds of quote as one. A message gives an answer away when it holds a large share of the answer's
runs of 4 tokens: at least CONTAINED of them and at least SHARED in number (a short answer's few runs are shared
by chance, by any sentence that names the same call).

Measured (the old messages are in tests/fixtures/student_copy/old_messages.json): the old giveaways hold 0.426 of
make_optimizer's runs (29 of them: the AdamW call with its two groups spelled out), 0.600 of causal_mask's (12:
`torch.ones(T, T, dtype=torch.bool).tril()`) and 0.375 of teacher_forcing_loss's (12: the whole call). Of the
messages the kit keeps, the closest are the positional encoding's buffer rule (0.438 of PositionalEncoding.__init__,
7 runs: `self.register_buffer("pe", table, persistent=False)`, which the task's text requires word for word),
a no-transpose message against merge_heads (0.294, 5 runs) and the clipping message against train_step (0.214, 15
runs: `clip_grad_norm_(model.parameters(), grad_clip)`, the text's own call). CONTAINED = 0.35 with SHARED = 8 sits
between them.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import h5py
import pytest
from test_student_copy import answer_functions

from grading import notebooks as nbs
from starter.cases import case_groups, read_case

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "student_copy"
TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d+)?|==|!=|>=|<=|\*\*|//|->|[^\s\w]")
N = 4
CONTAINED = 0.35
SHARED = 8
MIN_STRING = 30  # characters: shorter strings of starter/ are names and formats, not sentences


def runs(text: str) -> set[tuple[str, ...]]:
    tokens = TOKEN.findall(text.replace('"', "'"))
    return {tuple(tokens[i:i + N]) for i in range(len(tokens) - N + 1)}


@pytest.fixture(scope="module")
def answer_runs() -> dict[str, set]:
    return {name: runs("\n".join(ast.unparse(s) for s in fn.body)) for name, fn in answer_functions().items()}


def stored_messages() -> dict[str, str]:
    """{"<case>:hint" or "<case>:<bug>": message} of every stored case, public and hidden."""
    found = {}
    for folder in (nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES):
        for path in sorted(Path(folder).glob("*.h5")):
            with h5py.File(path, "r") as f:
                for name, group in case_groups(f):
                    case = read_case(group, name)
                    found[f"{name}:hint"] = case.hint
                    found.update({f"{name}:{bug}": message for bug, (message, _) in case.variants.items()})
    return found


def starter_strings() -> dict[str, str]:
    """{"starter/<module>.py:<line>": string} of every string constant of the copy's starter package."""
    found = {}
    for path in sorted((nbs.ROOT / "starter").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) >= MIN_STRING:
                found[f"starter/{path.name}:{node.lineno}"] = node.value
    return found


def giveaways(messages: dict[str, str], answer_runs: dict[str, set]) -> list[str]:
    out = []
    for where, message in messages.items():
        said = runs(message)
        for answer, answer_set in answer_runs.items():
            shared = len(said & answer_set)
            if answer_set and shared >= SHARED and shared / len(answer_set) >= CONTAINED:
                out.append(f"{where} holds {shared} of {answer}'s {len(answer_set)} runs of {N} tokens: {message[:120]!r}")
    return out


def test_the_message_scan_catches_the_old_giveaways(answer_runs):
    old = json.loads((FIXTURES / "old_messages.json").read_text())
    caught = giveaways(old, answer_runs)
    assert [line.split(" holds ")[0] for line in caught] == list(old), caught


def test_no_message_a_student_reads_writes_out_an_answer(answer_runs):
    messages = {**stored_messages(), **starter_strings()}
    assert len(messages) > 500, "the messages were not found"
    found = giveaways(messages, answer_runs)
    assert not found, "\n".join(found)
