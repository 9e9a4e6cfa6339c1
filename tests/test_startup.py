"""What the grader's processes import when they start: nothing slow that grading never uses."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from grading import notebooks

PROBE = """
import sys
import grading.worker
stand_in = sys.modules["rfc3987_syntax"]
print("deferred" if not hasattr(stand_in, "Lark") else "imported")
from jsonschema import FormatChecker
checker = FormatChecker()
print(checker.conforms("https://example.org/caf\\u00e9", "iri"), checker.conforms("https://[not an iri", "iri"))
print("imported" if hasattr(sys.modules["rfc3987_syntax"], "Lark") else "deferred")
"""


@pytest.mark.skipif(importlib.util.find_spec("rfc3987_syntax") is None, reason="rfc3987_syntax is not installed")
def test_rfc3987_syntax_is_imported_on_its_first_use_and_checks_iris_as_before():
    """jsonschema imports rfc3987_syntax for its "iri" format check; that import built a parser, 1.9 s in the grader
    and in each worker. The grader's processes import it when the check is first made, and the check is the same."""
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=notebooks.ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["deferred", "True False", "imported"], done.stdout


BROKEN_GRADER = """
import sys
class Broken:
    def find_spec(self, name, path=None, target=None):
        if name == "grading.worker":
            raise RuntimeError("a grader that cannot be imported")
sys.meta_path.insert(0, Broken())
import grading.worker_preload
print("grading.worker" in sys.modules)
"""


def test_a_grader_that_cannot_be_imported_leaves_the_process_workers_are_forked_from_running():
    """multiprocessing's forkserver ends when a module it preloads raises (all but ImportError), and then no worker
    would start: the preload leaves a grader that cannot be imported for each worker to import, and report, itself."""
    done = subprocess.run([sys.executable, "-c", BROKEN_GRADER], cwd=notebooks.ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"the preload raised: {done.stderr[-500:]}"
    assert done.stdout.split() == ["False"], f"the grader was imported after all: {done.stdout}"
