"""nbgrader's check of the cells' nbgrader metadata, with its JSON schema compiled once per process.

nbgrader's `MetadataValidatorV3.validate_cell` calls `jsonschema.validate(metadata, schema)` for every cell, and
that checks the schema itself against JSON Schema's meta-schema each time: 0.95 s for the course's seven notebooks
on a 2-core machine, paid twice per student while graded (nbgrader's sanitizing and autograding passes) and twice
when the course is prepared. `MetadataValidator` checks each cell against a validator made once (the same
`best_match` error as `jsonschema.validate`), then lets nbgrader's own `validate_cell` make every other check it
makes; `CheckCellMetadata` is nbgrader's step with it, and the course's configuration (grading/course.py) puts
it where nbgrader's pipelines have theirs.
"""
from __future__ import annotations

import traceback
from typing import Any

import jsonschema
from nbgrader.nbgraderformat import ValidationError
from nbgrader.nbgraderformat.v3 import MetadataValidatorV3
from nbgrader.preprocessors import CheckCellMetadata as NbgraderCheckCellMetadata

_VALIDATORS: dict[int, Any] = {}  # schema version -> its schema, checked and compiled


def _schema_validator(version: int, schema: dict) -> Any:
    if version not in _VALIDATORS:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)  # once, where jsonschema.validate does it for every cell
        _VALIDATORS[version] = cls(schema)
    return _VALIDATORS[version]


class MetadataValidator(MetadataValidatorV3):
    """nbgrader's MetadataValidatorV3, each cell checked against the schema compiled once."""

    schema: Any  # nbgrader's schema (a dict read from its v3.json), or True while nbgrader's own checks run

    def validate_cell(self, cell) -> None:
        meta = cell.metadata.get("nbgrader")
        if meta is not None and meta.get("schema_version", 0) == self.schema_version:
            validator = _schema_validator(self.schema_version, self.schema)
            error = jsonschema.exceptions.best_match(validator.iter_errors(meta))
            if error is not None:
                raise error
        # nbgrader's own checks (schema version, grade ids, points, cell types), its schema check already done:
        # `True` is the schema every value meets, and checking it costs nothing
        schema, self.schema = self.schema, True
        try:
            super().validate_cell(cell)
        finally:
            self.schema = schema


class CheckCellMetadata(NbgraderCheckCellMetadata):
    """nbgrader's CheckCellMetadata with `MetadataValidator`: the same checks, errors and log."""

    def preprocess(self, nb, resources):
        try:
            MetadataValidator().validate_nb(nb)
        except ValidationError:
            self.log.error(traceback.format_exc())
            msg = "Notebook failed to validate; the nbgrader metadata may be corrupted."
            self.log.error(msg)
            raise ValidationError(msg) from None
        return nb, resources
