#!/usr/bin/env python3
"""Set up and run the course kit with one command each. Needs only Python 3.10+.

    python3 kit.py run     set up (first time), then execute every solution notebook end to end
    python3 kit.py test    set up (first time), then run the test suite
    python3 kit.py setup   only set up: a virtual environment in .venv with everything pinned

Extra arguments after `run` or `test` go to the notebook runner or to pytest. Set KIT_VENV to use
another virtual-environment folder.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("KIT_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".kit-installed"


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml"):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()


def _run(*cmd: str | Path, **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, **kw)


def setup() -> None:
    """Create .venv and install the pinned requirements and the kit itself (skipped when up to date)."""
    if STAMP.exists() and STAMP.read_text() == _fingerprint() and PYTHON.exists():
        return
    if sys.version_info < (3, 10):  # noqa: UP036 - kit.py runs on any Python 3, to say that this one is too old
        sys.exit(f"Python 3.10 or newer is needed, this is {sys.version.split()[0]}")
    if not PYTHON.exists():
        print(f"creating a virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    _run(PYTHON, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    _run(PYTHON, "-m", "pip", "install", "--quiet", "-r", "requirements.txt")
    # setuptools warns on every editable install that a folder named like a package shadows it: true of
    # any checkout, not actionable, so silenced for this one step
    _run(PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "-e", ".", env={**os.environ, "PYTHONWARNINGS": "ignore"})
    # a `python3` kernel inside the venv, so notebooks and nbgrader run with these packages
    _run(PYTHON, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3", "--display-name", "Python 3")
    STAMP.write_text(_fingerprint())


def _env(command: str) -> dict:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])  # nbgrader calls `alembic`, kernels
    env["VIRTUAL_ENV"] = str(VENV)
    if command == "test":  # pytest draws off screen; `run` leaves the backend alone, its kernels use inline
        env.setdefault("MPLBACKEND", "Agg")
    return env


def test_workers(args: list[str]) -> list[str]:
    """Two xdist workers where the machine has two cores or more (measured in docs/testing.md), unless the arguments
    choose (`-n 0`: one process)."""
    chosen = any(a in ("-n", "--numprocesses", "no:xdist") or a.startswith(("-n", "--numprocesses=")) for a in args)
    return [] if chosen or (os.cpu_count() or 1) < 2 else ["-n", "2"]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"run", "test", "setup"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    setup()
    if command == "run":
        return subprocess.call([str(PYTHON), "-m", "grading", "execute", *rest], cwd=ROOT, env=_env("run"))
    if command == "test":
        return subprocess.call([str(PYTHON), "-m", "pytest", *test_workers(rest), *rest], cwd=ROOT, env=_env("test"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
