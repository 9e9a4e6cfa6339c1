"""Lint and types, as CI runs them: ruff with the rules chosen in pyproject.toml (notebooks included) and
mypy on the kit's packages (starter/, data/, grading/)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_the_code_is_clean(tool, tmp_path):
    if importlib.util.find_spec(tool) is None:
        needs(f"{tool} (requirements.txt)")
    command = ["ruff", "check", "--no-cache", "."] if tool == "ruff" else ["mypy", "--cache-dir", str(tmp_path)]
    run = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{tool} reports problems:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
