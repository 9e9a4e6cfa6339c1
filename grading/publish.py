"""Copy what students need into a folder of its own, for a separate student repository.

    python -m grading publish DEST [--repo OWNER/NAME]

This repository holds the solutions (`solutions/`) and the hidden references (`grading/`); a Colab
link must point at a repository without them. DEST receives the release notebooks, the `starter`
package with the public references, the dataset scripts, the packaging files and a short README,
and nothing else; the copy is then checked for anything that must stay private. With `--repo`, the
GitHub address in the notebooks' first cell and Colab badges becomes that of the student repository.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import h5py

from starter.compare import case_names

from . import notebooks

ROOT = notebooks.ROOT
FILES = ["pyproject.toml", "requirements.txt", "environment.yml", ".gitignore"]
TREES = {"notebooks": "*.ipynb", "starter": "*", "data": "*.py"}
DEFAULT_REPO = "attention-course-kit/attention-transformers"  # the address the notebooks are written with
README = """# Attention and Transformers: student notebooks

Open the notebooks in order, on Google Colab (the badges; the first cell of each notebook installs
this repository there and keeps your work in a Google Drive folder) or locally
(`pip install -e ".[jupyter]"`, then `jupyter lab notebooks/`). Fill in the cells marked
`# YOUR CODE HERE`; the test cell under each prints a one-line hint when something is wrong.
Submit the `.ipynb` files.

{badges}
"""


def colab_badge(repo: str, notebook: str) -> str:
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{repo}/blob/main/notebooks/{notebook})")


class LeakError(RuntimeError):
    pass


def hidden_case_names() -> set[str]:
    return case_names(notebooks.HIDDEN_REFERENCES)


def check_no_leak(dest: Path) -> None:
    """Raise LeakError if `dest` holds solution code or hidden tests/references."""
    hidden = hidden_case_names()
    for path in dest.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(dest)
        if rel.parts[0] in {"solutions", "grading", "tests"}:
            raise LeakError(f"{rel}: private folder")
        if path.suffix in {".ipynb", ".py", ".md", ".toml", ".txt", ".yml"}:
            text = path.read_text(encoding="utf-8", errors="replace")
            for marker in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS"):
                if marker in text:
                    raise LeakError(f"{rel}: contains {marker!r}")
        if path.suffix == ".h5":
            with h5py.File(path, "r") as f:
                names: list[str] = []
                f.visititems(lambda n, o, names=names: names.append(n) if isinstance(o, h5py.Group) else None)
            if hidden & set(names):
                raise LeakError(f"{rel}: holds hidden reference cases {sorted(hidden & set(names))[:3]}")


def publish(dest: Path, repo: str = DEFAULT_REPO) -> Path:
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    for folder, pattern in TREES.items():
        for path in sorted((ROOT / folder).rglob(pattern)):
            rel = path.relative_to(ROOT)
            if path.is_dir() or "__pycache__" in rel.parts or "cache" in rel.parts[1:2]:
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)
    released = sorted((dest / "notebooks").glob("*.ipynb"))
    if repo != DEFAULT_REPO:
        for nb in released:
            nb.write_text(nb.read_text(encoding="utf-8").replace(DEFAULT_REPO, repo), encoding="utf-8")
    badges = "\n".join(f"- {colab_badge(repo, nb.name)} `{nb.stem}`" for nb in released)
    (dest / "README.md").write_text(README.format(badges=badges))
    check_no_leak(dest)
    return dest
