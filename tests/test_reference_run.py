"""The reference run (reference_run/, grading/reference_run.py): the printed numbers and figures the written
questions of notebooks 06 and 07 can be answered from when a student's model does not train.

The folder is small, holds only the given cells' printed lines and figures, is named by every question it
serves, and is in step with the solution notebooks: each block records a hash of its cell's source, which must
be the current one (the cheap check, always run), and a fresh run of notebooks 05 to 07 prints the same lines,
in the same order, with the same figures, and numbers near the folder's (where this machine runs them: the Colab
walk's run, else the notebooks executed here).
"""
from __future__ import annotations

import base64
import io
import re

import nbformat
import pytest
from support import colab

from grading import execute
from grading import notebooks as nbs
from grading import reference_run as rr
from grading.publish import LeakError, check_no_leak

FIX = "`python -m grading execute` (a full run: `python3 kit.py run`) rewrites reference_run/"


def _text(stem: str) -> str:
    return (rr.FOLDER / f"{stem}.md").read_text(encoding="utf-8")


def test_the_folder_holds_one_file_per_notebook_and_its_figures():
    assert {p.name for p in rr.FOLDER.iterdir()} == {f"{s}.md" for s in rr.BLOCKS} | set(rr.BLOCKS)
    for stem in rr.BLOCKS:
        linked = set(re.findall(rf"\]\({stem}/([\w.-]+\.png)\)", _text(stem)))
        explorer = {"explorer.json"} if stem in rr.EXPLORERS else set()  # the explorer's data (starter/explorer.py)
        assert linked | explorer == {p.name for p in (rr.FOLDER / stem).iterdir()}, f"{stem}: figures linked and held differ"
        assert linked, f"{stem}: no figure"


def test_the_folder_is_small():
    from PIL import Image

    assert rr.folder_bytes() < rr.MAX_BYTES, f"reference_run/ is {rr.folder_bytes()} bytes"
    for png in rr.FOLDER.rglob("*.png"):
        assert Image.open(png).width <= rr.MAX_WIDTH, png


@pytest.mark.parametrize("stem", list(rr.BLOCKS))
def test_each_block_is_of_the_current_cell(stem):
    """The cheap check of staleness: the hash each block records is that of its cell's source now."""
    recorded = rr.recorded_hashes(_text(stem))
    solution = nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb")
    current = {b.cell: rr.source_hash(rr._cell(solution, b.cell).source) for b in rr.BLOCKS[stem]}
    assert recorded == current, f"{stem}: a cell changed since reference_run/ was written; {FIX}"
    for block in rr.BLOCKS[stem]:
        assert f"## {block.title} ({rr._for_questions(stem, block)})" in _text(stem), \
            f"{stem}: {block.title!r} is not headed as it would be now (question numbers?); {FIX}"


def test_the_folder_holds_no_code_and_no_path_of_this_machine(tmp_path):
    for stem in rr.BLOCKS:
        text = _text(stem)
        assert "BEGIN SOLUTION" not in text and "def " not in text and "import " not in text
        assert not re.search(r"(?<![\w.])/(work|home|tmp|Users)/", text), f"{stem}: an absolute path"
        assert "using your" not in text and "✓" not in text
        for block in rr.BLOCKS[stem]:  # only given cells' output
            meta = nbs.nbgrader_meta(rr._cell(nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb"), block.cell))
            assert not meta.get("solution") and not meta.get("grade"), (stem, block.cell)
    check_no_leak(rr.FOLDER.parent / "reference_run")  # the publish check, on the folder alone
    planted = tmp_path / "reference_run"
    planted.mkdir()
    (planted / "x.md").write_text("### BEGIN SOLUTION\n")
    with pytest.raises(LeakError):
        check_no_leak(tmp_path)


def test_every_question_it_serves_names_it():
    """Each written question whose numbers the folder holds says where, in the solution and the release
    notebook, with the Colab path; the student copy's README names the folder."""
    from grading.publish import README

    assert rr.QUESTION_FILES, "no question served"
    for (stem, md_id), files in rr.QUESTION_FILES.items():
        for folder in (nbs.SOLUTIONS, nbs.RELEASE):
            source = rr._cell(nbs.read(folder / f"{stem}.ipynb"), md_id).source
            for name in files:
                assert f"`{name}`" in source, f"{folder.name}/{stem} {md_id} does not name {name}"
            assert "If your own model does not train" in source and rr.COLAB_KIT in source, (stem, md_id)
    assert "reference_run/08_decoding.md" in README and "/content/attention-transformers/reference_run/" in README


def _fake_executed(stem: str, printed: dict[str, str], figure: bytes):
    nb = nbs.read(nbs.SOLUTIONS / f"{stem}.ipynb")
    for cell in nb.cells:
        gid = nbs.nbgrader_meta(cell).get("grade_id")
        if gid in printed:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed[gid]),
                            nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
                            nbformat.v4.new_output("display_data", data={
                                "image/png": base64.b64encode(figure).decode(), "text/plain": "<Figure>"})]
    return nb


def test_render_keeps_the_printed_lines_and_shrinks_the_figures(tmp_path):
    """What `write` makes of an executed notebook: each block's stdout less the loader's lines, its figures
    scaled down and linked; stderr and text results left out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(13, 4), dpi=100)
    fig.gca().plot(range(10))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    chatter = ("CaptioningTransformer from /work/main/solutions/05_captioning_model.ipynb\n"
               "using your fit\n✓ beam/basic passed\n")
    printed = {b.cell: chatter + f"the numbers of {b.cell}: 1.5%\n" for b in rr.BLOCKS["08_decoding"]}
    (md,) = rr.write({"08_decoding": _fake_executed("08_decoding", printed, buf.getvalue()),
                      "06_training": nbs.read(nbs.SOLUTIONS / "06_training.ipynb")},
                     tmp_path, date="2026-01-01")
    text = md.read_text()
    assert {p.name for p in tmp_path.iterdir()} == {"08_decoding.md", "08_decoding"}
    for block in rr.BLOCKS["08_decoding"]:
        assert f"```text\nthe numbers of {block.cell}: 1.5%\n```" in text
        assert f"](08_decoding/{block.cell}_1.png)" in text
    assert "from /work" not in text and "using your" not in text and "a warning" not in text and "✓" not in text
    assert "2026-01-01" in text and rr.COLAB_KIT in text
    from PIL import Image
    for png in (tmp_path / "08_decoding").iterdir():
        assert Image.open(png).width == rr.MAX_WIDTH and png.stat().st_size < len(buf.getvalue())


# ------------------------------------------------------------------ against a fresh run (slow)
STEMS = ("06_training", *rr.BLOCKS)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@pytest.fixture(scope="module")
def fresh(request, tmp_path_factory) -> dict:
    """The executed notebooks 06 to 09 of a full run: the Colab walk's where this machine simulates Colab, else
    run here one after the other in one folder (07 to 09 load 06's checkpoint)."""
    if colab.available():
        executed = request.getfixturevalue("colab_walk")["executed"]
        return {stem: executed[stem] for stem in STEMS}
    out = tmp_path_factory.mktemp("executed")
    done = {}
    for stem in STEMS:
        result = execute.execute_notebook(nbs.SOLUTIONS / f"{stem}.ipynb", out, timeout=900,
                                          figures_dir=out / "figures" / stem)
        assert result["ok"], result["errors"]
        done[stem] = nbs.read(out / f"{stem}.ipynb")
    return done


def _blocks(text: str) -> dict[str, list[str]]:
    """{heading: its lines} of a Markdown file of the folder (printed lines and figure links)."""
    out: dict[str, list[str]] = {}
    for part in text.split("\n## ")[1:]:
        heading, _, body = part.partition("\n")
        out[heading] = [line for line in body.splitlines() if line and not line.startswith(("<!--", "```"))]
    return out


def _prefix(line: str) -> str:
    """A printed line up to its first number: what stays the same from run to run."""
    return _NUMBER.split(line, 1)[0]


@pytest.mark.parametrize("stem", list(rr.BLOCKS))
def test_the_folder_is_what_a_run_prints_now(fresh, stem, tmp_path):
    """A fresh run, rendered, has the folder's blocks, the same number of printed lines and figures in each, and
    each line begins alike; the key numbers (`execute.KEY_NUMBERS`) differ by little, as between two runs."""
    (md,) = rr.write({stem: fresh[stem]}, tmp_path)
    now, stored = _blocks(md.read_text()), _blocks(_text(stem))
    assert list(now) == list(stored), f"{stem}: other blocks than reference_run/ holds; {FIX}"
    for heading in now:
        assert len(now[heading]) == len(stored[heading]), f"{stem} {heading}: other lines; {FIX}"
        for a, b in zip(now[heading], stored[heading]):
            assert _prefix(a)[:12] == _prefix(b)[:12], f"{stem} {heading}: {a!r} against {b!r}; {FIX}"
    ours, theirs = (execute.key_numbers(text) for text in (md.read_text(), _text(stem)))
    assert set(ours) == set(theirs)
    for name, value in ours.items():
        tolerance = 0.08 if isinstance(value, float) and value <= 1 else 0.15 * abs(theirs[name]) + 1
        assert abs(value - theirs[name]) <= tolerance, f"{stem} {name}: {value} now, {theirs[name]} stored; {FIX}"


def test_a_full_run_writes_the_folder_and_a_partial_one_does_not(tmp_path, monkeypatch):
    """`execute_all(reference=...)` (what `python -m grading execute` passes when it writes into build/) rewrites
    the folder after a run of every notebook that passes, and leaves it alone after a run of some notebooks or a
    failing one; `python -m grading execute --out DIR` passes no folder."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(3, 2))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    ok = {"value": True}

    def fake_execute(path, out_dir, figures_dir=None, km=None, exports=None, **_):
        printed = {b.cell: f"printed by {b.cell}: 2.5%\n" for b in rr.BLOCKS.get(path.stem, ())}
        out_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(_fake_executed(path.stem, printed, buf.getvalue()), str(out_dir / path.name))
        return {"name": path.stem, "seconds": 1.0, "ok": ok["value"], "errors": [], "tests": 1, "tests_passed": 1,
                "figures": 0, "numbers": {}, "html": None}

    monkeypatch.setattr(execute, "execute_notebook", fake_execute)
    monkeypatch.setattr(execute, "start_kernel", lambda *a, **k: execute.StartedKernel(None, None))
    folder = tmp_path / "reference_run"
    run = dict(out=tmp_path / "executed", figures=tmp_path / "figures", index=tmp_path / "index.md", reference=folder)
    assert execute.execute_all(["06"], **run) and not folder.exists()
    ok["value"] = False
    assert not execute.execute_all(None, **run) and not folder.exists()
    ok["value"] = True
    assert execute.execute_all(None, **run)
    assert {p.name for p in folder.iterdir()} == {f"{s}.md" for s in rr.BLOCKS} | set(rr.BLOCKS)
    assert "printed by code_leaky: 2.5%" in (folder / "08_decoding.md").read_text()

    from grading import __main__ as cli
    calls = []
    monkeypatch.setattr(execute, "execute_all", lambda names, out, **kw: calls.append((out, kw)) or True)
    cli.main(["execute", "--out", str(tmp_path / "x")])
    cli.main(["execute"])
    assert calls[0][1]["reference"] is None and calls[1][1]["reference"] == rr.FOLDER


def test_q16_model_answer_says_what_the_reference_run_printed():
    """Question 16's model answer (notebook 09): the rollout localises far better than the last layer's map and
    about as well as the best single layer, and its accuracy grows with the residual share; in the course's
    reference run, section 7."""
    text = (rr.FOLDER / "09_visualizing_attention.md").read_text(encoding="utf-8")
    line = re.search(r"localisation accuracy, exact cell: (.*)", text).group(1)
    layers = [float(v) for v in re.findall(r"layer \d+ ([\d.]+)%", line)]
    rollout = float(re.search(r"rollout ([\d.]+)%", line).group(1))
    shares = [float(v) for v in re.findall(r"0\.\d: ([\d.]+)%", re.search(r"another residual share: (.*)", text).group(1))]
    (answer,) = [c.source for c in nbs.read(nbs.SOLUTIONS / "09_visualizing_attention.ipynb").cells
                 if nbs.nbgrader_meta(c).get("grade_id") == "q_explorer"]
    assert "far better than the last layer's map" in answer and rollout > layers[-1] + 10, (rollout, layers)
    assert "about as well as layer 0's map, the best single layer" in answer
    assert max(layers) == layers[0] and abs(rollout - layers[0]) < 5, (rollout, layers)
    assert "The number grows with the residual share" in answer and shares == sorted(shares) and len(shares) == 3


def test_q16_model_answers_explorer_example_is_in_the_shipped_explorer():
    """Question 16 (b)'s example, val image 5 of the reference run's explorer: for "cross", layer 0 and the rollout
    (the solution's, on the stored weights) peak on the cross's cell, the last layer on the square's, and the step's
    self-attention weighs `<START>` most."""
    import torch

    from starter.data import load_dataset
    from starter.explorer import reference_explorer

    (answer,) = [c.source for c in nbs.read(nbs.SOLUTIONS / "09_visualizing_attention.ipynb").cells
                 if nbs.nbgrader_meta(c).get("grade_id") == "q_explorer"]
    assert 'val image 5 ("a small red square below a large green cross")' in answer
    ex = reference_explorer(rr.FOLDER.parent)
    caption = ex.data["captions"][5]
    assert caption["title"].startswith("val image 5: a small red square below a large green cross")
    cells = {o["shape"]: o["cell"] for o in load_dataset("shapes").split("val").objects(5)}
    cross, self_attn = ex.attention(5)
    step = caption["tokens"].index("cross") - 1                     # the step that produced "cross"
    rollout = nbs.execute_definitions(nbs.SOLUTIONS / "09_visualizing_attention.ipynb")["rollout_to_regions"]
    rolled = rollout(torch.from_numpy(self_attn)[:, None], torch.from_numpy(cross)[:, None])[0]
    assert int(cross[0].mean(0)[step].argmax()) == int(rolled[step].argmax()) == cells["cross"]
    assert int(cross[-1].mean(0)[step].argmax()) == cells["square"]
    assert int(self_attn[-1].mean(0)[step, : step + 1].argmax()) == 0   # <START>
