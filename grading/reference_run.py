"""The reference run: what the solution notebooks printed and drew for the written questions, for the student copy.

Notebook 07's question 10, notebook 08's questions 11 to 14 and notebook 09's question 15 ask about numbers and figures
of the student's own run: the bottleneck experiment, the greedy/beam comparison, the kinds of mistakes, the sampling
plot, the leaky-mask experiment, the wrong captions, the localisation table. A student whose model of notebooks 05-06
does not train has nothing to answer
from, so `reference_run/` (at the top of the repository, shipped by `python -m grading publish`) holds those
cells' printed lines and figures from a run of the solution notebooks: one Markdown file per notebook
(`reference_run/08_decoding.md`, for instance) and its figures, downscaled, in a
folder of the same name. Each question names the file.

Only the printed lines of given (non-graded, non-solution) code cells go in, less the loader's chatter (which
notebook a definition came from, with its absolute path, and "using your ..."), and their figures: no code.

`python -m grading execute` (a full run, `python3 kit.py run`) rewrites the folder, as it rewrites the README's
run figures. Each block records the cell it comes from and a hash of that cell's source, so that a test
(tests/test_reference_run.py) sees when a cell changed after the folder was written.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from . import notebooks

FOLDER = notebooks.ROOT / "reference_run"
COLAB_KIT = "/content/attention-transformers"  # where the notebooks' first cell clones the course on Colab
MAX_WIDTH = 820       # pixels: a figure wider than this is scaled down
COLOURS = 96          # a figure is stored with a palette of this many colours
MAX_BYTES = 1_000_000  # the whole folder stays under this (tests/test_reference_run.py)


@dataclass(frozen=True)
class Block:
    """One given code cell's output: `cell` its grade_id, `title` the heading, `questions` the grade_ids of the
    written questions' Markdown cells (`md_q_*`, in notebook `asked_in` or the block's own) it serves."""

    cell: str
    title: str
    questions: tuple[str, ...]
    asked_in: str | None = None


BLOCKS: dict[str, tuple[Block, ...]] = {
    "07_generation_and_evaluation": (
        Block("code_bottleneck", "Section 4 · What attention over the regions buys", ("md_q_bottleneck",)),
    ),
    "08_decoding": (
        Block("code_30", "Section 3 · Greedy against beam search", ("md_q_bleu_exact", "md_q_decoding")),
        Block("code_error_kinds", "Section 3 · What kind of mistakes?", ("md_q_bleu_exact", "md_q_exposure_bias")),
        Block("code_sampling", "Section 4 · Sampling: accuracy against diversity", ("md_q_decoding",)),
        Block("code_leaky", "Section 5 · The leaky mask", ("md_q_causal_mask",)),
    ),
    "09_visualizing_attention": (
        Block("code_27", "Section 6 · Localisation accuracy of every layer and head", ("md_q_heads_mean",)),
        Block("code_rollout", "Section 7 · Rollout against single layers", ("md_q_explorer",)),
        Block("code_30", "Section 9 · Failure cases", ("md_q_exposure_bias",), asked_in="08_decoding"),
    ),
}

# the explorer of a notebook's given cell, shipped as <stem>/explorer.json: the attention only (the views, such as
# the rollout the solution computed, are left out: the notebook adds the student's own)
EXPLORERS: dict[str, str] = {"09_visualizing_attention": "code_explorer"}
_EXPLORER_DATA = re.compile(r'<script type="application/json" class="ae-data">(.*?)</script>', re.S)


def explorer_data(cell, keep_views: bool = False) -> dict | None:
    """The data of the explorer a cell displayed, without its views (unless `keep_views`); None if it showed none."""
    html = "".join("".join(o["data"]["text/html"]) for o in cell.get("outputs", [])
                   if o.get("output_type") in ("display_data", "execute_result") and "text/html" in o.get("data", {}))
    found = _EXPLORER_DATA.findall(html)
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(f"{len(found)} explorers in the cell's output; expected one")
    data = json.loads(found[0])
    if not keep_views:  # what the reference run ships: it is not the student's model
        data["title"] = "the course's reference run: " + data["title"].replace("your model ", "the model ", 1)
    for caption in data["captions"]:
        caption["views"] = caption["views"] if keep_views else {}
    return data


# which file each written question's text must name (tests/test_reference_run.py)
QUESTION_FILES: dict[tuple[str, str], set[str]] = {}
for _stem, _blocks in BLOCKS.items():
    for _b in _blocks:
        for _q in _b.questions:
            QUESTION_FILES.setdefault((_b.asked_in or _stem, _q), set()).add(f"reference_run/{_stem}.md")

# lines left out: which notebook a definition was loaded from (an absolute path of the maintainers' machine),
# "using your ...", a check's tick, and anything else naming an absolute path
_DROP = re.compile(r"^(using your |✓ )|(?:^|\s)from /|(?<![\w.])/(?:work|home|tmp|content|Users)/")


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]


def _cell(nb, grade_id: str):
    found = [c for c in nb.cells if notebooks.nbgrader_meta(c).get("grade_id") == grade_id]
    if len(found) != 1:
        raise KeyError(f"{len(found)} cells with grade_id {grade_id!r}")
    return found[0]


def printed_lines(cell) -> list[str]:
    """The lines a cell printed on stdout, less the loader's chatter (`_DROP`)."""
    text = "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")
    return [line.rstrip() for line in text.splitlines() if line.strip() and not _DROP.search(line)]


def cell_figures(cell) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})]


def small_png(png: bytes, max_width: int = MAX_WIDTH, colours: int = COLOURS) -> bytes:
    """`png` scaled down to `max_width` pixels at most and stored with a palette of `colours` colours."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    if image.width > max_width:
        image = image.resize((max_width, round(image.height * max_width / image.width)), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(out, format="PNG", optimize=True)
    return out.getvalue()


def question_number(stem: str, md_grade_id: str) -> str:
    source = _cell(notebooks.read(notebooks.SOLUTIONS / f"{stem}.ipynb"), md_grade_id).source
    m = re.search(r"\*\*Question (\d+)", source)
    if not m:
        raise ValueError(f"{stem} {md_grade_id}: no '**Question N' in its text")
    return m.group(1)


def _for_questions(stem: str, block: Block) -> str:
    asked_in = block.asked_in or stem
    numbers = [question_number(asked_in, q) for q in block.questions]
    where = "" if asked_in == stem else f" of notebook {asked_in[:2]}"
    return ("for Question " if len(numbers) == 1 else "for Questions ") + " and ".join(numbers) + where


def header(stem: str, date: str) -> list[str]:
    return [f"# Reference run · {stem}", "",
            f"What notebook {stem[:2]} (`{stem}.ipynb`) printed and drew in the course's reference run ({date}): "
            "the course's own answers to every task of notebooks 01 to 09, run top to bottom on the default `shapes` "
            "data, with notebook 06's model trained in full. **Answer from your own run** when your notebooks run; if "
            "your model of notebooks 05 and 06 does not train, answer the written questions from these numbers and "
            "figures instead, and say so in your answer. Your own numbers will differ: every run does, and a model "
            "built with PyTorch's layers (`LAYERS = \"torch\"`) more.", "",
            f"This file is `reference_run/{stem}.md` in the course repository, its figures the PNG files of "
            f"`reference_run/{stem}/`. On Colab the first cell of each notebook put the course in "
            f"`{COLAB_KIT}`: open the folder icon on the left, then `attention-transformers/reference_run/` (a double "
            "click opens a file). The course repository's page on GitHub shows this file with its figures.", ""]


def render(stem: str, executed_nb, date: str | None = None) -> tuple[str, dict[str, bytes]]:
    """(the Markdown, {figure's file name: PNG bytes}) of notebook `stem` from its executed copy."""
    solution = notebooks.read(notebooks.SOLUTIONS / f"{stem}.ipynb")
    lines = header(stem, date or time.strftime("%Y-%m-%d"))
    figures: dict[str, bytes] = {}
    for block in BLOCKS[stem]:
        cell = _cell(executed_nb, block.cell)
        given = _cell(solution, block.cell)
        meta = notebooks.nbgrader_meta(given)
        if meta.get("solution") or meta.get("grade"):
            raise ValueError(f"{stem} {block.cell}: a graded or solution cell; only given cells' output ships")
        lines += [f"## {block.title} ({_for_questions(stem, block)})", "",
                  f"<!-- cell {block.cell}, source {source_hash(given.source)} -->", ""]
        printed = printed_lines(cell)
        lines += ["```text", *printed, "```", ""] if printed else ["(nothing printed)", ""]
        for k, png in enumerate(cell_figures(cell), start=1):
            name = f"{block.cell}_{k}.png"
            figures[name] = small_png(png)
            lines += [f"![{block.title}, figure {k}]({stem}/{name})", ""]
    return "\n".join(lines).rstrip("\n") + "\n", figures


def write(executed: dict, folder: Path = FOLDER, date: str | None = None) -> list[Path]:
    """Write `folder`/<stem>.md and `folder`/<stem>/*.png for each notebook of `BLOCKS` in `executed`
    ({stem: executed notebook}); return the Markdown files written."""
    written = []
    for stem, nb in executed.items():
        if stem not in BLOCKS:
            continue
        text, figures = render(stem, nb, date)
        folder.mkdir(parents=True, exist_ok=True)
        figure_dir = folder / stem
        if figure_dir.exists():
            shutil.rmtree(figure_dir)
        figure_dir.mkdir()
        for name, png in figures.items():
            (figure_dir / name).write_bytes(png)
        if stem in EXPLORERS:
            data = explorer_data(_cell(nb, EXPLORERS[stem]))
            if data is not None:  # (tests/test_explorer.py fails where a full run's file is missing)
                (figure_dir / "explorer.json").write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
        (folder / f"{stem}.md").write_text(text, encoding="utf-8")
        written.append(folder / f"{stem}.md")
    return written


def recorded_hashes(text: str) -> dict[str, str]:
    """{cell grade_id: source hash} as a file of the folder records them."""
    return dict(re.findall(r"<!-- cell (\S+), source ([0-9a-f]{12}) -->", text))


def folder_bytes(folder: Path = FOLDER) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
