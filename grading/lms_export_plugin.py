"""`python -m grading export` as an nbgrader exporter, for a course run with nbgrader's own commands:

    nbgrader export --exporter=grading.lms_export_plugin.LmsExport --LmsExport.out=OUT --LmsExport.lms=moodle

It writes what `python -m grading export OUT --to LMS` writes (grading/lms_export.py, docs/lms.md), from the
run's outcomes in OUT and the gradebook nbgrader opened (its scores at export time, formgrader's included).
nbgrader's `--to`, `--student` and `--assignment` are not used: the files go into OUT/<lms>/, for every student
of the run.
"""
from __future__ import annotations

from pathlib import Path

from nbgrader.plugins import ExportPlugin
from traitlets import Bool, Enum, Unicode

from .lms_export import LMS, export
from .notebooks import ASSIGNMENT
from .results import read_class_results


class LmsExport(ExportPlugin):
    """Grades and feedback pages as Moodle's or Canvas's import reads them."""

    out = Unicode("grading/work/results", help="the graded run's folder (autograde's --out)").tag(config=True)
    lms = Enum(list(LMS), default_value="moodle", help="moodle or canvas").tag(config=True)
    percent = Bool(False, help="grades as a percentage of the maximum, not points").tag(config=True)
    column = Unicode(ASSIGNMENT, help="Canvas: the assignment's column, 'Name (id)' as Canvas's export heads it"
                     ).tag(config=True)

    def export(self, gradebook) -> None:
        db_url = gradebook.engine.url.render_as_string(hide_password=False)
        out = Path(self.out)
        for path in export(out, read_class_results(out, db_url), self.lms, self.percent, self.column):
            self.log.info("wrote %s", path)
