"""Run a student's notebooks in a sandbox: the only place where student code ever runs while grading.

bubblewrap (Debian package `bubblewrap`) builds the sandbox from nothing and lets in only what the
notebooks need, read-only: the system's programs and libraries (/usr, /bin, /lib, /etc), the Python
environment, the kit's `starter/` and `data/` (public references and the dataset), and the hidden
cases' *inputs* under opaque ids (never their names or expected outputs). The code runs as a real
unprivileged user of the sandbox's own (`sandbox_user`: no two sandboxes on a machine share one) in new pid,
network, IPC and UTS namespaces (no network, no view of any other process); the only writable place is the notebooks' folder, a size-limited tmpfs of the
sandbox's own that the grader never opens (results come back in the server's answer); solutions, hidden references, the gradebook, the course
folder and other students' files do not exist in there. Limits: memory and process count (a cgroup,
where the machine lets us make one), file size, open files and core dumps (rlimits), a per-cell timeout
(an interrupt, then a kill), and a hard kill of the whole sandbox at a notebook's time limit.

One sandbox for all of a student's notebooks (a `Session`, held by the `StudentSandbox` that
`grading.worker.grade_student` opens for the student): its server (grading/sandbox_runner.py) imports torch and the rest once, forks a kernel
starter before it reads any notebook, and has it fork a fresh kernel for each notebook, so a notebook
costs what its cells cost, not seconds of start-up. Nothing crosses from one notebook to the next but
files in the sandbox's own /tmp: each kernel is a new process, and whatever a notebook started is killed
before the next one runs. When the sandbox ends, everything in it ends. A seccomp filter
(grading/seccomp.py) refuses what namespaces leave shared between sandboxes (keyrings, message queues, new
namespaces); what the kernel counts per user (epoll watches, inotify instances, pending signals, pipe buffers)
is each sandbox's own, and the machine's table of open files cannot be filled from one (`unlimit_file_table`,
`open_files_limit`). A worker keeps its sandbox warm for its next student, but only after a reset that ends
every process but the server and the starter, empties the one writable folder, removes IPC objects, and finds
nothing left, the filter in force and the starter answering; a sandbox that cannot be reset ends
(`--no-reuse-sandbox`: a new one per student). The server never runs student code, and no kernel is a fork of
a process that has held a student's notebook, so a warm sandbox holds nothing of the last student.

`run_in_sandbox` runs one notebook this way, in place of nbgrader's `Execute` step (grading/worker.py); what
the checks recorded is read back as plain data (`starter.compare.read_observations`) for the judge.
"""
from __future__ import annotations

import base64
import contextlib
import copy
import fcntl
import json
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

import nbformat

from data.common import DATA_ENV
from starter.cases import CASE_ATTRIBUTES, case_groups
from starter.compare import CASE_INPUTS_ENV, Observation, read_observations
from starter.runtime import GRADING_ENV

from . import notebooks, seccomp
from .sandbox_runner import INTERRUPT_GRACE, KERNEL_EXIT_SECONDS, MAX_FILES, PLAIN_NAME, STARTER_SECONDS
from .settings import Limits, Settings
from .trained_model import measured_outside

CPU_PERIOD_US = 100_000  # the cgroup's accounting period for the CPU quota
SCRATCH = "/tmp/work"  # the notebook's folder inside the sandbox (writable, private)
RUNNER = Path(__file__).with_name("sandbox_runner.py")  # mounted at /tmp/runner.py, read-only
CASES = "/tmp/cases"  # the hidden cases' inputs inside the sandbox (read-only)
NOBODY = 65534  # the sandbox's user inside its user namespace where the grader is not root
SANDBOX_UID_BASE = 0x70000000  # the sandboxes' users on the host, a range no distribution gives out (systemd's
SANDBOX_UIDS = 4096            # list leaves 1879048192-2147352575 unused); one per sandbox alive on the machine
SANDBOX_USERS_DIR = Path("/run/grading-sandbox-users")  # one lock file per uid in use
OPEN_FILES_SHARE = 16  # a sandbox's descriptors may be at most 1/16 of the machine's table of open files
FILE_TABLE = Path("/proc/sys/fs/file-max")  # the machine's table of open files, shared by every process
UNLIMITED_FILES = 2**63 - 1  # its largest size, which systemd sets at boot: open files are charged to the
                             # memory cgroup of whoever opened them, and the sandbox's is bounded
MAX_REPLY_BYTES = 200 * 2**20  # the server's answer for one notebook (the notebook and records, in base64)
SERVER_MARGIN_SECONDS = 15  # past a step's own limit, for the server's own work (the sweep, its answer) on a busy machine
RESET_SECONDS = 60  # for the server to reset the sandbox between two students


@dataclass
class SandboxResult:
    """How the run ended, the executed notebook (None if it could not be read) and the records."""

    status: str  # "finished" | "timed out" (cells interrupted) | "stopped" (the kernel died) | "time limit" | "killed"
    message: str = ""
    seconds: float = 0.0
    notebook: nbformat.NotebookNode | None = None
    observations: dict[str, Observation] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    isolated: bool = True


def bwrap() -> str | None:
    return shutil.which("bwrap")


class SandboxUnavailable(RuntimeError):
    pass


def require_bwrap() -> str:
    path = bwrap()
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed, so student code cannot be isolated: install it "
            "(Debian/Ubuntu: `sudo apt-get install bubblewrap`), or grade with --no-sandbox (flagged for review).")
    return path


def _python_roots() -> list[str]:
    """Folders the interpreter needs: the environment (sys.prefix) and the base installation."""
    roots = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    return sorted(r for r in roots if not r.startswith(("/usr", "/bin", "/lib")))


@contextlib.contextmanager
def sandbox_user():
    """A uid (and gid) for one sandbox, no other sandbox's on this machine while it lives. The kernel counts
    some things per user, machine-wide: epoll watches, inotify instances, pending signals, pipe buffer pages.
    Sandboxes sharing one user would share those limits, and a student who used one up in their sandbox would
    make the kernels die in the sandbox of a student graded beside them. The uid is held with a lock on a file
    in a folder only root may write (released when the grader closes it or dies), so grading processes on one
    machine (the workers) take different ones. Not root: the sandbox runs in a user namespace as NOBODY, and
    the kernel counts for the grader's own user, which every sandbox then shares (the threat model says so)."""
    if os.geteuid() != 0:
        yield NOBODY
        return
    SANDBOX_USERS_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = SANDBOX_USERS_DIR.stat()
    if folder.st_uid != 0 or folder.st_mode & 0o022:
        raise SandboxUnavailable(f"{SANDBOX_USERS_DIR} must be root's and writable by root only")
    for slot in range(SANDBOX_UIDS):
        fd = os.open(SANDBOX_USERS_DIR / str(slot), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield SANDBOX_UID_BASE + slot
        finally:
            os.close(fd)
        return
    raise SandboxUnavailable(f"all {SANDBOX_UIDS} sandbox users are in use on this machine")


def unlimit_file_table() -> str | None:
    """Make the machine's table of open files (fs.file-max) as large as it goes, as systemd does at boot, where
    the grader may (root); None once it is, else why not. A file held by a memory mapping after its descriptor
    is closed counts in the table and not against any descriptor limit: a sandbox's processes can open, map and
    close one file after another until the table is full (about 2.5 million files on a 24 GiB machine whose
    table was left at the kernel's default, in 40 s), and then every process without root's privileges, the
    kernels of the students graded beside them and the gradebook's PostgreSQL, fails to open anything. With the
    table unlimited, the sandbox's memory limit ends that student's sandbox first."""
    try:
        if int(FILE_TABLE.read_text()) >= UNLIMITED_FILES:
            return None
        FILE_TABLE.write_text(str(UNLIMITED_FILES))
        return None
    except (OSError, ValueError) as exc:
        return (f"the machine's table of open files ({FILE_TABLE}) could not be raised to its largest size "
                f"({exc.__class__.__name__}: {exc}): a student's sandbox could fill it and make the kernels of "
                f"students graded beside it fail (as root: sysctl -w fs.file-max={UNLIMITED_FILES})")


def open_files_limit(limits: Limits) -> int:
    """Open files per process in a sandbox (RLIMIT_NOFILE): all its processes together (limits.processes of
    them) may hold at most 1/OPEN_FILES_SHARE of the machine's table (fs.file-max), 256 to 4096 each. Without
    it a sandbox's processes could fill the table, and every other process without root's privileges, the
    next sandbox's kernel and the gradebook's database server included, would fail to open anything."""
    try:
        file_max = int(FILE_TABLE.read_text())
    except (OSError, ValueError):
        file_max = 2**20
    return max(256, min(4096, file_max // (OPEN_FILES_SHARE * max(1, limits.processes))))


def sandbox_argv(limits: Limits, case_inputs: Path | None, data_dir: Path | None,
                 seccomp_fd: int | None = None, uid: int = NOBODY) -> list[str]:
    """bubblewrap's command line, up to the program to run in the sandbox; `seccomp_fd`: an open file of the
    system-call filter (grading/seccomp.py), to be passed to bwrap; `uid`: the sandbox's user (`sandbox_user`).

    Run by root, bwrap builds the mounts and then `setpriv` makes the program a real unprivileged user
    (`uid`, no capabilities, no supplementary groups): with a user namespace instead, the user inside
    would be root outside (able to read /etc/shadow or write /proc/sys). Run by another user,
    bwrap needs a user namespace and the program stays that unprivileged user's."""
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if os.geteuid() != 0:
        namespaces += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL"]
    if seccomp_fd is not None:
        namespaces += ["--seccomp", str(seccomp_fd)]
    argv = [require_bwrap(), *namespaces, "--die-with-parent", "--new-session", "--hostname", "grading",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    binds = [(path, path, True) for path in ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc")
             if os.path.exists(path)]
    binds += [(path, path, False) for path in _python_roots()]
    kit = str(notebooks.ROOT)
    binds += [(f"{kit}/{part}", f"{kit}/{part}", False) for part in ("starter", "data")]  # as a student has it
    if data_dir is not None and data_dir.is_dir():
        binds.append((str(data_dir), "/tmp/data", False))
    if case_inputs is not None:
        binds.append((str(case_inputs), CASES, False))
    binds.append((str(RUNNER), "/tmp/runner.py", False))
    made: set[str] = set()
    for _, dest, _ in binds:  # bwrap would make the folders above a mount point 0700: readable by root only
        for parent in reversed(Path(dest).parents[:-1]):
            if str(parent) not in made and str(parent) not in ("/tmp",):
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
    for src, dest, optional in binds:
        argv += ["--ro-bind-try" if optional else "--ro-bind", src, dest]
    # the notebooks' folders: a tmpfs of the sandbox's own, of bounded size (its pages count against the
    # memory cgroup too); the grader never opens anything in it. Sticky: only its owner (root, outside) may set
    # extended attributes on the folder itself, which the reset between two students could not empty (memory
    # the next student would be short of, and a message to them)
    argv += ["--size", str(limits.scratch_mb * 2**20), "--perms", "1777", "--tmpfs", SCRATCH, "--chdir", SCRATCH]
    if os.geteuid() == 0:
        argv += [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}",
                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"]
    return argv


def _sandbox_env(data_dir: Path | None, isolate: bool, scratch: Path) -> dict:
    """A clean environment: nothing of the grader's (no database URL, no paths to hidden files). The
    runner sets COURSE_RESULTS_DIR per notebook."""
    home = SCRATCH if isolate else str(scratch)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": home,
           "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONWARNINGS": "ignore", "PYDEVD_DISABLE_FILE_VALIDATION": "1", GRADING_ENV: "autograde"}
    if data_dir is not None:
        env[DATA_ENV] = "/tmp/data" if isolate else str(data_dir)
    # the kit that grades (its starter/ and data/, mounted at the same paths in the sandbox) before any copy the
    # interpreter's environment names: an editable install of another checkout is not mounted there
    env["PYTHONPATH"] = str(notebooks.ROOT)
    return env


STALE_CGROUP_SECONDS = 600  # an empty group of ours this old was left by a grader that was killed


def _remove_stale_cgroups() -> None:
    """Remove the empty groups that graders killed before they could clean up left behind (a killed worker, an
    interrupted run): harmless one by one, but a machine has a bounded number of memory groups. A group with a
    process in it, a live sandbox's, cannot be removed; one just made is younger than STALE_CGROUP_SECONDS."""
    base = Path("/sys/fs/cgroup")
    for group in [*base.glob("grading-*"), *base.glob("*/grading-*")]:
        with contextlib.suppress(OSError):
            if time.time() - group.stat().st_mtime > STALE_CGROUP_SECONDS and not (group / "cgroup.procs").read_text():
                group.rmdir()


@contextlib.contextmanager
def _cgroup(limits: Limits):
    """Files to write the sandbox's pid into, one per controller (memory, pids, cpu); [] where the machine
    gives us no cgroup (not root, or a read-only hierarchy): then only the rlimits apply. The CPU quota
    keeps a notebook that starts many threads or processes to its share of the machine (the kernel's own
    math libraries run one thread: OMP_NUM_THREADS=1); a hierarchy without the cpu controller goes without it."""
    name = f"grading-{uuid.uuid4().hex[:12]}"
    made: list[Path] = []
    _remove_stale_cgroups()
    procs: list[str] = []
    settings: dict[str, dict[str, object]] = {"memory": {"memory.limit_in_bytes": limits.memory_mb * 2**20},
                                              "pids": {"pids.max": limits.processes}}
    unified: dict[str, object] = {"memory.max": limits.memory_mb * 2**20, "memory.swap.max": 0,
                                  "pids.max": limits.processes}
    if limits.cpus > 0:
        quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
        settings["cpu"] = {"cpu.cfs_period_us": CPU_PERIOD_US, "cpu.cfs_quota_us": quota}
        unified["cpu.max"] = f"{quota} {CPU_PERIOD_US}"
    try:
        if Path("/sys/fs/cgroup/cgroup.controllers").exists():  # cgroup v2 only
            group = Path("/sys/fs/cgroup") / name
            group.mkdir()
            made.append(group)
            for key, value in unified.items():
                with contextlib.suppress(OSError):
                    (group / key).write_text(str(value))
            procs.append(str(group / "cgroup.procs"))
        else:  # cgroup v1 (or hybrid): one hierarchy per controller
            for controller, values in settings.items():
                group = Path("/sys/fs/cgroup") / controller / name
                try:
                    group.mkdir()
                    made.append(group)
                    for key, value in values.items():
                        (group / key).write_text(str(value))
                except OSError:
                    if controller != "cpu":  # memory and pids or no cgroup at all; the quota is a bonus
                        raise
                    continue
                procs.append(str(group / "cgroup.procs"))
    except OSError:
        procs = []
    try:
        yield procs
    finally:
        for group in made:
            for _ in range(50):  # the processes are gone a moment after the kill
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


def _limit_child(procs: list[str], limits: Limits):
    open_files = open_files_limit(limits)

    def apply() -> None:  # runs in the child between fork and exec
        for path in procs:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * 2**20,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        files = open_files if hard == resource.RLIM_INFINITY else min(open_files, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    return apply


class Session:
    """One sandbox for one student: started on the first notebook, it keeps a warm server (imports done)
    that forks a fresh kernel per notebook (grading/sandbox_runner.py). A notebook past its time limit,
    or a server that died or stopped answering (`_Progress`), ends the sandbox with everything in it; the next
    notebook starts a new one.
    Use as a context manager; closing it kills whatever is left."""

    def __init__(self, case_inputs: Path | None = None, limits: Limits = Limits(), isolate: bool = True,
                 data_dir: Path | None = None):
        self.case_inputs, self.limits, self.isolate, self.data_dir = case_inputs, limits, isolate, data_dir
        self.reuse = False  # kept for the next student after a reset: StudentSandbox.session sets it, as asked
        self.starts = 0  # how many times a sandbox was started for it (one dies at a notebook's time limit)
        self.left_behind: list[str] = []  # what its last reset found left of the student (it then ended)
        self.uid: int | None = None  # the sandbox's user on the host (sandbox_user), while it runs
        self._stack: contextlib.ExitStack | None = None
        self._proc: subprocess.Popen | None = None
        self._jobs: BinaryIO | None = None  # the server's jobs, one line each
        self._lines: _Lines | None = None  # its replies
        self._scratch: Path | None = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        self.starts += 1
        self._stack = contextlib.ExitStack()
        self._scratch = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="sandbox-")))
        os.chmod(self._scratch, 0o777)  # --no-sandbox: the notebooks' folders (in the sandbox: a tmpfs of its own)
        workdir = SCRATCH if self.isolate else str(self._scratch)
        # the server's jobs and replies: pipes of their own, which bubblewrap's init (pid 1 in the sandbox, the
        # kernels' user where the grader is not root) does not keep, as it keeps standard input and output
        jobs, jobs_write = os.pipe()
        replies_read, replies = os.pipe()
        self._jobs = self._stack.enter_context(os.fdopen(jobs_write, "wb"))
        self._stack.callback(os.close, replies_read)
        self._lines = _Lines(replies_read)
        runner = [sys.executable, "/tmp/runner.py" if self.isolate else str(RUNNER), str(self.limits.cell_seconds),
                  workdir, str(jobs), str(replies)]
        env = _sandbox_env(self.data_dir, self.isolate, self._scratch)
        filter_fd = None
        if self.isolate:
            filter_fd = seccomp.filter_file()
            self._stack.callback(os.close, filter_fd)
            self.uid = self._stack.enter_context(sandbox_user())
            unlimit_file_table()  # here too: a Dask cluster's workers run on machines of their own
            argv = (sandbox_argv(self.limits, self.case_inputs, self.data_dir, filter_fd, self.uid) + runner
                    + ["--sweep"])
            env[CASE_INPUTS_ENV] = CASES
        else:
            argv = runner
            if self.case_inputs is not None:
                env[CASE_INPUTS_ENV] = str(self.case_inputs)
        procs = self._stack.enter_context(_cgroup(self.limits))
        self._stderr = self._stack.enter_context(tempfile.TemporaryFile())
        try:
            self._proc = subprocess.Popen(argv, cwd=self._scratch, env=env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=self._stderr, start_new_session=True,
                                          pass_fds=(jobs, replies, *(() if filter_fd is None else (filter_fd,))),
                                          preexec_fn=_limit_child(procs if self.isolate else [], self.limits))
        finally:  # the server's ends
            os.close(jobs)
            os.close(replies)
        self._stack.callback(self._kill)

    def start(self) -> None:
        """Start the sandbox now, not on the first notebook (its server's imports go on while the caller works)."""
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)  # the sandbox, and with it all it started
        if self._proc is not None:
            self._proc.wait()

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
        self._stack, self._proc, self._scratch, self._jobs, self._lines = None, None, None, None, None

    def _server_error(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return f": {lines[-1][:200]}" if lines else ""

    def reset(self) -> bool:
        """Make this sandbox ready for another student (grading/sandbox_runner.py `reset`): True if its
        server ended every other process, emptied the writable folder and removed the IPC objects, and
        found nothing left; otherwise (or with no sandbox running, or without bubblewrap) it is closed."""
        proc = self._proc
        if proc is None or proc.poll() is not None or not self.isolate:
            self.close()
            return False
        assert self._jobs is not None and self._lines is not None
        try:
            self._jobs.write(b'{"reset": true}\n')
            self._jobs.flush()
            reply = self._lines.next(time.monotonic() + RESET_SECONDS, 2**20)
            answer = json.loads(reply) if reply else {}
        except (OSError, ValueError):
            answer = {}
        if not (isinstance(answer, dict) and answer.get("reset") is True and answer.get("clean") is True):
            left = answer.get("left") if isinstance(answer, dict) else None
            self.left_behind = [str(x)[:200] for x in left[:5]] if isinstance(left, list) else ["no answer"]
            self.close()
            return False
        return True

    def run(self, nb, files: dict[str, bytes] | None = None) -> SandboxResult:
        """Execute `nb` in a fresh kernel in this sandbox, with `files` ({relative path: bytes}) beside it,
        and read back the executed notebook and records."""
        start = time.perf_counter()
        # the server stops the notebook a little before the hard limit, so that what it did still comes back
        job = {"folder": f"nb-{secrets.token_hex(6)}", "notebook": json.loads(nbformat.writes(nb)),
               "seconds": max(5, self.limits.notebook_seconds - 15),
               "files": {rel: base64.b64encode(data).decode() for rel, data in (files or {}).items()}}
        status, message = "finished", ""
        for _ in range(2):  # a second time in a new sandbox if this one could not start a kernel
            self.start()  # where none runs (the first notebook, or the last one's sandbox ended)
            proc: subprocess.Popen = self._proc  # type: ignore[assignment]  # (started above)
            assert self._jobs is not None and self._lines is not None
            progress = _Progress(job["notebook"], self.limits)
            try:
                self._jobs.write((json.dumps(job) + "\n").encode())
                self._jobs.flush()
                reply = progress.follow(self._lines, time.monotonic() + self.limits.notebook_seconds)
            except OSError:
                reply = b""
            answer = _parse(reply)
            if not answer.get("restart"):
                break
            self.close()
        if reply is None:  # what the server told of the cells that ran still counts
            self._kill()
            answer = progress.answer()
            if progress.stalled:
                status, message = "killed", progress.stalled
            else:
                status, message = "time limit", (f"stopped at the notebook's time limit "
                                                 f"({self.limits.notebook_seconds} s)")
        else:
            try:
                code, stuck = int(answer["exit"]), answer.get("stuck")
            except (ValueError, KeyError, TypeError):  # no answer: the server itself died
                self._kill()
                progress.results.clear()  # the notebook earns nothing, as the threat model says (`kill -9 -1`)
                status, message = "killed", f"the sandbox ended with exit code {proc.returncode}{self._server_error()}"
            else:
                if answer.get("time_limit"):
                    status, message = "time limit", (f"stopped at the notebook's time limit "
                                                     f"({self.limits.notebook_seconds} s) in cell {stuck}")
                elif stuck is not None:
                    status = "timed out"
                    message = (f"cell {stuck} ran past {self.limits.cell_seconds} s and did not stop when "
                               "interrupted, so the notebook was stopped there")
                elif answer.get("stopped"):
                    status, message = "stopped", f"{answer['stopped']}, so the notebook was stopped there"
                elif code != 0:
                    status = "stopped"
                    message = (f"the kernel died (exit code {code}"
                               + (", killed: out of memory or too many processes?)" if code == -9 else ")"))
        executed, unreadable = None, ""
        if isinstance(answer.get("out"), str):
            try:
                executed = nbformat.reads(answer["out"], as_version=4)
            except Exception as exc:
                unreadable = f"the executed notebook could not be read ({type(exc).__name__}): its outputs are lost"
                message = message or unreadable
        if executed is not None and status == "finished":
            run = executed.metadata.get("grading_run") or {}
            if run.get("timeouts"):
                status = "timed out"
                message = (f"cells {list(run['timeouts'])[:10]} took longer than {self.limits.cell_seconds} s "
                           "and were interrupted")
        with tempfile.TemporaryDirectory(prefix="records-") as records:  # a folder of the grader's own
            results = answer.get("results")  # those the server had not sent while the notebook ran
            dropped = _unpack_records({**progress.results, **(results if isinstance(results, dict) else {})},
                                      Path(records))
            observations, problems = read_observations(Path(records))
        problems += [str(p)[:300] for p in answer.get("problems") or [] if isinstance(p, str)][:10]
        if unreadable:  # (the scores stand: they come from the records)
            problems.append(unreadable)
        if dropped or answer.get("dropped"):
            problems.append(f"{int(dropped) + int(answer.get('dropped') or 0)} unreadable result file(s), not read back "
                            "(links, special files, odd names, or over the size limit)")
        if proc.poll() is not None:  # killed above: the next notebook gets a new sandbox
            self.close()
        return SandboxResult(status=status, message=message, seconds=time.perf_counter() - start, notebook=executed,
                             observations=observations, problems=problems, isolated=self.isolate)


def _parse(reply: bytes | None) -> dict:
    """The server's answer as a dict ({} if there is none, or it is not one)."""
    try:
        answer = json.loads(reply) if reply else {}
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _unpack_records(files, dest: Path) -> int:
    """Write the records the server sent ({name: base64}) as files of `dest`; returns how many were refused."""
    if not isinstance(files, dict):
        return 0
    refused = 0
    for name, data in list(files.items())[:MAX_FILES]:
        if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name) or not isinstance(data, str):
            refused += 1
            continue
        try:
            content = base64.b64decode(data, validate=True)
        except ValueError:
            refused += 1
            continue
        with open(os.open(dest / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(content)
    return refused + max(0, len(files) - MAX_FILES)


class _Lines:
    """The server's replies: lines of a pipe (`fd`), each read by a deadline and within a size limit."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer = fd, bytearray()

    def next(self, deadline: float, limit: int) -> bytes | None:
        """The next line by `deadline` (time.monotonic()): None if none came; b"" if the pipe closed or the
        line is longer than `limit`."""
        scanned = 0
        with selectors.DefaultSelector() as sel:
            sel.register(self.fd, selectors.EVENT_READ)
            while True:
                newline = self.buffer.find(b"\n", scanned)
                if newline >= 0:
                    line = bytes(self.buffer[:newline + 1])
                    del self.buffer[:newline + 1]
                    return line
                if len(self.buffer) > limit:
                    self.buffer.clear()
                    return b""
                scanned = len(self.buffer)
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(self.fd, 2**20)
                if not chunk:
                    return b""
                self.buffer += chunk


class _Progress:
    """What the server tells of a notebook while it runs it (grading/sandbox_runner.py `run_notebook`): each
    step as it begins (the kernel's start, each code cell, the end) and, once a cell ran, its outputs and the
    records it left. The grader keeps each step's deadline by its own clock too, from limits it knows (a
    cell's: `cell_seconds` + INTERRUPT_GRACE; the starter's; a kernel's exit), plus SERVER_MARGIN_SECONDS: a
    kernel can stop the server (SIGSTOP: they are one user, and a stopped process cannot keep a deadline), and
    the worker would otherwise wait for the notebook's time limit. No kernel can write to the server's
    replies (a pipe only the server holds in the sandbox, and it is not dumpable), and even so a step counts
    only once and in the notebook's order, so no line buys more time than the notebook's own cells could take."""

    def __init__(self, notebook: dict, limits: Limits) -> None:
        cell = limits.cell_seconds + INTERRUPT_GRACE
        self.notebook = notebook
        code = [i for i, c in enumerate(notebook.get("cells", [])) if c.get("cell_type") == "code"]
        # (the step's name, what it is in words, its limit in seconds), in the order the server takes them
        self.steps = [("kernel", "starting the kernel", STARTER_SECONDS),
                      ("cell -1", "the set-up cell", cell),
                      *((f"cell {i}", f"cell {i}", cell) for i in code),
                      ("end", "ending the notebook", 2 * KERNEL_EXIT_SECONDS)]
        self.at = -1  # the step the server is in (-1: none yet; until the first, no student code runs)
        self.since = 0.0
        self.cells: dict[int, dict] = {}  # each code cell that ran: its outputs and execution count
        self.results: dict = {}  # the records kept so far ({name: base64})
        self.received = 0  # bytes of cells and records told
        self.stalled = ""  # why the server was taken for stopped: it did not finish a step in time

    def deadline(self, end: float) -> float:
        return min(end, self.since + self.steps[self.at][2] + SERVER_MARGIN_SECONDS) if self.at >= 0 else end

    def take(self, message: dict, size: int) -> bool:
        """Note a line of progress (True), or say that `message` is not one (False: the server's answer)."""
        if "step" in message:
            name = f"{message['step']} {message.get('index')}" if message["step"] == "cell" else str(message["step"])
            later = [i for i, step in enumerate(self.steps) if step[0] == name and i > self.at]
            if later:
                self.at, self.since = later[0], time.monotonic()
            return True
        if "ran" in message:
            self.received += size
            if isinstance(message["ran"], int) and self.received <= MAX_REPLY_BYTES:
                self.cells[message["ran"]] = message
                if isinstance(message.get("results"), dict):
                    self.results.update(message["results"])
            return True
        return False

    def follow(self, lines: _Lines, end: float) -> bytes | None:
        """The server's answer to its notebook job, taking its progress on the way; None if it did not come by
        `end` (time.monotonic(), the notebook's time limit) or by the deadline of the step it was in (then
        `stalled` says so)."""
        while True:
            line = lines.next(self.deadline(end), MAX_REPLY_BYTES)
            if line is None:
                if self.at >= 0 and time.monotonic() < end:
                    _, what, limit = self.steps[self.at]
                    self.stalled = (f"the sandbox's server stopped answering: nothing from it for "
                                    f"{time.monotonic() - self.since:.0f} s in {what} (its limit: {limit} s), so "
                                    "the sandbox was ended; what ran before counts")
                return None
            message = _parse(line)
            if not self.take(message, len(line)):
                return line

    def answer(self) -> dict:
        """An answer made of what the server told (where its own never came): the notebook with the outputs of
        the cells that ran (the others' cleared), the records, the problems it had found."""
        notebook = copy.deepcopy(self.notebook)
        for index, cell in enumerate(notebook.get("cells", [])):
            if cell.get("cell_type") == "code":
                ran = self.cells.get(index, {})
                cell["outputs"] = ran.get("outputs") if isinstance(ran.get("outputs"), list) else []
                cell["execution_count"] = ran.get("execution_count") if isinstance(
                    ran.get("execution_count"), int) else None
        last = self.cells[max(self.cells)] if self.cells else {}
        return {"out": json.dumps(notebook), "dropped": last.get("dropped"), "problems": last.get("problems")}


def run_notebook(nb, case_inputs: Path | None, limits: Limits = Limits(), isolate: bool = True,
                 data_dir: Path | None = None) -> SandboxResult:
    """Execute `nb` in a sandbox of its own (a Session for one notebook)."""
    with Session(case_inputs, limits, isolate, data_dir) as session:
        return session.run(nb)


class WarmSandbox:
    """The sandbox reset after a worker process's last student and kept for its next (`Settings.reuse_sandbox`).
    A student's grading takes it and owns it until the student is done, so no two students are ever in one sandbox
    at a time; one kept for other settings (a worker that moves to another course) ends instead of being taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: tuple[tuple, Session] | None = None  # (the settings it was made for, the sandbox)

    def take(self, key: tuple) -> Session | None:
        with self._lock:
            kept, self._kept = self._kept, None
        if kept is not None and kept[0] != key:
            kept[1].close()
            return None
        return kept[1] if kept is not None else None

    def start(self, case_inputs: Path | None, limits: Limits, data_dir: Path | None) -> bool:
        """Start a sandbox for these settings and keep it for the worker's next student, unless one is kept for
        them already: what a run asks of each worker while the course is still being prepared, so that no student
        waits for a sandbox to start (bubblewrap, then the imports in it: seconds). True if it started one."""
        key = sandbox_key(case_inputs, limits, True, data_dir)
        with self._lock:
            if self._kept is not None and self._kept[0] == key:
                return False
        session = Session(case_inputs, limits, isolate=True, data_dir=data_dir)
        session.start()
        self.keep(key, session)
        return True

    def keep(self, key: tuple, session: Session) -> None:
        with self._lock:
            before, self._kept = self._kept, (key, session)
        if before is not None:  # another thread's student's (one is enough)
            before[1].close()

    def close(self) -> None:
        """End the sandbox kept here, if any."""
        with self._lock:
            kept, self._kept = self._kept, None
        if kept is not None:
            kept[1].close()


WARM = WarmSandbox()  # this worker process's


class StudentSandbox:
    """The sandbox all of one student's notebooks run in (`run_in_sandbox`), so the imports are paid once for
    all of them: a warm one from `warm` (the worker's last student's, reset) where there is one, else a new one.
    Closing it hands a sandbox made with `reuse` back to `warm`, but only once `Session.reset` has ended
    everything the student started, emptied the only writable folder and checked that nothing is left;
    otherwise, and for a sandbox made without it, the sandbox ends. Use as a context manager."""

    def __init__(self, warm: WarmSandbox | None = WARM) -> None:
        self.warm = warm
        self._sessions: dict[tuple, tuple[Session, int]] = {}  # settings: (session, its starts when taken)

    @property
    def left_behind(self) -> list[str]:
        """What the reset after this student found they had left or changed in the sandbox (it was then ended,
        not kept for the next student); empty when it was clean or not reset."""
        return [item for session, _ in self._sessions.values() for item in session.left_behind]

    @property
    def sandboxes_started(self) -> int:
        """How many sandboxes this student's grading had to start (0: it ran in a warm one)."""
        return sum(session.starts - before for session, before in self._sessions.values())

    def session(self, case_inputs: Path | None, limits: Limits, isolate: bool, data_dir: Path | None,
                reuse: bool = Settings.reuse_sandbox) -> Session:
        key = sandbox_key(case_inputs, limits, isolate, data_dir)
        if key not in self._sessions:
            session = (self.warm.take(key) if self.warm is not None else None) or Session(case_inputs, limits,
                                                                                          isolate, data_dir)
            session.reuse = reuse and isolate and self.warm is not None
            self._sessions[key] = (session, session.starts)
        return self._sessions[key][0]

    def __enter__(self) -> StudentSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for key, (session, _) in self._sessions.items():
            if session.reuse and self.warm is not None and session.reset():
                self.warm.keep(key, session)
            else:
                session.close()


def sandbox_key(case_inputs: Path | None, limits: Limits, isolate: bool, data_dir: Path | None) -> tuple:
    """What a sandbox is made for: what it mounts, down to the folders' identity (a course prepared again, with new
    opaque ids, or a dataset rebuilt since a warm sandbox was made needs a new one) and its limits."""
    return (case_inputs, limits, isolate, data_dir, *(_identity(p) for p in (case_inputs, data_dir, RUNNER)))


def _identity(path: Path | None) -> tuple:
    try:
        info = path.stat() if path is not None else None
    except OSError:
        return ()
    return (info.st_dev, info.st_ino, info.st_mtime_ns) if info else ()


class SandboxFiles(Protocol):
    """What a sandbox mounts of the prepared course (grading.course.CourseFiles has them)."""

    @property
    def case_inputs(self) -> Path | None: ...  # the hidden cases' inputs under opaque ids

    @property
    def data_dir(self) -> Path | None: ...  # the datasets, read-only


def run_in_sandbox(nb, stem: str, folder: Path | None, settings: Settings, files: SandboxFiles,
                   student: StudentSandbox | None = None) -> SandboxResult:
    """Run notebook `stem` (`nb`, handed in in `folder` with the files it reads) in the student's sandbox
    (`student`; a sandbox of its own when None), under the run's `settings` (its limits, isolation, whether a
    sandbox is kept for the next student) with the course's `files` (the hidden cases' inputs under opaque ids, the
    datasets); put the sandbox's outputs in `nb`'s code cells (nbgrader's cell metadata kept as restored) and return
    the result, its observations under the hidden cases' names. An observation filed under a hidden case's real
    name was not made by its check: it is dropped."""
    case_inputs, limits, isolate = files.case_inputs, settings.limits, settings.isolate
    names = json.loads(case_inputs.with_suffix(".json").read_text()) if case_inputs is not None else {}
    with (contextlib.nullcontext(student.session(case_inputs, limits, isolate, files.data_dir, settings.reuse_sandbox))
          if student else Session(case_inputs, limits, isolate, files.data_dir)) as session:
        result = session.run(hide_case_names(nb, {v: k for k, v in names.items()}),
                             files_beside(folder, stem) if folder is not None else {})
    real_names = set(names.values())
    result.observations = {names.get(k, k): v for k, v in result.observations.items()
                           if k in names or k not in real_names}
    if result.notebook is None:  # nothing came back: the notebook as submitted, with no outputs
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = []
        return result
    for cell, ran in zip(nb.cells, result.notebook.cells):
        if cell.cell_type == "code" and ran.get("cell_type") == "code":
            cell.outputs = ran.get("outputs", [])
            cell.execution_count = ran.get("execution_count")
    return result


def files_beside(folder: Path, stem: str) -> dict[str, bytes]:
    """What notebook `stem`'s run gets from the student's submission folder (grading.notebooks.FILES_BESIDE):
    regular files only (no link followed), each at most MAX_HANDED_IN bytes; a notebook without its test cells
    (the folder may hold other notebooks already graded, with their hidden tests restored)."""
    out = {}
    for rel in notebooks.FILES_BESIDE.get(stem, []):
        path = folder / rel
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_size > notebooks.MAX_HANDED_IN:
                continue
            if path.suffix == ".ipynb":
                nb = nbformat.read(str(path), as_version=4)
                nb.cells = [c for c in nb.cells if not notebooks.is_test(c)]
                out[rel] = nbformat.writes(nb).encode()
            else:
                out[rel] = path.read_bytes()
        except (OSError, ValueError):  # unreadable: the notebook's check says the file is missing
            continue
    return out


SANDBOX_ARRAYS = ("inputs", "params", "grad_weights")  # what the sandbox gets of a hidden case's arrays


def write_case_inputs(hidden_dir: Path, dest: Path) -> dict[str, str]:
    """What the sandboxes get of the hidden cases: their inputs, under opaque ids. Expected outputs,
    expected gradients, the outputs of known bugs and which cases expect an error are left out, and the
    names too (a student's code
    could print what it finds, and the names say what the hidden tests look for). Writes
    `dest/*.h5` and `dest.with_suffix('.json')` ({opaque id: name}, kept outside the sandbox);
    returns {name: opaque id}."""
    import h5py

    dest.mkdir(parents=True, exist_ok=True)
    ids: dict[str, str] = {}
    for path in sorted(hidden_dir.glob("*.h5")):
        with h5py.File(path, "r") as src, h5py.File(dest / f"cases-{len(ids):04d}.h5", "w") as out:
            for name, group in case_groups(src):
                if measured_outside(str(group.attrs["target"]), public=False):
                    continue  # the grader measures it itself (grading.trained_model): its scenes stay outside
                ids[name] = f"hidden-{secrets.token_hex(8)}"
                # the case as `write_case` lays it out, with its inputs only, copied by HDF5 itself (reading every
                # case whole and writing it again took 3.6 s a preparation): the group with its attributes, its
                # subgroups as empty shells (a shallow copy), which go; then the arrays the sandbox gets. That a case
                # expects an error is the judge's to know: the sandbox runs it as any other.
                # only what the layout holds is copied: a member or attribute it does not name could hold what the
                # sandbox must not see (and a deleted array's bytes stay in the file), so it stops the preparation
                unknown = [key for key, item in group.items() if not isinstance(item, h5py.Group)] + \
                    [key for key in group.attrs if key not in CASE_ATTRIBUTES]
                if unknown:
                    raise ValueError(f"{path.name}: the hidden case {name} holds {unknown}, which the reference layout "
                                     "(starter/cases.py) does not: not copied for the sandboxes")
                out.copy(group, out, name=ids[name], shallow=True)
                case = out[ids[name]]
                for key in list(case):
                    del case[key]
                case.attrs["hint"] = ""
                case.attrs["properties"] = json.dumps([p for p in json.loads(group.attrs["properties"])
                                                       if p[0] != "raises"])
                for key in SANDBOX_ARRAYS:
                    if key in group and len(group[key]):
                        out.copy(group[key], case, name=key)
    dest.with_suffix(".json").write_text(json.dumps({v: k for k, v in ids.items()}))
    return ids


def hide_case_names(nb, ids: dict[str, str]):
    """A copy of `nb` whose test cells check the opaque ids of the hidden cases instead of their names. A line
    that checks a hidden case the sandbox has no inputs for (one the grader measures itself, or inputs gone
    missing) is left out: its name stays outside, and the judge says the case did not run."""
    if not ids:
        return nb
    public = notebooks.public_case_names()
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        lines = [line for line in cell.source.splitlines(keepends=True)
                 if all(m["case"] in ids or m["case"] in public for m in notebooks.CHECK_CALL.finditer(line))]
        cell.source = notebooks.CHECK_CALL.sub(
            lambda m: m["before"] + ids.get(m["case"], m["case"]) + m["after"], "".join(lines))
    return nb




