"""A student's outcome is one record (grading.outcome): what the worker and the run write, every report reads
back as the same objects, the judge's notebook records included; the class report leaves out a damaged file."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from grading.judge import CaseResult, CellResult, NotebookRecord
from grading.outcome import Status, StudentOutcome, joined, read_outcome, read_outcomes, write_outcome


def record(student: str, notebook: str) -> NotebookRecord:
    case = CaseResult(case="beam/basic", label="beam/basic", public=True, passed=False, message="keeps k alive",
                      diagnosis="keep_k_live")
    return NotebookRecord(student=student, notebook=notebook, sandbox="finished", sandbox_message="", isolated=True,
                          seconds=1.5, problems=[], cells=[CellResult("test_beam_search", 0.0, 3.0, [case])])


def test_an_outcome_reads_back_as_it_was_written(tmp_path):
    written = StudentOutcome("alice", notebooks={"08_decoding": "08_decoding.ipynb"}, status=Status.GRADED,
                             flags=["08_decoding: time limit"], seconds=3.2, name="Alice A", lms_id="77", lms="moodle",
                             judged=[record("alice", "08_decoding")])
    path = write_outcome(tmp_path, written)
    assert path == tmp_path / "alice.json" and not list(tmp_path.glob("*.tmp"))
    assert read_outcome(path) == written and read_outcome(path).status is Status.GRADED
    assert json.loads(path.read_text())["status"] == "graded" and f"{written.status}" == "graded"  # its value
    assert read_outcomes(tmp_path) == {"alice": written}
    assert "judged" not in written.summary() and written.summary()["flags"] == written.flags  # report.json's entry
    assert written.summary()["lms"] == "moodle"  # whose id lms_id is: a Moodle participant id


def test_an_outcome_written_before_the_lms_was_recorded_reads_as_not_known(tmp_path):
    """An outcome file without `lms` (a run before it was recorded) reads back with lms "": the export takes its
    id as it is."""
    old = asdict(StudentOutcome("alice", status=Status.GRADED, name="Alice", lms_id="77"))
    del old["lms"]
    (tmp_path / "alice.json").write_text(json.dumps(old))
    outcome = read_outcome(tmp_path / "alice.json")
    assert (outcome.lms_id, outcome.lms) == ("77", "")


def test_a_damaged_outcome_is_left_out_of_the_reports_and_read_alone_raises(tmp_path):
    for student in ("alice", "bob"):
        write_outcome(tmp_path, StudentOutcome(student, status="graded", judged=[record(student, "08_decoding")]))
    broken = json.loads((tmp_path / "bob.json").read_text())
    del broken["judged"][0]["cells"][0]["cases"][0]["passed"]  # cut short
    (tmp_path / "bob.json").write_text(json.dumps(broken))
    assert set(read_outcomes(tmp_path)) == {"alice"}  # (a resumed run grades bob again)
    with pytest.raises(TypeError):
        read_outcome(tmp_path / "bob.json")
    (tmp_path / "bob.json").write_text(json.dumps(dict(broken, judged=[], status="grated")))  # no such status
    with pytest.raises(ValueError, match="'grated' is not a valid Status"):
        read_outcome(tmp_path / "bob.json")


def test_intake_and_grading_join_into_one_outcome():
    intake = StudentOutcome("alice", notebooks={"08_decoding": "x.ipynb"}, notes=["late"], name="Alice", lms_id="7",
                            lms="canvas")
    graded = StudentOutcome("alice", status="graded", flags=["look"], seconds=2.0, sandboxes_started=1,
                            judged=[record("alice", "08_decoding")])
    both = joined(intake, graded)
    assert (both.status, both.notes, both.flags, both.name, both.notebooks, both.seconds) == (
        "graded", ["late"], ["look"], "Alice", {"08_decoding": "x.ipynb"}, 2.0)
    assert (both.lms_id, both.lms) == ("7", "canvas")  # who the student is, and whose id that is: intake's
    assert both.judged == graded.judged and both.sandboxes_started == 1
    failed = joined(intake, StudentOutcome("alice", status="failed", error="the worker died"))
    assert failed.status == "failed" and failed.notes == ["late", "the worker died"] and failed.lms == "canvas"
    assert joined(intake, None) is intake  # not graded (no notebooks, or refused at intake)
    assert asdict(read_back(both)) == asdict(both)


def read_back(outcome: StudentOutcome) -> StudentOutcome:
    return StudentOutcome.from_dict(json.loads(json.dumps(asdict(outcome))))


def _record(notebook: str, cells: dict[str, float]) -> NotebookRecord:
    return NotebookRecord(student="ada", notebook=notebook, sandbox="finished", sandbox_message="", isolated=True,
                          seconds=1.0, problems=[], cells=[CellResult(g, p, 3.0) for g, p in cells.items()])


def test_a_trained_model_mark_without_a_training_notebook_is_worth_a_look():
    """The mark measures the weights, whoever trained them: a checkpoint handed in with a notebook 06 that trains
    nothing (every training task at 0, or no 06 at all) earns it, and review says so; a 06 that earns a point in one
    of them, or a mark of 0, says nothing."""
    from grading.worker import trained_without_training

    marked = _record("07_generation_and_evaluation", {"test_greedy_decode": 0.0, "test_trained_model": 3.0})
    idle = _record("06_training", {"test_lr_at_step": 1.0, "test_train_step": 0.0, "test_fit": 0.0,
                                   "test_train_script": 0.0})
    flag = trained_without_training([idle, marked])
    assert flag and "3/3" in flag and "train_step, fit, train_script" in flag and "stands" in flag
    assert "was not graded" in trained_without_training([marked])
    works = _record("06_training", {"test_train_step": 0.0, "test_fit": 1.0, "test_train_script": 0.0})
    assert trained_without_training([works, marked]) is None
    unmarked = _record("07_generation_and_evaluation", {"test_trained_model": 0.0})
    assert trained_without_training([idle, unmarked]) is None
