"""The judge: a student's scores from what the sandbox recorded, compared with the expected outputs.

It never imports or runs student code. Its inputs are plain data: the observations the checks wrote
in the sandbox (read by `starter.compare.read_observations`: JSON and .npz, size-capped, no pickles)
and the stored references, hidden ones included, which never enter the sandbox. Each test cell's
cases are the `check("case", ...)` calls of its source as nbgrader restored it (hidden tests
included); each case is compared by `starter.compare.diagnose` (what `verdict`, the comparison the
student's public check runs, is made of), so a grade and the message the student saw can't disagree,
and each failure keeps its kind (a known bug, a symptom) for the class report.

A test cell scores its points times the share of its hidden cases that pass (partial credit; all its
cases where it has no hidden one): public cases' expected outputs ship with the kit. Its outputs
become the judge's: one line per case (hidden cases by number, never by name) and the score, which
the student and the feedback page see. The notebook's record (each cell's points, each case's outcome and
diagnosis) goes into the student's outcome (grading/outcome.py), which the reports are views of, and its
points into the gradebook (`grading.worker.SaveJudgedScores`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat

from starter.compare import CheckFailed, Diagnosis, Observation, case_file, case_names, diagnose, load_case

from . import notebooks
from .notebooks import public_case_names

if TYPE_CHECKING:
    from .sandbox import SandboxResult

NOT_RUN = "did not run"  # the diagnosis of a case the sandbox recorded nothing for
# the diagnosis of a case the grader measured itself (grading.trained_model) and could not: its message is the
# grader's, about the file handed in, so the feedback page shows it in full
NOT_MEASURED = "trained model not measured"


@dataclass
class CaseResult:
    case: str  # the case's name (for the instructor's records; never shown for a hidden case)
    label: str  # what the student sees: the public name, or "hidden case N"
    public: bool
    passed: bool
    message: str  # one line, without the case's name
    diagnosis: str = ""  # the kind of failure, the same for every student with that mistake (starter.compare.Diagnosis)


@dataclass
class CellResult:
    grade_id: str
    points: float
    max_points: float
    cases: list[CaseResult] = field(default_factory=list)

    def lines(self) -> list[str]:
        scored = any(not c.public for c in self.cases)
        return [(f"\u2713 {c.label} passed" if c.passed else f"\u2717 {c.label}: {c.message}")
                + (" (public example, not scored)" if c.public and scored else "") for c in self.cases]


@dataclass
class NotebookRecord:
    student: str
    notebook: str
    sandbox: str  # how the sandbox run ended
    sandbox_message: str
    isolated: bool
    seconds: float
    problems: list[str]
    cells: list[CellResult]

    @classmethod
    def from_dict(cls, raw: dict) -> NotebookRecord:
        """A record from its `dataclasses.asdict` (in a student's outcome file, grading.outcome)."""
        cells = [CellResult(**{**c, "cases": [CaseResult(**k) for k in c["cases"]]}) for c in raw["cells"]]
        return cls(**{**raw, "cells": cells})


def _reference(name: str, dirs: tuple[Path, ...]):
    """A reference case, read once per worker process for all students (the judge never changes it);
    read again when its file changes (a rebuilt reference)."""
    path = case_file(name, list(dirs))
    stamp = (path, path.stat().st_mtime_ns) if path is not None else None
    key = (name, dirs)
    cached = _CASES.get(key)
    if cached is None or cached[0] != stamp:
        cached = _CASES[key] = (stamp, load_case(name, list(dirs)))
    return cached[1]


_CASES: dict = {}


def read_references(reference_dirs: list[Path]) -> dict:
    """Every reference case the judge may compare with, read (and kept in this process): what `keep_references`
    takes. A run reads them once, in its own process, and sends them to each worker before its first student, who
    would otherwise wait 2.5 s for them (reading them in each worker took 2 s of CPU a worker while the cluster
    started, where the CPU is short)."""
    dirs = tuple(reference_dirs)
    names = {name for folder in dirs for name in case_names(folder)}
    for name in names:
        _reference(name, dirs)
    return {(name, dirs): _CASES[(name, dirs)] for name in names}


def keep_references(read: dict) -> int:
    """Keep in this process the references `read_references` read elsewhere (each still read again here if its
    file has changed since: `_reference` compares the file's stamp first); returns how many."""
    _CASES.update(read)
    return len(read)


def judge_cell(grade_id: str, source: str, max_points: float, observations: dict[str, Observation],
               reference_dirs: list[Path], public: frozenset[str], not_run: str,
               by_grader: frozenset[str] = frozenset()) -> CellResult:
    """Score one test cell from the observations of the cases its source checks (`by_grader`: the names of
    those the grader measured itself, outside the sandbox)."""
    results = []
    hidden = 0
    for name in (m.group("case") for m in notebooks.CHECK_CALL.finditer(source)):
        is_public = name in public
        if not is_public:
            hidden += 1
        label = name if is_public else f"hidden case {hidden}"
        obs = observations.get(name)
        if obs is None:
            results.append(CaseResult(name, label, is_public, False, not_run, NOT_RUN))
            continue
        try:
            found = diagnose(_reference(name, tuple(reference_dirs)), obs)
        except CheckFailed as exc:  # the reference itself is missing: the grader's fault, said plainly
            found = Diagnosis("not graded", f"not graded: {exc}")
        except Exception as exc:
            found = Diagnosis("unreadable result", f"the recorded result could not be compared ({type(exc).__name__})")
        if found is not None and name in by_grader and obs.error:
            found = Diagnosis(NOT_MEASURED, obs.error)
        results.append(CaseResult(name, label, is_public, found is None, found.message if found else "",
                                  found.kind if found else ""))
    # Scored on the hidden cases where there are any: a public case's expected output ships with the kit,
    # so a submission could replay it; the hidden ones it can only earn by computing them.
    counted = [r for r in results if not r.public] or results
    points = max_points * sum(r.passed for r in counted) / len(counted) if counted else 0.0
    return CellResult(grade_id, round(points, 4), max_points, results)


def judge_notebook(nb, observations: dict[str, Observation], reference_dirs: list[Path],
                   not_run: str = "did not run (the notebook stopped before this test)",
                   by_grader: frozenset[str] = frozenset()) -> list[CellResult]:
    public = public_case_names()
    cells = []
    for cell in notebooks.test_cells(nb):
        meta = notebooks.nbgrader_meta(cell)
        cells.append(judge_cell(meta["grade_id"], cell.source, float(meta.get("points", 0)), observations,
                                reference_dirs, public, not_run, by_grader))
    return cells


def _not_run_message(sandbox) -> str:
    if sandbox is None:
        return "did not run"
    if sandbox.status == "time limit":
        return f"did not run: {sandbox.message}"
    if sandbox.status in ("stopped", "killed"):
        return f"did not run: the notebook stopped before this test ({sandbox.message})"
    return "did not run (the test cell was not reached or raised before checking)"


def judge_into(nb, sandbox: SandboxResult | None, reference_dirs: list[Path], student: str, notebook: str,
               measured: dict[str, Observation] | None = None) -> NotebookRecord:
    """Score `nb`'s test cells from what the sandbox's run of it observed (`sandbox`: its SandboxResult; None when
    it did not run) and what the grader measured itself (`measured`, by case name: notebook 07's hidden
    trained-model cases, which win over anything recorded under their names), and make each test cell's outputs
    the judge's lines and score (what the feedback page shows); returns the notebook's record, whose points
    `grading.worker.SaveJudgedScores` writes to the gradebook."""
    measured = measured or {}
    observations = {**(sandbox.observations if sandbox is not None else {}), **measured}
    cells = {c.grade_id: c for c in judge_notebook(nb, observations, reference_dirs, _not_run_message(sandbox),
                                                   frozenset(measured))}
    for cell in notebooks.test_cells(nb):
        result = cells[notebooks.nbgrader_meta(cell)["grade_id"]]
        cell.outputs = [
            nbformat.v4.new_output("stream", name="stdout", text="\n".join(result.lines()) + "\n"),
            nbformat.v4.new_output("execute_result", data={"text/plain": repr(result.points)}, execution_count=None),
        ]
    return NotebookRecord(
        student=student, notebook=notebook, sandbox=getattr(sandbox, "status", "not run"),
        sandbox_message=getattr(sandbox, "message", ""), isolated=getattr(sandbox, "isolated", False),
        seconds=round(getattr(sandbox, "seconds", 0.0), 2), problems=getattr(sandbox, "problems", []),
        cells=list(cells.values()))
