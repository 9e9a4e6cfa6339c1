"""Execute solution notebooks end to end: the maintainers' main job.

Every notebook in `solutions/` runs top to bottom in a fresh kernel on the default data, with the
hidden references available so hidden tests run too. Each executed copy goes to `build/executed/`
as .ipynb and as .html (figures embedded), every figure as a PNG to `build/figures/<notebook>/`,
and an index to `build/index.md` and `build/index.json`: per notebook its time, tests passed,
figures, PASS/FAIL and the key numbers it printed (see `KEY_NUMBERS`). A full run (`python -m grading execute` with no
notebook named and no `--out`) that passes also rewrites the README's run figures and `reference_run/`, the
printed lines and figures the written questions of notebooks 07 to 09 can be answered from
(grading/reference_run.py).

The kernels get their environment through jupyter_client (`start_kernel(env=...)`), never by changing
this process's `os.environ`, and always use the inline matplotlib backend, whatever `MPLBACKEND` this
process has (`kit.py test` sets Agg for pytest): with Agg, `plt.show()` emits no image at all.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from starter.compare import HIDDEN_ENV
from starter.runtime import GRADING_ENV, NOTEBOOKS_ENV

from . import notebooks

BUILD = notebooks.ROOT / "build"
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"  # what ipykernel picks when MPLBACKEND is unset

# Key numbers, parsed from the text a notebook prints (stdout and text/plain results, in cell order;
# the first match counts). Each pattern matches one print of a solution notebook (examples from a run):
#   06, training cell (starter.training.train's last line): "training on cpu (CPU, 2 threads): 700 steps in 85 s",
#       or "...: 420 of 700 steps in 185 s (time budget 180 s: ...)" when a busy machine ran out of time
#   07, evaluation cell: "greedy, 500 validation images (4.7 s):" then `format_scores`:
#       "BLEU-1 0.995  BLEU-2 0.988  BLEU-3 0.975  BLEU-4 0.954  CIDEr 7.536  ROUGE-L 0.972"
#       (the first BLEU-4 printed is this whole-validation evaluation; notebook 08 prints its greedy/beam
#       comparison on the first 100 images)
#   07, its exact-match print: "exact match: 86.2% of the captions equal one of their image's references"
#   09: "localisation accuracy, last layer, mean of heads, exact cell: 65.7%   (chance 2.0%)"
#       and the same "within 1 cell (3 x 3 block)"
#   09: "69 of 500 validation captions (14%) match no reference" -> exact match 86.2% of 500
#   08: "first 100 validation images", then "greedy      (...): BLEU-1 ... BLEU-4 0.972 ..." and
#       "beam, k = 3 (...): ... BLEU-4 0.996 ...": the row names both decoders (greedy's is the first BLEU-4)
_NUM = r"(\d+(?:\.\d+)?)"
KEY_NUMBERS: dict[str, re.Pattern] = {
    # the run that made the saved checkpoint, not a side experiment's (08 trains a leaky model, saves nothing)
    "train_steps": re.compile(r"^training on [^:]*: (\d+)(?: of (\d+))? steps in ([\d.]+) s\b.*\n(?:.*\n)??saved ",
                              re.M),
    "eval_seconds": re.compile(r"^exact match: [\d.]+% of the captions .*\(([\d.]+) s, start-up included\)", re.M),
    "eval_images": re.compile(r"^greedy, (\d+) validation images", re.M),
    "BLEU-4": re.compile(rf"\bBLEU-4 {_NUM}\b"),
    "CIDEr": re.compile(rf"\bCIDEr {_NUM}\b"),
    "exact_match": re.compile(rf"^exact[ -]match:? {_NUM}%", re.M | re.I),
    "localisation": re.compile(rf"localisation accuracy, last layer, mean of heads, exact cell: {_NUM}%\s+\(chance {_NUM}%\)"),
    "localisation_3x3": re.compile(rf"localisation accuracy, last layer, mean of heads, within 1 cell[^:]*: {_NUM}%\s+\(chance {_NUM}%\)"),
    "no_reference": re.compile(r"^(\d+) of (\d+) validation captions \([^)]*\) match no reference", re.M),
    "decoders_images": re.compile(r"^first (\d+) validation images\ngreedy ", re.M),
    "beam": re.compile(rf"^beam, k = (\d+) .*?\bBLEU-4 {_NUM}\b", re.M),
    # notebook 10: word positions run per caption without and with the cache (every line: one per length), and the
    # largest tensor held by attention in blocks and all at once (every line: one per sequence length)
    "cache_work": re.compile(r"^ *(\d+) words: .*\| positions run: +(\d+) against +(\d+) ", re.M),
    "held": re.compile(r"^T = +(\d+): largest tensor held, in numbers: blocks +([\d,]+) .*?\| plain +([\d,]+) ", re.M),
}


# The key numbers that come from the trained model. Another machine lands them a little differently (its CPU's
# arithmetic, its thread count), so the README's figures hold for a run of the same notebooks within these amounts;
# every other key number (counts, steps, chance) is the same on every machine.
TRAINED_NUMBERS_VARY: dict[str, float] = {"BLEU-4": 0.02, "CIDEr": 0.2, "beam_BLEU-4": 0.02, "exact_match": 0.04,
                                          "localisation": 0.04, "localisation_3x3": 0.04}
# each as format_numbers writes it (a percentage as its fraction)
_FORMATTED_TRAINED = {"BLEU-4": re.compile(r"^(?:greedy )?BLEU-4 ([\d.]+)"), "CIDEr": re.compile(r"\bCIDEr ([\d.]+)"),
                      "beam_BLEU-4": re.compile(r"\bbeam \(k = \d+\) BLEU-4 ([\d.]+)"),
                      "exact_match": re.compile(r"\bexact-match ([\d.]+)%"),
                      "localisation": re.compile(r"\blocalisation ([\d.]+)% vs"),
                      "localisation_3x3": re.compile(r"\b3x3: ([\d.]+)% vs")}


def figures_disagree(shown: str, numbers: dict[str, float]) -> list[str]:
    """Where `shown` (a row's key numbers as `format_numbers` wrote them, on another machine perhaps) is not a run
    whose key numbers are `numbers`: each trained number further from the run's than `TRAINED_NUMBERS_VARY` allows,
    or, when all are within it, the row as this run would write it with the shown trained numbers. Seconds are a
    run's own and are not compared. [] when they agree."""
    kept, problems = dict(numbers), []
    for name, pattern in _FORMATTED_TRAINED.items():
        m = pattern.search(shown)
        if name not in numbers or not m:
            continue
        value = float(m.group(1)) / (100 if "%" in pattern.pattern else 1)
        if abs(value - numbers[name]) > TRAINED_NUMBERS_VARY[name] + 1e-9:
            problems.append(f"{name} {m.group(1)} shown, {numbers[name]:.4g} in this run (they may differ by "
                            f"{TRAINED_NUMBERS_VARY[name]:g})")
        kept[name] = value
    if problems:
        return problems
    want = format_numbers(kept)
    shown, want = (re.sub(r"\b\d+ s\b", "N s", text) for text in (shown, want))
    return [] if shown == want else [f"{shown!r} shown, this run gives {want!r}"]


def _select(names: list[str] | None) -> list[Path]:
    paths = notebooks.solution_notebooks()
    if not names:
        return paths
    chosen = [p for p in paths if any(p.stem == n or p.name[:2] == n.zfill(2)[:2] or p.name == n for n in names)]
    if not chosen:
        raise SystemExit(f"no solution notebook matches {names}; have {[p.stem for p in paths]}")
    return chosen


def save_figures(nb, folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    count = 0
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                count += 1
                (folder / f"cell{index:02d}_{count:02d}.png").write_bytes(base64.b64decode(data["image/png"]))
    return count


def printed_text(nb) -> str:
    """Everything the code cells printed (stdout) or returned as text, in order."""
    parts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                parts.append(output.get("text", ""))
            elif output.get("output_type") in ("execute_result", "display_data"):
                parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def key_numbers(text: str) -> dict[str, float]:
    """The numbers of `KEY_NUMBERS` found in `text`; percentages as fractions (45.3% -> 0.453)."""
    found: dict[str, float] = {}
    for name, pattern in KEY_NUMBERS.items():
        m = pattern.search(text)
        if not m:
            continue
        if name in ("localisation", "localisation_3x3"):
            found[name], found[name.replace("localisation", "chance")] = (round(float(g) / 100, 6) for g in m.groups())
        elif name == "exact_match":
            found[name] = round(float(m.group(1)) / 100, 6)
        elif name == "eval_images":
            found[name] = int(m.group(1))
        elif name == "train_steps":
            found[name], found["train_seconds"] = int(m.group(1)), float(m.group(3))
            if m.group(2):
                found["train_steps_planned"] = int(m.group(2))
        elif name == "decoders_images":
            found.setdefault("eval_images", int(m.group(1)))
        elif name == "cache_work":  # the course's caption length (the first line) and four times it
            rows = {int(m[0]): int(m[1]) / int(m[2]) for m in pattern.findall(text)}
            first = int(m.group(1))
            found["cache_words"], found["cache_less_work"] = first, round(rows[first], 6)
            if 4 * first in rows:
                found["cache_less_work_4x"] = round(rows[4 * first], 6)
        elif name == "held":  # the longest sequence measured
            T, blocks, plain = pattern.findall(text)[-1]
            found["held_T"], found["held_blocks"], found["held_plain"] = (int(x.replace(",", "")) for x in (T, blocks, plain))
        elif name == "beam":
            found["beam_k"], found["beam_BLEU-4"] = int(m.group(1)), float(m.group(2))
        elif name == "no_reference":
            wrong, total = int(m.group(1)), int(m.group(2))
            if "exact_match" not in found:  # a notebook's own exact-match print wins
                found["exact_match"], found["exact_match_images"] = round((total - wrong) / total, 6), total
        else:
            found[name] = float(m.group(1))
    return found


def format_numbers(n: dict[str, float]) -> str:
    parts, training = [], None
    if "train_steps" in n:
        planned = f" of {n['train_steps_planned']}" if "train_steps_planned" in n else ""
        took = f" in {n['train_seconds']:.0f} s" if "train_seconds" in n else ""
        training = f"{n['train_steps']}{planned} training steps{took}"
    if "BLEU-4" in n:
        context = []
        if "eval_images" in n:
            context.append(f"{n['eval_images']} val images")
        if training:
            context.append(training)
        if "eval_seconds" in n:
            context.append(f"evaluated in {n['eval_seconds']:.0f} s")
        beam = f"; beam (k = {n['beam_k']}) BLEU-4 {n['beam_BLEU-4']:.3f}" if "beam_BLEU-4" in n else ""
        parts.append(("greedy " if beam else "") + f"BLEU-4 {n['BLEU-4']:.3f}"
                     + (f", CIDEr {n['CIDEr']:.3f}" if "CIDEr" in n else "") + beam
                     + (f" ({', '.join(context)})" if context else ""))
    elif training:
        parts.append(training)
    if "exact_match" in n:
        parts.append(f"exact-match {n['exact_match']:.1%}"
                     + (f" of {n['exact_match_images']:.0f}" if "exact_match_images" in n else ""))
    if "localisation" in n:
        parts.append(f"localisation {n['localisation']:.1%} vs chance {n['chance']:.1%}"
                     + (f" (3x3: {n['localisation_3x3']:.1%} vs {n['chance_3x3']:.1%})" if "localisation_3x3" in n else ""))
    if "cache_less_work" in n:
        parts.append(f"the cache runs {n['cache_less_work']:.1f}x fewer word positions per caption of "
                     f"{n['cache_words']:.0f} words" + (f", {n['cache_less_work_4x']:.1f}x of {4 * n['cache_words']:.0f}"
                                                        if "cache_less_work_4x" in n else ""))
    if "held_T" in n:
        parts.append(f"at T = {n['held_T']:,.0f} attention in blocks holds {n['held_blocks']:,.0f} numbers at most, "
                     f"all at once {n['held_plain']:,.0f}")
    return "; ".join(parts) or "-"


def kernel_env(base: dict | None = None) -> dict:
    """The kernel's environment: this one, plus the hidden references and the inline backend."""
    env = dict(os.environ if base is None else base)
    env[HIDDEN_ENV] = str(notebooks.HIDDEN_REFERENCES)
    env[NOTEBOOKS_ENV] = str(notebooks.SOLUTIONS)  # "your" earlier notebooks, for 05-09
    env["MPLBACKEND"] = INLINE_BACKEND  # not an inherited Agg: figures must become outputs
    env.pop(GRADING_ENV, None)
    return env


def _launch_options() -> dict:
    """Kernel-start options beyond env. ipykernel warns on stderr ("Kernel is running over TCP without
    encryption") unless the manager gives it CurveZMQ keys: ask for them where jupyter_client, pyzmq and
    the kernelspec support it ('auto' quietly does without when the kernelspec does not declare it)."""
    from jupyter_client.manager import KernelManager
    try:
        import zmq
        curve = zmq.has("curve")
    except Exception:
        curve = False
    if curve and KernelManager.class_traits().get("transport_encryption") is not None:
        return {"transport_encryption": "auto"}
    return {}


def write_html(nb, path: Path, source_dir: Path) -> Path:
    """The executed notebook as one self-contained HTML file (outputs' images are data URIs)."""
    from nbconvert import HTMLExporter
    log = logging.getLogger("grading.execute.html")  # nbconvert's "Alternative text is missing" warnings
    log.setLevel(logging.ERROR)
    body, _ = HTMLExporter(embed_images=True, log=log).from_notebook_node(
        nb, resources={"metadata": {"path": str(source_dir), "name": path.stem}})
    path.write_text(body, encoding="utf-8")
    return path


def start_kernel(cwd: Path, warm_up: bool = True):
    """A fresh kernel for a notebook to run in, started now: `execute_all` starts the next notebook's kernel while
    one runs, so that kernel start-up overlaps work. With `warm_up`, a thread then imports `WARM_UP` in it
    (`warm_up_kernel`, on the thread `warming`). The kernel takes one request at a time: a notebook whose first
    cell reaches it after the warm-up's request waits for the imports to finish, one whose cell gets there first
    runs before them; either way the notebook sees a fresh kernel's namespace."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync

    cwd.mkdir(parents=True, exist_ok=True)
    km = AsyncKernelManager(kernel_name="python3")
    run_sync(km.start_kernel)(extra_arguments=[f"--HistoryManager.hist_file={HISTORY}"], env=kernel_env(),
                              cwd=str(cwd), **_launch_options())
    warming = None
    if warm_up:
        warming = threading.Thread(target=warm_up_kernel, args=(km.get_connection_info(),), daemon=True)
        warming.start()
    return StartedKernel(km, warming)


@dataclass
class StartedKernel:
    """A kernel of `start_kernel`: its manager (for `execute_notebook(km=...)`) and the thread warming it up."""

    manager: Any
    warming: threading.Thread | None = None


# The libraries every notebook imports in its first cells (torch alone takes over a second to import).
WARM_UP = ("torch", "numpy", "matplotlib.pyplot", "h5py", "tqdm.auto")


def warm_up_kernel(connection_info: Any, timeout: float = 120) -> None:
    """Import `WARM_UP` in a started kernel, so that a notebook's own imports find them loaded. The request is
    silent (no output, no history, no execution count) and binds no name in the notebook's namespace: a notebook
    that forgets an import still fails. Nothing of the kit is imported: its modules load as the notebook does."""
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient()
    kc.load_connection_info(connection_info)
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=timeout)
        code = f"[__import__(name) for name in {WARM_UP!r}] and None"
        msg_id = kc.execute(code, silent=True, store_history=False)
        while kc.get_shell_msg(timeout=timeout)["parent_header"].get("msg_id") != msg_id:
            pass
    except Exception:  # a warm-up that fails costs only time: the notebook imports for itself
        pass
    finally:
        kc.stop_channels()


def stop_kernel(km) -> None:
    from jupyter_core.utils import run_sync
    run_sync(km.shutdown_kernel)(now=True)


HISTORY = ":memory:"  # nbclient's default for the kernel's history (none on disk)


def execute_notebook(path: Path, out_dir: Path, timeout: int = 1200, figures_dir: Path | None = None,
                     km=None, exports=None) -> dict:
    """Run one notebook; write out_dir/<name>.ipynb and .html and the PNGs (figures_dir, default
    build/figures/<name>); return {name, seconds, ok, errors, tests_passed, tests, figures, numbers, html}.
    `km`: a kernel from `start_kernel` (its cwd out_dir) to run in, else a new one; either way it is shut down.
    `exports`: an executor to write the HTML on, so that the next notebook need not wait for it (its errors
    then come with `finish_exports`)."""
    nb = notebooks.read(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    error = None
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True, km=km,
                            resources={"metadata": {"path": str(out_dir)}})
    try:
        client.execute(env=kernel_env(), **_launch_options())  # both go to KernelManager.start_kernel
    except CellExecutionError as exc:  # pragma: no cover - allow_errors keeps going
        error = str(exc).splitlines()[0]
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        seconds = time.perf_counter() - start
        if km is not None:  # nbclient shuts down only the kernels it started
            stop_kernel(km)
    errors = []
    tests = passed = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        failed = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if notebooks.is_test(cell):
            tests += 1
            passed += not failed
        if failed:
            errors.append(f"cell {index}: {failed[0].get('ename')}: {str(failed[0].get('evalue'))[:160]}")
    if error:
        errors.append(error)
    nbformat.write(nb, str(out_dir / path.name))
    html = out_dir / f"{path.stem}.html"
    figures = save_figures(nb, (figures_dir or BUILD / "figures" / path.stem))
    result = {"name": path.stem, "seconds": seconds, "ok": not errors, "errors": errors,
              "tests": tests, "tests_passed": passed, "figures": figures,
              "numbers": key_numbers(printed_text(nb)), "html": str(html)}
    if exports is None:
        _export(result, nb, html, path.parent)
    else:
        result["_export"] = exports.submit(_export, result, nb, html, path.parent)
    return result


def _export(result: dict, nb, html: Path, source_dir: Path) -> None:
    try:
        write_html(nb, html, source_dir)
    except Exception as exc:
        result["errors"].append(f"HTML export: {type(exc).__name__}: {exc}")
        result["ok"], result["html"] = False, None


def finish_exports(results: list[dict]) -> None:
    """Wait for the HTML exports `execute_notebook` left running."""
    for r in results:
        pending = r.pop("_export", None)
        if pending is not None:
            pending.result()


def _row(r: dict) -> str:
    return (f"{r['name']:<33} {r['seconds']:>6.1f} s  {r['tests_passed']:>3}/{r['tests']:<3} {r['figures']:>7}  "
            f"{'PASS' if r['ok'] else 'FAIL':<6}  {format_numbers(r['numbers'])}")


HEADER = f"{'notebook':<33} {'time':>8}  {'tests':>7} {'figures':>7}  result  key numbers"


def write_index(results: list[dict], index: Path, out: Path, figures: Path) -> None:
    """index.md (a table) and index.json (the same, with every parsed number) for a later read."""
    index.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Solution notebooks, executed", "",
             f"Run of {time.strftime('%Y-%m-%d %H:%M')}: executed copies (.ipynb, .html) in `{out}`, figures in `{figures}`.",
             "", "| notebook | time (s) | tests | figures | result | key numbers |", "|---|---:|---:|---:|---|---|"]
    for r in results:
        lines.append(f"| {r['name']} | {r['seconds']:.1f} | {r['tests_passed']}/{r['tests']} | {r['figures']} | "
                     f"{'PASS' if r['ok'] else 'FAIL'} | {format_numbers(r['numbers'])} |")
    errors = [f"- {r['name']}: {e}" for r in results for e in r["errors"]]
    if errors:
        lines += ["", "## Errors", "", *errors]
    index.write_text("\n".join(lines) + "\n", encoding="utf-8")
    index.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


README = notebooks.ROOT / "README.md"
# the README's block of run figures, between these two lines, is written by a run of every notebook
RUN_FIGURES = ("<!-- run figures: written by `python3 kit.py run` (grading/execute.py); do not edit by hand -->",
               "<!-- end of run figures -->")
# the course's estimate of a student's time on a notebook, from what the student reads and writes: its text read
# closely (technical prose with formulas and code, about 100 words a minute), each line of answer code (about a
# minute: typing, and the thought behind it), each task (about 23 minutes of its own: working out the spec, running
# the checks, fixing what they find) and each written question (about 15 minutes). The per-line and per-task figures
# are fitted to an independent walk of the student copy (the old 04, data and model: 5 hours; the old 05, training
# and evaluation with 196 answer lines: 5.5 to 10); the other notebooks' walk times (2 to 4 hours) come out within
# that walk's range, and a second walk, of the copy with the old 05 at 77 answer lines, put 02 at 2-2.5 h, the old 04
# at 4-5 h, the old 05 at 5-6 h and visualising at 3 h (this estimate then: 2.5, 5.25, 5.5, 3). Those two notebooks
# are now four (04 data, 05 model, 06 training, 07 generation and evaluation), each within a sitting.
READING_WORDS_PER_MINUTE = 100
MINUTES_PER_ANSWER_LINE = 1
MINUTES_PER_TASK = 23
MINUTES_PER_WRITTEN_QUESTION = 15
MOST_HOURS = 3.5  # a sitting: no notebook asks more (tests/test_execute.py)


def answer_lines(source: str) -> int:
    """The lines of code between a cell's solution markers, less blank lines and comments."""
    inside, count = False, 0
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("### BEGIN SOLUTION"):
            inside = True
        elif text.startswith("### END SOLUTION"):
            inside = False
        elif inside and text and not text.startswith("#"):
            count += 1
    return count


def student_work(path: Path) -> dict[str, int]:
    """What a solution notebook asks of a student: words of text read (a written answer's model text is not read),
    lines of answer code, tasks (answer cells of code) and written questions."""
    cells = notebooks.read(path).cells
    return {"words": sum(len(c.source.split()) for c in cells if c.cell_type == "markdown"
                         and not notebooks.nbgrader_meta(c).get("grade")),
            "answer_lines": sum(answer_lines(c.source) for c in cells if c.cell_type == "code" and notebooks.is_solution(c)),
            "tasks": sum(1 for c in cells if c.cell_type == "code" and notebooks.is_solution(c)),
            "questions": sum(1 for c in cells if notebooks.is_written_answer(c))}


def student_hours(path: Path) -> float:
    """The estimated hours a student spends on solution notebook `path`, rounded to a quarter of an hour."""
    work = student_work(path)
    minutes = (work["words"] / READING_WORDS_PER_MINUTE + MINUTES_PER_ANSWER_LINE * work["answer_lines"]
               + MINUTES_PER_TASK * work["tasks"] + MINUTES_PER_WRITTEN_QUESTION * work["questions"])
    return round(minutes / 15) / 4


def notebook_points(path: Path) -> int:
    """The points of a notebook's graded cells (test cells and written questions)."""
    return int(sum(notebooks.nbgrader_meta(c).get("points", 0) for c in notebooks.read(path).cells
                   if notebooks.nbgrader_meta(c).get("grade")))


def _machine() -> str:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{os.cpu_count()} CPU cores, {gpu}"


def trained_numbers_vary() -> str:
    """`TRAINED_NUMBERS_VARY` in words, as the README's block of run figures states it."""
    v = TRAINED_NUMBERS_VARY
    return (f"{v['BLEU-4']:g} of BLEU-4, {v['CIDEr']:g} of CIDEr and {v['exact_match'] * 100:g} points of exact match "
            "and localisation")


def run_figures(results: list[dict], date: str | None = None, machine: str | None = None,
                wall: float | None = None, trained: tuple[float, float] | None = None) -> str:
    """The README's block of run figures: per notebook its points, run time, tests passed and key numbers, and
    the estimated student time; the whole run's wall time (`wall`, default the notebooks' sum); and what the
    trained-model cell measures of this run's notebook-06 model (`trained`: its public and hidden shares)."""
    lines = ["",
             f"Measured by `python3 kit.py run` on {date or time.strftime('%Y-%m-%d')} ({machine or _machine()}): each "
             "solution notebook run top to bottom in a fresh kernel, on the default data; \"all\" is the whole run's wall "
             "time (each kernel starts, and imports torch, while the notebook before runs, which takes about 1 s "
             "off each run time from 02 on). A student's time is the course's estimate, not a measurement: the "
             f"text read at {READING_WORDS_PER_MINUTE} words a minute, {MINUTES_PER_ANSWER_LINE} minute per line of "
             f"answer code, {MINUTES_PER_TASK} minutes per task and {MINUTES_PER_WRITTEN_QUESTION} per written question, "
             "fitted to an independent walk of the student copy (grading/execute.py, `student_hours`); a notebook over "
             f"{MOST_HOURS:g} h is more than one sitting. The numbers of the trained model land a little differently on "
             "another machine (its CPU's arithmetic, its thread count): another run of the same notebooks gives them "
             f"within {trained_numbers_vary()}, and every other figure to the digit but the seconds.", "",
             "| notebook | points | run time | tests passed | key numbers | a student's time (estimate) |",
             "|---|---:|---:|---:|---|---:|"]
    points = {r["name"]: notebook_points(notebooks.SOLUTIONS / f"{r['name']}.ipynb") for r in results}
    for r in results:
        lines.append(f"| `{r['name']}` | {points[r['name']]} | {r['seconds']:.0f} s | {r['tests_passed']}/{r['tests']} | "
                     f"{format_numbers(r['numbers'])} | {student_hours(notebooks.SOLUTIONS / (r['name'] + '.ipynb')):.2f} h |")
    total = sum(r["seconds"] for r in results) if wall is None else wall
    lines.append(f"| all | {sum(points.values())} | {total:.0f} s | | | |")
    if trained is not None:
        lines += ["", f"Notebook 06's trained model of this run, measured as the trained-model cell measures a student's "
                      f"checkpoint: it captions {trained[0]:.0%} of the public case's new scenes and {trained[1]:.0%} of "
                      "the hidden cases' exactly right (`python -m grading.cases.captioning "
                      "build/executed/runs/captioning_transformer.pt` prints the same)."]
    return "\n".join([*lines, ""])


def trained_model_shares(out: Path) -> tuple[float, float] | None:
    """(public, hidden) share of the trained-model cases' scenes that the notebook-06 model a run saved in `out`
    captions exactly right (the hidden cases share their images: one share); None without that model."""
    checkpoint = out / notebooks.TRAINED_CHECKPOINT
    if not checkpoint.is_file():
        return None
    from .cases.captioning.training import trained_shares

    shares = trained_shares(checkpoint)
    public = shares.pop("trained/new_scenes", None)
    return (public, next(iter(shares.values()))) if public is not None and shares else None


def replace_block(readme: Path, markers: tuple[str, str], block: str, what: str) -> None:
    """Replace the README's generated block between its `markers` lines (kept) with `block` (without them)."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(markers[0]), text.find(markers[1])
    if start < 0 or end < start:
        raise ValueError(f"{readme} has no block of {what} (its first and last lines: {markers})")
    readme.write_text(text[:start] + "\n".join([markers[0], block, markers[1]]) + text[end + len(markers[1]):],
                      encoding="utf-8")


def write_run_figures(results: list[dict], readme: Path = README, wall: float | None = None,
                      trained: tuple[float, float] | None = None) -> None:
    """Replace the README's block of run figures with those of `results`."""
    replace_block(readme, RUN_FIGURES, run_figures(results, wall=wall, trained=trained), "run figures")


def execute_all(names: list[str] | None = None, out: Path | None = None, figures: Path | None = None,
                index: Path | None = None, readme: Path | None = None, reference: Path | None = None) -> bool:
    """Run the chosen solution notebooks (all by default); print a header, one index row per notebook
    as it finishes (errors one line each under it) and a summary; write the index and, given `readme`, when
    every notebook ran and passed, its block of run figures; given `reference`, in the same case, the reference
    run for the written questions there (grading/reference_run.py). True if all passed."""
    out = out or BUILD / "executed"
    figures = figures or BUILD / "figures"
    index = index or BUILD / "index.md"
    paths = _select(names)
    print(f"executing {len(paths)} solution notebook{'s' * (len(paths) != 1)}, each in a fresh kernel", flush=True)
    print(HEADER, flush=True)
    results = []
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1) as exports:
        kernel = start_kernel(out, warm_up=False)  # nothing runs yet to overlap its imports with
        for i, path in enumerate(paths):
            this, kernel = kernel, (start_kernel(out) if i + 1 < len(paths) else None)  # the next starts meanwhile
            r = execute_notebook(path, out, figures_dir=figures / path.stem, km=this.manager, exports=exports)
            if this.warming is not None:
                this.warming.join()  # long done: it ran in the kernel before or between the notebook's cells
            results.append(r)
            print(_row(r), flush=True)
            for e in r["errors"]:
                print(f"    {e}", flush=True)
    finish_exports(results)
    for r in results:
        if r["errors"] and r["errors"][-1].startswith("HTML export"):
            print(f"    {r['name']}: {r['errors'][-1]}", flush=True)
    write_index(results, index, out, figures)
    total = time.perf_counter() - began
    n_figures = sum(r["figures"] for r in results)

    def rel(p: Path) -> str:
        try:
            return str(p.resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(p)
    print(f"{sum(r['ok'] for r in results)}/{len(results)} notebooks passed in {total:.0f} s; executed copies and "
          f"HTML in {rel(out)}, {n_figures} figure{'s' * (n_figures != 1)} in {rel(figures)}, index in {rel(index)}")
    passed = all(r["ok"] for r in results)
    if readme is not None and not names and passed:
        write_run_figures(results, readme, wall=total, trained=trained_model_shares(out))
        print(f"run figures written into {rel(readme)}")
    if reference is not None and not names and passed:
        from . import reference_run
        written = reference_run.write({r["name"]: notebooks.read(out / f"{r['name']}.ipynb") for r in results}, reference)
        print(f"reference run for the written questions written into {rel(reference)} "
              f"({', '.join(p.name for p in written)}; {reference_run.folder_bytes(reference) / 1000:.0f} kB)")
    return passed
