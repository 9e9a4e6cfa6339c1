"""Where the test suite's time goes: the logs of whole runs of `python3 kit.py test --durations=0`, side by side.

    python3 kit.py test -p no:cacheprovider --durations=0 > after.log      (and the same on another revision)
    python benchmarks/suite_time.py before.log after.log [--top 30] [--markdown FILE] [--readme]

Prints each run's wall time and counts (pytest's closing line), then the slowest set-ups, calls and tear-downs of
the last run (a session or module fixture's set-up is charged to the first test that asks for it) next to the
same phase in the first run, then each test module's seconds in every run. Under xdist the phases of several
workers overlap: their sum is more than the wall time. `--readme` writes the last run's wall time and its five
slowest phases into the README's block of test time (between its marker lines).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
README = ROOT / "README.md"
BLOCK = ("<!-- test time: written by `python benchmarks/suite_time.py LOG --readme`; do not edit by hand -->",
         "<!-- end of test time -->")
PHASE = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)", re.M)
CLOSING = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+,? ?)+) in (?P<seconds>[\d.]+)s", re.M)


@dataclass
class Run:
    name: str
    seconds: float
    counts: str
    phases: dict[tuple[str, str], float] = field(default_factory=dict)  # (nodeid, phase) -> seconds

    def modules(self) -> dict[str, float]:
        total: dict[str, float] = defaultdict(float)
        for (nodeid, _), s in self.phases.items():
            total[nodeid.split("::")[0]] += s
        return dict(total)


def read(path: Path) -> Run:
    text = path.read_text(encoding="utf-8", errors="replace")
    closing = list(CLOSING.finditer(text))
    if not closing:
        raise SystemExit(f"{path}: no closing line of pytest (N passed ... in S s): not a whole run's log")
    phases = {(m.group(3), m.group(2)): float(m.group(1)) for m in PHASE.finditer(text)}
    if not phases:
        raise SystemExit(f"{path}: no durations: run pytest with --durations=0")
    last = closing[-1]
    return Run(path.name, float(last["seconds"]), last["counts"].strip().rstrip(","), phases)


def report(runs: list[Run], top: int) -> str:
    last, first = runs[-1], runs[0]
    lines = ["| run | wall time | tests | sum of the phases |", "|---|---:|---|---:|"]
    for r in runs:
        lines.append(f"| `{r.name}` | {r.seconds / 60:.1f} min ({r.seconds:.0f} s) | {r.counts} | "
                     f"{sum(r.phases.values()):.0f} s |")
    if len(runs) > 1:
        lines.append(f"\nwall time of `{last.name}` / `{first.name}`: {last.seconds / first.seconds:.2f}")
    lines += ["", f"The {top} slowest phases of `{last.name}`" + (f", and the same phase in `{first.name}`" if len(runs) > 1
                                                                 else "") + ":", ""]
    head = "| seconds | phase | test |" if len(runs) == 1 else f"| `{last.name}` | `{first.name}` | phase | test |"
    lines += [head, "|---:|" + ("---:|" if len(runs) > 1 else "") + "---|---|"]
    for (nodeid, phase), s in sorted(last.phases.items(), key=lambda kv: -kv[1])[:top]:
        before = "" if len(runs) == 1 else (f" {first.phases[(nodeid, phase)]:.1f} |" if (nodeid, phase) in first.phases
                                            else " - |")
        lines.append(f"| {s:.1f} |{before} {phase} | `{nodeid}` |")
    lines += ["", f"The {top} slowest phases of `{first.name}`:" if len(runs) > 1 else "", ""]
    if len(runs) > 1:
        lines += ["| seconds | phase | test |", "|---:|---|---|"]
        for (nodeid, phase), s in sorted(first.phases.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"| {s:.1f} | {phase} | `{nodeid}` |")
    modules = sorted({m for r in runs for m in r.modules()}, key=lambda m: -max(r.modules().get(m, 0) for r in runs))
    lines += ["", "Seconds per test module (set-ups, calls and tear-downs):", "",
              "| module | " + " | ".join(f"`{r.name}`" for r in runs) + " |", "|---|" + "---:|" * len(runs)]
    for m in modules[:top]:
        lines.append(f"| `{m}` | " + " | ".join(f"{r.modules().get(m, 0):.0f}" for r in runs) + " |")
    return "\n".join(lines) + "\n"


def readme_block(run: Run, command: str) -> str:
    slowest = sorted(run.phases.items(), key=lambda kv: -kv[1])[:5]
    named = "; ".join(f"`{nodeid.split('::')[0]}` {nodeid.split('::')[1].split('[')[0]} ({phase}, {s:.0f} s)"
                      for (nodeid, phase), s in slowest)
    return (f"\nA whole run of `python3 kit.py test` on 2 cores, as `{command}` reads its log: pytest took "
            f"{run.seconds / 60:.1f} minutes ({run.counts}). Its slowest phases: {named}. docs/testing.md has the whole "
            "table.\n")


def write_readme(block: str, readme: Path = README) -> None:
    from grading.execute import replace_block  # the one writer of the README's generated blocks

    replace_block(readme, BLOCK, block, "test time")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="logs of whole runs, oldest first")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--markdown", type=Path, help="also write the tables to this file")
    parser.add_argument("--readme", action="store_true", help="write the last run's figures into the README")
    args = parser.parse_args(argv)
    runs = [read(p) for p in args.logs]
    text = report(runs, args.top)
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    if args.readme:
        write_readme(readme_block(runs[-1], f"python benchmarks/suite_time.py {args.logs[-1]} --readme"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
