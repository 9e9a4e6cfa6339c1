"""The grading command.

    python -m grading release                 solutions/ -> notebooks/ (student release, hidden data excluded)
    python -m grading references              rebuild the stored reference cases from the solutions
    python -m grading autograde SUBMISSIONS   grade a folder or zip of student notebooks
    python -m grading report OUT [--anonymise]  every output of a graded run again, with the scores given since
                                              (formgrader), and what the class got wrong (OUT/class_report.html)
    python -m grading export OUT --to moodle|canvas [--percent]   grades and feedback for the LMS's import
                                              (OUT/moodle/ or OUT/canvas/; docs/lms.md)
    python -m grading execute [NOTEBOOK ...]  run solution notebooks end to end (the maintainers' main job)
    python -m grading publish DEST [--repo OWNER/NAME]   the student-facing files only, for a student repository
    python -m grading rubric [DEST]           the graders' sheet of the written questions: each question, its
                                              model answer and rubric (grading/work/rubric.html; never for students)
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path

from .settings import add_options, from_options


def command_line() -> argparse.ArgumentParser:
    """The command's parser: every subcommand and its options."""
    parser = argparse.ArgumentParser(prog="python -m grading", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("release", help="generate notebooks/ from solutions/")
    sub.add_parser("references", help="rebuild reference outputs from the solution notebooks")
    ag = sub.add_parser("autograde", help="grade a folder or zip of submissions")
    ag.add_argument("submissions", type=Path)
    ag.add_argument("--out", type=Path, default=Path("grading/work/results"), help="grades, feedback, report")
    ag.add_argument("--course", type=Path, default=None, help="nbgrader course folder (default grading/work/course)")
    ag.add_argument("--db", default=None, help="gradebook SQLAlchemy URL (default: SQLite in the course folder)")
    ag.add_argument("--student", action="append", help="grade this student again (repeatable; the name as the export "
                    "gives it, the id in grades.csv or the LMS id); the rest of the "
                    "class keeps its results from the course folder's last run, and OUT holds the whole class")
    ag.add_argument("--resume", action="store_true", help="keep students finished by an interrupted run")
    add_options(ag)  # the settings of grading/settings.py: --cell-seconds, --notebook-seconds, ..., --no-sandbox
    add_late_options(ag)
    rp = sub.add_parser("report", help="write the class report of a graded run (autograde writes it too)")
    rp.add_argument("out", type=Path, nargs="?", default=Path("grading/work/results"), help="autograde's --out folder")
    rp.add_argument("--anonymise", action="store_true", help="students as 'student 01', ... in the report")
    rp.add_argument("--course", type=Path, default=None, help="the run's nbgrader course folder (default: the one "
                    "the run recorded in OUT): its gradebook's scores, those given by hand included, are the report's")
    rp.add_argument("--db", default=None, help="the run's gradebook URL (default: the one the run "
                    "recorded in OUT, else the course folder's SQLite file)")
    add_late_options(rp)
    xp = sub.add_parser("export", help="grades and feedback pages as Moodle's or Canvas's import reads them")
    xp.add_argument("out", type=Path, nargs="?", default=Path("grading/work/results"), help="autograde's --out folder")
    xp.add_argument("--to", choices=["moodle", "canvas"], required=True, help="the LMS (written into OUT/<LMS>/)")
    xp.add_argument("--percent", action="store_true", help="grades as a percentage of the maximum, not points")
    xp.add_argument("--assignment", default=None, help="Canvas: the assignment's column as Canvas's gradebook "
                    "export heads it, 'Name (id)' (default: the assignment's name, matched by title)")
    xp.add_argument("--course", type=Path, default=None, help="the run's nbgrader course folder (default: the one "
                    "the run recorded in OUT): its gradebook's scores, those given by hand included, are exported")
    xp.add_argument("--db", default=None, help="the run's gradebook URL (default: the one the run "
                    "recorded in OUT, else the course folder's SQLite file)")
    rb = sub.add_parser("rubric", help="the graders' sheet of the written questions (model answers and rubrics)")
    rb.add_argument("dest", type=Path, nargs="?", default=None, help="the HTML file (default grading/work/rubric.html)")
    pb = sub.add_parser("publish", help="copy the student-facing files into an empty folder")
    pb.add_argument("dest", type=Path)
    pb.add_argument("--repo", default=None, help="GitHub OWNER/NAME of the student repository, for the notebooks' "
                    "first cell and Colab badges")
    ex = sub.add_parser("execute", help="execute solution notebooks end to end")
    ex.add_argument("names", nargs="*", help="notebook names or numbers (default: all)")
    ex.add_argument("--out", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    # the grading modules log what they do (logging.getLogger("grading....")); the command shows that log, and
    # only that (not Dask's or Jupyter's), as plain lines
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("grading")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    args = command_line().parse_args(argv)

    if args.command == "release":
        from .course import release
        for path in release():
            print(f"wrote {path}")
    elif args.command == "references":
        from .cases.registry import build_all
        for public, hidden in build_all():
            print(f"wrote {public} and {hidden}")
    elif args.command == "autograde":
        from .autograde import autograde
        from .course import CourseLockError
        from .outcome import Status
        from .sandbox import SandboxUnavailable
        settings = from_options(args)
        if not settings.isolate:
            print("warning: grading WITHOUT the sandbox: student code runs as you, with your files; "
                  "every row is flagged for review", file=sys.stderr)
        try:
            results = autograde(args.submissions, args.out.resolve(),
                                args.course.resolve() if args.course else None, args.db, args.student,
                                resume=args.resume, settings=settings, progress=True, late=late_given(args))
        except (SandboxUnavailable, CourseLockError, ValueError) as exc:  # a PolicyError is a ValueError
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"graded {sum(r.status == Status.GRADED for r in results)} of {len(results)} students; "
              f"grades in {args.out / 'grades.csv'}")
    elif args.command == "report":
        from .report import write_outputs

        # the run's outcomes with the gradebook's points now: scores given in formgrader since count, in the
        # feedback pages too (made again first, for the students whose scores changed)
        if _from_class_results(args, "report", lambda results: write_outputs(args.out, results, args.anonymise)):
            return 2
        print(f"feedback pages: {args.out / 'feedback'} (with the gradebook's scores)")
        print(f"grades: {args.out / 'grades.csv'} (from the gradebook)")
        print(f"class report: {args.out / 'class_report.html'} (data: {args.out / 'class_report.json'})")
    elif args.command == "export":
        from .lms_export import NOT_EXPORTED, export
        from .notebooks import ASSIGNMENT
        from .spreadsheet import read_csv

        written: list[Path] = []
        students: list[int] = []  # how many the class has

        def export_class(results) -> None:
            written.extend(export(args.out, results, args.to, args.percent, args.assignment or ASSIGNMENT))
            students.append(len(results.students))

        if _from_class_results(args, "export", export_class):
            return 2
        for path in written:
            print(f"wrote {path}")
        listed = args.out / args.to / NOT_EXPORTED
        left_out = len(read_csv(listed))  # as the export listed them, each with its reason
        if left_out and left_out == students[0]:  # a file of headers only: the LMS would import nothing
            print(f"error: no student of {args.out} could be exported to {args.to.capitalize()}; "
                  f"{listed} says why for each (an export from the other LMS?)", file=sys.stderr)
            return 1
        print(f"exported {students[0] - left_out} of {students[0]} students to {args.to.capitalize()}"
              + (f"; {left_out} not exported, each with the reason: {listed}" if left_out else ""))
    elif args.command == "rubric":
        from .rubric import DEFAULT, write, written_questions
        questions = written_questions()
        dest = write(args.dest or DEFAULT, questions)
        print(f"wrote {dest}: {len(questions)} written questions with their model answers and rubrics "
              "(for graders only)")
    elif args.command == "publish":
        from .publish import publish
        dest = publish(args.dest, args.repo) if args.repo else publish(args.dest)
        print(f"student copy written to {dest} (checked: no solutions, no hidden tests)")
    elif args.command == "execute":
        from .execute import README, execute_all
        from .reference_run import FOLDER
        ok = execute_all(args.names, args.out, readme=README if args.out is None else None,
                         reference=FOLDER if args.out is None else None)
        return 0 if ok else 1
    return 0


def add_late_options(parser: argparse.ArgumentParser) -> None:
    """The late policy's parts (grading/late.py), recorded in the course folder; one not given keeps its record."""
    from .late import RULE_HELP

    group = parser.add_argument_group("late work", "recorded in the course folder and used by every later report and "
                                      "export until changed; one not given keeps what was recorded ('' clears it)")
    group.add_argument("--due", default=None, help="the due date and time, e.g. '2026-12-01 23:59'")
    group.add_argument("--late-penalty", default=None, help=RULE_HELP.replace("%", "%%"))
    group.add_argument("--extensions", default=None, help="CSV with columns student, due, penalty: a "
                       "student's own due date, or a penalty in points set by hand (0 waives it)")
    group.add_argument("--submitted", default=None, help="when each student handed in: Moodle's grading "
                       "worksheet, or a CSV with columns student, submitted (LMS zips carry no submission times)")


def late_given(args) -> dict:
    """The late-policy options given on the command line (grading.late.update_policy's arguments)."""
    given = {"due": args.due, "rule": args.late_penalty, "extensions": args.extensions, "submitted": args.submitted}
    return {k: v for k, v in given.items() if v is not None}


def late_warnings(policy, results) -> list[str]:
    """What the late policy's files say of nobody in the class, and the graded students it has no time for."""
    from .late import LateFacts
    from .results import student_keys

    facts = LateFacts.read(policy)
    lines = facts.unmatched([student_keys(s.outcome) for s in results.students])
    if policy.submitted:
        untimed = [s.outcome.name or s.student for s in results.graded if s.lateness.submitted is None]
        if untimed:
            lines.append(f"{policy.submitted} gives no submission time for {len(untimed)} graded student(s) "
                         f"({', '.join(untimed[:5])}{' …' if len(untimed) > 5 else ''}): not late by time")
    return lines


def _from_class_results(args, command: str, write) -> bool:
    """`write(results)`: the class's results of the run in `args.out` (its outcomes, the gradebook's points
    now), holding the course folder while it reads and writes, after the feedback pages in OUT are made again
    where the gradebook changed since (`report.refresh_feedback`). True, after one line on stderr, if it could not."""
    from .course import DEFAULT_COURSE, GRADEBOOK_FILE, CourseLockError, hold, sqlite_url
    from .late import read_policy, update_policy
    from .report import recorded_course, refresh_feedback
    from .results import missing_from_out, read_class_results

    if not (args.out / "outcomes").is_dir():
        print(f"error: {args.out} holds no graded run (no outcomes/): run autograde first", file=sys.stderr)
        return True
    course, gradebook = recorded_course(args.out)  # where the run graded, as it recorded it
    same_course = args.course is None or (course is not None and Path(args.course).resolve() == course)
    if same_course and args.db is None and gradebook and not gradebook.startswith("sqlite"):
        args.db = gradebook
        print(f"gradebook {gradebook} (where the run in {args.out} graded)")
    if args.course is None:
        args.course = course
        if args.course is not None:
            print(f"course folder {args.course} (where the run in {args.out} graded)")
    course_dir = args.course or DEFAULT_COURSE
    db_url = args.db or (sqlite_url(course_dir) if (course_dir / GRADEBOOK_FILE).is_file() else None)
    if db_url is None:  # the points are the gradebook's: without it there are none
        print(f"error: no gradebook in {course_dir}: give the run's --course or --db", file=sys.stderr)
        return True
    # not while a run grades in the course folder: its gradebook and report are still being written
    uses_course = (args.course or not args.db) and course_dir.is_dir()
    try:
        with hold(course_dir, f"{command} {args.out}") if uses_course else contextlib.nullcontext():
            absent = missing_from_out(args.out, course_dir if uses_course else None)
            if absent:  # OUT is not the whole class: its grades would leave students out
                raise ValueError(f"{args.out} holds no outcome of {len(absent)} student(s) of the class graded in "
                                 f"{course_dir} ({', '.join(absent[:3])}{' …' if len(absent) > 3 else ''}): it is not "
                                 "that class's last run (grade the class into it again, or give the --course it was "
                                 "graded in)")
            given = late_given(args) if hasattr(args, "due") else {}
            policy = update_policy(course_dir, **given) if given else read_policy(course_dir)
            results = read_class_results(args.out, db_url, policy)
            if policy.active:
                late = sum(s.lateness.late for s in results.students)
                print(f"late work: {policy.describe()}; {late} of {len(results.students)} students late")
                for line in late_warnings(policy, results):
                    print(f"warning: {line}", file=sys.stderr)
            # the feedback pages in OUT (which the export zips) with the gradebook's scores now, before any output
            made, notes = refresh_feedback(args.out, course_dir if uses_course else None, results, db_url)
            write(results)
    except (CourseLockError, ValueError) as exc:  # an export's ExportError (two students, one id) is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return True
    if made:
        print(f"feedback pages made again with the gradebook's scores: {len(made)} student(s)")
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    return False


if __name__ == "__main__":
    sys.exit(main())
