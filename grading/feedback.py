"""Feedback that shows grades and the student's own code, never the hidden tests."""
from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*", re.S | re.M)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def redact_source(source: str) -> str:
    return HIDDEN.sub("# (hidden tests ran here)", source)


def short_error(output) -> str:
    """The last line of an error, without a traceback that could quote hidden test code."""
    text = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
    return ANSI.sub("", text).strip().splitlines()[0] if text.strip() else "Error"


class RedactHiddenTests(NbGraderPreprocessor):
    """For graded test cells: hide hidden-test source and reduce errors to one line."""

    def preprocess_cell(self, cell, resources, cell_index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            cell.source = redact_source(cell.source)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    line = short_error(output)
                    output["traceback"] = [line]
        return cell, resources
