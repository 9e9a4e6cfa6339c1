"""What runs inside the grading sandbox: a student's notebooks, each top to bottom in a fresh kernel.

    python sandbox_runner.py CELL_SECONDS WORKDIR JOBS_FD REPLIES_FD [--sweep]

A standalone script (it imports nothing of the grader, which does not exist inside the sandbox):
`grading/sandbox.py` mounts it read-only into a sandbox and starts it there. Three kinds of process:

- the **server** imports once what every notebook imports (torch, numpy, matplotlib, ...) and warms them up
  (`warm_up`), imports the kit's checks and reads the reference folders' case index (`warm_checks`), forks the
  kernel starter, then takes jobs on the pipe JOBS_FD, one line per notebook:
  `{"folder": NAME, "notebook": {...}, "files": {PATH: base64}}`, or `{"reset": true}` between two students
  (`reset`: nothing of the last one stays, checked). For a notebook it writes the files beside it
  (grading.notebooks.FILES_BESIDE) into WORKDIR/NAME, has the starter fork a kernel, sends it the code cells
  one at a time and keeps each cell's deadline by its own clock (`run_notebook`). It then ends whatever the
  notebook left running (`--sweep`: every other process of the sandbox but the starter) and answers one
  line on the pipe REPLIES_FD: how the run ended, the executed notebook and the checks' records (not on its
  standard input and output: bubblewrap's init, pid 1, holds those, and where the grader is not root it is
  the kernels' user, so a kernel could open them through /proc/1/fd). While the notebook runs
  it tells the grader each step as it begins (`{"step": "kernel"}`, `{"step": "cell", "index": I}`, `{"step":
  "end"}`) and what each cell left (`{"ran": I, "outputs": [...], "results": {...}, ...}`): the grader keeps
  each step's deadline too, so a server that a kernel stopped (SIGSTOP: the server and the kernels are one
  user) is ended at a cell's limit plus a margin, and what ran before it stopped still counts;
- the **kernel starter** (`KernelStarter`), forked before the first job, so that no kernel is ever a fork of
  a process that has held a student's notebook (a fork inherits freed memory, readable through /proc);
- a **kernel** per notebook, forked by the starter: an IPython kernel in its own process (ipykernel's
  in-process kernel) with ``$COURSE_RESULTS_DIR=WORKDIR/NAME/results``, so every ``check`` records what the
  student's code did instead of judging it. It sees only the cells it is sent.

A fork costs milliseconds where a fresh kernel that imports torch costs seconds: that was most of the time
grading a notebook took. In the sandbox WORKDIR is a size-limited tmpfs of the sandbox's own that the
grader never opens. Nothing here decides a grade: the judge outside reads the records. Ending the kernel
is refused (it would lose every later cell), a cell over CELL_SECONDS seconds is interrupted (the next
cells still run) or killed, and outputs are capped.
"""
from __future__ import annotations

import base64
import contextlib
import fcntl
import importlib
import json
import os
import platform
import re
import resource
import select
import shutil
import signal
import socket
import stat
import sys
import time

MAX_TEXT = 20_000  # characters of text kept per output
MAX_IMAGE = 400_000  # bytes (base64) of one image kept
MAX_NOTEBOOK_OUTPUTS = 1_000_000  # characters of all outputs of the notebook kept
INTERRUPT_GRACE = 5  # seconds a cell past its timeout has to stop after the interrupt before it is killed
MAX_RECORDS_BYTES = 64 * 2**20  # the checks' records read back per notebook
MAX_ANSWER_BYTES = 16 * 2**20  # a kernel's answer for one cell (its outputs, capped by the kernel before)
MAX_FILES = 4096  # records files read back per notebook
STARTER_SECONDS = 30  # for the kernel starter to answer
KERNEL_EXIT_SECONDS = 10  # for a kernel to exit once its notebook is done, and again once it is killed
_EXIT = os._exit  # the kernel's code replaces os._exit (REFUSE_EXIT)
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
RESULTS_ENV = "COURSE_RESULTS_DIR"  # starter.compare.RESULTS_ENV (the grader's code is not importable here)

# Imported once by the server, so that a notebook's own imports of them cost nothing. The kit's checks are
# warmed apart (`warm_checks`); not the rest of `starter`, whose notebook set-up (the error display,
# `starter.runtime.start_notebook`) needs the notebook's kernel.
PRELOAD = ("numpy", "torch", "torch.nn", "torch.nn.functional", "torch.optim", "h5py", "matplotlib",
           "matplotlib.pyplot", "PIL.Image", "tqdm.std", "IPython", "ipykernel.inprocess.manager",
           "torch._dynamo")
# (not tqdm.auto: it chooses between a text bar and a widget when imported, which needs the kernel;
# torch._dynamo: torch imports it on the first optimizer or "meta" tensor, 1.3 s in notebooks 02 and 04 each)

# Run in the kernel before the notebook: `exit()`, `quit()`, `os._exit`, `os.abort` and signals raise
# SystemExit (an error in that cell) instead of ending the kernel.
REFUSE_EXIT = "\n".join([
    "import os as _os",
    "def _refuse(*a, **k): raise SystemExit('ending the process is disabled while grading')",
    "_os._exit = _os.abort = _os.kill = _os.killpg = _refuse",
    "get_ipython().ask_exit = _refuse",
    "exit = quit = _refuse",
    "del _os",
])
OUTPUT_MESSAGES = ("stream", "display_data", "execute_result", "error")


def warm_up() -> None:
    """Do once in the server what torch and matplotlib do slowly the first time, so that every notebook's
    kernel (a fork of the server) starts past it: a figure like the notebooks' (subplots, log axes, an image
    with a colour bar, a legend, text with symbols) rendered to PNG as the inline backend does, and a
    training step. Random states are restored: a kernel starts as it would without this."""
    import io
    import random

    import matplotlib.pyplot as plt
    import numpy as np
    import torch
    import torch.nn.functional as F

    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        for layout in ("constrained", None):
            fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(6, 2), layout=layout)
            ax1.loglog([1, 10, 100], [1, 5, 50], "o-", label="q·k / √d")
            ax1.semilogx([1, 10], [2, 3], "s--", label="softmax")
            ax1.legend()
            image = ax2.imshow(np.linspace(0, 1, 49).reshape(7, 7), cmap="viridis")
            fig.colorbar(image, ax=ax2, label="weight")
            ax2.set(xlabel="key", ylabel="query", title="warm-up", xticks=range(7), xticklabels=list("abcdefg"))
            ax3.bar([0, 1], [1, 2])
            ax3.text(0, 1, r"$\sqrt{d_k}$ → 1.0")
            if layout is None:
                fig.tight_layout()
            fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")
            plt.close(fig)
        layer = torch.nn.Linear(8, 8)
        optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
        x = torch.randn(2, 3, 8)
        out = F.scaled_dot_product_attention(layer(x), x, x, attn_mask=torch.ones(3, 3, dtype=torch.bool).tril())
        F.cross_entropy(out.reshape(6, 8), torch.arange(6), ignore_index=0).backward()
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
        optimizer.step()
        (torch.zeros(2, device="meta") + 1).sum()
    except Exception:  # a warm-up that fails costs nothing but time in the notebooks
        pass
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


def cap_outputs(nb, budget: int = MAX_NOTEBOOK_OUTPUTS) -> int:
    """Keep the notebook small: long texts cut, big images dropped, the total within `budget` characters.
    Returns what is left of the budget."""
    for cell in nb["cells"]:
        kept = []
        for out in cell.get("outputs", []):
            if budget <= 0:
                kept.append({"output_type": "stream", "name": "stdout", "text": "[further output removed]\n"})
                break
            for key in ("text", "evalue"):
                if isinstance(out.get(key), str) and len(out[key]) > MAX_TEXT:
                    out[key] = out[key][:MAX_TEXT] + "\n[output truncated]\n"
            if "traceback" in out:
                out["traceback"] = [line[:MAX_TEXT] for line in out["traceback"][-20:]]
            data = out.get("data", {})
            for mime in list(data):
                value = data[mime] if isinstance(data[mime], str) else str(data[mime])
                limit = MAX_IMAGE if mime.startswith("image/") else MAX_TEXT
                if len(value) > limit:
                    data[mime] = value[:MAX_TEXT] + "\n[output truncated]" if mime.startswith("text/") else ""
                    if not data[mime]:
                        del data[mime]
            budget -= len(str(out))
            kept.append(out)
        cell["outputs"] = kept
    return budget


class _CellTimeout(KeyboardInterrupt):
    """Raised in the running cell by the alarm: the kernel shows it as the cell's KeyboardInterrupt."""


def _alarm(signum, frame):
    raise _CellTimeout()


def _output(kind: str, content: dict) -> dict:
    """One output as nbformat 4 stores it (nbformat.v4.output_from_msg, without importing nbformat:
    its schema validator alone takes a second to import)."""
    if kind == "stream":
        return {"output_type": "stream", "name": content.get("name", "stdout"), "text": content.get("text", "")}
    if kind == "error":
        return {"output_type": "error", "ename": content.get("ename", ""), "evalue": content.get("evalue", ""),
                "traceback": content.get("traceback", [])}
    out = {"output_type": kind, "data": content.get("data", {}), "metadata": content.get("metadata", {})}
    if kind == "execute_result":
        out["execution_count"] = content.get("execution_count")
    return out


def _outputs(messages) -> list:
    """The cell's outputs from the kernel's messages, as Jupyter's own client would store them."""
    outputs: list = []
    for msg in messages:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "clear_output":
            outputs.clear()  # `wait=True` clears on the next output; no difference once the cell is done
        elif kind in OUTPUT_MESSAGES:
            out = _output(kind, content)
            if kind == "stream" and outputs and outputs[-1].get("name") == content.get("name"):
                outputs[-1]["text"] += out["text"]
            else:
                outputs.append(out)
    return outputs


def kernel(folder: str, cell_seconds: int, commands: int, answers: int) -> None:
    """A notebook's kernel (a child of the kernel starter): reads one cell at a time from `commands`
    ({"source": ..., "silent": ...}, one JSON line), runs it in an in-process IPython kernel, and answers
    on `answers` with its outputs ({"outputs": [...], "execution_count": N, "interrupted": bool}). It never
    sees the notebook itself, only the cells the server sends. A cell still running after `cell_seconds`
    seconds is interrupted here (an alarm); the server kills the process if that does not stop it."""
    from ipykernel.inprocess.manager import InProcessKernelManager
    from traitlets.config import Config

    _first_to_go()
    os.chdir(folder)
    os.environ[RESULTS_ENV] = os.path.join(folder, "results")
    manager = InProcessKernelManager(config=Config({"HistoryManager": {"enabled": False}}))
    manager.start_kernel()
    client = manager.client()
    client.start_channels()

    def execute(source: str, silent: bool) -> tuple[list, object, bool]:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, cell_seconds)
        interrupted = False
        try:
            client.execute(source, silent=silent, store_history=not silent)  # runs the cell here, in this thread
        except _CellTimeout:  # the alarm came between two statements of the kernel's own code
            interrupted = True
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        messages = client.iopub_channel.get_msgs()
        replies = client.shell_channel.get_msgs()
        reply = replies[-1]["content"] if replies else {}
        interrupted = interrupted or reply.get("ename") == "_CellTimeout" or any(
            m["msg_type"] == "error" and m["content"].get("ename") == "_CellTimeout" for m in messages)
        return _outputs(messages), reply.get("execution_count"), interrupted

    budget = MAX_NOTEBOOK_OUTPUTS
    with os.fdopen(commands, "rb") as inbox, os.fdopen(answers, "wb") as outbox:
        for line in inbox:
            request = json.loads(line)
            outputs, number, interrupted = execute(str(request["source"]), bool(request.get("silent")))
            for out in outputs:  # as a kernel shows an interrupt: KeyboardInterrupt
                if out.get("ename") == "_CellTimeout":
                    out["ename"] = "KeyboardInterrupt"
            cell = {"outputs": outputs}
            budget = cap_outputs({"cells": [cell]}, budget)
            outbox.write(json.dumps({"outputs": cell["outputs"], "execution_count": number,
                                     "interrupted": interrupted}, default=str).encode() + b"\n")
            outbox.flush()


class KernelStarter:
    """The process that forks every notebook's kernel: a child of the server, forked once after the warm-up
    and before the first job, so it never holds anything of a student's (notebooks, outputs, files). A kernel
    forked from the server itself would inherit the freed memory in which the server had read earlier
    students' notebooks, and could read it back from /proc/self/mem. The server hands it the two pipes of a
    kernel (file descriptors over a Unix socket); it answers with the kernel's pid, and with each kernel's
    exit code when it ends. It is not dumpable (no /proc access, no ptrace) and ignores the signals it can;
    a kernel that kills or stops it only ends its own student's sandbox."""

    def __init__(self, cell_seconds: int, server_pipes: tuple[int, ...] = ()):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.exits: dict[int, int] = {}
        self.pid = os.fork()
        if self.pid == 0:
            self.sock.close()
            for fd in server_pipes:  # the server's jobs (the next students' notebooks) and replies
                os.close(fd)
            _starter_loop(theirs, cell_seconds)  # never returns
        theirs.close()
        self.sock.settimeout(STARTER_SECONDS)

    def _receive(self, want: str, seconds: float) -> dict | None:
        """The next answer with key `want` (exit codes that come first are kept); None if it does not come."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not select.select([self.sock], [], [], max(0.0, end - time.monotonic()))[0]:
                break
            try:
                data = self.sock.recv(4096)
            except OSError:
                return None
            if not data:
                return None
            message = json.loads(data)
            if "ended" in message:
                self.exits[int(message["ended"])] = int(message["exit"])
            if want in message:
                return message
        return None

    def start(self, folder: str, commands: int, answers: int) -> int | None:
        """A new kernel for the notebook in `folder`: its pid, or None if the starter does not answer."""
        try:
            socket.send_fds(self.sock, [json.dumps({"folder": folder}).encode()], [commands, answers])
        except OSError:
            return None
        message = self._receive("started", STARTER_SECONDS)
        return int(message["started"]) if message else None

    def exit_code(self, pid: int, seconds: float) -> int | None:
        """The exit code of kernel `pid` once it has ended, waiting up to `seconds`; None if it has not."""
        end = time.monotonic() + seconds
        while pid not in self.exits and time.monotonic() < end:
            if self._receive("ended", end - time.monotonic()) is None:
                break
        return self.exits.pop(pid, None)

    def alive(self, seconds: float = 5) -> bool:
        try:
            self.sock.send(b'{"ping": true}')
        except OSError:
            return False
        return self._receive("pong", seconds) is not None


STARTER_IGNORES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGALRM, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def _starter_loop(sock: socket.socket, cell_seconds: int) -> None:
    handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STARTER_IGNORES}
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # nothing of the server's: not its job pipe (the next students' notebooks), not its replies
        os.dup2(devnull, fd)
    os.close(devnull)
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)  # a kernel's end wakes the select below
    signal.signal(signal.SIGCHLD, lambda *_: None)
    kernels: set[int] = set()  # only these are reported: not a process a kernel made a child of this one
    while True:
        try:
            while True:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                if pid in kernels:
                    kernels.discard(pid)
                    sock.send(json.dumps({"ended": pid, "exit": os.waitstatus_to_exitcode(status)}).encode())
        except ChildProcessError:
            pass
        except OSError:
            _EXIT(0)
        ready = select.select([sock.fileno(), woken], [], [], 1.0)[0]
        if woken in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(woken, 4096)
        if sock.fileno() not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 4096, 2)
        except OSError:
            _EXIT(0)
        if not data:  # the server is gone
            _EXIT(0)
        request = json.loads(data)
        if request.get("ping"):
            sock.send(b'{"pong": true}')
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                os.close(woken)
                os.close(wake)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)
                # a /dev/null of its own: the starter's open file description, shared, would keep a kernel's
                # locks and file flags on it for the next student's kernels to read
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                os.close(devnull)
                # a session of its own, and with it a scheduling autogroup of its own: the server's and the
                # starter's, whose nice value any member may set (/proc/self/autogroup), would keep it for the
                # next student's kernels
                os.setsid()
                _own_open_files(keep=(0, 1, 2, *fds))
                kernel(str(request["folder"]), cell_seconds, fds[0], fds[1])
                code = 0
            except BaseException:
                pass
            _EXIT(code)
        kernels.add(pid)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"started": pid}).encode())


def _own_open_files(keep: tuple[int, ...]) -> None:
    """Give a new kernel open files of its own. What the server had open when it forked the starter (the
    fonts Matplotlib keeps open since the warm-up) is shared by every kernel forked since, offset and locks
    included: a channel from one student to the next. Each read-only file is opened again at the same
    descriptor; anything else inherited is closed."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep:
            continue
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            flags = os.O_RDONLY | (os.O_CLOEXEC if not os.get_inheritable(fd) else 0)
            if (os.get_blocking(fd) and path.startswith("/") and os.path.isfile(path)
                    and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY):
                fresh = os.open(path, flags)
                os.dup2(fresh, fd, inheritable=not flags & os.O_CLOEXEC)
                os.close(fresh)
            else:
                os.close(fd)
        except OSError:  # (the listing's own descriptor, gone by now)
            continue


class _Answers:
    """A kernel's answers: JSON lines, each read within a deadline and a size limit."""

    def __init__(self, fd: int):
        self.fd, self.buffer = fd, b""

    def next(self, deadline: float, limit: int) -> tuple[str, bytes]:
        """("line", bytes), ("too long", b""), ("timeout", b"") or ("closed", b"")."""
        skipping = False
        while True:
            newline = self.buffer.find(b"\n")
            if newline >= 0:
                line, self.buffer = self.buffer[:newline], self.buffer[newline + 1:]
                return ("too long", b"") if skipping else ("line", line)
            if len(self.buffer) > limit:
                skipping, self.buffer = True, b""
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", b""
            if not select.select([self.fd], [], [], min(left, 1.0))[0]:
                continue
            chunk = os.read(self.fd, 2**20)
            if not chunk:
                return "closed", b""
            self.buffer += chunk


def _send(fd: int, data: bytes, deadline: float) -> str:
    """Write `data` to a kernel's command pipe (non-blocking) by `deadline`: "sent", "timeout" or "closed"."""
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        if not select.select([], [fd], [], min(left, 1.0))[1]:
            continue
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
        except OSError:
            return "closed"
    return "sent"


def _cell_outputs(answer: dict) -> list:
    """The outputs a kernel sent for a cell, rebuilt as nbformat 4 outputs of the right JSON types (what the
    kernel sends is not trusted; the grader validates the notebook again)."""
    outputs = answer.get("outputs")
    clean = []
    for out in outputs if isinstance(outputs, list) else []:
        kind = out.get("output_type") if isinstance(out, dict) else None
        if kind == "stream":
            clean.append(_output("stream", {"name": "stderr" if out.get("name") == "stderr" else "stdout",
                                            "text": str(out.get("text", ""))}))
        elif kind == "error":
            trace = out.get("traceback")
            clean.append(_output("error", {"ename": str(out.get("ename", "")), "evalue": str(out.get("evalue", "")),
                                           "traceback": [str(t) for t in trace] if isinstance(trace, list) else []}))
        elif kind in ("display_data", "execute_result"):
            data, meta = out.get("data"), out.get("metadata")
            content = {"data": {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, (str, dict, list))}
                       if isinstance(data, dict) else {}, "metadata": meta if isinstance(meta, dict) else {}}
            clean.append(_output(kind, content))
    return clean


def _is_test(cell: dict) -> bool:
    """An nbgrader test cell (grading.notebooks.is_test: the grader's code is not importable here)."""
    meta = cell.get("metadata", {}).get("nbgrader") or {}
    return isinstance(meta, dict) and bool(meta.get("grade")) and not meta.get("solution")


def _tell_nobody(line: dict) -> None:
    pass


def run_notebook(nb: dict, folder: str, cell_seconds: int, seconds: float, starter: KernelStarter,
                 records: Records, tell=_tell_nobody) -> dict:
    """Run `nb`'s code cells in a new kernel from `starter`, one at a time, each within its deadline, kept
    here by the server's own clock whatever the kernel does to its pipes or signals: a cell that does not
    answer `cell_seconds` + INTERRUPT_GRACE seconds after it was sent (the kernel's own interrupt did not stop
    it), or past the notebook's `seconds`, has its kernel killed and the notebook stops there. Fills in the
    outputs, takes the checks' records as each cell ends (`records`) and returns what the grader is told of
    how the run ended. `tell` sends the grader a line: each step as it begins, and each cell's outputs and
    new records once it ran (the grader's own deadlines, and what counts if this server is stopped)."""
    commands_out, commands = os.pipe()
    answers, answers_in = os.pipe()
    tell({"step": "kernel"})
    try:
        pid = starter.start(folder, commands_out, answers_in)
    finally:
        os.close(commands_out)
        os.close(answers_in)
    if pid is None:
        os.close(commands)
        os.close(answers)
        return {"restart": True}
    os.set_blocking(commands, False)
    inbox = _Answers(answers)
    end = time.monotonic() + seconds
    stuck, stopped, timeouts, count = None, "", [], 0
    cells: list[tuple[int | None, dict]] = [(None, {"source": REFUSE_EXIT})]
    cells += [(i, c) for i, c in enumerate(nb.get("cells", [])) if c.get("cell_type") == "code"]
    graded = any(_is_test(c) for _, c in cells)  # else (a plain notebook, not an assignment) every cell records
    budget = MAX_NOTEBOOK_OUTPUTS
    for index, cell in cells:
        source = cell.get("source", "")
        tell({"step": "cell", "index": -1 if index is None else index})
        sent = time.monotonic()
        deadline = min(sent + cell_seconds + INTERRUPT_GRACE, end)
        request = json.dumps({"source": "".join(source) if isinstance(source, list) else str(source),
                              "silent": index is None}).encode() + b"\n"
        how = _send(commands, request, deadline)
        kind, line = inbox.next(deadline, MAX_ANSWER_BYTES) if how == "sent" else (how, b"")
        if kind in ("timeout", "closed"):  # what the cell recorded before it stopped still counts
            if index is not None:
                records.after_cell(index, _is_test(cell) or not graded)
                tell({"ran": index, **records.report()})
            if kind == "timeout":
                stuck = index if index is not None else -1
            else:
                stopped = f"the kernel stopped answering in cell {index}"
            break
        try:
            answer = json.loads(line) if kind == "line" else {}
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if index is None:
            continue
        outputs = _cell_outputs(answer)
        if kind == "too long":
            outputs = [_output("stream", {"name": "stdout", "text": "[output removed: over the size limit]\n"})]
        number = answer.get("execution_count")
        count = number if isinstance(number, int) else count + 1
        if answer.get("interrupted") is True or time.monotonic() - sent > cell_seconds:
            timeouts.append(index)
            outputs.append(_output("error", {"ename": "CellTimeoutError", "evalue":
                                             f"the cell took longer than {cell_seconds} s", "traceback": []}))
        cell["outputs"], cell["execution_count"] = outputs, count
        budget = cap_outputs({"cells": [cell]}, budget)
        records.after_cell(index, _is_test(cell) or not graded)
        tell({"ran": index, "outputs": cell["outputs"], "execution_count": count, **records.report()})
    tell({"step": "end"})
    os.close(commands)  # the kernel's end of the notebook: it exits
    code = None if stuck is not None else starter.exit_code(pid, KERNEL_EXIT_SECONDS if not stopped else 1)
    if code is None:  # stuck, or alive without answering: killed
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        code = starter.exit_code(pid, KERNEL_EXIT_SECONDS)
        if stopped:
            stopped = stopped.replace("stopped answering", "closed its connection to the grader")
        elif code is None and stuck is None:
            stopped = "the notebook ended the kernel starter"
    elif stopped and code == 0:
        stopped = stopped.replace("stopped answering", "ended")
    elif stopped:
        stopped = ""  # it died: the exit code says how
    os.close(answers)
    nb.setdefault("metadata", {})["grading_run"] = {"timeouts": timeouts}
    cap_outputs(nb)
    return {"exit": code if code is not None else -9, "stuck": stuck,
            "time_limit": stuck is not None and time.monotonic() >= end, "stopped": stopped}


def _dumpable(flag: bool) -> None:
    """Not dumpable (the server): children of the same user may not trace it or open its /proc files
    (its reply pipe). Dumpable again (a notebook's kernel): its own /proc files are its own."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, int(flag), 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _first_to_go() -> None:
    """Out of memory, the kernel kills this process (the notebook's) first, not the server: the next
    notebook then starts as usual. Raising one's own score needs no privilege, only a /proc file of
    one's own (a process that is not dumpable has root's)."""
    _dumpable(True)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _sweep(spare: int) -> None:
    """End every process of the sandbox but this one, its init (pid 1) and `spare` (the kernel starter):
    what a notebook started."""
    me = os.getpid()
    for attempt in range(60):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me, spare)]
        if not others:
            return
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        if attempt:  # a killed process another one started stays (a zombie) until init reaps it: give init time
            time.sleep(0.05)


def _empty(folder: str) -> list[str]:
    """Remove everything in `folder` (dot-files, folders a notebook made unreadable to its own user, links:
    never followed); returns the names still there (a tree too deep to walk is left, and reported)."""
    def remove(path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            with contextlib.suppress(OSError):
                os.chmod(path, 0o700)
            with contextlib.suppress(OSError):
                for entry in os.scandir(path):
                    remove(entry.path)
            with contextlib.suppress(OSError):
                os.rmdir(path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)

    with contextlib.suppress(OSError, RecursionError):
        for entry in os.scandir(folder):
            remove(entry.path)
    try:
        return sorted(os.listdir(folder))
    except OSError as exc:
        return [f"({exc.strerror})"]


def _remove_xattrs(path: str) -> list[str]:
    """Remove the extended attributes of `path` (the writable folder itself, which outlives its files; its
    sticky bit keeps a student from setting any); returns those left."""
    try:
        for name in os.listxattr(path):
            with contextlib.suppress(OSError):
                os.removexattr(path, name)
        return os.listxattr(path)
    except OSError as exc:
        return [f"({exc.strerror})"]


def _remove_ipc() -> list[str]:
    """Remove the System V shared memory, message queues and semaphores of this sandbox's IPC namespace
    (they outlive the processes that made them); returns those that could not be removed."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    remove = {"shm": lambda i: libc.shmctl(i, 0, None), "msg": lambda i: libc.msgctl(i, 0, None),
              "sem": lambda i: libc.semctl(i, 0, 0)}  # IPC_RMID = 0

    def ids(kind: str) -> list[int]:
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                return [int(line.split()[1]) for line in f.readlines()[1:] if line.split()]
        except (OSError, ValueError, IndexError):
            return []

    for kind, rm in remove.items():
        for ipc_id in ids(kind):
            rm(ipc_id)
    return [f"{kind} {i}" for kind in remove for i in ids(kind)]


def _seccomp_mode() -> int:
    """2 when a seccomp filter holds this process (grading/seccomp.py, given by bubblewrap)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Seccomp:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0


RLIMITS = sorted(name for name in dir(resource) if name.startswith("RLIMIT_"))
IOPRIO_GET = {"x86_64": 252, "aarch64": 31}  # the ioprio_get system call's number
SCHED_GETATTR = {"x86_64": 315, "aarch64": 275}  # sched_getattr's
SCHED_ATTR_SIZE = 56  # struct sched_attr with the utilisation clamps (SCHED_ATTR_SIZE_VER1)


def process_state(pid: int) -> dict:
    """What any process of the sandbox's user may change in another of its processes, the server or the kernel
    starter, and every kernel forked later inherits: resource limits (a lowered hard limit cannot be raised
    again), nice value, scheduling (policy, priority, and all of sched_getattr: time slice, utilisation
    clamps), CPU affinity and I/O priority."""
    state = {"limits": {name: resource.prlimit(pid, getattr(resource, name)) for name in RLIMITS},
             "nice": os.getpriority(os.PRIO_PROCESS, pid),
             "scheduler": (os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority),
             "affinity": sorted(os.sched_getaffinity(pid))}
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if platform.machine() in IOPRIO_GET:
        state["ioprio"] = libc.syscall(IOPRIO_GET[platform.machine()], 1, pid)  # IOPRIO_WHO_PROCESS
    if platform.machine() in SCHED_GETATTR:  # all of it: the time slice (sched_runtime) and utilisation clamps too
        attr = ctypes.create_string_buffer(SCHED_ATTR_SIZE)
        done = libc.syscall(SCHED_GETATTR[platform.machine()], pid, attr, SCHED_ATTR_SIZE, 0)
        state["sched_attr"] = attr.raw if done == 0 else ctypes.get_errno()
    return state


def network_use() -> str:
    """The sandbox's network namespace's traffic counters (the loopback's, IP's, TCP's, UDP's): notebooks do not
    use the network, and whatever traffic there was leaves state that outlives its sockets and that a later
    kernel can read (the counters themselves, the TCP metrics cache of each address connected to)."""
    parts = []
    for name in ("dev", "snmp", "snmp6", "netstat"):
        try:
            with open(f"/proc/net/{name}") as f:
                parts.append(f.read())
        except OSError:
            continue
    return "".join(parts)


def sockets() -> set[str]:
    """The TCP and UDP sockets of the sandbox's network namespace: a connection closed on loopback waits in
    TIME_WAIT for a minute after its process has gone, its ports readable by the next kernel."""
    found: set[str] = set()
    for name in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/net/{name}") as f:
                found.update(f"{name} {' '.join(line.split()[1:4])}" for line in f.readlines()[1:] if line.strip())
        except OSError:
            continue
    return found


def autogroup() -> str | None:
    """This process's scheduling autogroup and its nice value (shared with the kernel starter, one session), or
    None where the kernel has no autogroups."""
    try:
        with open("/proc/self/autogroup") as f:
            return f.read().strip()
    except OSError:
        return None


def reset(workdir: str, starter: KernelStarter, started: dict) -> dict:
    """Between two students, in the sandbox (--sweep): nothing of the last one stays. Every other process but
    the kernel starter is ended, the writable folder (the notebooks' folders and $HOME: the only place a
    student can write) emptied, its extended attributes too, and the System V IPC objects removed (POSIX
    message queues and the keyring are refused by the seccomp filter, which must be in force), then checked,
    the starter too (it must answer), and the server's and the starter's limits and scheduling (their
    `process_state`, the server's `autogroup`) and the namespace's `sockets` and `network_use` compared with
    `started`, theirs when the sandbox started:
    {"clean": False, "left": [...]} if anything survived, and the grader then ends this sandbox and starts a
    new one."""
    _sweep(spare=starter.pid)
    left = [f"process {p}" for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), starter.pid)]
    left += [f"file {name}" for name in _empty(workdir)]
    left += [f"extended attribute {name}" for name in _remove_xattrs(workdir)]
    left += [f"ipc {name}" for name in _remove_ipc()]
    if _seccomp_mode() != 2:
        left.append("no seccomp filter")
    if not starter.alive():
        left.append("the kernel starter does not answer")
    starter.exits.clear()  # (after the ping: an exit reported late is not taken for the next student's kernel)
    left += [f"socket {entry}" for entry in sorted(sockets() - started["sockets"])][:5]
    if network_use() != started["network"]:
        left.append("the network was used (its counters changed since the sandbox started)")
    for who, pid in (("server", os.getpid()), ("kernel starter", starter.pid)):
        try:
            changed = process_state(pid) != started[who]
        except OSError:
            changed = True
        if changed:
            left.append(f"the {who}'s resource limits or scheduling changed since the sandbox started")
    if autogroup() != started["autogroup"]:
        left.append("the server's scheduling autogroup changed since the sandbox started")
    return {"reset": True, "clean": not left, "left": left[:20]}


def _read_regular(path: str, limit: int) -> bytes | None:
    """The bytes of a regular file of at most `limit` bytes (no link followed, no FIFO opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
        return data if len(data) <= limit else None
    finally:
        os.close(fd)


class Records:
    """The checks' records of one notebook (`folder/results`), taken as each test cell ends: what a test cell
    wrote is kept as it was then, so a later cell that rewrites, removes or adds records changes nothing the
    judge reads; records written outside test cells are left out (they score nothing: only test cells record
    hidden cases), and one that names a hidden case, or any change to a kept record, is reported for review.
    Only regular files with plain names, within MAX_RECORDS_BYTES and MAX_FILES. The grader writes them into a
    folder of its own; it never opens anything the sandbox can change."""

    def __init__(self, folder: str):
        self.folder = os.path.join(folder, "results")
        self.kept: dict[str, tuple[bytes, tuple[int, int]]] = {}  # name -> (content, (size, mtime) when kept)
        self.reported: set[str] = set()  # the kept records already sent to the grader
        self.budget, self.dropped = MAX_RECORDS_BYTES, 0
        self.outside: set[str] = set()
        self.problems: list[str] = []

    def _listing(self) -> dict[str, tuple[int, int]] | OSError:
        """The records' names with (size, mtime); the error where the folder exists and cannot be read (say,
        the machine's table of open files is full): an error is not an empty folder."""
        try:
            entries = list(os.scandir(self.folder))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            return exc
        listing = {}
        for entry in entries:
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                listing[entry.name] = (info.st_size, info.st_mtime_ns)
        return listing

    def after_cell(self, index: int, is_test: bool) -> None:
        listing = self._listing()
        if isinstance(listing, OSError):  # said, and nothing taken for changed or new
            self.problems.append(f"after cell {index} the checks' records could not be read "
                                 f"({listing.__class__.__name__}: {listing.strerror or listing})")
            return
        changed = sorted(n for n, (_, sig) in self.kept.items() if listing.get(n) != sig)
        if changed:
            self.problems.append(f"cell {index} changed or removed the checks' records of an earlier test cell "
                                 f"({', '.join(changed[:3])}); the records as that test cell left them were used")
            for name in changed:  # reported once
                self.kept[name] = (self.kept[name][0], listing.get(name, (-1, -1)))
        new = sorted(n for n in listing if n not in self.kept and n not in self.outside)
        if not is_test:
            self.outside.update(new)
            hidden = [n for n in new if n.endswith(".json") and b'"hidden-' in (_read_regular(
                os.path.join(self.folder, n), 2**20) or b"")]
            if hidden:
                self.problems.append(f"cell {index}, not a test cell, wrote records of hidden cases "
                                     f"({', '.join(hidden[:3])}); they were left out")
            return
        for name in new:
            data = (_read_regular(os.path.join(self.folder, name), self.budget)
                    if PLAIN_NAME.fullmatch(name) and len(self.kept) < MAX_FILES else None)
            if data is None:
                self.dropped += 1
                self.outside.add(name)
                continue
            self.budget -= len(data)
            self.kept[name] = (data, listing[name])

    def report(self) -> dict:
        """For the grader: the records kept since the last report (each is sent once, as it was kept), how many
        were dropped and the problems so far."""
        new = sorted(name for name in self.kept if name not in self.reported)
        self.reported.update(new)
        return {"results": {name: base64.b64encode(self.kept[name][0]).decode() for name in new},
                "dropped": self.dropped, "problems": self.problems[:10]}


def _write_files(folder: str, files: dict) -> None:
    """The files the grader hands a notebook beside it ({"runs/x.pt": base64}: a trained model, the student's
    other notebooks), each path made of plain names only."""
    for rel, data in files.items():
        parts = str(rel).split("/")
        if not all(PLAIN_NAME.fullmatch(p) for p in parts):
            continue
        os.makedirs(os.path.join(folder, *parts[:-1]), exist_ok=True)
        with open(os.path.join(folder, *parts), "wb") as f:
            f.write(base64.b64decode(data))


def warm_checks() -> None:
    """Import the kit's checks and read the case index of every reference folder this sandbox sees (the public
    references, the hidden cases' inputs) once, here: each kernel, a fork of the server, then starts past it, where
    every notebook's first test cell took 0.4 s longer than the others. The import sets nothing up (the checks read
    their settings when called), and the index is read again where a file changed."""
    try:
        from starter import checks, compare

        del checks  # imported for the kernels
        for folder in compare.reference_dirs():
            compare.case_names(folder)
    except Exception:  # a warm-up that fails costs nothing but time in the notebooks
        pass


def serve(cell_seconds: int, workdir: str, jobs_fd: int, replies_fd: int, sweep: bool) -> int:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    warm_up()
    warm_checks()
    _dumpable(False)
    starter = KernelStarter(cell_seconds, (jobs_fd, replies_fd))  # before any job: it holds nothing of a student's
    started = {"server": process_state(os.getpid()), "kernel starter": process_state(starter.pid),
               "autogroup": autogroup(), "sockets": sockets(), "network": network_use()}
    replies = os.fdopen(replies_fd, "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # what the notebooks print outside their kernel goes nowhere
    for line in os.fdopen(jobs_fd, encoding="utf-8"):
        job = json.loads(line)
        if job.get("reset"):
            replies.write(json.dumps(reset(workdir, starter, started) if sweep else
                                     {"reset": True, "clean": False, "left": ["no sandbox to reset"]}) + "\n")
            continue
        name = job["folder"] if PLAIN_NAME.fullmatch(str(job["folder"])) else "notebook"
        folder = os.path.join(workdir, name)
        shutil.rmtree(folder, ignore_errors=True)  # (a notebook before could have made one of that name)
        os.mkdir(folder)
        _write_files(folder, job.get("files") or {})
        nb = job["notebook"]
        records = Records(folder)
        # the notebook's time, Limits.notebook_seconds less a margin, always in the job (grading/sandbox.py)
        ran = run_notebook(nb, folder, cell_seconds, float(job["seconds"]), starter, records,
                           tell=lambda line: replies.write(json.dumps(line) + "\n"))
        if ran.get("restart"):  # the starter was killed or stopped (by a notebook before): a new sandbox
            replies.write(json.dumps({"folder": name, "restart": True}) + "\n")
            return 1
        if sweep:  # in the sandbox; without it, what the notebook started ends with the session (grading/sandbox.py)
            _sweep(spare=starter.pid)
        reply = {"folder": name, **ran, "out": json.dumps(nb), **records.report()}  # the records not sent yet
        shutil.rmtree(folder, ignore_errors=True)  # the space is the next notebook's
        replies.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "--sweep" in sys.argv[5:]))
