"""Who shares work with whom: a similarity check of a class's answers, for a person to read; it never changes a grade.

For every graded task (an answer cell of code) and every written question, each pair of students' answers is compared:

- **code** with copydetect (the winnowing fingerprints of MOSS; maintained, pure Python, no network). Its tokenizer
  replaces every name with one letter and drops comments, blank lines and strings, so renamed variables, added
  comments and reflowed lines change nothing. The release notebook's own cell (signature, docstring, the
  `# YOUR CODE HERE` stub) is the boilerplate, left out of every answer. Fingerprints are k-grams of the filtered
  code (every one: see WINDOW); a pair's similarity in a task is the share of the shorter answer's fingerprints that the other holds.
- **written answers** as text: 4-word shingles of the lower-cased words, the question's own words left out.

Many correct answers to "compute attention" look alike, so a pair's similarity in a task only counts by how far it
stands above what that task's pairs share anyway: `excess = (s - typical) / (1 - typical)` with `typical` the median of
the task's pairs' similarities (a few copies do not move it), and it is weighed by the length of the shorter answer (a one-line answer
is no evidence; the weight grows with the length, up to `MOST_WEIGHT`). A pair's score is the sum over tasks of
(weight * excess)^2: one long answer shared whole (9) counts more than many short ones a little alike, which is what
independent work shows. Fingerprints are weighed by their rarity in the class's answers to the task, so an idiom most
answers share adds little. A pair is flagged when its score is at least `FLAG_SCORE` (more than one long answer
shared whole) and stands out of the class's scores (`FLAG_SPREAD` robust deviations above their median). On the
test class of independent solutions and planted copies the independent pairs reach 2.0 at most, the copies of a whole
notebook set 44 and more, one long task copied 2.7 (ranked above every independent pair, not flagged).
Thresholds: tests/test_similarity.py measures them on independent solutions and planted copies.

The check reads the staged notebooks of the course folder (`submitted/<student>/attention/*.ipynb`) as JSON: no
student code runs. `check_class` writes `similarity.html` (the pairs ranked, each shown side by side with the shared
parts marked; self-contained) and returns the review flags.
"""
from __future__ import annotations

import html
import io
import json
import logging
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import notebooks
from .host_bounds import Bound, PastBound, each_bounded

log = logging.getLogger(__name__)

K = 12                   # characters of filtered code per fingerprint (a filtered token is often one character)
WINDOW = 1               # every k-gram kept: copydetect hashes with Python's salted hash(), and winnowing's
                         # choice of the smallest would change from run to run; all k-grams give the same sets always
SHINGLE = 4              # words per shingle of a written answer
TYPICAL_QUANTILE = 0.5   # what a task's pairs share anyway: this quantile of their similarities (robust to the few copies)
FULL_WEIGHT = 80         # fingerprints (or shingles) of the shorter answer at which a task weighs 1
MOST_WEIGHT = 3.0        # and the most it weighs (a long answer)
MIN_PRINTS = 16          # a shorter answer with fewer fingerprints is not compared
FLAG_SCORE = 10.0
FLAG_SPREAD = 8.0
SHOWN_PAIRS = 50         # pairs shown on the page
# Trained models: the same code trains the same weights (notebook 06's seed), the same code on another machine
# 8.8e-3 apart (relative distance of all weights, one thread against two), a copy with noise of 1e-3 of each
# tensor's spread 9.6e-4 apart, a copy trained 20 steps more 6.5e-3 (benchmarks/bench_checkpoint_closeness.py).
# So a pair closer than NEAR_COPY but not the same is a copy made to look like another run; a copy trained on is
# as far apart as honest work, and only the run's identity (grading.intake.flag_shared_runs) ties it.
NEAR_COPY = 2e-3
SKETCH = 16_384          # weights compared per checkpoint: an even sample of all of them
WEIGHTS_BOUND = Bound(seconds=60, memory_mb=2048)  # reading one checkpoint, in a child process
PAGE = "similarity.html"


@dataclass
class Answer:
    """One student's answer to one task: its text, the fingerprints (hash -> positions in the filtered text)."""
    text: str
    prints: dict[int, list[int]]
    fingerprint: object = None  # copydetect's CodeFingerprint (code), for the marked slices


@dataclass
class Pair:
    a: str
    b: str
    score: float
    tasks: list[tuple[str, float, float]] = field(default_factory=list)  # (task, similarity, what it adds to score)
    flagged: bool = False
    deviations: float = 0.0  # how far above the class's pairs: robust deviations above their median score


WORD = re.compile(r"[a-z0-9]+")  # a word of a written answer, lower-cased


def _grams(text: str):
    """(position, the SHINGLE words from there) of a written answer's words."""
    words = WORD.findall(text.lower())
    return ((i, tuple(words[i:i + SHINGLE])) for i in range(len(words) - SHINGLE + 1))


def _shingle_set(text: str) -> set[tuple[str, ...]]:
    return {gram for _, gram in _grams(text)}


def _shingles(text: str, ignore: set[tuple[str, ...]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, gram in _grams(text):
        if gram not in ignore:
            out.setdefault(hash(gram), []).append(i)
    return out


def _code_print(source: str, boilerplate):
    from copydetect import CodeFingerprint

    return CodeFingerprint("answer.py", K, WINDOW, boilerplate=boilerplate, language="python", fp=io.StringIO(source))


def _read(path: Path) -> list:
    """A notebook's cells; [] for a file that is not a notebook."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return cells if isinstance(cells, list) else []


def _source(cell: dict):
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _answer_cells(cells: list) -> dict[str, tuple[str, str]]:
    """{grade_id: (kind "code" or "text", source)} of a notebook's answer cells."""
    out = {}
    for cell in cells:
        if not isinstance(cell, dict):
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell.get("metadata"), dict) else {}
        if not isinstance(meta, dict) or not meta.get("solution") or not isinstance(meta.get("grade_id"), str):
            continue
        source = _source(cell)
        if isinstance(source, str):
            out[meta["grade_id"]] = ("code" if cell.get("cell_type") == "code" else "text", source)
    return out


def _templates() -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """({"<stem>/<grade_id>": (kind, the release notebook's cell)}, {stem: the release notebook's cells, code and
    text}): what every student starts from, and what every student reads."""
    cells, given = {}, {}
    for path in sorted(notebooks.RELEASE.glob("*.ipynb")):
        release = _read(path)
        cells.update({f"{path.stem}/{gid}": cell for gid, cell in _answer_cells(release).items()})
        given[path.stem] = "\n".join(_source(c) for c in release)
    return cells, given


def class_answers(staged: Path) -> tuple[dict[str, dict[str, Answer]], list[str]]:
    """{task: {student: Answer}} of every staged student's answers that differ from the release's cell, and the lines
    saying what was skipped."""
    templates, given = _templates()
    skipped: list[str] = []
    # left out of every answer: its own cell as released, and, for code, the notebook's given code; for text, every
    # shingle of the notebook (the question's words, which answers echo)
    given_code = {stem: _code_print(text, None).hashes for stem, text in given.items()}
    given_text = {stem: _shingle_set(text) for stem, text in given.items()}
    boiler = {task: (_code_print(src, None).hashes | given_code[task.split("/")[0]] if kind == "code" else
                     _shingle_set(src) | given_text[task.split("/")[0]])
              for task, (kind, src) in templates.items()}
    answers: dict[str, dict[str, Answer]] = {task: {} for task in templates}
    for folder in sorted(p for p in staged.iterdir() if p.is_dir()) if staged.is_dir() else []:
        nbs = sorted((folder / notebooks.ASSIGNMENT).glob("*.ipynb"))
        if not nbs:
            skipped.append(f"{folder.name}: no notebooks")
            continue
        for path in nbs:
            for gid, (kind, source) in _answer_cells(_read(path)).items():
                task = f"{path.stem}/{gid}"
                if task not in templates or source.strip() == templates[task][1].strip():
                    continue
                try:
                    if kind == "code":
                        fp = _code_print(source, list(boiler[task]))
                        answers[task][folder.name] = Answer(source, fp.hash_idx, fp)
                    else:
                        answers[task][folder.name] = Answer(source, _shingles(source, boiler[task]))
                except Exception as exc:  # a cell the tokenizer cannot read: skipped, said, nothing else affected
                    skipped.append(f"{folder.name}: {task} not compared ({type(exc).__name__})")
    return answers, skipped


def _task_similarities(answers: dict[str, Answer], students: list[str]) -> np.ndarray:
    """(n, n): the share of the shorter answer's fingerprints that the other holds, each fingerprint weighed by how
    rare it is in the class's answers to this task (log((answers + 1) / answers holding it)), so that an idiom
    most answers share counts little and one only these two share counts much; NaN where either is missing."""
    n = len(students)
    sim = np.full((n, n), np.nan)
    index = {s: i for i, s in enumerate(students)}
    prints = {s: set(a.prints) for s, a in answers.items() if len(a.prints) >= MIN_PRINTS}
    held: dict[int, int] = {}
    for found in prints.values():
        for h in found:
            held[h] = held.get(h, 0) + 1
    rarity = {h: math.log((len(prints) + 1) / count) for h, count in held.items()}
    mass = {s: sum(rarity[h] for h in found) for s, found in prints.items()}
    names = sorted(prints)
    for x, a in enumerate(names):
        for b in names[x + 1:]:
            shared = sum(rarity[h] for h in prints[a] & prints[b]) / max(1e-12, min(mass[a], mass[b]))
            sim[index[a], index[b]] = sim[index[b], index[a]] = shared
    return sim


def score_pairs(answers: dict[str, dict[str, Answer]], students: list[str]) -> list[Pair]:
    """Every pair of `students` with its score and its tasks, highest first; `flagged` set as the module says."""
    n = len(students)
    score = np.zeros((n, n))
    per_task: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for task, by_student in answers.items():
        if len(by_student) < 2:
            continue
        sim = _task_similarities(by_student, students)
        upper = sim[np.triu_indices(n, 1)]
        upper = upper[~np.isnan(upper)]
        if not upper.size:
            continue
        typical = float(np.quantile(upper, TYPICAL_QUANTILE)) if upper.size >= 3 else 0.0
        excess = np.clip((sim - typical) / max(1e-9, 1 - typical), 0, 1)
        lengths = np.array([len(by_student[s].prints) if s in by_student else 0 for s in students], dtype=float)
        weight = np.minimum(MOST_WEIGHT, np.minimum.outer(lengths, lengths) / FULL_WEIGHT)
        contribution = np.nan_to_num((weight * excess) ** 2)
        score += contribution
        per_task[task] = (np.nan_to_num(sim), contribution)
    pairs = []
    for i in range(n):
        for j in range(i + 1, n):
            tasks = sorted(((t, float(s[i, j]), float(c[i, j])) for t, (s, c) in per_task.items() if c[i, j] > 0),
                           key=lambda x: -x[2])
            pairs.append(Pair(students[i], students[j], float(score[i, j]), tasks))
    pairs.sort(key=lambda p: -p.score)
    values = np.array([p.score for p in pairs]) if pairs else np.zeros(1)
    median = float(np.median(values))
    spread = float(np.median(np.abs(values - median))) * 1.4826 + 0.05
    for p in pairs:
        p.deviations = (p.score - median) / spread
        p.flagged = p.score >= FLAG_SCORE and p.deviations >= FLAG_SPREAD
    return pairs


def _marked(text: str, slices) -> str:
    """`text` escaped, with the characters of `slices` (2 x N starts and ends) in <mark>."""
    out, at = [], 0
    for start, end in sorted(zip(*slices)) if len(slices) and len(slices[0]) else []:
        start, end = max(int(start), at), int(end)
        if end <= start:
            continue
        out += [html.escape(text[at:start]), "<mark>", html.escape(text[start:end]), "</mark>"]
        at = end
    return "".join(out) + html.escape(text[at:])


def _shared_slices(a: Answer, b: Answer):
    """The marked parts of each answer: copydetect's slices for code; shared shingles (as word spans) for text."""
    if a.fingerprint is not None and b.fingerprint is not None:
        from copydetect import compare_files

        _, _, slices = compare_files(a.fingerprint, b.fingerprint)
        return slices
    out = []
    for mine, theirs in ((a, b), (b, a)):
        spans = [m.span() for m in WORD.finditer(mine.text.lower())]
        shared = set(mine.prints) & set(theirs.prints)
        starts, ends = [], []
        for h in shared:
            for i in mine.prints[h]:
                starts.append(spans[i][0])
                ends.append(spans[i + SHINGLE - 1][1])
        out.append(np.array([starts, ends]) if starts else np.array([[], []]))
    return tuple(out)


def write_page(out: Path, pairs: list[Pair], answers: dict[str, dict[str, Answer]], students: list[str],
               skipped: list[str], copies: Sequence[tuple[str, str, float]] = ()) -> Path:
    """OUT/similarity.html: the pairs ranked, each flagged or top one side by side with its shared parts marked."""
    rows, details = [], []
    shown = [p for p in pairs[:SHOWN_PAIRS] if p.score > 0]
    for rank, p in enumerate(shown, 1):
        anchor = f"pair-{rank}"
        rows.append(f"<tr class='{'flag' if p.flagged else ''}'><td>{rank}</td><td><a href='#{anchor}'>"
                    f"{html.escape(p.a)} &amp; {html.escape(p.b)}</a></td><td>{p.score:.2f}</td>"
                    f"<td>{max(0.0, p.deviations):.0f}</td><td>{len(p.tasks)}</td><td>{'flagged' if p.flagged else ''}</td></tr>")
        blocks = []
        for task, sim, contribution in p.tasks[:12]:
            left, right = answers[task][p.a], answers[task][p.b]
            s1, s2 = _shared_slices(left, right)
            blocks.append(f"<h4>{html.escape(task)}: {sim:.0%} of the shorter answer shared "
                          f"(counts {contribution:.2f})</h4><div class='side'><pre>{_marked(left.text, s1)}</pre>"
                          f"<pre>{_marked(right.text, s2)}</pre></div>")
        details.append(f"<section id='{anchor}'><h3>{rank}. {html.escape(p.a)} &amp; {html.escape(p.b)}: score "
                       f"{p.score:.2f}{', flagged' if p.flagged else ''}</h3>{''.join(blocks)}</section>")
    notes = "".join(f"<li>{html.escape(s)}</li>" for s in skipped)
    models = "".join(f"{html.escape(a)}'s and {html.escape(b)}'s {notebooks.TRAINED_CHECKPOINT} are {d:.1e} apart "
                     "(relative distance of their weights): a near copy. " for a, b, d in copies) \
        or "No two trained models are near copies."
    page = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>Similarity of the class's answers</title>
<style>body{{font:14px/1.4 system-ui,sans-serif;margin:1.5em;max-width:1400px}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px}} tr.flag{{background:#fde2e2}} .side{{display:flex;gap:8px}}
.side pre{{flex:1;background:#f7f7f7;padding:6px;overflow:auto;font-size:12px;white-space:pre-wrap}}
mark{{background:#ffd54f}}</style></head><body>
<h1>Similarity of the class's answers</h1>
<p>{len(students)} students, {len(pairs)} pairs. Each pair's score adds, over the tasks both answered, how far their
answers' shared fingerprints stand above what that task's pairs share anyway (the median of the
class's pairs), times the shorter answer's weight (its length, up to {MOST_WEIGHT:g}), squared: one long answer shared
whole adds {MOST_WEIGHT ** 2:g}, a pair of short, obvious answers nearly nothing. Shared fingerprints count by their
rarity among the class's answers to the task. Flagged: a score of at least {FLAG_SCORE} that stands {FLAG_SPREAD:g} robust deviations
above the class's median. The marks are copydetect's: a shared stretch of code that runs through a docstring
marks the docstring too, though a string counts as one token. Code is compared with its names, comments, blank lines and strings left out, and without
the release notebook's own lines. A flag is a reason to read both notebooks, not a finding; no grade changes.</p>
<table><tr><th>rank</th><th>pair</th><th>score</th><th>above the class (robust deviations)</th>
<th>tasks above typical</th><th></th></tr>{''.join(rows)}</table>
<h2>Trained models</h2><p>{models} Two models trained by the same code are the same; on two machines, about 1e-2 apart; a model handed in
within {NEAR_COPY:g} of another's, and not the same, is one run with a little noise added. A copy trained on for a few
steps cannot be told from independent work by its weights.</p>
{f'<h2>Not compared</h2><ul>{notes}</ul>' if notes else ''}
{''.join(details)}</body></html>"""
    path = out / PAGE
    path.write_text(page, encoding="utf-8")
    return path


def _weights_sketch(path: str) -> dict | None:
    """An even sample of SKETCH of the checkpoint's floating-point weights and their layout; None if it cannot be
    read (`grading.trained_model.read_checkpoint`'s checks, then torch.load(weights_only=True): nothing runs)."""
    import torch

    from .trained_model import UnusableCheckpoint, read_checkpoint

    try:
        state = read_checkpoint(Path(path))["state_dict"]
    except UnusableCheckpoint:
        return None
    keys = sorted(k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point())
    if not keys:
        return None
    weights = torch.cat([state[k].detach().double().flatten() for k in keys])
    step = max(1, weights.numel() // SKETCH)
    return {"layout": repr([(k, list(state[k].shape)) for k in keys]), "weights": weights[::step][:SKETCH].tolist()}


def near_copies(staged: Path) -> list[tuple[str, str, float]]:
    """(student, student, relative distance) of the trained models handed in that are closer than NEAR_COPY but
    not the same. Each checkpoint is read in a bounded child process: one that cannot be read is left out."""
    paths = {f.name: f / notebooks.ASSIGNMENT / notebooks.TRAINED_CHECKPOINT
             for f in (sorted(staged.iterdir()) if staged.is_dir() else []) if f.is_dir()}
    paths = {s: p for s, p in paths.items() if p.is_file() and not p.is_symlink()}
    sketches = each_bounded(_weights_sketch, [str(p) for p in paths.values()], WEIGHTS_BOUND)
    by_layout: dict[str, list[tuple[str, np.ndarray]]] = {}
    for student, sketch in zip(paths, sketches):
        if isinstance(sketch, dict) and not isinstance(sketch, PastBound):
            by_layout.setdefault(sketch["layout"], []).append((student, np.asarray(sketch["weights"])))
    found = []
    for group in by_layout.values():
        for x, (a, wa) in enumerate(group):
            for b, wb in group[x + 1:]:
                apart = float(np.linalg.norm(wa - wb) / max(np.linalg.norm(wa), np.linalg.norm(wb), 1e-12))
                if 0 < apart < NEAR_COPY:
                    found.append((a, b, apart))
    return found


def check_class(root: Path, out: Path) -> dict[str, list[str]]:
    """Compare every pair of the course folder's staged students, write OUT/similarity.html, and return {student:
    [review flag]} for the students of flagged pairs."""
    started = time.monotonic()
    answers, skipped = class_answers(root / "submitted")
    students = sorted({s for by_student in answers.values() for s in by_student})
    pairs = score_pairs(answers, students)
    copies = near_copies(root / "submitted")
    out.mkdir(parents=True, exist_ok=True)
    write_page(out, pairs, answers, students, skipped, copies)
    flags: dict[str, list[str]] = {}
    for rank, p in enumerate(pairs, 1):
        if not p.flagged:
            break
        for me, other in ((p.a, p.b), (p.b, p.a)):
            flags.setdefault(me, []).append(
                f"shares much of its work with {other} (pair {rank} of {len(pairs)} in {PAGE}, score {p.score:.1f}, "
                f"{len(p.tasks)} tasks above what the class shares): worth reading both; no grade changes")
    for a, b, apart in copies:
        for me, other in ((a, b), (b, a)):
            flags.setdefault(me, []).append(
                f"{notebooks.TRAINED_CHECKPOINT} is a near copy of {other}'s: their weights are {apart:.1e} apart "
                f"(relative), closer than two runs of the same code on two machines and not the same, as one run "
                f"with a little noise added is: worth a look; the trained-model mark measures the weights and stands")
    log.info("similarity: %d students, %d pairs, %d flagged, %d trained models near copies, in %.1f s", len(students),
             len(pairs), sum(p.flagged for p in pairs), len(copies), time.monotonic() - started)
    return flags
