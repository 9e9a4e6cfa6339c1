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


# ---- calls written out: a message that spells a call of the answer it checks (`model.eval()`, `mean(dim=1)`)
CALL = re.compile(r"[A-Za-z_][\w.]*\((?:[^()]|\([^()]*\))*\)")


def _call_forms(node: ast.Call) -> set[str]:
    """A call as written and with its receivers dropped: a.b.c(x) -> {"a.b.c(x)", "b.c(x)", "c(x)"}."""
    forms, func = {ast.unparse(node)}, node.func
    while isinstance(func, ast.Attribute):
        forms.add(ast.unparse(ast.Call(func=ast.Name(func.attr), args=node.args, keywords=node.keywords)))
        func = func.value
    return forms


def calls_in_code(tree: ast.AST) -> set[str]:
    return {form for node in ast.walk(tree) if isinstance(node, ast.Call) for form in _call_forms(node)}


def calls_in_text(text: str) -> set[str]:
    """The calls a sentence writes out, as code would write them."""
    found = set()
    for piece in CALL.findall(text):
        try:
            node = ast.parse(piece, mode="eval").body
        except SyntaxError:
            continue
        if isinstance(node, ast.Call):
            found |= _call_forms(node)
    return found


def spelled_calls() -> list[str]:
    """Every stored message that writes out a call of the answer its case checks, beyond the calls the notebook's
    own text writes out (a task's text may name the API it requires: `register_buffer("pe", table,
    persistent=False)`); a call without arguments counts only when it is more than a method name (`cnn.eval()`)."""
    answers = answer_functions()
    spec = {stem[:2]: calls_in_text("\n".join(c.source for c in nbs.read(nbs.RELEASE / f"{stem}.ipynb").cells
                                              if c.cell_type == "markdown"))
            for stem in (p.stem for p in nbs.solution_notebooks())}
    out = []
    for folder in (nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES):
        for path in sorted(Path(folder).glob("*.h5")):
            nb = path.name[:2]
            with h5py.File(path, "r") as f:
                for name, group in case_groups(f):
                    case = read_case(group, name)
                    own = [a for a in answers if a.startswith(f"{nb}.")
                           and re.search(rf"\b{re.escape(a.split('.')[1])}\b", case.target)]
                    checked = set().union(*(calls_in_code(answers[a]) for a in own)) - spec[nb]
                    messages = {"hint": case.hint, **{bug: m for bug, (m, _) in case.variants.items()}}
                    for what, message in messages.items():
                        spelled = {c for c in calls_in_text(message) & checked if not c.endswith("()") or "." in c}
                        if spelled:
                            out.append(f"{name}:{what} writes out {sorted(spelled)}: {message[:100]!r}")
    return out


def test_no_message_writes_out_a_call_of_the_answer_it_checks():
    """A check's message says what is wrong and the rule, not the line that fixes it."""
    found = spelled_calls()
    assert not found, "\n".join(found)


def test_the_call_scan_catches_the_old_messages():
    """The messages of 3a265bf that wrote out the fix (tests/fixtures/student_copy/old_messages.json has the
    token-run giveaways; these are the ones whose code was one call)."""
    answers = answer_functions()
    old = {"06.validation_loss": "the validation loss is measured in train mode (dropout on): call model.eval() first.",
           "06.train_step": "the update uses unclipped gradients: call torch.nn.utils.clip_grad_norm_("
                            "model.parameters(), grad_clip) after backward() and before optimizer.step().",
           "05.CaptioningTransformer.forward": "features not projected: the memory is feature_proj(features) + "
                                               "region embeddings."}
    for answer, message in old.items():
        assert calls_in_text(message) & calls_in_code(answers[answer]), answer
