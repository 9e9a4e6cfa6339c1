"""The main job's runner (grading.execute): figures come out as PNG and in the HTML, key numbers are parsed,
and an Agg backend in the parent's environment does not reach the kernels. One tiny notebook, tmp paths."""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import re

import nbformat
import pytest
from conftest import ROOT

from grading import execute

FIGURE = "import matplotlib.pyplot as plt\nplt.plot([0, 1, 4])\nplt.title('tiny')\nplt.show()"
PRINTS = ("import os\nprint('backend', os.environ.get('MPLBACKEND'))\n"
          "print('hidden', os.environ.get('COURSE_HIDDEN_REFERENCES'))\nprint('BLEU-4 0.95')")


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")  # what `kit.py test` gives pytest: must not reach the kernel
    monkeypatch.delenv("COURSE_HIDDEN_REFERENCES", raising=False)
    path = tmp_path / "src" / "07_tiny.ipynb"
    path.parent.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(FIGURE), nbformat.v4.new_code_cell(PRINTS)])
    nbformat.write(nb, str(path))
    return path


def test_execute_notebook_writes_png_html_and_numbers(tiny, tmp_path):
    environ_before = dict(os.environ)
    r = execute.execute_notebook(tiny, tmp_path / "executed", timeout=60, figures_dir=tmp_path / "figures")
    assert r["ok"], r["errors"]
    assert dict(os.environ) == environ_before  # the kernel's environment never passes through os.environ
    assert r["figures"] == 1
    (png,) = (tmp_path / "figures").glob("*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = tmp_path / "executed" / "07_tiny.html"
    assert r["html"] == str(html)
    assert base64.b64encode(png.read_bytes()).decode()[:200] in html.read_text(encoding="utf-8")
    assert (tmp_path / "executed" / "07_tiny.ipynb").exists()
    assert r["numbers"] == {"BLEU-4": 0.95}
    printed = execute.printed_text(nbformat.read(str(tmp_path / "executed" / "07_tiny.ipynb"), 4))
    assert f"backend {execute.INLINE_BACKEND}" in printed
    assert f"hidden {execute.notebooks.HIDDEN_REFERENCES}" in printed


def test_a_warmed_kernel_has_the_libraries_loaded_and_no_name_bound(tmp_path):
    # kit.py run imports torch & co. in the next notebook's kernel while one runs: the notebook must still see
    # the namespace of a fresh kernel (a forgotten import fails, as it would for a student), cells counted from 1
    probe = (f"import sys\nprint('loaded', all(m in sys.modules for m in {execute.WARM_UP!r}))\n"
             "print('names', sorted(n for n in dir() if not n.startswith('_')))")
    seen = {}
    for warm in (True, False):
        path = tmp_path / f"src{warm}" / "01_names.ipynb"
        path.parent.mkdir()
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(probe)]), str(path))
        kernel = execute.start_kernel(tmp_path / f"executed{warm}", warm_up=warm)
        if kernel.warming is not None:
            kernel.warming.join()  # as in kit.py run, where the warm-up overlaps the notebook before
        execute.execute_notebook(path, tmp_path / f"executed{warm}", timeout=120, figures_dir=tmp_path / "figures",
                                 km=kernel.manager)
        cell = nbformat.read(str(tmp_path / f"executed{warm}" / path.name), 4).cells[0]
        seen[warm] = ("".join(o.get("text", "") for o in cell.outputs), cell.execution_count)
    assert "loaded True" in seen[True][0], seen
    assert seen[True][0].splitlines()[1] == seen[False][0].splitlines()[1], seen  # the same names
    assert seen[True][1] == seen[False][1] == 1


def test_execute_all_prints_the_index_and_writes_it(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(execute.notebooks, "solution_notebooks", lambda: [tiny])
    index = tmp_path / "index.md"
    assert execute.execute_all(None, tmp_path / "executed", tmp_path / "figures", index)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines  # what it runs, the header, one row, the summary: nothing else
    assert lines[1].split()[:2] == ["notebook", "time"]
    assert lines[2].startswith("07_tiny") and "PASS" in lines[2] and "BLEU-4 0.950" in lines[2]
    assert lines[3].startswith("1/1 notebooks passed") and "1 figure in" in lines[3]
    assert (tmp_path / "figures" / "07_tiny").is_dir()
    assert "| 07_tiny |" in index.read_text()
    (saved,) = json.loads(index.with_suffix(".json").read_text())
    assert saved["figures"] == 1 and saved["numbers"] == {"BLEU-4": 0.95}


def test_key_numbers_of_the_solution_prints():
    """The lines notebooks 04 and 05 print (as in an executed copy); the first BLEU-4 is the full evaluation."""
    text = ("overfit 8 captions for 150 steps: loss 3.739 -> 0.0026 (0.8 s) ✓ passed\n"
            "training on cpu (CPU, 2 threads): 700 steps in 85 s\n"
            "final validation loss 0.136\n"
            "saved runs/captioning_transformer.pt\n"
            "greedy, 500 validation images (4.7 s):\n"
            "BLEU-1 0.995  BLEU-2 0.988  BLEU-3 0.975  BLEU-4 0.954  CIDEr 7.536  ROUGE-L 0.972\n"
            "greedy      (  0.9 s): BLEU-1 0.996  BLEU-2 0.985  BLEU-3 0.967  BLEU-4 0.939  CIDEr 7.432  ROUGE-L 0.969\n")
    n = execute.key_numbers(text)
    assert n == {"train_steps": 700, "train_seconds": 85.0, "eval_images": 500, "BLEU-4": 0.954, "CIDEr": 7.536}
    assert execute.format_numbers(n) == "BLEU-4 0.954, CIDEr 7.536 (500 val images, 700 training steps in 85 s)"
    script = ("training on cpu: 700 steps in 41 s (the script, start-up included)\nsaved runs/captioning_transformer.pt\n"
              "greedy, 500 validation images; wrote runs/captioning_transformer.json\n"
              "BLEU-1 0.996  BLEU-2 0.991  BLEU-3 0.982  BLEU-4 0.970  CIDEr 7.508  ROUGE-L 0.982\n"
              "exact match: 84.2% of the captions equal one of their image's references (8.3 s, start-up included)\n")
    assert execute.format_numbers(execute.key_numbers(script)) == \
        "BLEU-4 0.970, CIDEr 7.508 (500 val images, 700 training steps in 41 s, evaluated in 8 s); exact-match 84.2%"
    cut = ("training on cpu (CPU, 2 threads): 420 of 700 steps in 185 s (time budget 180 s: the schedule was "
           "compressed)\nfinal validation loss 0.2\nsaved runs/captioning_transformer.pt\n")
    assert execute.key_numbers(cut) == {"train_steps": 420, "train_steps_planned": 700, "train_seconds": 185.0}
    # a side experiment's run (06's leaky model) saves nothing: its steps are not the evaluated model's
    side = "training on cpu (CPU, 2 threads): 150 steps in 31 s\nyour model (700 steps): teacher-forced val loss 0.1\n"
    assert execute.key_numbers(side) == {}
    assert execute.key_numbers(side.replace("31 s", "5.3 s")) == {}
    text = ("localisation accuracy, last layer, mean of heads, exact cell: 65.7%   (chance 2.0%)\n"
            "localisation accuracy, last layer, mean of heads, within 1 cell (3 x 3 block): 77.7%   (chance 18.4%)\n"
            "128 of 500 validation captions (26%) match no reference\n")
    n = execute.key_numbers(text)
    assert n == pytest.approx({"localisation": 0.657, "chance": 0.02, "localisation_3x3": 0.777, "chance_3x3": 0.184,
                               "exact_match": 0.744, "exact_match_images": 500})
    assert execute.format_numbers(n) == ("exact-match 74.4% of 500; localisation 65.7% vs chance 2.0% "
                                         "(3x3: 77.7% vs 18.4%)")
    assert execute.key_numbers("exact match: 87.5% of validation captions\n") == {"exact_match": 0.875}
    assert execute.key_numbers("nothing to see\n") == {} and execute.format_numbers({}) == "-"


def test_key_numbers_of_notebook_10():
    """The course's caption length is the first line of the cache's table, four times it another; the blocks' figures
    are those of the longest sequence."""
    text = ("  15 words:    0.69 ms per caption without the cache,   0.15 ms with it ( 4.6x faster) | positions run:   "
            "120 against   15 ( 8.0x)\n"
            "  60 words:    8.34 ms per caption without the cache,   0.72 ms with it (11.6x faster) | positions run:  "
            "1830 against   60 (30.5x)\n"
            "T =   256: largest tensor held, in numbers: blocks    16,384 (0.002 s) | plain      65,536 (0.001 s) | x\n"
            "T =  4096: largest tensor held, in numbers: blocks   262,144 (0.197 s) | plain  16,777,216 (0.074 s) | x\n")
    n = execute.key_numbers(text)
    assert n == {"cache_words": 15, "cache_less_work": 8.0, "cache_less_work_4x": 30.5, "held_T": 4096,
                 "held_blocks": 262144, "held_plain": 16777216}
    assert execute.format_numbers(n) == ("the cache runs 8.0x fewer word positions per caption of 15 words, 30.5x of 60; "
                                         "at T = 4,096 attention in blocks holds 262,144 numbers at most, all at once "
                                         "16,777,216")


def test_kit_run_leaves_the_backend_to_the_kernels(monkeypatch):
    spec = importlib.util.spec_from_file_location("kit", ROOT / "kit.py")
    kit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kit)
    monkeypatch.delenv("MPLBACKEND", raising=False)
    assert "MPLBACKEND" not in kit._env("run")
    assert kit._env("test")["MPLBACKEND"] == "Agg"


def test_the_run_figures_are_written_into_the_readme_block(tmp_path):
    """A run of every notebook writes its figures between the README's two marker lines, and only there."""
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{execute.RUN_FIGURES[0]}\nold figures\n{execute.RUN_FIGURES[1]}\nafter\n")
    result = {"name": "07_generation_and_evaluation", "seconds": 41.6, "tests": 7, "tests_passed": 7,
              "numbers": {"BLEU-4": 0.972, "exact_match": 0.862}}
    execute.write_run_figures([result], readme)
    text = readme.read_text()
    assert text.startswith(f"before\n{execute.RUN_FIGURES[0]}\n") and text.endswith(f"{execute.RUN_FIGURES[1]}\nafter\n")
    assert "old figures" not in text
    points = execute.notebook_points(execute.notebooks.SOLUTIONS / "07_generation_and_evaluation.ipynb")
    hours = execute.student_hours(execute.notebooks.SOLUTIONS / "07_generation_and_evaluation.ipynb")
    assert f"| `07_generation_and_evaluation` | {points} | 42 s | 7/7 | BLEU-4 0.972; exact-match 86.2% | {hours:.2f} h |" in text
    execute.write_run_figures([result], readme, trained=(0.89, 0.85))  # what the trained-model cell measured
    assert "it captions 89% of the public case's new scenes and 85% of the hidden cases' exactly right" in readme.read_text()
    assert execute.trained_model_shares(tmp_path) is None  # no model saved there: nothing to say
    readme.write_text("no block\n")
    with pytest.raises(ValueError, match="no block of run figures"):
        execute.write_run_figures([result], readme)


def test_the_readme_gives_the_trained_model_shares_of_its_own_run():
    """The README's figures of the graded trained model are the run's (written with its run figures), measured as
    the grader measures a checkpoint: the model the run saved in build/executed, where there is one."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(execute.RUN_FIGURES[0]):text.index(execute.RUN_FIGURES[1])]
    found = re.search(r"it captions (\d+)% of the public case's new scenes and (\d+)% of the hidden", block)
    assert found, "the run figures do not give the trained model's shares: run `python3 kit.py run`"
    shares = execute.trained_model_shares(ROOT / "build" / "executed")
    if shares is not None:  # this machine ran the notebooks: its model, within what training varies by machine
        for shown, measured in zip(found.groups(), shares):
            assert abs(int(shown) / 100 - measured) <= execute.TRAINED_NUMBERS_VARY["exact_match"], (found.groups(), shares)


def test_another_machines_figures_agree_within_what_training_varies_and_nothing_else_does():
    """The README's figures were written on some machine; a run elsewhere trains a slightly other model. Its trained
    numbers may differ by `TRAINED_NUMBERS_VARY`, and its seconds freely; a count, a label or a larger difference
    is a stale README, named."""
    run = {"BLEU-4": 0.972, "CIDEr": 7.511, "eval_images": 500, "train_steps": 700, "train_seconds": 44.0,
           "exact_match": 0.844, "localisation": 0.59, "chance": 0.02}
    shown = execute.format_numbers({**run, "BLEU-4": 0.970, "CIDEr": 7.508, "train_seconds": 42.0,
                                    "exact_match": 0.842, "localisation": 0.588})
    assert execute.figures_disagree(shown, run) == []
    vary = execute.TRAINED_NUMBERS_VARY
    far = execute.format_numbers({**run, "exact_match": run["exact_match"] - 2 * vary["exact_match"]})
    assert [p.split()[0] for p in execute.figures_disagree(far, run)] == ["exact_match"]
    for stale in ({**run, "eval_images": 400}, {**run, "train_steps": 600}, {**run, "chance": 0.03},
                  {k: v for k, v in run.items() if k != "CIDEr"}):
        assert execute.figures_disagree(execute.format_numbers(stale), run), stale
    beam = {"BLEU-4": 0.97, "CIDEr": 7.5, "beam_k": 3, "beam_BLEU-4": 0.998, "eval_images": 100}
    assert execute.figures_disagree(execute.format_numbers({**beam, "beam_BLEU-4": 0.99}), beam) == []
    assert execute.figures_disagree(execute.format_numbers({**beam, "beam_BLEU-4": 0.9}), beam)
    assert f"within {vary['BLEU-4']:g} of BLEU-4" in execute.run_figures([], date="d", machine="m")


def test_the_readme_figures_are_those_of_the_notebooks_as_they_are():
    """The README's run figures name every solution notebook with its points as the notebook has them: after a
    notebook is added, renamed or regraded, `python3 kit.py run` must be run again."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(execute.RUN_FIGURES[0]):text.index(execute.RUN_FIGURES[1])]
    rows = {line.split("|")[1].strip().strip("`"): int(line.split("|")[2]) for line in block.splitlines()
            if line.startswith("| `")}
    assert rows == {p.stem: execute.notebook_points(p) for p in execute.notebooks.solution_notebooks()}, \
        "the README's run figures are stale: run `python3 kit.py run`"


def test_every_notebook_fits_a_sitting():
    """No notebook asks more than a sitting of a student by the course's estimate (what it has a student read and
    write)."""
    hours = {p.stem: execute.student_hours(p) for p in execute.notebooks.solution_notebooks()}
    assert max(hours.values()) <= execute.MOST_HOURS, hours


def test_a_training_run_without_scores_still_shows_its_steps():
    """The training notebook prints its run's steps and time but no scores (those are the next notebook's): its
    row says the steps."""
    numbers = {"train_steps": 700, "train_seconds": 18.2}
    assert execute.format_numbers(numbers) == "700 training steps in 18 s"
    assert "700 training steps in 18 s" in execute.format_numbers({**numbers, "BLEU-4": 0.96, "eval_images": 500})


def test_the_estimate_counts_what_a_student_reads_and_writes():
    work = execute.student_work(execute.notebooks.SOLUTIONS / "06_training.ipynb")
    assert work["tasks"] == 5 and work["questions"] == 1 and work["answer_lines"] <= 50, work
    assert execute.answer_lines("x = 1\n### BEGIN SOLUTION\n# why\ny = 2\n\nz = 3\n### END SOLUTION\n") == 2
