"""Plant each defect of `benchmarks/defects.py` in a scratch clone of the kit and run the part of the test suite that
should catch it: a table of caught and missed, for one revision of the suite or two side by side.

    python benchmarks/planted_defects.py [--rev REV ...] [--only NAME ...] [--work DIR] [--control]
                                         [--save FILE.json] [--earlier FILE.json ...] [--no-run] [--markdown FILE]

Each `--rev` (default HEAD) gets a scratch clone in WORK/<rev> with a virtual environment of its own
(`kit.py setup`, whose editable install points at that clone, so the suite, its sandboxes and its kernels all
import the planted code). For each defect the clone is reset to the revision, the defect's one replacement is
made in its file (it must occur exactly once there: a defect that no longer applies is said, never skipped
quietly), and `pytest -x` runs the defect's tests, with CI=true as `.ci/run` has it:

    caught   pytest failed (exit 1), or could not collect or finish (2, 3): the suite would have gone red
    MISSED   every selected test passed with the defect in place
    error    the selection ran no test (exit 4, 5), the defect did not apply, or the run timed out

`--control` first runs every defect's tests once with no defect planted: they must pass, or a 'caught' means
nothing. `--save` keeps this run's verdicts as JSON; `--earlier` puts a saved run's verdicts first in the table, as
the suite compared against (the two revisions' runs need not share a quiet hour); with `--no-run`, the saved runs'
table alone. `--markdown FILE` writes the table
(one column per revision) with the command that made it. The exit status is 1 when a defect is not caught, or is
caught by the first revision's suite and not by a later one's.
A defect is one plausible bug, written as an edit of the kit's code; its tests are pytest arguments (files, node
ids, -k), the narrowest part of the suite that should see it, so a revision's whole table takes minutes, not hours.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from defects import DEFECTS, Defect

TIMEOUT = 1800  # seconds one defect's tests may take


@dataclass
class Outcome:
    defect: str
    verdict: str  # caught, MISSED, error
    detail: str
    seconds: float


def _git(repo: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, **kw)


def scratch(rev: str, work: Path) -> tuple[Path, Path]:
    """(clone, its python) for `rev`, made once in work/<sha> and reused."""
    sha = _git(ROOT, "rev-parse", "--verify", f"{rev}^{{commit}}").stdout.strip()
    repo = work / sha[:12]
    if not (repo / ".git").exists():
        repo.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(repo)], check=True)
    _git(repo, "checkout", "--quiet", "--force", sha)
    venv = repo / ".venv"
    subprocess.run([sys.executable, "kit.py", "setup"], cwd=repo, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "KIT_VENV": str(venv)})
    return repo, venv / "bin" / "python"


def reset(repo: Path) -> None:
    _git(repo, "checkout", "--quiet", "--force", "HEAD", "--", ".")
    _git(repo, "clean", "-fdq")  # untracked files a defect or a test left (ignored ones, .venv and build/, stay)


def plant(repo: Path, defect: Defect) -> str | None:
    """Make the defect's replacement; None, or why it does not apply."""
    path = repo / defect.path
    if not path.is_file():
        return f"{defect.path} does not exist"
    text = path.read_text(encoding="utf-8")
    if text.count(defect.old) != 1:
        return f"{defect.path} holds the text to replace {text.count(defect.old)} times, not once"
    path.write_text(text.replace(defect.old, defect.new), encoding="utf-8")
    return None


def pytest(repo: Path, python: Path, args: tuple[str, ...] | list[str]) -> tuple[int, str, float]:
    env = {**os.environ, "CI": "true", "MPLBACKEND": "Agg", "VIRTUAL_ENV": str(python.parent.parent),
           "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.monotonic()
    try:
        run = subprocess.run([str(python), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra",
                              *args], cwd=repo, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {TIMEOUT} s", time.monotonic() - start
    return run.returncode, run.stdout + run.stderr, time.monotonic() - start


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line[:200]
    tail = [line for line in output.splitlines() if line.strip()]
    return tail[-1][:200] if tail else ""


def judge(defect: Defect, repo: Path, python: Path) -> Outcome:
    reset(repo)
    problem = plant(repo, defect)
    if problem:
        return Outcome(defect.name, "error", problem, 0.0)
    try:
        rc, output, seconds = pytest(repo, python, defect.tests)
    finally:
        reset(repo)
    if rc in (1, 2, 3):
        return Outcome(defect.name, "caught", first_failure(output), seconds)
    if rc == 0:
        return Outcome(defect.name, "MISSED", first_failure(output), seconds)
    return Outcome(defect.name, "error", f"pytest exit {rc}: {first_failure(output)}", seconds)


def control(repo: Path, python: Path, defects: list[Defect]) -> bool:
    reset(repo)
    args = sorted({a for d in defects for a in d.tests if not a.startswith("-")})
    rc, output, seconds = pytest(repo, python, args)
    print(f"control ({len(args)} selections, no defect planted): pytest exit {rc} in {seconds:.0f} s"
          + ("" if rc == 0 else f": {first_failure(output)}"), flush=True)
    return rc == 0


def table(revs: list[str], results: dict[str, dict[str, Outcome]], defects: list[Defect], command: str) -> str:
    lines = [f"Written by `{command}`.", "",
             "| defect | what is wrong | " + " | ".join(f"`{r}`" for r in revs) + " |",
             "|---|---|" + "---|" * len(revs)]
    for d in defects:
        cells = []
        for r in revs:
            o = results[r].get(d.name)
            cells.append("-" if o is None else f"{o.verdict} ({o.seconds:.0f} s)")
        lines.append(f"| `{d.name}` | {d.what} | " + " | ".join(cells) + " |")
    for r in revs:
        got = list(results[r].values())
        lines.append("")
        lines.append(f"`{r}`: {sum(o.verdict == 'caught' for o in got)} caught, "
                     f"{sum(o.verdict == 'MISSED' for o in got)} missed, {sum(o.verdict == 'error' for o in got)} "
                     f"errors of {len(got)}; {sum(o.seconds for o in got):.0f} s of tests")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", action="append", help="revision whose suite is run (repeatable; default HEAD)")
    parser.add_argument("--only", action="append", default=[], help="only this defect (repeatable)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/planted-defects"), help="scratch folder")
    parser.add_argument("--markdown", type=Path, help="write the table to this file")
    parser.add_argument("--control", action="store_true", help="first run the selections with no defect planted")
    parser.add_argument("--save", type=Path, help="write this run's verdicts to this JSON file")
    parser.add_argument("--earlier", type=Path, action="append", default=[],
                        help="a saved run's verdicts, shown first (repeatable: in the order given)")
    parser.add_argument("--no-run", action="store_true", help="run nothing: the table of the --earlier runs alone")
    args = parser.parse_args(argv)
    revs = [] if args.no_run else args.rev or ["HEAD"]
    unknown = set(args.only) - {d.name for d in DEFECTS}
    if unknown:
        parser.error(f"no defect named {', '.join(sorted(unknown))}")
    defects = [d for d in DEFECTS if not args.only or d.name in args.only]
    results: dict[str, dict[str, Outcome]] = {}
    for saved in args.earlier:
        for rev, outcomes in json.loads(saved.read_text()).items():
            results[rev] = {o["defect"]: Outcome(**o) for o in outcomes if o["defect"] in {d.name for d in defects}}
    for rev in revs:
        repo, python = scratch(rev, args.work)
        print(f"== {rev} ({repo})", flush=True)
        if args.control and not control(repo, python, defects):
            print("the selections fail with no defect planted: a 'caught' would mean nothing", flush=True)
            return 1
        results[rev] = {}
        for d in defects:
            o = judge(d, repo, python)
            results[rev][d.name] = o
            print(f"{o.verdict:7} {d.name:34} {o.seconds:6.0f} s  {o.detail}", flush=True)
    if args.save:
        args.save.write_text(json.dumps({r: [vars(o) for o in results[r].values()] for r in revs}, indent=1))
    revs = list(results)  # the earlier run's first
    command = "python benchmarks/planted_defects.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = table(revs, results, defects, re.sub(r"\s+", " ", command).strip())
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    def verdict(rev: str, name: str) -> str:
        return results[rev][name].verdict if name in results[rev] else "-"

    lost = [d.name for d in defects if verdict(revs[0], d.name) == "caught"  # ("-": not run on that revision)
            and any(verdict(r, d.name) not in ("caught", "-") for r in revs[1:])]
    if lost:
        print(f"caught by {revs[0]}'s suite, not by a later one: {', '.join(lost)}")
    return 1 if lost or any(o.verdict != "caught" for r in results.values() for o in r.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
