"""What the class got wrong: one page an instructor reads after grading, built from the class's results.

    python -m grading report OUT [--anonymise]      (autograde writes it at the end of every run)

Built from the run's `ClassResults` (grading/results.py), the value grades.csv and every other output are
written from too: the students' outcomes (who submitted what, review flags, and the judge's per-case results,
each failure with its `diagnosis`: a known bug's name, a symptom, an exception type; see
`starter.compare.Diagnosis`) and the gradebook's points (the judge's, or a person's where formgrader gave one).
Every score on the report (a task's full marks and mean credit, the totals) is the gradebook's, so it agrees
with grades.csv; the judge's cases and diagnoses say what went wrong, and where a person's score for a cell
differs from the judge's, the cell is marked "overridden by hand". Runs nothing and grades nothing. Writes
`OUT/class_report.json` and `OUT/class_report.html` (self-contained: inline PNG figures, no script, no network):
- score distributions per notebook and overall, and how many students attempted each task;
- per task and hidden case: pass rate, mean credit, and the cases that separate students most;
- the diagnoses, ranked by how many students received them, with the students they affect;
  failures with no diagnosis (exceptions, wrong values, time-outs) grouped by kind;
- written questions awaiting manual grading; review flags and missing notebooks;
- from the second run on (a re-submission round), the change since the previous run.
`OUT/outcomes` names hidden cases: it is for instructors, like the rest of OUT but `feedback/`.
"""
from __future__ import annotations

import base64
import html
import io
import json
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .judge import NOT_RUN, CaseResult
from .outcome import Status, StudentOutcome
from .results import ClassResults, Column

# Failures that name what is wrong (a misconception the class can be taught about) ...
NO_DIAGNOSIS = ("wrong values", "did not run", "no usable output", "output missing", "unreadable result",
                "not graded", "not implemented")  # ... and failures that do not (besides "raises X")
TOP_SEPARATING = 8


@dataclass
class CaseStats:
    notebook: str
    task: str
    case: str
    public: bool
    students: int  # students whose notebook was graded
    passed: int
    separation: float  # pass rate among the better half of the class minus the weaker half

    @property
    def pass_rate(self) -> float:
        return self.passed / self.students if self.students else 0.0


@dataclass
class TaskStats:
    notebook: str
    task: str
    max_points: float
    students: int
    attempted: int
    full_marks: int
    mean_credit: float  # mean share of the points earned, over students whose notebook was graded
    overridden: int = 0  # students whose score a person changed from the judge's
    cases: list[CaseStats] = field(default_factory=list)


@dataclass
class DiagnosisStats:
    notebook: str
    task: str
    diagnosis: str
    explanation: str  # the line a student saw (the most common one)
    students: list[str]
    named: bool  # False: a failure with no diagnosis (an exception, wrong values, did not run)
    overridden: list[str] = field(default_factory=list)  # of `students`, those whose score a person changed


def _labels(students: list[StudentOutcome]) -> dict[str, str]:
    """How the report names each student (by id): the name as the export gave it, with the LMS id where it
    gave one; with the id too where two students would read the same."""
    shown = {}
    for s in students:
        name = s.name or s.student
        shown[s.student] = f"{name} ({s.lms_id})" if s.lms_id else name
    twice = Counter(shown.values())
    return {k: v if twice[v] == 1 else f"{v} [{k}]" for k, v in shown.items()}


def _explain(message: str) -> str:
    """The diagnosis without the function's name in front (`sdpa`: ...)."""
    return message.split("`: ", 1)[1] if message.startswith("`") and "`: " in message else message


PUBLIC_NOT_SCORED = " (public example, not scored)"  # a failure of a public case where the cell is scored on hidden ones


def _task_stats(results: ClassResults, col: Column, better: set[str], weaker: set[str],
                found: dict[tuple[str, str, str], list[tuple[str, str]]]) -> TaskStats:
    """One task's row of the table: its points are the gradebook's, as in the totals; its cases and the
    failures' diagnoses (added to `found`: (notebook, task, diagnosis) -> [(student, message)]) the judge's."""
    took = [(s.student, s.task(col.notebook, col.task)) for s in results.graded if s.took(col.notebook)]
    stats = TaskStats(col.notebook, col.task, col.max_points, len(took), 0, 0, 0.0)
    credit = []
    case_rows: dict[str, list[tuple[str, CaseResult]]] = defaultdict(list)
    for s, t in took:
        points = t.points or 0.0
        credit.append(points / col.max_points if col.max_points else 0.0)
        stats.full_marks += points >= col.max_points
        stats.overridden += t.by_hand
        cases = t.judged.cases if t.judged else []
        scored_on_hidden = any(not k.public for k in cases)
        stats.attempted += points > 0 or any(k.passed or k.diagnosis not in ("not implemented", NOT_RUN)
                                             for k in cases)
        seen = set()
        for k in cases:
            case_rows[k.case].append((s, k))
        # a student counts once per task and diagnosis; a public example that is not scored (the cell is scored on
        # its hidden cases) only where no scored case of the student's failed the same way, and marked as such
        for k in sorted(cases, key=lambda k: k.public):
            kind = k.diagnosis or "wrong values"
            if k.passed or kind in seen:
                continue
            seen.add(kind)
            found[(col.notebook, col.task, kind + (PUBLIC_NOT_SCORED if k.public and scored_on_hidden else ""))].append(
                (s, k.message))
    stats.mean_credit = statistics.fmean(credit) if credit else 0.0
    for case, rows in case_rows.items():
        passed = {s for s, k in rows if k.passed}

        def rate(group, passed=passed):
            return len(passed & group) / len(group) if group else 0.0

        stats.cases.append(CaseStats(col.notebook, col.task, case, rows[0][1].public, len(rows), len(passed),
                                     round(rate(better) - rate(weaker), 3)))
    return stats


def build(results: ClassResults, anonymise: bool = False) -> dict:
    """The class report as plain data (what class_report.json holds)."""
    students = [s.student for s in results.students]
    label = _labels([s.outcome for s in results.students])
    alias = {s: (f"student {i + 1:0{len(str(len(students)))}d}" if anonymise else label[s])
             for i, s in enumerate(students)}
    # a flag may name another student (a shared run, a similar pair): anonymised, it names their alias
    others = re.compile(r"\b(" + "|".join(map(re.escape, sorted(students, key=len, reverse=True))) + r")\b") \
        if anonymise and students else None

    def with_aliases(flag: str) -> str:
        return others.sub(lambda m: alias[m.group(1)], flag) if others else flag

    graded = results.graded
    totals = {s.student: s.total() for s in graded}
    ranked = sorted(totals, key=lambda s: totals[s])
    weaker, better = set(ranked[: len(ranked) // 2]), set(ranked[(len(ranked) + 1) // 2:])

    distributions = {}
    for stem in results.notebooks:
        who = [s for s in graded if s.took(stem)]
        distributions[stem] = {"max": results.max_total(stem), "students": len(who),
                               "scores": [s.total(stem) for s in who]}
    distributions["overall"] = {"max": results.max_total(), "students": len(totals),
                                "scores": [totals[s] for s in ranked]}

    found: dict[tuple[str, str, str], list[tuple[str, str]]] = defaultdict(list)  # -> [(student, message)]
    tasks = [_task_stats(results, col, better, weaker, found) for col in results.columns if not col.written]
    by_hand = {(t.column.notebook, t.column.task, s.student) for s in graded for t in s.tasks if t.by_hand}
    diagnoses = []
    for (stem, task, kind), hits in found.items():
        message = Counter(_explain(m) for _, m in hits).most_common(1)[0][0]
        named = kind not in NO_DIAGNOSIS and not kind.startswith("raises ")
        diagnoses.append(DiagnosisStats(stem, task, kind, message, sorted(alias[s] for s, _ in hits), named,
                                        sorted(alias[s] for s, _ in hits if (stem, task, s) in by_hand)))
    diagnoses.sort(key=lambda d: (-len(d.students), d.notebook, d.task, d.diagnosis))

    review: list[dict] = []
    missing: list[dict] = []
    sandbox: Counter[str] = Counter()
    for s in results.students:
        entry = s.outcome
        review += [{"student": alias[s.student], "flag": with_aliases(flag)} for flag in entry.flags]
        if entry.status != Status.GRADED:
            review.append({"student": alias[s.student], "flag": f"not graded ({entry.status}): "
                           + "; ".join(entry.notes)[:300]})
        absent = [stem for stem in results.notebooks if stem not in entry.notebooks]
        if absent:
            missing.append({"student": alias[s.student], "missing": absent})
        for rec in entry.judged:
            if rec.sandbox != "finished":
                sandbox[rec.sandbox] += 1
    all_cases = [c for t in tasks for c in t.cases if not c.public and c.students >= 4]
    separating = sorted(all_cases, key=lambda c: (-c.separation, c.case))[:TOP_SEPARATING]
    return {
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run": results.run,
        "anonymised": anonymise,
        "students": len(students), "graded": len(graded),
        "distributions": distributions,
        "tasks": [asdict(t) | {"cases": [asdict(c) | {"pass_rate": round(c.pass_rate, 3)} for c in t.cases]}
                  for t in tasks],
        "separating_cases": [asdict(c) | {"pass_rate": round(c.pass_rate, 3)} for c in separating],
        "diagnoses": [asdict(d) for d in diagnoses if d.named],
        "no_diagnosis": [asdict(d) for d in diagnoses if not d.named],
        "written_questions": written_questions(results),
        "review": review,
        "missing_notebooks": missing,
        "sandbox_endings": dict(sandbox),
        "totals": {alias[s]: totals[s] for s in ranked},
    }


def written_questions(results: ClassResults) -> list[dict]:
    """Each written question (graded by a person in nbgrader's formgrader) with how far its grading has
    got among the graded students who handed its notebook in: answers graded, awaiting, mean score; and how many
    did not hand it in (their 0 is no answer graded 0)."""
    found = []
    for col in (c for c in results.columns if c.written):
        took = [s for s in results.graded if s.took(col.notebook)]  # a notebook not handed in has no answer to grade
        given = [t.points for s in took if (t := s.task(col.notebook, col.task)).points is not None]
        waiting, absent = len(took) - len(given), len(results.graded) - len(took)
        status = (f"{len(given)} graded" + (f", {waiting} awaiting manual grading" if waiting else "")
                  + (f"; mean {sum(given) / len(given):.2f} of {col.max_points:g}" if given else "")
                  + (f"; {absent} not handed in" if absent else ""))
        found.append({"notebook": col.notebook, "question": col.task, "points": col.max_points,
                      "graded": len(given), "awaiting": waiting, "not_handed_in": absent, "status": status})
    return found


def change(now: dict, before: dict | None) -> dict | None:
    """What moved since the previous run: the mean total, each diagnosis's count, students up or down."""
    if before is None:
        return None
    key = lambda d: (d["notebook"], d["task"], d["diagnosis"])  # noqa: E731
    was = {key(d): len(d["students"]) for d in before["diagnoses"] + before["no_diagnosis"]}
    now_counts = {key(d): len(d["students"]) for d in now["diagnoses"] + now["no_diagnosis"]}
    moved = sorted(({"notebook": k[0], "task": k[1], "diagnosis": k[2], "before": was.get(k, 0),
                     "now": now_counts.get(k, 0)} for k in set(was) | set(now_counts)
                    if was.get(k, 0) != now_counts.get(k, 0)), key=lambda m: (m["now"] - m["before"], m["task"]))
    both = set(now["totals"]) & set(before["totals"])
    mean = lambda d: statistics.fmean(d["distributions"]["overall"]["scores"]) if d["distributions"]["overall"]["scores"] else 0.0  # noqa: E731
    return {"previous_run": before["run"], "previous_generated": before["generated"],
            "mean_total_before": round(mean(before), 2), "mean_total_now": round(mean(now), 2),
            "improved": sum(now["totals"][s] > before["totals"][s] for s in both),
            "worse": sum(now["totals"][s] < before["totals"][s] for s in both),
            "unchanged": sum(now["totals"][s] == before["totals"][s] for s in both),
            "diagnoses": moved}


# ---- the page ---------------------------------------------------------------------------------------

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return f'<img alt="" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _histograms(data: dict) -> str:
    from matplotlib.figure import Figure  # not pyplot: no backend chosen, none changed, safe in a thread

    names = list(data["distributions"])
    fig = Figure(figsize=(2.6 * len(names), 2.4))
    axes = fig.subplots(1, len(names), squeeze=False)
    for ax, name in zip(axes[0], names):
        dist = data["distributions"][name]
        top = dist["max"] or 1.0
        ax.hist(dist["scores"], bins=10, range=(0, top), color="tab:blue" if name != "overall" else "tab:green")
        ax.set_title(f"{name[:2] if name != 'overall' else 'overall'} (n={dist['students']})", fontsize=9)
        ax.set_xlabel(f"points of {top:g}", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("students", fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _diagnosis_chart(rows: list[dict], graded: int) -> str:
    from matplotlib.figure import Figure

    rows = rows[:15][::-1]
    fig = Figure(figsize=(9, 0.32 * max(3, len(rows)) + 1))
    ax = fig.subplots()
    ax.barh([f"{r['notebook'][:2]} {r['task']}: {r['diagnosis']}"[:70] for r in rows],
            [len(r["students"]) for r in rows], color="tab:red")
    ax.set_xlabel(f"students (of {graded} graded)")
    ax.set_xlim(0, max(1, graded))
    ax.tick_params(labelsize=8)
    fig.tight_layout()
    return _png(fig)


def _table(head: list[str], rows: list[list], classes: str = "") -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{classes}"><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>'


def _who(students: list[str], limit: int = 12) -> str:
    return ", ".join(students[:limit]) + (f" and {len(students) - limit} more" if len(students) > limit else "")


def _who_diagnosed(d: dict) -> str:
    """The students a diagnosis was given to, and those of them whose score a person has since changed."""
    over = d.get("overridden") or []
    return _who(d["students"]) + (f"; overridden by hand: {len(over)} of {len(d['students'])} ({_who(over)})"
                                  if over else "")


CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:14px}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}img{max-width:100%}h2{margin-top:1.6em}
.muted{color:#666}"""


def render(data: dict) -> str:
    graded = data["graded"]
    parts = [f"<h1>What the class got wrong</h1><p class='muted'>{data['students']} students, {graded} graded; "
             f"generated {html.escape(data['generated'])} from run {data['run']}"
             + (" (student ids anonymised)" if data["anonymised"] else "") + "</p>"]
    if data.get("change"):
        ch = data["change"]
        parts.append("<h2>Since the previous run</h2>"
                     f"<p>Mean total {ch['mean_total_before']} &rarr; {ch['mean_total_now']}; "
                     f"{ch['improved']} students improved, {ch['worse']} went down, {ch['unchanged']} unchanged.</p>"
                     + _table(["notebook", "task", "diagnosis", "students before", "now"],
                              [[d["notebook"], d["task"], d["diagnosis"], d["before"], d["now"]]
                               for d in ch["diagnoses"][:30]]))
    named = data["diagnoses"]
    parts.append("<h2>Diagnoses, most common first</h2>")
    if named:
        parts.append(_diagnosis_chart(named, graded))
        parts.append(_table(["students", "notebook", "task", "diagnosis", "what the students were told", "who"],
                            [[len(d["students"]), d["notebook"], d["task"], d["diagnosis"], d["explanation"],
                              _who_diagnosed(d)] for d in named]))
    else:
        parts.append("<p>No named diagnosis was given to anyone.</p>")
    parts.append("<h2>Failures without a diagnosis</h2><p class='muted'>Exceptions, values that match no known "
                 "bug, tests that did not run (an earlier cell stopped, or a time-out).</p>")
    parts.append(_table(["students", "notebook", "task", "kind", "example", "who"],
                        [[len(d["students"]), d["notebook"], d["task"], d["diagnosis"], d["explanation"][:200],
                          _who_diagnosed(d)] for d in data["no_diagnosis"]]) if data["no_diagnosis"] else "<p>None.</p>")
    parts.append("<h2>Scores</h2>" + _histograms(data))
    parts.append("<h2>Tasks</h2><p class='muted'>Full marks and mean credit are the gradebook's scores, as in "
                 "grades.csv (a person's where one was given); the hidden cases' pass rates are the judge's.</p>" + _table(
        ["notebook", "task", "points", "graded", "attempted", "full marks", "mean credit", "overridden by hand",
         "hidden cases passed"],
        [[t["notebook"], t["task"], t["max_points"], t["students"], t["attempted"], t["full_marks"],
          f"{t['mean_credit']:.0%}", f"{t['overridden']} of {t['students']}" if t.get("overridden") else "",
          ", ".join(f"{c['case']} {c['pass_rate']:.0%}" for c in t["cases"] if not c["public"])]
         for t in data["tasks"]]))
    parts.append("<h2>Hidden cases that separate students most</h2><p class='muted'>Pass rate in the better half "
                 "of the class (by total) minus the weaker half.</p>" + _table(
                     ["case", "notebook", "task", "pass rate", "separation"],
                     [[c["case"], c["notebook"], c["task"], f"{c['pass_rate']:.0%}", f"{c['separation']:+.2f}"]
                      for c in data["separating_cases"]]))
    wq = data["written_questions"]
    parts.append("<h2>Written questions</h2>" + (_table(["notebook", "question", "points", "status"],
                 [[q["notebook"], q["question"], q["points"], q["status"]] for q in wq]) if wq else
                 "<p>This assignment has no written (manually graded) questions.</p>"))
    parts.append("<h2>For review</h2>" + (_table(["student", "flag"], [[r["student"], r["flag"]] for r in data["review"]])
                                          if data["review"] else "<p>Nothing flagged.</p>"))
    if data["sandbox_endings"]:
        parts.append("<p>Sandbox runs that did not finish normally: " + html.escape(
            ", ".join(f"{k}: {v}" for k, v in sorted(data["sandbox_endings"].items()))) + "</p>")
    absent: dict[str, list[str]] = defaultdict(list)
    for m in data["missing_notebooks"]:
        for stem in m["missing"]:
            absent[stem].append(m["student"])
    parts.append("<h2>Missing notebooks</h2>" + (_table(["notebook", "students without it", "who"],
                                                        [[stem, len(who), _who(who)] for stem, who in absent.items()])
                                                 if absent else "<p>Every student handed in every notebook.</p>"))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title><style>{CSS}</style>"
            f"</head><body>{''.join(parts)}</body></html>")


def write(out: Path, results: ClassResults, anonymise: bool = False) -> tuple[Path, Path]:
    """Write OUT/class_report.json and .html of `results`; the report of an earlier run is kept as
    class_report.previous.json and compared with."""
    out = Path(out)
    data = build(results, anonymise)
    current, previous = out / "class_report.json", out / "class_report.previous.json"
    before = None
    if current.exists():
        try:
            old = json.loads(current.read_text())
            if old.get("run") != data["run"]:  # an earlier grading run: it becomes the previous one
                current.replace(previous)
        except (OSError, ValueError):
            pass
    if previous.exists():
        try:
            before = json.loads(previous.read_text())
        except (OSError, ValueError):
            before = None
    if before is not None and before.get("anonymised") != anonymise:
        before = None  # ids would not match
    data["change"] = change(data, before)
    current.write_text(json.dumps(data, indent=1))
    page = out / "class_report.html"
    page.write_text(render(data), encoding="utf-8")
    return current, page
