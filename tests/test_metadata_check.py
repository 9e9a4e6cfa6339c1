"""The kit's check of the cells' nbgrader metadata (grading/metadata_check.py) is nbgrader's, schema compiled once:
the same verdict and the same error for each kind of damage, and every pipeline of the course that checks metadata
uses it."""
from __future__ import annotations

import copy
import re

import pytest
from nbgrader.nbgraderformat import MetadataValidator as NbgraderValidator
from nbgrader.preprocessors import CheckCellMetadata as NbgraderCheck

from grading import course
from grading import notebooks as nbs
from grading.metadata_check import CheckCellMetadata, MetadataValidator

DAMAGE = {
    "points_not_a_number": lambda m: m.__setitem__("points", "x"),
    "no_grade_id": lambda m: m.pop("grade_id"),
    "empty_grade_id": lambda m: m.__setitem__("grade_id", ""),
    "old_schema": lambda m: m.__setitem__("schema_version", 2),
    "new_schema": lambda m: m.__setitem__("schema_version", 4),
    "extra_key": lambda m: m.__setitem__("extra", 1),
    "grade_not_boolean": lambda m: m.__setitem__("grade", "yes"),
    "no_points": lambda m: m.pop("points"),
    "nothing_wrong": lambda m: None,
}


def _verdict(validator, nb) -> str:
    try:
        validator().validate_nb(nb)
        return "valid"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_the_kits_check_gives_nbgraders_verdict(damage):
    nb = nbs.read(nbs.solution_notebooks()[0])
    cell = next(c for c in nb.cells if nbs.nbgrader_meta(c).get("grade"))
    DAMAGE[damage](cell.metadata["nbgrader"])
    ours, theirs = _verdict(MetadataValidator, copy.deepcopy(nb)), _verdict(NbgraderValidator, copy.deepcopy(nb))
    assert ours == theirs, f"{damage}: the kit's check says {ours!r}, nbgrader's {theirs!r}"
    assert (ours == "valid") == (damage == "nothing_wrong"), f"{damage}: {ours}"


def test_a_duplicate_grade_id_is_refused_by_the_kits_step():
    nb = nbs.read(nbs.solution_notebooks()[0])
    graded = [c for c in nb.cells if nbs.nbgrader_meta(c).get("grade")]
    graded[1].metadata["nbgrader"]["grade_id"] = graded[0].metadata["nbgrader"]["grade_id"]
    for step in (CheckCellMetadata, NbgraderCheck):
        with pytest.raises(Exception, match="failed to validate"):
            step().preprocess(copy.deepcopy(nb), {})


def test_every_pipeline_of_the_course_that_checks_metadata_uses_the_kits_check(tmp_path):
    course.write_config(tmp_path)
    config = (tmp_path / "nbgrader_config.py").read_text()
    assert "nbgrader.preprocessors.CheckCellMetadata" not in config
    assert "checkcellmetadata.CheckCellMetadata" not in config
    for pipeline in ("Autograde.autograde_preprocessors", "Autograde.sanitize_preprocessors",
                     "GenerateAssignment.preprocessors"):
        block = re.search(rf"c\.{re.escape(pipeline)} = \[(.*?)\]", config, re.S)
        assert block and "grading.metadata_check.CheckCellMetadata" in block.group(1), pipeline
    compile(config, "nbgrader_config.py", "exec")
