"""The pieces of grading one at a time: the sandbox's walls, the observations that cross them, the judge."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import secrets
import time
from pathlib import Path

import h5py
import nbformat
import numpy as np
import pytest
from conftest import filled_submission

from grading import notebooks as nbs
from grading import sandbox, seccomp
from grading.judge import judge_cell, public_case_names
from starter.checks import load_case
from starter.compare import observe, read_observations, record, verdict

HIDDEN_CASE = "causal/17"  # a hidden case of notebook 01
DIRS = [nbs.PUBLIC_REFERENCES, nbs.HIDDEN_REFERENCES]


def _causal(off: int):
    import torch

    return lambda T, device=None: torch.ones(T, T, dtype=torch.bool, device=device).tril(off)


def test_the_judge_says_what_the_public_check_says():
    case = load_case("causal/5")
    wrong = verdict(case, observe(case, _causal(-1)))
    assert wrong and "off by one" in wrong and "causal/5" not in wrong  # no case name in the judge's line
    assert verdict(case, observe(case, _causal(0))) is None


def test_observations_round_trip_and_hostile_files_are_refused(tmp_path):
    case = load_case(HIDDEN_CASE, DIRS)
    record(observe(case, _causal(0)), tmp_path)
    (tmp_path / "0001.json").write_text(json.dumps({"case": "x", "error": 3}))  # wrong types
    meta = {"case": "y", "error": "", "raised": None, "raised_text": "", "dtypes": {"mask": "torch.bool"},
            "grad_error": "", "outputs": ["mask"], "grads": []}
    (tmp_path / "0002.json").write_text(json.dumps(meta))
    np.savez(tmp_path / "0002.npz", **{"out:mask": np.array([object()], dtype=object)})  # a pickle inside
    (tmp_path / "0003.json").symlink_to(tmp_path / "0000.json")
    found, problems = read_observations(tmp_path)
    assert set(found) == {HIDDEN_CASE} and verdict(case, found[HIDDEN_CASE]) is None
    assert len(problems) == 3, problems


def test_partial_credit_counts_hidden_cases_and_never_names_them():
    source = 'check("causal/5", causal_mask)\n### BEGIN HIDDEN TESTS\ncheck("causal/1", causal_mask)\n' \
             'check("causal/17", causal_mask)\n### END HIDDEN TESTS'
    good, bad = _causal(0), _causal(-1)
    observations = {"causal/5": observe(load_case("causal/5"), bad),  # the public case fails: not scored
                    "causal/1": observe(load_case("causal/1", DIRS), good)}  # causal/17 never ran
    cell = judge_cell("test_causal_mask", source, 2.0, observations, DIRS, public_case_names(), "did not run")
    assert cell.points == 1.0  # one of two hidden cases
    lines = "\n".join(cell.lines())
    assert "causal/1" not in lines and "causal/17" not in lines and "hidden case 2: did not run" in lines
    assert "causal/5" in lines and "not scored" in lines


def test_references_read_ahead_are_the_ones_judging_reads(monkeypatch):
    """The run reads every reference case once (judge.read_references) and sends them to each worker
    (judge.keep_references, pickled as Dask sends them); judging there then reads no file, and every case a
    notebook's test cells check is among them."""
    import pickle

    from grading import judge

    monkeypatch.setattr(judge, "_CASES", {})
    read = judge.read_references(DIRS)
    assert len(read) == len(judge._CASES) > 200
    monkeypatch.setattr(judge, "_CASES", {})  # a worker's, before it is sent them
    assert judge.keep_references(pickle.loads(pickle.dumps(read))) == len(read)
    monkeypatch.setattr(judge, "load_case", lambda *a, **k: pytest.fail(f"a case read again while judging: {a}"))
    for path in nbs.solution_notebooks():
        for cell in nbs.read(path).cells:
            for match in nbs.CHECK_CALL.finditer(cell.source):
                judge._reference(match["case"], tuple(DIRS))


def test_a_reference_sent_to_a_worker_is_read_again_if_its_file_changed_since(monkeypatch):
    """What a worker was sent is kept only while the reference file is the one it was read from (its path and
    modification time): a rebuilt reference is read again, not judged against the old copy."""
    from grading import judge

    monkeypatch.setattr(judge, "_CASES", {})
    read = judge.read_references(DIRS)
    (name, dirs), ((path, mtime), case) = next(iter(read.items()))
    monkeypatch.setattr(judge, "_CASES", {})
    judge.keep_references({(name, dirs): ((path, mtime - 1), case)})  # read before the file was last written
    again = []
    monkeypatch.setattr(judge, "load_case", lambda n, d: again.append(n) or load_case(n, d))
    assert judge._reference(name, dirs).name == name and again == [name]


def test_case_inputs_hold_no_expected_outputs_and_no_names(tmp_path):
    ids = sandbox.write_case_inputs(nbs.HIDDEN_REFERENCES, tmp_path / "cases")
    keys = []
    for path in (tmp_path / "cases").glob("*.h5"):
        with h5py.File(path, "r") as f:
            f.visit(keys.append)
    assert keys and not [k for k in keys if k.split("/")[-1] in ("expected", "grads", "variants")]
    assert any(k.endswith("/inputs") for k in keys)
    assert HIDDEN_CASE in ids and not [k for k in keys if any(name in k for name in ids)]
    assert json.loads((tmp_path / "cases.json").read_text())[ids[HIDDEN_CASE]] == HIDDEN_CASE
    hidden = sandbox.hide_case_names(nbs.read(nbs.SOLUTIONS / "01_scaled_dot_product_attention.ipynb"), ids)
    text = "".join(c.source for c in hidden.cells)
    assert f'check("{ids[HIDDEN_CASE]}"' in text and f'"{HIDDEN_CASE}"' not in text and 'check("causal/5"' in text


def test_a_case_input_reads_back_as_its_case_without_what_only_the_judge_may_know(tmp_path):
    from grading.trained_model import measured_outside
    from starter.cases import case_groups, read_case

    ids = sandbox.write_case_inputs(nbs.HIDDEN_REFERENCES, tmp_path / "cases")
    copied = {}
    for path in (tmp_path / "cases").glob("*.h5"):
        with h5py.File(path, "r") as f:
            copied.update({name: read_case(group, name) for name, group in case_groups(f)})
    compared = 0
    for path in sorted(nbs.HIDDEN_REFERENCES.glob("*.h5")):
        with h5py.File(path, "r") as f:
            for name, group in case_groups(f):
                case = read_case(group, name)
                if measured_outside(case.target, public=False):
                    assert name not in ids, f"{name}: measured outside the sandbox, yet given to it"
                    continue
                mine = copied[ids[name]]
                # what the sandbox must get: the case whole, less its outputs, known bugs, hint and error property
                want = dataclasses.replace(case, name=ids[name], hint="", expected={}, grads={}, variants={},
                                           properties=[p for p in case.properties if p[0] != "raises"])
                assert mine.__dict__.keys() == want.__dict__.keys()
                for key, value in want.__dict__.items():
                    got = getattr(mine, key)
                    if isinstance(value, dict) and value and isinstance(next(iter(value.values())), np.ndarray):
                        assert got.keys() == value.keys(), f"{name}: {key} holds {sorted(got)}"
                        for array, expected in value.items():
                            assert got[array].dtype == expected.dtype and np.array_equal(got[array], expected), \
                                f"{name}: {key}/{array} differs"
                    else:
                        assert got == value, f"{name}: {key} is {got!r}, not {value!r}"
                compared += 1
    assert compared == len(ids) == len(copied) > 100


def test_a_hidden_case_holding_what_its_layout_does_not_is_not_copied_for_the_sandbox(tmp_path):
    """A member or attribute the reference layout does not name could hold what the sandbox must not see: the
    preparation stops, naming it, instead of copying or half-deleting it."""
    from starter.cases import case_groups

    for extra in ("answer_array", "answer_attribute"):
        hidden = tmp_path / extra
        hidden.mkdir()
        source = sorted(nbs.HIDDEN_REFERENCES.glob("*.h5"))[0]
        (hidden / source.name).write_bytes(source.read_bytes())
        with h5py.File(hidden / source.name, "r+") as f:
            name, group = case_groups(f)[0]
            if extra == "answer_array":
                group.create_dataset("answer", data=np.arange(3))
            else:
                group.attrs["answer"] = "42"
        with pytest.raises(ValueError, match=f"the hidden case {name} holds \\['answer'\\]"):
            sandbox.write_case_inputs(hidden, tmp_path / f"cases-{extra}")


def test_without_bubblewrap_grading_stops_and_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        sandbox.require_bwrap()


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_inside_the_sandbox(tmp_path):
    probe = f"""
import json, os, resource, socket
seen = {{p: os.path.exists(p) for p in {[str(nbs.HIDDEN_REFERENCES), str(nbs.SOLUTIONS), str(tmp_path),
                                        str(nbs.ROOT / "grading"), str(Path.home() / ".cache")]!r}}}
try:
    socket.create_connection(("127.0.0.1", 22), timeout=1)
    net = "connected"
except OSError as exc:
    net = type(exc).__name__
try:
    open({str(nbs.ROOT / "starter" / "x")!r}, "w")
    wrote = True
except OSError:
    wrote = False
def attempt(action):
    try:
        action()
        return True
    except OSError:
        return False
root_only = {{"shadow": attempt(lambda: open("/etc/shadow").read()),
             "sysctl": attempt(lambda: open("/proc/sys/kernel/printk_ratelimit", "w").write(
                 open("/proc/sys/kernel/printk_ratelimit").read()))}}
files = resource.getrlimit(resource.RLIMIT_NOFILE)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (files[1] + 1,) * 2)
    raised = True
except (OSError, ValueError):
    raised = False
print(json.dumps({{"seen": seen, "net": net, "uid": os.getuid(), "pids": len(os.listdir("/proc")), "wrote": wrote,
                  "root_only": root_only, "files": files, "raised": raised}}))
"""
    (tmp_path / "secret.txt").write_text("the grader's own file")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(probe)])
    result = sandbox.run_notebook(nb, None, sandbox.Limits(cell_seconds=30, notebook_seconds=120))
    assert result.status == "finished", result.message
    report = json.loads(result.notebook.cells[0].outputs[0]["text"])
    assert not any(report["seen"].values()), report["seen"]
    assert report["net"] != "connected" and not report["wrote"]
    assert not any(report["root_only"].values()), report["root_only"]  # not root outside, either
    users = range(sandbox.SANDBOX_UID_BASE, sandbox.SANDBOX_UID_BASE + sandbox.SANDBOX_UIDS)
    assert report["uid"] in (users if os.geteuid() == 0 else (sandbox.NOBODY,)), report["uid"]
    limit = sandbox.open_files_limit(sandbox.Limits())
    assert report["files"] == [limit, limit] and not report["raised"], (report["files"], report["raised"])


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes run as users of their own only where the grader is root")
def test_sandboxes_alive_at_once_run_as_users_of_their_own(tmp_path, monkeypatch):
    """The kernel counts epoll watches, inotify instances, pending signals and pipe buffers per user, machine-wide:
    a student who used one up in a sandbox that shared its user with another (uid 65534 for all, before) made the
    kernels die in the sandbox of the student graded beside them. Each sandbox alive takes a uid no other has;
    a uid is free again once its sandbox has ended."""
    monkeypatch.setattr(sandbox, "SANDBOX_USERS_DIR", tmp_path / "users")
    with sandbox.sandbox_user() as first, sandbox.sandbox_user() as second:
        assert first != second and {first, second} <= set(range(sandbox.SANDBOX_UID_BASE,
                                                                 sandbox.SANDBOX_UID_BASE + sandbox.SANDBOX_UIDS))
        assert os.stat(tmp_path / "users").st_mode & 0o777 == 0o700
    with sandbox.sandbox_user() as again:
        assert again == first, (again, first)
    (tmp_path / "users").chmod(0o777)  # a folder anybody could write: another user could hold every uid
    with pytest.raises(sandbox.SandboxUnavailable, match="writable by root only"), sandbox.sandbox_user():
        pass


def test_a_sandbox_cannot_fill_the_machines_table_of_open_files(tmp_path, monkeypatch):
    """A student's processes that filled the machine's table of open files (eventfds: 124 processes of 20000
    each; or files opened, mapped and closed, which no descriptor limit counts) made every other process without
    root's privileges fail to open anything, the kernels of the students graded beside them and the gradebook's
    PostgreSQL included. The grader makes the table as large as it goes (as systemd does at boot; the sandbox's
    memory limit then ends the student's sandbox first) or says it could not, and a sandbox's descriptors are at
    most 1/16 of a table that could not be lifted."""
    limits = sandbox.Limits()
    per_process = sandbox.open_files_limit(limits)
    assert 256 <= per_process <= 4096
    file_max = int(Path("/proc/sys/fs/file-max").read_text())
    assert per_process * limits.processes <= max(file_max // sandbox.OPEN_FILES_SHARE, 256 * limits.processes)
    table = tmp_path / "file-max"
    monkeypatch.setattr(sandbox, "FILE_TABLE", table)
    table.write_text("2466170\n")  # the kernel's default on a 24 GiB machine
    assert sandbox.unlimit_file_table() is None and int(table.read_text()) == sandbox.UNLIMITED_FILES
    table.write_text("2466170\n")

    class ReadOnly(type(table)):  # /proc/sys in a container that mounts it read-only
        def write_text(self, *args, **kwargs):
            raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(sandbox, "FILE_TABLE", ReadOnly(table))
    problem = sandbox.unlimit_file_table()
    assert problem is not None and "sysctl -w fs.file-max=" in problem, problem


def _cgroups_available() -> bool:
    with sandbox._cgroup(sandbox.Limits()) as procs:
        return bool(procs)


@pytest.mark.skipif(not _cgroups_available(), reason="needs a writable cgroup hierarchy (root)")
def test_groups_left_by_a_killed_grader_are_removed_and_a_live_sandboxs_kept(monkeypatch):
    """A grader killed mid-run (a killed worker, an interrupted run) leaves its sandboxes' cgroups behind, empty:
    a machine has a bounded number of memory groups, and they piled up (117 on this machine). The next sandbox
    removes the empty ones old enough; a group with a process in it, a live sandbox's, stays."""
    import subprocess
    import sys

    with sandbox._cgroup(sandbox.Limits()) as live, sandbox._cgroup(sandbox.Limits()) as left:
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            for procs in live:
                Path(procs).write_text(str(sleeper.pid))
            monkeypatch.setattr(sandbox, "STALE_CGROUP_SECONDS", -1)
            sandbox._remove_stale_cgroups()
            assert all(Path(procs).parent.exists() for procs in live)
            assert not any(Path(procs).parent.exists() for procs in left)
        finally:
            sleeper.kill()
            sleeper.wait()


@pytest.mark.skipif(sandbox.bwrap() is None or not _cgroups_available(),
                    reason="needs bubblewrap and a writable cgroup hierarchy (root)")
def test_a_memory_hog_is_stopped_and_the_rest_of_the_machine_is_not():
    hog = "import numpy as np\nx = np.ones(2_000_000_000 // 8)\nprint(x.sum())"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('before')"), nbformat.v4.new_code_cell(hog)])
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60, memory_mb=700)) as session:
        result = session.run(nb)
        server = session._proc.pid
        after = session.run(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('after')")]))
        assert session._proc.pid == server  # the notebook's kernel was killed, not the student's sandbox
    assert result.status == "stopped" and "died" in result.message, (result.status, result.message)
    assert result.notebook.cells[0].outputs[0]["text"] == "before\n"
    assert after.status == "finished" and after.notebook.cells[0].outputs[0]["text"] == "after\n"


BUSY_THREE = '''
import resource, subprocess, sys, time
start = time.monotonic()
busy = [subprocess.Popen([sys.executable, "-c", "import time\\nend = time.monotonic() + 3\\nwhile time.monotonic() < end: pass"])
        for _ in range(3)]
for p in busy:
    p.wait()
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime / (time.monotonic() - start))
'''


@pytest.mark.skipif(sandbox.bwrap() is None or not _cgroups_available(),
                    reason="needs bubblewrap and a writable cgroup hierarchy (root)")
def test_a_notebook_gets_its_share_of_the_cpus_however_many_processes_it_starts():
    """Three busy processes for 3 s in a sandbox allowed half a CPU use about half a CPU's time (on this
    2-core machine, unlimited, they would use up to two CPUs' worth)."""
    if not (Path("/sys/fs/cgroup/cpu").is_dir() or Path("/sys/fs/cgroup/cgroup.controllers").exists()):
        pytest.skip("no cpu controller")
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60, cpus=0.5)) as session:
        result = session.run(_notebook(BUSY_THREE))
    assert result.status == "finished", result.message
    share = float(_text(result.notebook.cells[0]))
    assert share < 0.75, f"the busy processes used {share:.2f} CPUs' worth of time under a quota of 0.5"


def _notebook(*sources: str):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


LEAVE_BEHIND = '''
import builtins, subprocess, sys, torch
builtins.planted = True
torch.matmul = lambda *a, **k: "patched"
subprocess.Popen(["sleep", "60"], start_new_session=True)
subprocess.Popen([sys.executable, "-c", "import time, pathlib; time.sleep(3); pathlib.Path('../planted').write_text('x')"],
                 start_new_session=True)
print("planted")
'''
LOOK_FOR_IT = '''
import builtins, json, os, pathlib, time, torch
time.sleep(4)
starter = os.getppid()  # the kernel starter, and its parent the server
server = int(open(f"/proc/{starter}/stat").read().rsplit(")", 1)[1].split()[1])
others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), starter, server)]
print(json.dumps({"builtins": hasattr(builtins, "planted"), "torch": torch.matmul(torch.eye(2), torch.eye(2)) == "patched",
                  "others": others, "file": pathlib.Path("../planted").exists()}))
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_a_students_notebooks_share_a_sandbox_but_nothing_else():
    """One warm sandbox per student, a fresh kernel per notebook: nothing a notebook changed in memory,
    and nothing it started, is there for the next one."""
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60)) as session:
        first = session.run(_notebook(LEAVE_BEHIND))
        second = session.run(_notebook(LOOK_FOR_IT))
    assert first.status == "finished" and _text(first.notebook.cells[0]) == "planted\n", first.message
    assert second.status == "finished", second.message
    found = json.loads(_text(second.notebook.cells[0]))
    assert found == {"builtins": False, "torch": False, "others": [], "file": False}, found


LEAVE_FOR_THE_NEXT_STUDENT = '''
import ctypes, os, pathlib, subprocess, sys
home = pathlib.Path.home()
startup = home / ".ipython" / "profile_default" / "startup"
startup.mkdir(parents=True, exist_ok=True)
(startup / "00-planted.py").write_text("print('PLANTED')")
(home / ".hidden").write_text("x")
locked = home / "locked"
(locked / "inner").mkdir(parents=True)
(locked / "inner" / "answers.txt").write_text("x")
os.chmod(locked / "inner", 0)
os.chmod(locked, 0)
print("shm", ctypes.CDLL(None).shmget(0x5eed, 4096, 0o1666))  # IPC_CREAT | 0666
try:  # on the writable folder itself, which outlives its files (its sticky bit refuses it)
    os.setxattr(home, "user.answers", b"x" * 60000)
except OSError:
    pass
import fcntl, struct
fcntl.fcntl(0, 37, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 42, 1, 0))  # F_OFD_SETLK on /dev/null
fcntl.fcntl(0, fcntl.F_SETFL, fcntl.fcntl(0, fcntl.F_GETFL) | os.O_APPEND | os.O_NONBLOCK)
if os.path.exists("/proc/self/autogroup"):  # the scheduling group's nice value (no privilege needed to raise it)
    open("/proc/self/autogroup", "w").write("19")
subprocess.Popen([sys.executable, "-c", "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                  "time.sleep(120)"], start_new_session=True)
print("left", os.getppid())
'''
LOOK_FOR_THE_LAST_STUDENT = '''
import json, os, pathlib
here = pathlib.Path.cwd()
files = sorted(str(p) for p in pathlib.Path.home().rglob("*") if here not in p.parents and p != here)
shm = open("/proc/sysvipc/shm").read().splitlines()[1:]
starter = os.getppid()  # the kernel starter, and its parent the server
server = int(open(f"/proc/{starter}/stat").read().rsplit(")", 1)[1].split()[1])
others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), starter, server)]
import fcntl, struct
lock = fcntl.fcntl(os.open("/dev/null", os.O_RDWR), 36, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
channels = {"xattrs": os.listxattr(pathlib.Path.home()), "lock": struct.unpack("hhqqi4x", lock)[0] != fcntl.F_UNLCK,
            "flags": bool(fcntl.fcntl(0, fcntl.F_GETFL) & (os.O_APPEND | os.O_NONBLOCK)),
            "autogroup": open("/proc/self/autogroup").read().split()[-1] if os.path.exists("/proc/self/autogroup") else "0"}
print(json.dumps({"files": files, "shm": shm, "others": others, "server": os.getppid(), **channels}))
'''


def _grade_one_student(sources: list[str], limits: sandbox.Limits, warm: sandbox.WarmSandbox):
    """What grading does for one student: their notebooks in the student's sandbox, the worker's warm one if any."""
    with sandbox.StudentSandbox(warm) as student:
        session = student.session(None, limits, True, None, reuse=True)
        return session, [session.run(_notebook(source)) for source in sources], student.sandboxes_started


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_a_warm_sandbox_reaches_the_next_student_with_nothing_of_the_last():
    """A worker keeps its sandbox warm for its next student (the imports are paid once per worker), but only
    after a reset: every process of the last student ended (one that ignores SIGTERM included), the writable
    folder emptied (dot-files, an IPython start-up script, folders made unreadable), IPC objects removed, and
    nothing left on what outlives a kernel (the folder's extended attributes, the starter's /dev/null, the
    scheduling autogroup of the starter's session).
    A sandbox whose server a student killed is not reused: the next student gets a new one."""
    limits = sandbox.Limits(cell_seconds=30, notebook_seconds=60)
    warm = sandbox.WarmSandbox()  # a worker's
    try:
        first, (planted,), started = _grade_one_student([LEAVE_FOR_THE_NEXT_STUDENT], limits, warm)
        second, (looked,), started_again = _grade_one_student([LOOK_FOR_THE_LAST_STUDENT], limits, warm)
        assert planted.status == "finished" and "left" in _text(planted.notebook.cells[0]), planted.message
        assert second is first and (started, started_again) == (1, 0), f"the warm sandbox was not reused: {first.left_behind}"
        found = json.loads(_text(looked.notebook.cells[0]))
        assert "PLANTED" not in _text(looked.notebook.cells[0])
        planted_files = [f for f in found["files"] if any(n in f for n in ("planted", "hidden", "locked", "answers"))]
        assert (planted_files, found["shm"], found["others"]) == ([], [], []), found
        # nothing on what outlives a kernel: the writable folder's extended attributes, locks or flags on /dev/null,
        # the nice value of a scheduling group
        assert (found["xattrs"], found["lock"], found["flags"], found["autogroup"]) == ([], False, False, "0"), found
        # a student who ends the server: the sandbox cannot be reset, so the next student gets a new one
        kill = "import ctypes, os\nctypes.CDLL(None).kill(os.getppid(), 9)"
        killer, _, _ = _grade_one_student([kill], limits, warm)
        after, (fine,), started = _grade_one_student(["print('fresh')"], limits, warm)
        assert after is not killer and started == 1
        assert fine.status == "finished" and _text(fine.notebook.cells[0]) == "fresh\n"
    finally:
        warm.close()


MEDDLE_WITH_THE_STARTER = {  # what a kernel may do, as the same user, to processes that outlive it
    "lowers a hard limit": "resource.prlimit(starter, resource.RLIMIT_FSIZE, (0, 0))",
    "lowers the priority": "os.setpriority(os.PRIO_PROCESS, starter, 10)",
    "changes the scheduling": "os.sched_setscheduler(starter, os.SCHED_IDLE, os.sched_param(0))",
    "sets the I/O priority": "ctypes.CDLL(None).syscall(251 if platform.machine() == 'x86_64' else 30, 1, starter, 3 << 13)",
    "lowers the server's limit": "resource.prlimit(server, resource.RLIMIT_NOFILE, (900, 900))",
    "shortens its time slice": ("import struct\nattr = ctypes.create_string_buffer(struct.pack('=IIQiIQQQII', 56, 0, 0, "
                                "0, 0, 100_000, 0, 0, 0, 0), 56)\n"  # sched_setattr: SCHED_NORMAL, a 0.1 ms slice
                                "assert ctypes.CDLL(None).syscall(314 if platform.machine() == 'x86_64' else 274, "
                                "starter, attr, 0) == 0"),
}
if len(os.sched_getaffinity(0)) > 1:
    MEDDLE_WITH_THE_STARTER["pins it to one CPU"] = "os.sched_setaffinity(starter, {min(os.sched_getaffinity(0))})"
USE_THE_NETWORK = {  # what outlives a kernel's sockets in the sandbox's network namespace
    "leaves a connection in TIME_WAIT": ("import socket\nserving = socket.create_server(('127.0.0.1', 41000))\n"
                                         "client = socket.create_connection(('127.0.0.1', 41000))\n"
                                         "accepted, _ = serving.accept()\nclient.close()\naccepted.close()"),
    "sends a datagram": ("import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', "
                         "('127.83.69.67', 9))"),  # gone at once, but the counters (and a TCP metrics cache) stay
}
MEDDLE_PRELUDE = ("import ctypes, os, platform, resource\nstarter = os.getppid()\n"
                  "server = int(open(f'/proc/{starter}/stat').read().rsplit(')', 1)[1].split()[1])\n")


def test_the_reset_sees_every_change_a_kernel_may_make_to_the_starter():
    """Every process in a sandbox runs as the sandbox's one user, so a kernel may change the kernel starter's and the server's
    resource limits and scheduling, which every kernel forked later inherits. The same calls, made here on a
    process of the test's own: each changes what the reset compares (`process_state`)."""
    import subprocess
    import sys

    from grading.sandbox_runner import process_state

    for what, code in MEDDLE_WITH_THE_STARTER.items():
        target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            before = process_state(target.pid)
            exec("import ctypes, os, platform, resource\n" + code, {"starter": target.pid, "server": target.pid})
            assert process_state(target.pid) != before, f"the reset would not see that a student {what}"
        finally:
            target.kill()
            target.wait()


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_a_sandbox_whose_starter_or_network_a_student_changed_is_not_kept_for_the_next():
    """A sandbox in which a student changed the starter (a file-size limit of 0: every later kernel dies at
    start-up), or used the network (a connection closed on loopback waits a minute, its ports readable; traffic
    leaves counters and a cache of TCP metrics), is ended by the reset: the next student gets a new one and is
    graded in full, and the student's grading says what was left."""
    limits = sandbox.Limits(cell_seconds=30, notebook_seconds=60)
    for what, code in USE_THE_NETWORK.items():
        with sandbox.Session(limits=limits) as session:
            ran = session.run(_notebook(code + "\nprint('done')"))
            assert ran.status == "finished" and "done" in _text(ran.notebook.cells[0]), (what, ran.message)
            assert session.reset() is False, f"a sandbox in which a student {what} was kept"
    with sandbox.Session(limits=limits) as session:  # and one that nobody changed is kept
        session.run(_notebook("print('honest')"))
        assert session.reset() is True
    warm = sandbox.WarmSandbox()
    try:
        with sandbox.StudentSandbox(warm) as meddler:
            meddler.session(None, limits, True, None, reuse=True).run(
                _notebook(MEDDLE_PRELUDE + MEDDLE_WITH_THE_STARTER["lowers a hard limit"]))
        assert meddler.left_behind == ["the kernel starter's resource limits or scheduling changed since the "
                                       "sandbox started"], meddler.left_behind  # what grade_student flags
        _, (next_one,), started = _grade_one_student(["open('x', 'w').write('fine')\nprint('fine')"], limits, warm)
        assert started == 1 and next_one.status == "finished" and _text(next_one.notebook.cells[0]) == "fine\n"
    finally:
        warm.close()


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_records_that_cannot_be_listed_are_said_and_not_taken_for_removed(tmp_path, monkeypatch):
    """With the machine's table of open files full, the sandbox's server could not list the checks' records and
    took the error for an empty folder: an honest student's row said a later cell had changed or removed them.
    An error is said as an error; the records kept stand."""
    from grading import sandbox_runner

    records = sandbox_runner.Records(str(tmp_path))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "0000.json").write_text("{}")
    records.after_cell(3, is_test=True)
    assert list(records.kept) == ["0000.json"]

    def table_full(path):
        raise OSError(23, "Too many open files in system")

    monkeypatch.setattr(sandbox_runner.os, "scandir", table_full)
    records.after_cell(4, is_test=False)
    monkeypatch.undo()
    records.after_cell(5, is_test=False)
    assert records.problems == ["after cell 4 the checks' records could not be read (OSError: Too many open files "
                                "in system)"], records.problems
    assert list(records.kept) == ["0000.json"]


def test_outputs_that_cannot_be_read_back_are_flagged_and_the_scores_stand():
    """An output nested deeper than the grader's reader goes (JSON 850 lists deep) gets the whole executed notebook
    lost: the run says so among its problems (which review_flags lists), and what the checks recorded still
    comes back."""
    deep = ("from IPython.display import display\nfrom starter.checks import check\nimport torch\n"
            "check('causal/5', lambda T, device=None: torch.ones(T, T, dtype=torch.bool).tril())\n"
            "deep = []\nfor _ in range(850): deep = [deep]\ndisplay({'application/json': {'a': deep}}, raw=True)")
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60)) as session:
        ran = session.run(_notebook(deep))
    assert ran.notebook is None and any("could not be read" in p for p in ran.problems), (ran.message, ran.problems)
    assert "causal/5" in ran.observations


LOOK_BESIDE = '''
import json, pathlib
print(json.dumps(sorted(str(p) for p in pathlib.Path(".").rglob("*") if p.is_file() and p.name != "in.ipynb"
                        and "results" not in p.parts and not p.name.startswith("out.ipynb"))))
print(pathlib.Path("runs/captioning_transformer.pt").read_bytes().decode())
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_files_handed_in_reach_their_notebook_and_nothing_else(tmp_path):
    """Notebook 06's trained model and the student's notebooks 02, 03 and 05 are put beside notebook 07 in the sandbox
    (grading.notebooks.FILES_BESIDE), the latter without their test cells; a path that leaves the folder is
    not written."""
    folder = tmp_path / "submitted"
    (folder / "runs").mkdir(parents=True)
    (folder / nbs.TRAINED_CHECKPOINT).write_bytes(b"weights")
    nbformat.write(filled_submission("03_multi_head_attention"), str(folder / "03_multi_head_attention.ipynb"))
    (folder / "02_positional_encoding.ipynb").symlink_to(nbs.SOLUTIONS / "02_positional_encoding.ipynb")
    files = sandbox.files_beside(folder, "07_generation_and_evaluation")
    assert sorted(files) == ["03_multi_head_attention.ipynb", nbs.TRAINED_CHECKPOINT], "a link is never followed"
    assert not any(nbs.is_test(c) for c in nbformat.reads(files["03_multi_head_attention.ipynb"].decode(), 4).cells)
    assert sandbox.files_beside(folder, "01_scaled_dot_product_attention") == {}
    files["../escaped.txt"] = files["runs/a b.txt"] = b"out"
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60)) as session:
        result = session.run(_notebook(LOOK_BESIDE), files)
    assert result.status == "finished", result.message
    listed, content = _text(result.notebook.cells[0]).splitlines()
    assert json.loads(listed) == ["03_multi_head_attention.ipynb", nbs.TRAINED_CHECKPOINT] and content == "weights"


REACH_THE_SERVER = '''
import json, os
ppid, tried = os.getppid(), {}
for fd in range(3, 12):
    try:
        with open(f"/proc/{ppid}/fd/{fd}", "w") as f:
            f.write(json.dumps({"folder": "/tmp/work/nb9", "exit": 0}) + "\\n")
        tried[fd] = "written"
    except OSError as exc:
        tried[fd] = type(exc).__name__
try:
    open(f"/proc/{ppid}/mem", "rb").read(1)
    tried["mem"] = "read"
except OSError as exc:
    tried["mem"] = type(exc).__name__
tried["oom_score_adj"] = open("/proc/self/oom_score_adj").read().strip()  # out of memory, this goes first
print(json.dumps(tried))
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_a_notebook_cannot_answer_for_the_server():
    """The server that forks the kernels is not dumpable: a notebook cannot open its reply pipe or memory
    through /proc to report a notebook done, or change what the next notebook runs."""
    with sandbox.Session() as session:
        result = session.run(_notebook(REACH_THE_SERVER))
    tried = json.loads(_text(result.notebook.cells[0]))
    assert "written" not in tried.values() and tried["mem"] != "read", tried
    assert tried["oom_score_adj"] == "1000", tried


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_a_slow_cell_is_interrupted_and_one_that_ignores_it_is_stopped():
    limits = sandbox.Limits(cell_seconds=2, notebook_seconds=60)
    ignores = "import signal\nfor s in (signal.SIGINT, signal.SIGALRM):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"
    with sandbox.Session(limits=limits) as session:
        slow = session.run(_notebook("print('a')", "import time\ntime.sleep(20)", "print('c')"))
        stuck = session.run(_notebook("print('a')", ignores, "print('c')"))
        after = session.run(_notebook("print('ok')"))
    assert slow.status == "timed out" and "[1]" in slow.message, (slow.status, slow.message)
    assert [_text(c) for c in slow.notebook.cells] == ["a\n", "", "c\n"]
    assert slow.notebook.cells[1].outputs[-1]["ename"] == "CellTimeoutError"
    assert stuck.status == "timed out" and "cell 1 " in stuck.message and "did not stop" in stuck.message, stuck.message
    assert _text(stuck.notebook.cells[0]) == "a\n" and _text(stuck.notebook.cells[2]) == ""
    assert after.status == "finished" and _text(after.notebook.cells[0]) == "ok\n", after.message


def test_without_bubblewrap_the_same_runner_grades_unisolated(tmp_path):
    """--no-sandbox: the same server and kernels, as the grader's user, flagged as not isolated."""
    nb = _notebook("from starter.checks import check\nimport torch\n"
                   "check('causal/5', lambda T, device=None: torch.ones(T, T, dtype=torch.bool).tril())",
                   "print('next')")
    with sandbox.Session(isolate=False) as session:
        result = session.run(nb)
        again = session.run(_notebook("print('second notebook')"))
    assert result.status == "finished" and not result.isolated, result.message
    assert set(result.observations) == {"causal/5"} and _text(result.notebook.cells[1]) == "next\n"
    assert again.status == "finished" and _text(again.notebook.cells[0]) == "second notebook\n"


FILL_THE_DISK = '''
import errno, os
os.makedirs("junk", exist_ok=True)
chunk, written = b"\\0" * (16 << 20), 0
try:
    for i in range(64):  # 1 GiB
        with open(f"junk/f{i}", "wb") as f:
            f.write(chunk)
        written += 16
except OSError as exc:
    print("stopped:", errno.errorcode[exc.errno])
print(written)
for i in range(0, 64, 2):  # room again for the outputs
    if os.path.exists(f"junk/f{i}"):
        os.remove(f"junk/f{i}")
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_a_notebook_cannot_fill_the_disk():
    """The notebooks' folders are a size-limited tmpfs inside the sandbox, freed after each notebook."""
    limits = sandbox.Limits(cell_seconds=60, notebook_seconds=120, scratch_mb=128)
    keep_it_full = FILL_THE_DISK.split("for i in range(0, 64, 2)")[0]
    with sandbox.Session(limits=limits) as session:
        filled = session.run(_notebook(FILL_THE_DISK))
        full = session.run(_notebook(keep_it_full, "print('next cell')"))
        after = session.run(_notebook("open('x', 'w').write('y' * 100_000)\nprint('room again')"))
    # a full folder costs the notebook nothing else: its outputs come back through the kernel's pipe
    assert full.status == "finished" and _text(full.notebook.cells[1]) == "next cell\n", (full.status, full.message)
    stopped, written = _text(filled.notebook.cells[0]).split("\n")[:2]
    assert stopped == "stopped: ENOSPC" and int(written) <= 128, (stopped, written)
    assert after.status == "finished" and _text(after.notebook.cells[0]) == "room again\n", after.message


SCAN_OWN_MEMORY = '''
import json, re, secrets
own = "LEAKMARK-" + secrets.token_hex(16) + "-END"  # made here: the scan must find it
found, scanned = set(), 0
with open("/proc/self/maps") as f:
    maps = [line.split() for line in f]
with open("/proc/self/mem", "rb", buffering=0) as mem:
    for line in maps:
        if "r" not in line[1] or (len(line) > 5 and line[5] != "[heap]"):
            continue
        start, end = (int(x, 16) for x in line[0].split("-"))
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, ValueError, OverflowError):
            continue
        scanned += len(chunk)
        found.update(m.decode() for m in re.findall(rb"LEAKMARK-[0-9a-f]{32}-END", chunk))
print(json.dumps({"own": own in found, "found": sorted(found - {own}), "scanned_mb": scanned >> 20}))
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_no_kernel_holds_an_earlier_students_notebook_in_its_memory():
    """The next student's kernel, in a sandbox kept warm, scans its own memory for the last student's notebook
    (its source and its outputs, both in the server's memory while it was graded): nothing, while the same
    scan finds a string the kernel made itself. Every kernel is forked by the kernel starter, which never
    holds a student's notebook."""
    token = secrets.token_hex(16)
    victim = _notebook(f"answer = 'LEAKMARK-{token}-END'\nprint(answer * 3)", "x = 1")
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=60, notebook_seconds=120)) as session:
        assert session.run(victim).status == "finished"
        assert session.reset(), "the sandbox could not be reset"
        thief = session.run(_notebook(SCAN_OWN_MEMORY))
    assert thief.status == "finished", thief.message
    seen = json.loads(_text(thief.notebook.cells[0]))
    assert seen["own"] and seen["scanned_mb"] > 1, seen
    assert f"LEAKMARK-{token}-END" not in seen["found"], "the next student's kernel read the last one's notebook"


KEYRING_AND_QUEUES = '''
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def attempt(*call):
    result = libc.syscall(*call)
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
print(attempt(248, b"user", b"grading-test", b"secret", 6, ctypes.c_int(-4)),  # add_key to the user keyring
      attempt(250, 10, b"user", b"grading-test", 0),  # keyctl(KEYCTL_SEARCH): whatever another sandbox added
      attempt(240, b"grading-test", os.O_CREAT | os.O_RDWR, 0o600, None),  # mq_open
      attempt(272, 0x10000000),  # unshare(CLONE_NEWUSER)
      attempt(56, 0x8000 | 17, 0, 0, 0, 0),  # clone(CLONE_PARENT): a child of the kernel starter
      attempt(435, 0, 0))  # clone3: the C library falls back to clone
'''


@pytest.mark.skipif(sandbox.bwrap() is None or seccomp.platform.machine() not in seccomp.AUDIT_ARCH,
                    reason="bubblewrap is not installed, or no filter for this machine")
def test_the_keyring_queues_and_new_namespaces_are_refused():
    """What namespaces leave shared (the keyring of the sandbox's user, POSIX message queues of a warm sandbox) and new
    namespaces are refused by the seccomp filter, in two sandboxes in turn; threads, processes and torch work."""
    works = "import subprocess, threading, torch\nt = threading.Thread(target=print); t.start(); t.join()\n" \
            "print(subprocess.run(['echo', 'ok'], capture_output=True, text=True).stdout.strip(), float(torch.ones(2).sum()))"
    for _ in range(2):
        with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60)) as session:
            result = session.run(_notebook(KEYRING_AND_QUEUES, works))
        assert result.status == "finished", result.message
        assert _text(result.notebook.cells[0]).split() == ["EPERM", "EPERM", "EPERM", "EPERM", "EPERM", "ENOSYS"]
        assert _text(result.notebook.cells[1]).split() == ["ok", "2.0"]


# what a student knowing the grader's layout would try: the socket of the process the grader's workers are forked from
# (multiprocessing's forkserver) forks and runs whatever a client sends it, as the grader
REACH_THE_FORKSERVER = '''
import glob, os, socket, stat
found = [p for top in ("/tmp", "/var/tmp", "/run", "/dev/shm") for p in glob.glob(top + "/**", recursive=True)
         if not os.path.islink(p) and os.path.exists(p) and stat.S_ISSOCK(os.stat(p).st_mode)]
reached = []
for path in found + [{listener!r}]:
    client = socket.socket(socket.AF_UNIX)
    try:
        client.connect(path)
        reached.append(path)
    except OSError:
        pass
    finally:
        client.close()
print("reached", reached)
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_the_process_the_workers_are_forked_from_is_out_of_a_sandboxs_reach():
    """The grader's forkserver listens on a Unix socket in the grader's own temporary folder: a sandbox sees neither
    the folder nor, by its path, the socket, so a notebook cannot have it fork code as the grader."""
    import multiprocessing.util

    from grading import engine

    engine._start_forkserver()
    listeners = glob.glob(os.path.join(multiprocessing.util.get_temp_dir(), "listener-*"))
    assert listeners, "the forkserver listens on no socket in this process's temporary folder"
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=60, notebook_seconds=90)) as session:
        result = session.run(_notebook(REACH_THE_FORKSERVER.format(listener=listeners[0])))
    assert result.status == "finished", result.message
    said = _text(result.notebook.cells[0])
    assert said.startswith("reached") and listeners[0] not in said, f"a sandboxed notebook reached the forkserver: {said}"


CLOSE_THE_PIPES = '''
import os, signal
for s in (signal.SIGINT, signal.SIGALRM, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
for fd in os.listdir("/proc/self/fd"):  # the pipes to the server among them
    try:
        if int(fd) > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
            os.close(int(fd))
    except OSError:  # the listing's own descriptor
        pass
while True:
    pass
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_the_cell_deadline_is_kept_whatever_the_kernel_does_to_its_pipes():
    """A cell that ignores the interrupt and closes its pipes to the server is killed at once (it can no longer
    answer), and at the latest at its deadline (2 s + 5 s), not at the notebook's (60 s); the next notebook runs."""
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=2, notebook_seconds=60)) as session:
        session.run(_notebook("print('warm')"))  # the sandbox's start (imports) is not the notebook's time
        stuck = session.run(_notebook("print('a')", CLOSE_THE_PIPES, "print('never')"))
        after = session.run(_notebook("print('ok')"))
    assert stuck.status == "stopped" and "closed its connection" in stuck.message and stuck.seconds < 20, \
        (stuck.status, stuck.seconds, stuck.message)
    assert _text(stuck.notebook.cells[0]) == "a\n" and _text(stuck.notebook.cells[2]) == ""
    assert after.status == "finished" and _text(after.notebook.cells[0]) == "ok\n", after.message


STOP_THE_SERVER = '''
import os, posix, signal
starter = os.getppid()  # the kernel starter, and its parent the server
server = int(open(f"/proc/{starter}/stat").read().rsplit(")", 1)[1].split()[1])
assert open(f"/proc/{server}/cmdline").read().split("\\0")[1] == "/tmp/runner.py"
posix.kill(server, signal.SIGSTOP)  # (os.kill is refused in the kernel)
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_a_kernel_that_stops_the_server_holds_the_worker_only_past_its_cells_limit(monkeypatch):
    """A stopped server keeps no deadline: the grader keeps each cell's too (2 s + 5 s here, and its margin, cut
    from 15 s to 1 s: the same sequence on a shorter clock) and ends the sandbox, not at the notebook's limit
    (120 s); what ran before counts, the notebook is flagged, and the sandbox is not kept for the next student,
    who is graded in a new one."""
    monkeypatch.setattr(sandbox, "SERVER_MARGIN_SECONDS", 1)
    limits = sandbox.Limits(cell_seconds=2, notebook_seconds=120)
    test = nbformat.v4.new_code_cell("from starter.checks import check\nimport torch\n"
                                     "check('causal/5', lambda T, device=None: torch.ones(T, T, dtype=torch.bool).tril())")
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "t", "points": 1}
    nb = _notebook("print('a')")
    nb.cells += [test, nbformat.v4.new_code_cell(STOP_THE_SERVER), nbformat.v4.new_code_cell("print('never')")]
    warm = sandbox.WarmSandbox()
    with sandbox.StudentSandbox(warm) as student:
        session = student.session(None, limits, True, None, reuse=True)
        session.run(_notebook("print('warm')"))  # the sandbox's start (imports) is not the notebook's time
        stopped = session.run(nb)
    assert stopped.status == "killed" and stopped.message.startswith("the sandbox's server stopped answering: ") \
        and "in cell 2 (" in stopped.message and stopped.seconds < 30, (stopped.status, stopped.seconds, stopped.message)
    assert _text(stopped.notebook.cells[0]) == "a\n" and not stopped.notebook.cells[3].outputs
    assert set(stopped.observations) == {"causal/5"}, stopped.observations  # recorded before the stop
    _, (after,), started = _grade_one_student(["print('ok')"], limits, warm)
    assert started == 1 and after.status == "finished" and _text(after.notebook.cells[0]) == "ok\n", after.message


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_the_sandboxs_init_holds_no_pipe_to_the_grader():
    """bubblewrap's init (pid 1 in the sandbox) keeps its standard input and output, and where the grader is not
    root it is the kernels' user: a kernel could open them through /proc/1/fd and write the server's replies.
    The server's jobs and replies are pipes of their own, which init does not keep."""
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60)) as session:
        result = session.run(_notebook("print('ok')"))
        bwrap = session._proc.pid
        init = int(Path(f"/proc/{bwrap}/task/{bwrap}/children").read_text().split()[0])
        held = {os.readlink(f"/proc/{init}/fd/{fd}") for fd in os.listdir(f"/proc/{init}/fd")}
    assert result.status == "finished" and _text(result.notebook.cells[0]) == "ok\n", result.message
    assert not [link for link in held if link.startswith("pipe:")], held


def test_the_graders_deadline_moves_only_with_the_notebooks_own_steps():
    """Each step the server tells of counts once and in the notebook's order: a line told again, out of order or
    for a cell the notebook does not have buys no time."""
    progress = sandbox._Progress(json.loads(nbformat.writes(_notebook("a", "b"))), sandbox.Limits(cell_seconds=2))
    end = time.monotonic() + 600
    assert progress.deadline(end) == end  # before the kernel is asked for, no student code runs
    assert progress.take({"step": "kernel"}, 0)
    assert progress.deadline(end) == pytest.approx(progress.since + sandbox.STARTER_SECONDS
                                                   + sandbox.SERVER_MARGIN_SECONDS)
    progress.take({"step": "cell", "index": 1}, 0)
    at = (progress.at, progress.since)
    for line in ({"step": "cell", "index": 1}, {"step": "cell", "index": 0}, {"step": "kernel"},
                 {"step": "cell", "index": 7}, {"step": "cell", "index": "1"}):
        assert progress.take(line, 0) and (progress.at, progress.since) == at, line
    assert progress.deadline(end) == pytest.approx(progress.since + 2 + sandbox.INTERRUPT_GRACE
                                                   + sandbox.SERVER_MARGIN_SECONDS)
    assert not progress.take({"folder": "nb", "exit": 0}, 0)  # the server's answer


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_a_kernel_that_kills_the_kernel_starter_harms_no_later_notebook():
    """The starter ignores what signals it can; killed (-9), its sandbox cannot start kernels, so the next
    notebook runs in a new sandbox, and a reset reports it."""
    kill = "import os, subprocess\nsubprocess.run(['kill', '-9', str(os.getppid())])\nprint('done')"
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60)) as session:
        first = session.run(_notebook("import os, signal\nfor s in (2, 15, 1, 10):\n"
                                      "    os.system(f'kill -{s} {os.getppid()}')\nprint('still here')"))
        assert session.reset(), "the starter did not survive catchable signals"
        killed = session.run(_notebook(kill))
        after = session.run(_notebook("print('ok')"))
        reset = session.reset()
    assert first.status == "finished" and _text(first.notebook.cells[0]) == "still here\n", first.message
    assert _text(killed.notebook.cells[0]) == "done\n", killed.message
    assert after.status == "finished" and _text(after.notebook.cells[0]) == "ok\n", after.message
    assert reset, "the new sandbox could not be reset"


MARK_INHERITED_FILES = '''
import fcntl, os
marked = 0
for fd in range(3, 64):
    try:
        if os.path.isfile(os.readlink(f"/proc/self/fd/{fd}")):
            os.lseek(fd, 12345, os.SEEK_SET)  # a mark the next kernel could read
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            marked += 1
    except OSError:
        pass
print(marked)
'''
READ_INHERITED_FILES = '''
import fcntl, os
seen = []
for fd in range(3, 64):
    try:
        if not os.path.isfile(os.readlink(f"/proc/self/fd/{fd}")):
            continue
    except OSError:
        continue
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the last kernel's lock held
        fcntl.flock(fd, fcntl.LOCK_UN)  # (one file may be open at several descriptors)
        seen.append(os.lseek(fd, 0, os.SEEK_CUR))
    except OSError as exc:
        seen.append(str(exc))
print(seen)
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_no_open_file_is_shared_from_one_kernel_to_the_next():
    """Files the server had open when it forked the starter (Matplotlib's fonts) are opened again by each
    kernel: an offset moved or a lock taken by one student's kernel is not there for the next one's."""
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60)) as session:
        first = session.run(_notebook(MARK_INHERITED_FILES))
        assert session.reset()
        second = session.run(_notebook(READ_INHERITED_FILES))
    assert int(_text(first.notebook.cells[0])) > 0, "no inherited file to mark: the test shows nothing"
    seen = eval(_text(second.notebook.cells[0]))
    assert seen and all(offset == 0 for offset in seen), [s for s in seen if s != 0]


FORGE_A_RECORD = '''
import json, os
import numpy as np
folder = os.environ["COURSE_RESULTS_DIR"]
os.makedirs(folder, exist_ok=True)
for name in NAMES:
    np.savez(f"{folder}/{name}.npz", **{"out:mask": np.ones((5, 5), dtype=bool)})
    json.dump({"case": CASE, "error": "", "raised": None, "raised_text": "", "dtypes": {"mask": "torch.bool"},
               "grad_error": "", "outputs": ["mask"], "grads": []}, open(f"{folder}/{name}.json", "w"))
'''


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_only_test_cells_record_and_what_they_recorded_stays():
    """Records are taken as each test cell ends: one written by a cell that is not a test is left out and, for a
    hidden case, reported; a test cell's records rewritten by a later cell are used as the test cell left them."""
    hidden = "hidden-0123456789abcdef"
    answer = "import torch\ndef causal_mask(T, device=None):\n    return torch.ones(T, T, dtype=torch.bool).tril(-1)"
    test = nbformat.v4.new_code_cell("from starter.checks import check\ncheck('causal/5', causal_mask)")
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "t", "points": 1}
    rewrite = ("import glob, os\nCASE = 'causal/5'\nNAMES = [os.path.basename(p)[:-5] for p in "
               "glob.glob(os.environ['COURSE_RESULTS_DIR'] + '/*.json') if not p.endswith('9000.json')]\n")
    nb = _notebook(answer, f"CASE, NAMES = {hidden!r}, ['9000']\n" + FORGE_A_RECORD)
    nb.cells += [test, nbformat.v4.new_code_cell(rewrite + FORGE_A_RECORD)]
    with sandbox.Session(limits=sandbox.Limits(cell_seconds=30, notebook_seconds=60)) as session:
        result = session.run(nb)
    assert result.status == "finished", result.message
    assert set(result.observations) == {"causal/5"}, set(result.observations)  # not the hidden forgery
    assert result.observations["causal/5"].outputs["mask"].sum() == 10, "the rewritten record was used"  # tril(-1)
    assert any("not a test cell, wrote records of hidden cases" in p for p in result.problems), result.problems
    assert any("changed or removed the checks' records" in p for p in result.problems), result.problems


def test_the_sandbox_is_not_told_which_hidden_cases_expect_an_error(tmp_path):
    """A hidden case that expects an error is run in the sandbox like any other (its `raises` property stays with
    the judge), so code cannot raise because the case file says so; what the code raised is recorded and the
    judge decides."""
    from starter.cases import case_groups, read_case

    sandbox.write_case_inputs(nbs.HIDDEN_REFERENCES, tmp_path / "cases")
    expecting = {name for path in nbs.HIDDEN_REFERENCES.glob("*.h5") for name, group in case_groups(h5py.File(path))
                 if any(p[0] == "raises" for p in read_case(group, name).properties)}
    assert expecting, "no hidden case expects an error: the test shows nothing"
    for path in (tmp_path / "cases").glob("*.h5"):
        with h5py.File(path) as f:
            for name, group in case_groups(f):
                assert not any(p[0] == "raises" for p in read_case(group, name).properties), name
    # the judge's copy says it: a function that raises the expected error passes, one that returns fails
    name = sorted(expecting)[0]
    case = next(read_case(g, n) for path in nbs.HIDDEN_REFERENCES.glob("*.h5")
                for n, g in case_groups(h5py.File(path)) if n == name)
    expected = next(p for p in case.properties if p[0] == "raises")[1]
    bare = dataclasses.replace(case, properties=[p for p in case.properties if p[0] != "raises"])
    error = {"ValueError": ValueError, "IndexError": IndexError, "TypeError": TypeError}.get(expected, ValueError)

    def raising(*args, **kwargs):
        raise error("refused")

    assert verdict(case, observe(bare, raising)) is None, verdict(case, observe(bare, raising))
    assert verdict(case, observe(bare, lambda *a, **k: 0)) is not None


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not installed")
def test_grading_one_notebook_is_a_plain_call_sandbox_then_judge():
    """`grading.worker.grade_notebook`, what nbgrader's Execute step is replaced by, called without nbgrader: the
    notebook runs in the sandbox, the judge scores its test cell from the observation and writes its lines and
    score into the cell (what the feedback page shows), and the record says the same."""
    from grading.course import CourseFiles
    from grading.settings import Settings
    from grading.worker import grade_notebook

    answer = "import torch\ndef causal_mask(T, device=None):\n    return torch.ones(T, T, dtype=torch.bool).tril(-1)"
    test = nbformat.v4.new_code_cell("from starter.checks import check\ncheck('causal/5', causal_mask)")
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "t", "points": 2}
    nb = _notebook(answer)
    nb.cells.append(test)
    record = grade_notebook(nb, "s", "01_scaled_dot_product_attention", None,
                            Settings(sandbox.Limits(cell_seconds=30, notebook_seconds=60)),
                            CourseFiles(None, None, (nbs.PUBLIC_REFERENCES,)))
    (cell,) = record.cells
    assert (record.sandbox, cell.grade_id, cell.points, cell.max_points) == ("finished", "t", 0.0, 2.0), record
    assert cell.cases[0].diagnosis.startswith("known bug"), cell.cases[0]  # the diagonal left out, named
    text, score = nb.cells[-1].outputs
    assert "\u2717 causal/5" in text["text"] and score["data"]["text/plain"] == "0.0"


def test_the_gradebook_gets_the_judges_number_not_what_the_cell_shows():
    """SaveJudgedScores, in the place of nbgrader's SaveAutoGrades, writes a test cell's points from the judge's
    record of the notebook; the cell's output (what a student's code could have printed into) is not read."""
    from types import SimpleNamespace

    from grading.feedback import GRADING
    from grading.judge import CellResult, NotebookRecord
    from grading.worker import SaveJudgedScores

    cell = nbformat.v4.new_code_cell("check('causal/5', causal_mask)")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "t", "points": 2}
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2.0"}, execution_count=None)]
    grade = SimpleNamespace(auto_score=None, manual_score=None, needs_manual_grade=True)
    step = SaveJudgedScores()
    step.notebook_id, step.assignment_id, step.student_id = "01_nb", "a", "s"
    step.gradebook = SimpleNamespace(find_grade=lambda *key: grade, db=SimpleNamespace(commit=lambda: None))
    record = NotebookRecord("s", "01_nb", "finished", "", True, 1.0, [], [CellResult("t", 0.5, 2.0)])
    step._add_score(cell, {GRADING: SimpleNamespace(judged=[record])})  # as StudentAutograde gives it
    assert (grade.auto_score, grade.needs_manual_grade) == (0.5, False)
    with pytest.raises(Exception, match="no score for test cell t of 01_nb"):
        step._add_score(cell, {GRADING: SimpleNamespace(judged=[dataclasses.replace(record, notebook="02_other")])})


def test_the_kits_steps_refuse_to_run_under_nbgraders_own_autograde():
    """Outside `python -m grading autograde` (its StudentAutograde gives them the student's sandbox and keeps the
    judge's records), the kit's steps stop with a message: no notebook is run without the student's sandbox,
    and no score is written without the judge's."""
    from grading.worker import NOT_IN_A_RUN, GradeNotebook, SaveJudgedScores

    cell = nbformat.v4.new_code_cell("check('causal/5', causal_mask)")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "t", "points": 2}
    with pytest.raises(Exception, match="python -m grading autograde"):
        GradeNotebook().preprocess(nbformat.v4.new_notebook(cells=[cell]), {"nbgrader": {"student": "s",
                                                                                         "notebook": "01_nb"}})
    with pytest.raises(Exception, match="python -m grading autograde"):
        SaveJudgedScores()._add_score(cell, {})
    assert "nbgrader's own autograde" in NOT_IN_A_RUN


def test_a_students_grading_follows_calls_not_thread_locals():
    """What one student's grading shares (the sandbox, the judge's records, the course preparation the run started
    with) is passed as arguments: no module of grading/ keeps state per thread or per context."""
    import ast

    found = []
    for path in sorted((nbs.ROOT / "grading").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                name = f"{node.value.id}.{node.attr}"
            elif isinstance(node, ast.Import | ast.ImportFrom):
                name = " ".join([getattr(node, "module", None) or ""] + [a.name for a in node.names])
            else:
                continue
            if name == "threading.local" or "contextvars" in name or "ContextVar" in name or "threading local" in name:
                found.append(f"{path.name}:{node.lineno} {name}")
    assert found == [], found
