"""Re-run a submission's checks in a clean room, out of reach of the student's tampering.

    python -m grading.cleanroom SOURCE_NOTEBOOK SUBMITTED_NOTEBOOK HIDDEN_DIR

In the notebook, test cells call `check` in the same kernel as the student's code, which could
rebind `check`, patch `starter.checks`, or replace library functions. Here, in a fresh process, the
checker is loaded first as a private module (not in `sys.modules`; it binds the primitives it uses
at import), then the set-up cells and the student's own code cells run (each under a time limit,
with output discarded), then every `check("case", obj)` of every test cell of the *source* notebook
(hidden tests included) runs with that private checker. The result, one JSON object
`{grade_id: {"passed": bool, "message": str}}`, goes to the original stdout, whatever the student's
code did to `sys.stdout`.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

CELL_LIMIT = 30  # seconds for one student cell or one check


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _check_calls(source: str) -> list[tuple[str, ast.expr]] | None:
    """The (case, expression) of each `check(...)` in a test cell; None if the cell does anything else."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "starter.checks":
            continue  # the test cell's own re-import; the clean room uses its private checker
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check"
                and len(stmt.value.args) == 2 and isinstance(stmt.value.args[0], ast.Constant)):
            return None
        calls.append((stmt.value.args[0].value, stmt.value.args[1]))
    return calls


def _meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader") or {}


def main(source_path: str, submitted_path: str, hidden_dir: str) -> None:
    out_fd = os.dup(1)
    write, dumps = os.write, json.dumps
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.environ.update({"COURSE_HIDDEN_REFERENCES": hidden_dir, "NBGRADER_EXECUTION": "autograde",
                       "MPLBACKEND": "Agg"})
    root = Path(__file__).resolve().parent.parent
    import grading.kernel_guard  # noqa: F401 - side effect: student code may not end this process
    from starter.notebook_loader import python_source, read_cells

    spec = importlib.util.spec_from_file_location(
        "_cleanroom_checks", root / "starter" / "checks.py")
    checker = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = checker  # dataclasses need it while the module runs; not afterwards
    spec.loader.exec_module(checker)
    del sys.modules[spec.name]
    check, CheckFailed = checker.check, checker.CheckFailed

    source, submitted = read_cells(source_path), read_cells(submitted_path)
    tests = [(_meta(c)["grade_id"], _check_calls(c["source"])) for c in source
             if c["cell_type"] == "code" and _meta(c).get("grade") and not _meta(c).get("solution")]

    signal.signal(signal.SIGALRM, _alarm)
    ns: dict = {"__name__": "__main__"}
    for cell in submitted:
        if cell["cell_type"] != "code":
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        meta = _meta(cell)
        student_code = meta.get("solution") or not meta  # solutions, and the student's extra cells
        if not ("setup" in tags or student_code):
            continue
        signal.alarm(CELL_LIMIT)
        try:
            exec(compile(python_source(cell), "<student cell>", "exec"), ns)  # noqa: S102 - isolated process
        except BaseException:  # noqa: BLE001 - SystemExit, KeyboardInterrupt, anything: go on
            pass
        finally:
            signal.alarm(0)

    results = {}
    for grade_id, calls in tests:
        if calls is None:
            results[grade_id] = {"passed": None, "message": "not a check-only cell: not verified"}
            continue
        passed, message = True, ""
        for case, expr in calls:
            signal.alarm(CELL_LIMIT)
            try:
                obj = eval(compile(ast.Expression(expr), "<test>", "eval"), ns)  # noqa: S307
                check(case, obj)
            except CheckFailed as exc:
                passed, message = False, str(exc)
            except _Timeout:
                passed, message = False, f"{case}: took longer than {CELL_LIMIT} s"
            except BaseException as exc:  # noqa: BLE001
                passed, message = False, f"{case}: {type(exc).__name__}: {exc}"
            finally:
                signal.alarm(0)
            if not passed:
                break
        results[grade_id] = {"passed": passed, "message": message[:300]}
    write(out_fd, dumps(results).encode())


if __name__ == "__main__":
    main(*sys.argv[1:4])
