"""A grading run's settings (grading/settings.py): one name each, from the command line through the run
(grading.course.GradingRun) to the sandbox's step, and no other place that sets them."""
from __future__ import annotations

import argparse
import pickle
import re

import cloudpickle
from conftest import ROOT
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets.config.loader import PyFileConfigLoader

from grading import course
from grading.course import CourseFiles, GradingRun
from grading.settings import Limits, Settings, add_options, from_options
from grading.worker import GradeNotebook


def parse(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_options(parser)
    return from_options(parser.parse_args(list(argv)))


def test_the_command_line_has_one_option_per_setting_named_as_its_field():
    assert parse() == Settings()
    chosen = parse("--cell-seconds", "7", "--notebook-seconds", "90", "--memory-mb", "900", "--cpus", "0.5",
                   "--processes", "64", "--file-mb", "8", "--scratch-mb", "128", "--no-sandbox", "--no-reuse-sandbox",
                   "--workers", "3", "--scheduler", "tcp://h:8786")
    assert chosen == Settings(Limits(cell_seconds=7, notebook_seconds=90, memory_mb=900, cpus=0.5, processes=64,
                                     file_mb=8, scratch_mb=128), isolate=False, reuse_sandbox=False, workers=3,
                              scheduler="tcp://h:8786")


def test_the_settings_travel_in_the_run_not_in_the_course_configuration(tmp_path):
    """A run's settings reach every student's grading in its GradingRun, pickled whole to the workers;
    nbgrader_config.py holds nbgrader's own keys and the kit's steps in its pipelines, nothing of the kit's steps'
    own (they get the run from the app that runs them)."""
    settings = Settings(Limits(cell_seconds=7, notebook_seconds=90, memory_mb=900, scratch_mb=128), isolate=False,
                        reuse_sandbox=False)
    run = GradingRun(tmp_path, settings, CourseFiles(tmp_path / "case_inputs", None, (tmp_path,)), "digest",
                     "sqlite:///gradebook.db")
    assert pickle.loads(cloudpickle.dumps(run)) == run
    course.write_config(tmp_path)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    assert "GradeNotebook" not in config and "RedactHiddenTests" not in config, config
    assert config.Autograde.autograde_preprocessors[0] == "grading.worker.GradeNotebook"  # keeps nbgrader's own out
    own = set(GradeNotebook.class_traits(config=True)) - set(NbGraderPreprocessor.class_traits(config=True))
    assert not own, f"settings of the grading step read from the configuration: {own}"


def test_no_other_name_or_default_for_a_setting_in_the_grading_code():
    old = re.compile(r"cell_timeout|notebook_timeout|CELL_TIMEOUT|NOTEBOOK_TIMEOUT|--cell-timeout|\"--timeout\"")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "grading").glob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if old.search(line)]
    assert not found, f"the old names of a setting: {found}"
