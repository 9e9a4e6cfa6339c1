"""The CSV files grading writes (grades.csv, failures.csv), safe to open in a spreadsheet.

A spreadsheet reads a cell that starts with `=`, `+`, `-` or `@` (some also tab or carriage return, or
the full-width forms of those signs) as a formula: a submitted file named `=HYPERLINK("http://…")` would
become a live link in the `notes` column, or worse (CSV injection). So every text cell that starts so is
written with a single quote in front, OWASP's rule (the spreadsheet shows the rest as text), and every text
cell is quoted, so that a spreadsheet that splits on `;` (its locale's separator) cannot make a new cell
start inside one. Numbers are written as numbers. Reading undoes the quote: a student id or a note reads
back exactly as it was written.

A spreadsheet holds at most 32 767 characters in a cell (Excel; counted in UTF-16 units, two for an emoji) and
cuts or refuses a longer one: a text cell is written with at most MAX_TEXT characters, cut with a mark (the
grades table fits its notes itself, with a pointer to the student's outcome file, where they are whole).
"""
from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
MAX_TEXT = 16_000  # characters of a text cell: under a spreadsheet's 32 767 even at two UTF-16 units each
CUT = " …(cut)"  # ends a text cell cut to MAX_TEXT


def _quoted(text: str) -> bool:
    """Whether `text` is written with a quote in front: it starts like a formula, maybe behind quotes of its
    own (so that a text that really starts with `'=` reads back with its quote)."""
    return text.lstrip("'").startswith(FORMULA_START)


def to_cell(value):
    """What a CSV cell holds for `value`: numbers as they are, text with a quote in front if it starts like
    a formula, and cut to MAX_TEXT characters if longer."""
    if not isinstance(value, str):
        return value
    if len(value) > MAX_TEXT:
        value = value[:MAX_TEXT - len(CUT)] + CUT
    return "'" + value if _quoted(value) else value


def from_cell(text):
    """The value `to_cell` wrote (as text)."""
    return text[1:] if isinstance(text, str) and text.startswith("'") and _quoted(text) else text


def write_csv(path: Path, rows: Iterable[Iterable]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:  # names as given: any script, whatever the locale
        csv.writer(f, quoting=csv.QUOTE_NONNUMERIC).writerows([to_cell(v) for v in row] for row in rows)
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file that `write_csv` wrote, as dicts by column name, every cell as written."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{from_cell(k): from_cell(v) for k, v in row.items()} for row in csv.DictReader(f)]
