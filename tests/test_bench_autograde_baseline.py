"""The grading benchmark's plain-nbgrader baseline grades for real.

`benchmarks/bench_autograde.py` compares the kit with plain nbgrader; that ratio means something only if
plain nbgrader ran its own steps and graded every student. A tiny class (two students, notebook 01 only,
the second with a bug in `causal_mask`) goes through the benchmark's own functions both ways: every
student graded on both sides, and the same, nonzero points per student and notebook, with the bug costing
points on both. Should plain nbgrader run the kit's steps again (they refuse outside the kit's autograde),
its side fails here.
"""
from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT

NB01 = "01_scaled_dot_product_attention"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_autograde", ROOT / "benchmarks" / "bench_autograde.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def both_ways(bench, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    students = bench.make_class(tmp / "subs", 2, [NB01])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU only, in the kernels and sandboxes too
        _, plain = bench.plain_nbgrader(tmp / "subs", tmp, students, agg=True)
        kit = bench.kit(tmp / "subs", tmp, "1worker", len(students)).points
    return students, plain, kit


def test_plain_nbgrader_grades_every_student_with_points(both_ways):
    students, plain, _ = both_ways
    assert set(plain) == set(students)
    assert all(plain[s][NB01] > 0 for s in students), plain
    # the bug in causal_mask costs the second student points, as the check in nbgrader's kernel judges it
    assert plain["student001"][NB01] < plain["student000"][NB01], plain


def test_both_sides_give_the_same_points(bench, both_ways):
    _, plain, kit = both_ways
    assert kit == plain
    bench.same_points(plain, kit, "1worker")  # the benchmark's own check agrees


def test_the_check_stops_on_different_points(bench, both_ways):
    _, plain, _ = both_ways
    off = {s: {nb: p + (1 if s == "student001" and nb == NB01 else 0) for nb, p in points.items()}
           for s, points in plain.items()}
    with pytest.raises(SystemExit, match="student001: plain nbgrader gave"):
        bench.same_points(plain, off, "1worker")


def test_the_class_is_notebook_01_only(both_ways):
    students, plain, _ = both_ways
    assert {nb for s in students for nb, p in plain[s].items() if p} == {NB01}


def test_the_readme_speed_paragraph_is_a_run_of_the_benchmark(bench, tmp_path):
    """The README's paragraph on grading speed sits between the benchmark's marker lines, names the command that
    wrote it and a commit that exists; the benchmark replaces it there and only there."""
    import subprocess

    text = (ROOT / "README.md").read_text()
    start, end = text.index(bench.SPEED[0]), text.index(bench.SPEED[1])
    block = text[start + len(bench.SPEED[0]):end]
    assert "python benchmarks/bench_autograde.py" in block and "--readme" in block, block
    (commit,) = [w.strip(",") for w in block.split() if len(w.strip(",")) >= 7 and
                 all(c in "0123456789abcdef" for c in w.strip(","))][:1]
    assert subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT).returncode == 0, commit
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{bench.SPEED[0]}\nold\n{bench.SPEED[1]}\nafter\n")
    bench.replace_block(readme, bench.SPEED, bench.speed_paragraph(3, 90.0, 30.0, 1.9, "today"), "grading speed")
    new = readme.read_text()
    assert new.startswith(f"before\n{bench.SPEED[0]}\n") and new.endswith(f"{bench.SPEED[1]}\nafter\n")
    assert "old" not in new and "30.0 s" in new and "0.33 times" in new and "1.90 times as fast" in new
    several = bench.speed_paragraph(3, 90.0, 30.0, 1.9, "today", pairs=3)  # the median of three pairs of runs
    assert "--students 3 --pairs 3 --readme" in several and "the median of 3 runs of each" in several, several
    bounded = bench.speed_paragraph(3, 90.0, 30.0, 1.6, "today", pairs=3, bound=1.75)
    assert "1.60 times as fast" in bounded and "allowed at most 1.75 times" in bounded, bounded


def test_the_cpu_bound_is_one_workers_time_over_the_two_worker_runs_cpu_on_every_core(bench):
    """A two-worker run that used exactly half of one worker's wall time on every core allows 2x; one that used
    more CPU (a second start-up) allows less; a machine without /proc/stat gives no bound."""
    import os

    cores, n, one = os.cpu_count(), 3, 30.0  # one worker: 30 s a submission, 90 s for the class
    run = lambda busy: bench.KitRun(0.0, 0.0, 0.0, {}, bench.CPU(busy, 0.0))  # noqa: E731
    assert bench.cpu_bound(one, run(cores * 45.0), n) == pytest.approx(2.0)
    assert bench.cpu_bound(one, run(cores * 50.0), n) == pytest.approx(1.8)
    assert bench.cpu_bound(one, bench.KitRun(0.0, 0.0, 0.0, {}, None), n) is None


def test_the_machines_cpu_counts_a_busy_second(bench):
    """/proc/stat's busy core-seconds grow by about the CPU a busy loop takes (other work here only adds)."""
    import time

    before, start = bench.machine_cpu(), time.thread_time()
    while time.thread_time() - start < 0.5:
        pass
    after = bench.machine_cpu()
    if before is None:
        pytest.skip("no /proc/stat here")
    assert after.busy - before.busy >= 0.4 and after.stolen >= before.stolen >= 0, (before, after)


def test_plain_nbgrader_runs_none_of_the_kits_steps(bench):
    """Every pipeline the plain side sets is nbgrader's own (the kit's metadata check included: not the kit's)."""
    import re

    steps = re.findall(r'"([\w.]+)"', bench.PLAIN)
    assert steps and all(s.startswith(("nbgrader.", "nbconvert.")) for s in steps), steps
    for pipeline in ("autograde_preprocessors", "sanitize_preprocessors"):
        assert f"c.Autograde.{pipeline} = [" in bench.PLAIN, pipeline


def test_a_dask_worker_starting_imports_no_grader_from_the_benchmark():
    """A worker's start imports the main module again (as __mp_main__): as with `python -m grading`, that costs
    no import of the grader, so the kit's start-up is timed as its command pays it."""
    import subprocess

    probe = ("import runpy, sys; runpy.run_path(sys.argv[1], run_name='__mp_main__'); "
             "print(sorted(m for m in ('torch', 'grading', 'nbformat') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, str(ROOT / "benchmarks" / "bench_autograde.py")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.strip() == "[]", f"a worker importing the benchmark imports {out.stdout.strip()}"
    probe_cli = probe.replace("runpy.run_path(sys.argv[1], run_name='__mp_main__')",
                              "runpy.run_module('grading.__main__', run_name='__mp_main__')")
    out = subprocess.run([sys.executable, "-c", probe_cli, "x"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and "torch" not in out.stdout, (out.stdout, out.stderr[-500:])
