"""The student copy holds what students need and nothing private."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading import intake
from grading import notebooks as nbs
from grading.outcome import StudentOutcome
from grading.publish import LeakError, MissingPathError, check_mentions, check_no_leak, publish


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    return publish(tmp_path_factory.mktemp("student") / "kit")


def test_student_copy_has_the_release_and_starter(copy):
    assert {p.name for p in (copy / "notebooks").glob("*.ipynb")} == {p.name for p in nbs.RELEASE.glob("*.ipynb")}
    assert {p.name for p in (copy / "starter" / "references").glob("*.h5")} == \
        {p.name for p in nbs.PUBLIC_REFERENCES.glob("*.h5")}
    assert not (copy / "solutions").exists() and not (copy / "grading").exists() and not (copy / "tests").exists()
    # the starter package works from the copy alone (no import of the private grading package)
    code = "import starter.checks, starter.data, starter.plotting, starter.notebook_loader; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True,
                         env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})
    assert out.stdout.strip() == "ok", out.stderr[-500:]


def test_leaks_are_caught(copy, tmp_path):
    planted = tmp_path / "planted"
    shutil.copytree(copy, planted)
    shutil.copy(nbs.solution_notebooks()[0], planted / "notebooks" / "extra.ipynb")
    with pytest.raises(LeakError, match="BEGIN SOLUTION"):
        check_no_leak(planted)
    (planted / "notebooks" / "extra.ipynb").unlink()
    shutil.copy(next(nbs.HIDDEN_REFERENCES.glob("*.h5")), planted / "starter" / "references" / "more.h5")
    with pytest.raises(LeakError, match="hidden reference cases"):
        check_no_leak(planted)


def test_repo_address_reaches_the_first_cell_and_the_badges(tmp_path):
    dest = publish(tmp_path / "kit", repo="my-uni/attention-2027")
    for nb in (dest / "notebooks").glob("*.ipynb"):
        text = nb.read_text()
        assert "https://github.com/my-uni/attention-2027.git" in text, f"{nb.name}: first cell still clones the default"
        assert f"colab.research.google.com/github/my-uni/attention-2027/blob/main/notebooks/{nb.name}" in text
        assert "attention-course-kit/attention-transformers" not in text
    assert "github/my-uni/attention-2027/blob/main/notebooks/01_" in (dest / "README.md").read_text()


# ---------------------------------------------------------------------------------- handing in
HAND_IN = ["ten notebooks", "runs/captioning_transformer.pt", "My Drive/attention-course", "My Drive/Colab Notebooks"]


def test_readme_says_what_to_hand_in_and_where_it_is(copy):
    readme = (copy / "README.md").read_text()
    handing_in = readme.split("## Handing in", 1)[-1]
    assert "## Handing in" in readme
    for words in HAND_IN:
        assert words in readme, f"the student README does not say {words!r}"
    assert "runs/captioning_transformer.pt" in handing_in and "next to the notebooks" in handing_in
    assert "notebooks/runs/captioning_transformer.pt" in readme  # where a local copy keeps it
    assert "Submit the `.ipynb` files" not in readme  # the old line, which left the model out


def test_each_notebook_ends_with_what_to_hand_in(copy):
    for path in sorted((copy / "notebooks").glob("*.ipynb")):
        cells = nbs.read(path).cells
        last = cells[-1]
        assert last.cell_type == "markdown", f"{path.name}: ends with a {last.cell_type} cell"
        for words in HAND_IN + ["course folder"]:
            assert words in last.source, f"{path.name}: its last cell does not say {words!r}"


# Paths the copy may name without holding them: what a student's own work creates.
STUDENT_CREATED = {"runs", "runs/captioning_transformer.pt", "runs/captioning_transformer_coco-grid.pt",
                   "runs/captioning_transformer_coco-fc7.pt", "notebooks/runs/captioning_transformer.pt",
                   "data/cache", "runs/captioning_transformer.csv", "runs/captioning_transformer.json",
                   "runs/resume_check", "runs/resume_check/one_go.pt", "runs/resume_check/resumed.pt"}  # 05's scripts
# a relative path (not inside a URL or an absolute path) or a bare file name
PATH_MENTION = re.compile(r"(?<![\w./:@~-])((?:[\w.-]+/)+[\w.*…-]*|[\w-]+\.(?:py|ipynb|md|toml|txt|yml|pt|h5))")


def named_but_absent(copy: Path) -> list[str]:
    """Every mention, in any text file of the copy, of a path of this repository (one starting with a name at
    its top: kit.py, benchmarks/, grading/, solutions/, tests/, docs/, ...) that the copy does not hold."""
    top = {p.name for p in nbs.ROOT.iterdir() if not p.name.startswith(".")} | {"kit.py", "runs"}
    absent = []
    for path in sorted(copy.rglob("*")):
        if not path.is_file() or path.suffix not in {".ipynb", ".py", ".md", ".toml", ".txt", ".yml", ""}:
            continue
        for mention in PATH_MENTION.findall(path.read_text(encoding="utf-8", errors="replace")):
            name = mention.rstrip("/").split("…")[0].rstrip("_")
            if name.split("/")[0] not in top or name in STUDENT_CREATED:
                continue
            held = any(copy.glob(name + "*")) if "…" in mention or "*" in mention else (copy / name).exists()
            if not held:
                absent.append(f"{path.relative_to(copy)}: {mention}")
    return absent


def test_the_copy_names_only_what_it_holds(copy):
    assert named_but_absent(copy) == []


def test_a_mention_of_what_the_copy_lacks_is_caught(copy, tmp_path):
    planted = tmp_path / "planted"
    shutil.copytree(copy, planted)
    nb = planted / "notebooks" / "01_scaled_dot_product_attention.ipynb"
    nb.write_text(nb.read_text().replace("Run this cell first.", "Run `python3 kit.py setup` first.", 1))
    assert named_but_absent(planted) == [f"notebooks/{nb.name}: kit.py"]
    with pytest.raises(MissingPathError, match="kit.py"):
        check_mentions(planted)
    nb.write_text(nb.read_text().replace("kit.py setup", "benchmarks/bench_prenorm.py"))
    with pytest.raises(MissingPathError, match="benchmarks/bench_prenorm.py"):
        check_mentions(planted)


def test_the_copys_packaging_installs_what_the_kits_does(copy):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    ours, theirs = (tomllib.loads((root / "pyproject.toml").read_text()) for root in (nbs.ROOT, copy))
    assert theirs["project"] == ours["project"]
    assert theirs["tool"]["setuptools"]["packages"]["find"]["include"] == ["starter*", "data*"]
    pins = [line for line in (nbs.ROOT / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert (copy / "requirements.txt").read_text().splitlines() == pins


@pytest.mark.parametrize("where", ["runs", "beside"])
def test_intake_takes_what_the_copy_says_to_hand_in(copy, tmp_path, where):
    """The ten notebooks (05 as Colab's "Copy of" from My Drive/Colab Notebooks) and the checkpoint, under
    its name, in a runs/ folder or next to the notebooks: all ten are graded and the checkpoint is kept."""
    student = tmp_path / "class" / "ada"
    for path in (copy / "notebooks").glob("*.ipynb"):
        name = f"Copy of {path.name}" if path.name.startswith("05_") else path.name
        (student / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, student / name)
    checkpoint = student / ("runs" if where == "runs" else "") / "captioning_transformer.pt"
    checkpoint.parent.mkdir(exist_ok=True)
    checkpoint.write_bytes(b"the trained weights")
    (handin,), loose = intake.handins(tmp_path / "class", {})
    result, staged = StudentOutcome(student="ada"), tmp_path / "staged"
    intake.collect(handin, {p.name[:2]: p.stem for p in nbs.RELEASE.glob("*.ipynb")}, result, staged)
    assert sorted(result.notebooks) == sorted(p.stem for p in nbs.RELEASE.glob("*.ipynb")), result.notes
    assert (staged / nbs.TRAINED_CHECKPOINT).read_bytes() == b"the trained weights"
    assert not [note for note in result.notes if "captioning_transformer" in note], result.notes


def test_the_reference_run_ships(copy):
    """reference_run/ (grading/reference_run.py), which the written questions of notebooks 07 to 09 name, is in
    the copy as it is here, and the copy's README says what it is for."""
    here = sorted(p.relative_to(nbs.ROOT) for p in (nbs.ROOT / "reference_run").rglob("*") if p.is_file())
    assert here, "no reference_run/ to ship"
    assert sorted(p.relative_to(copy) for p in (copy / "reference_run").rglob("*") if p.is_file()) == here
    assert all((copy / rel).read_bytes() == (nbs.ROOT / rel).read_bytes() for rel in here)
    readme = (copy / "README.md").read_text()
    assert "## If your model does not train" in readme and "reference_run/09_visualizing_attention.md" in readme
