"""An instructor's term on a class of three, run for real, its outputs written into docs/instructors.md.

    python benchmarks/instructor_walk.py            # run the walk, print each command and what it printed
    python benchmarks/instructor_walk.py --docs     # ... and write them into docs/instructors.md's step list

The class (notebook 01 only, so the walk takes about a minute): a Moodle download of three participants, Ada with
the solution, Alan with a causal mask that hides the diagonal, Grace with a text file and no notebook. The walk
publishes the student copy, grades the zip, writes the graders' sheet, gives Ada's and Alan's written answers
scores the way formgrader does (nbgrader's gradebook API), reports, gives a late policy with Moodle's grading
worksheet (Alan a day late), exports to Moodle, then re-grades Alan after he fixed his mask. Each command runs as an instructor types it, `python -m grading ...` in a fresh folder; the doc shows
what it printed, with that folder's path written as `~/term`.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import nbformat

from grading.execute import replace_block
from grading.notebooks import ASSIGNMENT, filled_submission, written_columns

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "instructors.md"
MARKERS = ("<!-- term walk: written by `python benchmarks/instructor_walk.py --docs`; do not edit by hand -->",
           "<!-- end of term walk -->")
NB = "01_scaled_dot_product_attention"
MOODLE = "{name}_{id}_assignsubmission_file_/{file}"
BUG = {"causal_mask": "def causal_mask(T, device=None):\n    return torch.ones(T, T, dtype=torch.bool).tril(-1)\n"}
SHOWN_AS = "~/term"

# (the step's text, the commands it runs); a command's output is shown under it
STEPS = [
    ("**Before the term, publish the student copy** into an empty folder, and push that folder as the students' "
     "repository (this one holds the solutions and hidden references: keep it private).",
     [["publish", "student-copy", "--repo", "my-uni/attention-2027"]]),
    ("**Collect the class's work**: Moodle's *Download all submissions* or Canvas's *Download Submissions*, one "
     "zip (here `class.zip`). For late work on Moodle, download its *grading worksheet* too (the zip holds no "
     "submission times: see [late work](#late-work)).", []),
    ("**Grade it.** One course folder per class and term (`--course`), one OUT for its results (`--out`):",
     [["autograde", "class.zip", "--out", "out", "--course", "course"]]),
    ("**Read `review`.** `out/grades.csv` has a row per student; its `review` column says what to look at before "
     "grades go out ([each flag, and what to do](#what-does-each-review-flag-mean)), `not_handed_in` and `notes` "
     "what was missing or repaired, `late` how late under your policy. `out/class_report.html` is what the class got "
     "wrong, most common first.", []),
    ("**Grade the written questions** in nbgrader's formgrader ([how](#written-questions)), with the graders' sheet "
     "open beside it:", [["rubric", "rubric.html"]]),
    ("**Put the written grades into every output** (`grades.csv`, the feedback pages, the class report):",
     [["report", "out"]]),
    ("**Late work**, at any time (here from Moodle's grading worksheet, where Alan handed in a day late): the policy "
     "is recorded in the course folder for every later report and export ([late work](#late-work)):",
     [["report", "out", "--due", "2026-12-01 23:59", "--late-penalty", "10%/day,max 50%", "--submitted",
       "worksheet.csv"]]),
    ("**Export to the LMS** and upload what it wrote (Moodle: *Upload grading worksheet*, then *Upload multiple "
     "feedback files in a zip*; Canvas: *Import* in the Gradebook, then *Re-Upload Submissions*):",
     [["export", "out", "--to", "moodle"]]),
    ("**Re-grade** a resubmission or a regrade request (here Alan's, his mask fixed), then report and export again:",
     [["autograde", "class.zip", "--out", "out", "--course", "course", "--student", "Alan Turing"]]),
]


def write_class(path: Path, alan_fixed: bool) -> None:
    """The Moodle download: Ada (the solution), Alan (a mask without its diagonal, unless fixed), Grace (no notebook)."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, pid, overrides in (("Ada Lovelace", 1001, None), ("Alan Turing", 1002, None if alan_fixed else BUG)):
            zf.writestr(MOODLE.format(name=name, id=pid, file=f"{NB}.ipynb"),
                        nbformat.writes(filled_submission(NB, overrides)))
        zf.writestr(MOODLE.format(name="Grace Hopper", id=1003, file="notes.txt"), "I will hand it in tomorrow\n")


def write_worksheet(path: Path) -> None:
    """Moodle's grading worksheet as it downloads (the columns the late policy reads, userdate()'s English times):
    Ada on time, Alan a day late, Grace with no submission."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["Identifier", "Full name", "Status", "Last modified (submission)"],
                                 ["Participant 1001", "Ada Lovelace", "Submitted for grading",
                                  "Tuesday, 1 December 2026, 10:12 PM"],
                                 ["Participant 1002", "Alan Turing", "Submitted for grading",
                                  "Wednesday, 2 December 2026, 9:30 AM"],
                                 ["Participant 1003", "Grace Hopper", "No submission", "-"]])


def grade_written_answers(course: Path) -> None:
    """What a TA does in formgrader: a score for each written answer of notebook 01 (Ada full marks, Alan half)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for submission in gb.assignment_submissions(ASSIGNMENT):
            share = 1.0 if submission.student_id.startswith("ada") else 0.5
            for stem, question, points in written_columns():
                if stem == NB:
                    gb.find_grade(question, stem, ASSIGNMENT, submission.student_id).manual_score = share * points
        gb.db.commit()


def run(folder: Path, argv: list[str]) -> str:
    """`python -m grading ARGV` in `folder`, as an instructor runs it: what it printed (progress bars left out)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "grading", *argv], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"python -m grading {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    lines = [line for line in (done.stdout + done.stderr).splitlines()
             if line.strip() and not re.search(r"\d+%\|", line)]  # tqdm's bars
    shown = "\n".join(lines).replace(str(folder.resolve()), SHOWN_AS).replace(str(folder), SHOWN_AS)
    return re.sub(r"\(\d+(?:\.\d+)? s\)", "(… s)", shown)  # seconds differ from run to run


def walk(folder: Path) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each step's text with its commands and their outputs."""
    write_class(folder / "class.zip", alan_fixed=False)
    done = []
    for text, commands in STEPS:
        outputs = []
        for argv in commands:
            if argv == ["report", "out"]:
                grade_written_answers(folder / "course")
            if "--submitted" in argv:
                write_worksheet(folder / "worksheet.csv")
            if "--student" in argv:
                write_class(folder / "class.zip", alan_fixed=True)
            shown = " ".join(f'"{a}"' if " " in a else a for a in argv)
            outputs.append((f"python -m grading {shown}", run(folder, argv)))
            print(f"$ {outputs[-1][0]}\n{outputs[-1][1]}\n", flush=True)
        done.append((text, outputs))
    return done


def markdown(done: list[tuple[str, list[tuple[str, str]]]]) -> str:
    parts = []
    for i, (text, outputs) in enumerate(done, start=1):
        parts.append(f"{i}. {text}")
        for command, output in outputs:
            parts.append("   ```console\n   $ " + command + "\n" + "\n".join(f"   {line}" for line in output.splitlines())
                         + "\n   ```")
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", action="store_true", help=f"write the walk into {DOC.relative_to(ROOT)}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="term-") as tmp:
        done = walk(Path(tmp))
    if args.docs:
        replace_block(DOC, MARKERS, markdown(done), "term walk")
        print(f"wrote the walk into {DOC}")


if __name__ == "__main__":
    main()
