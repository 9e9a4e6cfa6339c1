"""Execute solution notebooks end to end: the maintainers' main job.

Every notebook in `solutions/` runs top to bottom in a fresh kernel on the default data, with the
hidden references available so hidden tests run too. Executed copies go to `build/executed/`, every
figure to `build/figures/<notebook>/`, and one line per notebook reports time and pass/fail.
"""
from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from . import notebooks

BUILD = notebooks.ROOT / "build"


def _select(names: list[str] | None) -> list[Path]:
    paths = notebooks.solution_notebooks()
    if not names:
        return paths
    chosen = [p for p in paths if any(p.stem == n or p.name[:2] == n.zfill(2)[:2] or p.name == n for n in names)]
    if not chosen:
        raise SystemExit(f"no solution notebook matches {names}; have {[p.stem for p in paths]}")
    return chosen


def save_figures(nb, folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    count = 0
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                count += 1
                (folder / f"cell{index:02d}_{count:02d}.png").write_bytes(base64.b64decode(data["image/png"]))
    return count


def execute_notebook(path: Path, out_dir: Path, timeout: int = 1200) -> dict:
    """Run one notebook; return {name, seconds, ok, errors, tests_passed, tests}."""
    nb = notebooks.read(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    env_backup = dict(os.environ)
    os.environ["COURSE_HIDDEN_REFERENCES"] = str(notebooks.HIDDEN_REFERENCES)
    os.environ["COURSE_NOTEBOOKS_DIR"] = str(notebooks.SOLUTIONS)  # "your" layers of 02/03, for 04 and 05
    os.environ.pop("NBGRADER_EXECUTION", None)
    start = time.perf_counter()
    error = None
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": str(out_dir)}})
        client.execute()
    except CellExecutionError as exc:  # pragma: no cover - allow_errors keeps going
        error = str(exc).splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - e.g. a dead kernel or timeout
        error = f"{type(exc).__name__}: {exc}"
    finally:
        os.environ.clear()
        os.environ.update(env_backup)
    seconds = time.perf_counter() - start
    errors = []
    tests = passed = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        failed = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if notebooks.is_test(cell):
            tests += 1
            passed += not failed
        if failed:
            errors.append(f"cell {index}: {failed[0].get('ename')}: {str(failed[0].get('evalue'))[:160]}")
    if error:
        errors.append(error)
    out_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out_dir / path.name))
    figures = save_figures(nb, BUILD / "figures" / path.stem)
    return {"name": path.stem, "seconds": seconds, "ok": not errors, "errors": errors,
            "tests": tests, "tests_passed": passed, "figures": figures}


def execute_all(names: list[str] | None = None, out: Path | None = None) -> bool:
    out = out or BUILD / "executed"
    results = []
    print(f"{'notebook':<40} {'time':>8}  {'tests':>7}  result")
    for path in _select(names):
        r = execute_notebook(path, out)
        results.append(r)
        status = "PASS" if r["ok"] else "FAIL"
        print(f"{r['name']:<40} {r['seconds']:>7.1f}s  {r['tests_passed']:>3}/{r['tests']:<3}  {status}"
              f"  ({r['figures']} figures)", flush=True)
        for e in r["errors"]:
            print(f"    {e}")
    total = sum(r["seconds"] for r in results)
    print(f"{len([r for r in results if r['ok']])}/{len(results)} notebooks passed in {total:.1f} s; "
          f"executed copies in {out}, figures in {BUILD / 'figures'}")
    return all(r["ok"] for r in results)
