"""The judge's notebook records have one reader (grading.judge.read_record): what the judge writes, every report
reads back as the same objects; the class report leaves out a damaged file, a student's review does not."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from grading.judge import CaseResult, CellResult, NotebookRecord, read_class_records, read_record, read_records


def record(student: str, notebook: str) -> NotebookRecord:
    case = CaseResult(case="beam/basic", label="beam/basic", public=True, passed=False, message="keeps k alive",
                      diagnosis="keep_k_live")
    return NotebookRecord(student=student, notebook=notebook, sandbox="finished", sandbox_message="", isolated=True,
                          seconds=1.5, problems=[], cells=[CellResult("test_beam_search", 0.0, 3.0, [case])])


def test_a_record_reads_back_as_the_judge_wrote_it(tmp_path):
    written = record("alice", "06_decoding")
    path = tmp_path / "alice" / "06_decoding.json"
    path.parent.mkdir()
    path.write_text(json.dumps(asdict(written), indent=1))  # as grading.judge.Judge writes it
    assert read_record(path) == written
    assert read_records(tmp_path, "alice") == [written]
    assert read_class_records(tmp_path) == {"alice": {"06_decoding": written}}


def test_a_damaged_record_is_left_out_of_the_class_report_and_stops_a_review(tmp_path):
    for student in ("alice", "bob"):
        (tmp_path / student).mkdir()
        (tmp_path / student / "06_decoding.json").write_text(json.dumps(asdict(record(student, "06_decoding"))))
    (tmp_path / "bob" / "06_decoding.json").write_text('{"student": "bob"}')  # cut short
    assert set(read_class_records(tmp_path)) == {"alice"}
    with pytest.raises((TypeError, KeyError)):
        read_records(tmp_path, "bob")
