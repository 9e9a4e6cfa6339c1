"""Packaging: what `pip install` of the kit brings is what the notebooks import, and it builds cleanly."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

from grading.notebooks import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
STUDENT_DEPS = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]


def _pins(text: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^[\s-]*([A-Za-z0-9_.-]+)==([^\s#]+)", text, re.M)}


def test_environment_yml_matches_requirements():
    req = _pins((ROOT / "requirements.txt").read_text())
    env = _pins((ROOT / "environment.yml").read_text())
    assert req == env, {k: (req.get(k), env.get(k)) for k in set(req) | set(env) if req.get(k) != env.get(k)}


def _third_party_imports(folders) -> dict[str, str]:
    """Top-level module -> a file importing it, for imports outside the standard library and the kit."""
    local = {"starter", "data", "grading"}
    used: dict[str, str] = {}
    for folder in folders:
        for f in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names} - local - set(sys.stdlib_module_names):
                    used.setdefault(top, str(f.relative_to(ROOT)))
    return used


def test_student_install_declares_every_import_of_starter_and_data():
    """`pip install` (Colab's first cell) must bring every package the notebooks' code imports."""
    declared = {r.name.lower().replace("_", "-") for r in STUDENT_DEPS}
    dists = metadata.packages_distributions()
    missing = {}
    for module, where in _third_party_imports(["starter", "data"]).items():
        names = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if not names & declared:
            missing[module] = where
    assert not missing, f"imported but not in pyproject's dependencies: {missing}"


def test_pinned_versions_satisfy_the_declared_ranges():
    pins = _pins((ROOT / "requirements.txt").read_text())
    for req in STUDENT_DEPS + [Requirement(r) for extra in PYPROJECT["project"]["optional-dependencies"].values()
                               for r in extra if not r.startswith("attention-course-kit")]:
        key = req.name.lower()
        assert key in pins, f"{req.name} is a dependency but requirements.txt does not pin it"
        assert req.specifier.contains(pins[key]), f"requirements.txt pins {req.name}=={pins[key]}, outside {req}"


def test_wheel_builds_cleanly_ships_public_references_only_and_runs_a_check_once_installed(tmp_path):
    tree = tmp_path / "kit"  # a copy: an in-place build would leave build/ in the checkout
    skip = shutil.ignore_patterns("__pycache__", "cache", "work", "*.egg-info")
    for part in ("starter", "data", "grading"):
        shutil.copytree(ROOT / part, tree / part, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path), str(tree)], capture_output=True, text=True, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    assert "Warning" not in build.stdout + build.stderr, (build.stdout + build.stderr)[-3000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    public = sorted(p.name for p in (ROOT / "starter" / "references").glob("*.h5"))
    assert public and sorted(n.split("/")[-1] for n in names if n.startswith("starter/references/")) == public
    assert not [n for n in names if n.startswith(("grading/references/", "data/cache/", "solutions/", "tests/"))]

    # installed into a fresh virtual environment (its dependencies borrowed from this one, without the kit),
    # the wheel alone runs a public check from outside the repository
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (Path(site) / "borrowed.pth").write_text("\n".join(ours) + "\n")  # paths only: the kit's editable hook stays out
    with zipfile.ZipFile(wheel) as z:  # a wheel is a zip laid out as site-packages (pip is not needed for this)
        z.extractall(site)
    probe = (
        "import starter\n"
        "from starter.checks import check\n"
        "def attention(q, k, v, mask=None):\n"
        "    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5\n"
        "    if mask is not None:\n"
        "        s = s.masked_fill(~mask, float('-inf'))\n"
        "    w = s.softmax(-1)\n"
        "    return w @ v, w\n"
        "check('sdpa/basic', attention)\n"
        "print(starter.__file__)\n")
    run = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "sdpa/basic passed" in run.stdout and run.stdout.strip().endswith(str(Path(site) / "starter" / "__init__.py"))


def test_the_kit_imports_in_one_direction():
    """No module of grading/, starter/ or data/ imports, directly or through others, a module that imports it
    back: imports inside functions count too."""
    from support.imports import cycles, import_graph
    graph = import_graph(("grading", "starter", "data"))
    assert "grading.report" in graph and "grading.report" in graph["grading.autograde"]  # the reader sees imports
    assert "starter.compare" in graph["starter.checks"] and "starter.layers" in graph["starter.checks"]
    assert cycles(graph) == []


def test_the_comparison_the_judge_runs_stands_below_the_student_api():
    """starter.compare (what the judge imports) reaches none of what a notebook's cells use it through: the student
    API (`check`), the adapters around answers, the notebook loader; and nothing of the grader."""
    from support.imports import import_graph
    graph = import_graph(("grading", "starter", "data"))
    reached, todo = set(), ["starter.compare"]
    while todo:
        for m in graph[todo.pop()] - reached:
            reached.add(m)
            todo.append(m)
    # (starter.data for the vocabulary of trained-model cases, which reaches the dataset builders of data/)
    assert {m for m in reached if m.split(".")[0] != "data"} == {"starter.cases", "starter.stand_ins",
                                                                 "starter.data"}, sorted(reached)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_documents_reaches_its_file_and_heading():
    """The README and docs/ link to each other's files and sections: each linked file exists and each #anchor
    is one of that file's headings (a section moved or dropped leaves a link to nowhere)."""
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):  # a web address, not ours to check here
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and path.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)}
                if anchor not in headings:
                    broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken


ENV_NAME = re.compile(r"(COURSE|NBGRADER)_[A-Z_]+")


def test_each_environment_variable_of_the_kit_is_named_in_one_place():
    """A variable the kit reads or sets (`COURSE_*`, nbgrader's `NBGRADER_EXECUTION`) is spelled as a string once,
    in a module-level constant that everything else imports; the sandbox's standalone runner, which imports
    nothing of the kit, keeps a copy that must equal the constant."""
    from starter import compare

    spelled: dict[str, list[str]] = {}
    defined: dict[str, str] = {}
    for folder in ("grading", "starter", "data", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            constants = {id(node.value) for node in tree.body if isinstance(node, ast.Assign)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and ENV_NAME.fullmatch(node.value):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    spelled.setdefault(node.value, []).append(where)
                    if id(node) in constants:
                        defined.setdefault(node.value, where)
    assert "NBGRADER_EXECUTION" in spelled and "COURSE_DATA_DIR" in spelled  # the scan sees them
    runner_copy = [w for w in spelled.get(compare.RESULTS_ENV, []) if w.startswith("grading/sandbox_runner.py")]
    assert len(runner_copy) == 1, f"grading/sandbox_runner.py should keep its copy of {compare.RESULTS_ENV}"
    twice = {name: places for name, places in spelled.items()
             if len([p for p in places if p not in runner_copy]) != 1 or name not in defined}
    assert not twice, ("spelled more than once, or not as a module's constant (import the constant instead): "
                       + "; ".join(f"{n} at {', '.join(p)}" for n, p in sorted(twice.items())))
