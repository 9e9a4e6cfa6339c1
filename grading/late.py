"""Late work: a due date, each student's extension, a penalty rule, and when each student handed in.

What the grader can know of when work was handed in, and what it does not trust:
- Canvas's download marks a late submission in its file names (`LATE`): Canvas's own judgement, with its
  per-student due dates; intake keeps it (the outcome's `lms_late`), but it says not how late.
- The time of each submission is in the LMS, not in its zip: Moodle (4.1 on) writes its download zip with
  ZipStream and no time for the files, so every file carries the time of the download (mod/assign's downloader
  calls `add_file_from_stored_file` without the `time` option, whose default is the current time); a folder's
  file times are those of whoever copied it. The kit reads neither. The times come from a file the instructor
  gives (`--submitted`): Moodle's grading worksheet (its `Last modified (submission)` column, by `Identifier`),
  or a CSV with columns `student` and `submitted`.

The policy is the instructor's, kept in the course folder (`late_policy.json`, written by `autograde` or `report`
from `--due`, `--late-penalty`, `--extensions` and `--submitted`; what is not given is kept): the class's due date,
the rule, a CSV of extensions and hand overrides (`student`, `due`, `penalty`), the submission times. Its files
are read again at every `report` and `export`, so an extension added or a penalty waived counts at once. The
penalty is worked out where the grades are (`grading.results`), from the student's total as the gradebook holds
it then (written answers graded since included), once: `grades.csv` has the total, the penalty and the final
grade; both LMS exports write the final grade and say why in the comment; the feedback page says how late and
the rule.

nbgrader's own late-penalty step (AssignLatePenalties) is not in the pipeline: it fixes a penalty per notebook at
autograde time, from scores before anyone grades the written answers, from a submission time nbgrader reads from
a `timestamp.txt` that LMS exports do not have.

Times are wall-clock times without a time zone, compared as they are: give `--due` in the time the submission
times are written in (Moodle's worksheet: the downloading user's time zone).
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

POLICY_FILE = "late_policy.json"  # in the course folder
RULE = re.compile(r"\s*(?P<rate>\d+(?:\.\d+)?)\s*%\s*/\s*day\s*(?:,\s*max\s*=?\s*(?P<cap>\d+(?:\.\d+)?)\s*%)?\s*",
                  re.I)
RULE_HELP = ("none (the default), zero (late work gets 0), or P%/day[,max C%]: P per cent of the student's total "
             "for each day or part of a day late, at most C per cent")
# Moodle's grading worksheet: a participant's row, and when they last changed their submission (userdate's default
# format, English: "Monday, 1 December 2026, 11:59 PM"; "-" where there is no submission)
MOODLE_ID, MOODLE_SUBMITTED, MOODLE_PARTICIPANT = "Identifier", "Last modified (submission)", "Participant "
TIME_FORMATS = ("%A, %d %B %Y, %I:%M %p", "%d %B %Y, %I:%M %p", "%A, %d %B %Y, %H:%M", "%d %B %Y, %H:%M")


class PolicyError(ValueError):
    """The late policy given cannot be used: the message says what and why, on one line."""


def parse_time(text: str, what: str) -> datetime:
    """A wall-clock time from `text`: ISO (`2026-12-01 23:59`) or Moodle's English format; one with a time zone
    is taken in this machine's."""
    text = text.strip()
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        for fmt in TIME_FORMATS:
            try:
                return datetime.strptime(text, fmt)
            except ValueError:
                continue
        raise PolicyError(f"{what} {text!r} is not a date and time (write it as 2026-12-01 23:59)") from None
    return when.astimezone().replace(tzinfo=None) if when.tzinfo else when


def check_rule(rule: str) -> str:
    rule = rule.strip().lower()
    if rule in ("none", "zero"):
        return rule
    m = RULE.fullmatch(rule)
    if m is None:
        raise PolicyError(f"late penalty {rule!r} is not a rule: give {RULE_HELP}")
    if not (0 < float(m["rate"]) <= 100 and (m["cap"] is None or 0 < float(m["cap"]) <= 100)):
        raise PolicyError(f"late penalty {rule!r}: a day's share and the cap are per cent of the total, more than 0 "
                          "and at most 100 (for late work that gets 0, give zero)")
    return rule


def _rows(path: Path, what: str, option: str) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return [{(k or "").strip(): (v or "").strip() for k, v in row.items() if isinstance(v, str)}
                    for row in csv.DictReader(f)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PolicyError(f"the {what} file {path} of the late policy cannot be read ({exc}): give {option} again "
                          f"with the file, or {option} '' to stop using one") from None


@dataclass(frozen=True)
class Override:
    """A row of the extensions CSV: the student's own due date, and a penalty a person set (points; None: the rule's)."""
    due: datetime | None
    penalty: float | None


@dataclass(frozen=True)
class LatePolicy:
    due: str = ""  # the class's due date (ISO); "": none
    rule: str = "none"
    extensions: str = ""  # the CSV of extensions and hand overrides (a path), read at each report
    submitted: str = ""  # the submission times (a path): Moodle's grading worksheet, or student,submitted

    @property
    def active(self) -> bool:
        return self != LatePolicy()

    def describe(self) -> str:
        """The rule in words, as students read it."""
        if self.rule == "none":
            return "no late penalty"
        if self.rule == "zero":
            return "late work gets 0"
        m = RULE.fullmatch(self.rule)
        assert m is not None
        return f"late penalty {m['rate']}% of the total a day (a part of a day counts as one)" + (
            f", at most {m['cap']}%" if m["cap"] else "")

    def read_extensions(self) -> dict[str, Override]:
        """{student as the CSV names them: their extension or override}; columns `student`, `due`, `penalty` (either
        may be empty). A CSV that cannot be used raises PolicyError naming the line."""
        if not self.extensions:
            return {}
        path, found = Path(self.extensions), {}
        for line, row in enumerate(_rows(path, "extensions", "--extensions"), start=2):
            who, due, penalty = row.get("student", ""), row.get("due", ""), row.get("penalty", "")
            if not who:
                raise PolicyError(f"{path}, line {line}: no student (columns: student, due, penalty)")
            try:
                points = float(penalty) if penalty else None
            except ValueError:
                raise PolicyError(f"{path}, line {line}: penalty {penalty!r} is not a number of points") from None
            if points is not None and not (math.isfinite(points) and points >= 0):
                raise PolicyError(f"{path}, line {line}: penalty {penalty!r} must be 0 or more points")
            found[who] = Override(parse_time(due, f"{path}, line {line}: due") if due else None, points)
        return found

    def read_times(self) -> dict[str, datetime]:
        """{student (Moodle: the participant id): when they handed in} from the submission-times file."""
        if not self.submitted:
            return {}
        path, found = Path(self.submitted), {}
        rows = _rows(path, "submission times", "--submitted")
        moodle = bool(rows) and MOODLE_ID in rows[0] and MOODLE_SUBMITTED in rows[0]
        if rows and not moodle and not {"student", "submitted"} <= set(rows[0]):
            raise PolicyError(f"{path} has neither Moodle's worksheet columns ({MOODLE_ID}, {MOODLE_SUBMITTED}) "
                              "nor the columns student, submitted")
        for line, row in enumerate(rows, start=2):
            who = row[MOODLE_ID].removeprefix(MOODLE_PARTICIPANT) if moodle else row["student"]
            when = row[MOODLE_SUBMITTED] if moodle else row["submitted"]
            if who and when and when != "-":
                found[who] = parse_time(when, f"{path}, line {line}:")
        return found

    def checked(self) -> LatePolicy:
        """The policy, each part checked (raises PolicyError): the due date, the rule, both files."""
        if self.due:
            parse_time(self.due, "--due")
        check_rule(self.rule)
        self.read_extensions()
        self.read_times()
        return self


NO_LATE_POLICY = LatePolicy()


def read_policy(root: Path) -> LatePolicy:
    """The course folder's late policy; none recorded: no penalty for anyone."""
    try:
        raw = json.loads((Path(root) / POLICY_FILE).read_text())
        return LatePolicy(**{k: str(raw[k]) for k in ("due", "rule", "extensions", "submitted") if k in raw})
    except (OSError, ValueError, TypeError):
        return LatePolicy()


def update_policy(root: Path, due: str | None = None, rule: str | None = None, extensions: str | None = None,
                  submitted: str | None = None) -> LatePolicy:
    """The course folder's policy with what is given replaced (the rest kept; "" clears a part), checked, then
    recorded there. Raises PolicyError, recording nothing, if a part cannot be used."""
    old = read_policy(root)

    def path(given: str | None, kept: str) -> str:
        return kept if given is None else (str(Path(given).resolve()) if str(given).strip() else "")

    policy = LatePolicy(due=old.due if due is None else due.strip(),
                        rule=old.rule if rule is None else (rule.strip().lower() or "none"),
                        extensions=path(extensions, old.extensions), submitted=path(submitted, old.submitted))
    policy.checked()
    if policy != old:
        target = Path(root) / POLICY_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(asdict(policy), indent=1) + "\n")
    return policy


@dataclass(frozen=True)
class Lateness:
    """How late one student handed in under a policy: the facts, not the points (those follow the total)."""
    due: datetime | None  # the due date that applies to them (their extension's, else the class's)
    extended: bool  # `due` is their own
    submitted: datetime | None  # when they handed in (None: not known)
    lms_late: bool  # the export marks it late
    days: int  # days late, a part of a day counting as one; 0 on time or not known
    penalty_by_hand: float | None  # points a person set in the extensions CSV

    @property
    def late(self) -> bool:
        """Late by the times, or marked late by the LMS where no time says otherwise (and no extension of theirs)."""
        return self.days > 0 or (self.lms_late and self.submitted is None and not self.extended)


ON_TIME = Lateness(None, False, None, False, 0, None)


@dataclass(frozen=True)
class LateFacts:
    """The policy with its files read once, for a whole class."""
    policy: LatePolicy
    extensions: dict[str, Override]
    times: dict[str, datetime]

    @classmethod
    def read(cls, policy: LatePolicy) -> LateFacts:
        return cls(policy, policy.read_extensions(), policy.read_times())

    def unmatched(self, class_keys: list[list[str]]) -> list[str]:
        """A line for each row of the files that names no student of the class (a typo loses an extension or a
        time without a word otherwise)."""
        known = {k for keys in class_keys for k in keys}
        lines = [f"{self.policy.extensions}: {who!r} is no student of the class (names: the name as the export gives "
                 "it, the id in grades.csv, or the LMS id); its row is not used" for who in self.extensions
                 if who not in known]
        lines += [f"{self.policy.submitted}: {who!r} is no student of the class; its time is not used"
                  for who in self.times if who not in known]
        return lines

    def of(self, keys: list[str], lms_late: bool) -> Lateness:
        """A student's lateness: `keys` are the ways the files may name them (name, id, LMS id)."""
        own = next((self.extensions[k] for k in keys if k and k in self.extensions), None)
        due = own.due if own and own.due else (parse_time(self.policy.due, "--due") if self.policy.due else None)
        submitted = next((self.times[k] for k in keys if k and k in self.times), None)
        days = 0
        if due is not None and submitted is not None and submitted > due:
            days = math.ceil((submitted - due).total_seconds() / 86400)
        return Lateness(due, bool(own and own.due), submitted, lms_late, days, own.penalty if own else None)


def penalty(policy: LatePolicy, late: Lateness, total: float) -> float:
    """Points taken off a total of `total` (never more than it): a person's, else the rule's."""
    if late.penalty_by_hand is not None:
        return min(total, late.penalty_by_hand)
    if not late.late or policy.rule == "none":
        return 0.0
    if policy.rule == "zero":
        return total
    m = RULE.fullmatch(policy.rule)
    assert m is not None
    share = float(m["rate"]) * late.days
    if m["cap"]:
        share = min(share, float(m["cap"]))
    return round(min(total, total * share / 100), 4)


def stamp(when: datetime | None) -> str:
    return when.strftime("%Y-%m-%d %H:%M") if when else ""


def late_line(policy: LatePolicy, late: Lateness) -> str:
    """One line for the student's page and LMS comment (no points: those follow the total); "" when nothing to say."""
    by_hand = "" if late.penalty_by_hand is None else f"late penalty set by your instructor: {late.penalty_by_hand:g} points"
    due = f"due {stamp(late.due)}" + (", your extension" if late.extended else "")
    if late.days > 0:
        said = f"handed in {stamp(late.submitted)}, {late.days} day{'s' * (late.days > 1)} late ({due})"
    elif late.late:
        said = "marked late by the LMS" + (
            " (how late is not known: no penalty counted)" if RULE.fullmatch(policy.rule) and not by_hand else "")
    elif late.extended and late.submitted is not None:  # on time thanks to the extension: say so
        return f"handed in {stamp(late.submitted)}, on time ({due})" + (f"; {by_hand}" if by_hand else "")
    else:
        return by_hand
    return f"{said}; {by_hand or policy.describe()}"
