"""What runs inside the grading sandbox: a student's notebooks, each top to bottom in a fresh kernel.

    python sandbox_runner.py CELL_TIMEOUT WORKDIR [--sweep]

A standalone script (it imports nothing of the grader, which does not exist inside the sandbox):
`grading/sandbox.py` mounts it read-only into a sandbox and starts it there. It imports once what every
notebook imports (torch, numpy, matplotlib, ...) and warms them up (`warm_up`), then takes jobs on
stdin, one line per notebook: `{"folder": NAME, "notebook": {...}, "files": {PATH: base64}}`, or
`{"reset": true}` between two students (`reset`: nothing of the last one stays, checked). For each job it writes
WORKDIR/NAME/in.ipynb and the files beside it (grading.notebooks.FILES_BESIDE) and forks; the child
runs an IPython kernel in its own process (ipykernel's in-process kernel),
executes the notebook's code cells in order with ``$COURSE_RESULTS_DIR=WORKDIR/NAME/results`` (so
every ``check`` records what the student's code did instead of judging it), writes out.ipynb after
every cell, and exits. The server then ends whatever the notebook left running (`--sweep`: every
other process of the sandbox) and answers one line on stdout: the exit code, the cell that had to be
killed (if one did), the executed notebook and the records. In the sandbox WORKDIR is a size-limited
tmpfs of the sandbox's own that the grader never opens. A fork costs milliseconds where a fresh
kernel that imports torch costs seconds: that was most of the time grading a notebook took.

Nothing here decides a grade: the judge outside reads the records. Ending the kernel is refused (it
would lose every later cell), a cell over CELL_TIMEOUT seconds is interrupted (the next cells still
run), and outputs are capped before the notebook is written.
"""
from __future__ import annotations

import base64
import contextlib
import importlib
import json
import os
import re
import selectors
import shutil
import signal
import stat
import sys
import time

MAX_TEXT = 20_000  # characters of text kept per output
MAX_IMAGE = 400_000  # bytes (base64) of one image kept
MAX_NOTEBOOK_OUTPUTS = 1_000_000  # characters of all outputs of the notebook kept
INTERRUPT_GRACE = 5  # seconds a cell past its timeout has to stop after the interrupt before it is killed
MAX_REPLY_BYTES = 64 * 2**20  # the executed notebook and the records read back per notebook
MAX_FILES = 4096  # records files read back per notebook
FOLDER_FULL = 3  # the child's exit code when the executed notebook could not be saved
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
RESULTS_ENV = "COURSE_RESULTS_DIR"  # starter.checks.RESULTS_ENV (the grader's code is not importable here)

# Imported once by the server, so that a notebook's own imports of them cost nothing. Not the kit's
# `starter` package: importing it sets up the notebook's error display, which needs the notebook's kernel.
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


def cap_outputs(nb) -> None:
    """Keep the notebook small: long texts cut, big images dropped, the total bounded."""
    budget = MAX_NOTEBOOK_OUTPUTS
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


def run_notebook(folder: str, cell_timeout: int, progress: int) -> bool:
    """The child's work: `folder/in.ipynb` through an in-process kernel to `folder/out.ipynb`, telling
    the server on `progress` which cell it starts. False: the executed notebook could not be saved."""
    from ipykernel.inprocess.manager import InProcessKernelManager
    from traitlets.config import Config

    os.chdir(folder)
    os.environ[RESULTS_ENV] = os.path.join(folder, "results")
    with open("in.ipynb", encoding="utf-8") as f:
        nb = json.load(f)  # nbformat 4, as the grader wrote it
    manager = InProcessKernelManager(config=Config({"HistoryManager": {"enabled": False}}))
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    timeout_error = {"ename": "CellTimeoutError", "evalue": f"the cell took longer than {cell_timeout} s",
                     "traceback": []}
    timeouts: list[int] = []

    def execute(source: str, silent: bool = False) -> tuple[list, object, bool]:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, cell_timeout)
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

    execute(REFUSE_EXIT, silent=True)
    count = 0
    for index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        os.write(progress, b"%d\n" % index)
        source = cell.get("source", "")
        outputs, number, interrupted = execute("".join(source) if isinstance(source, list) else source)
        count = number if isinstance(number, int) else count + 1
        for out in outputs:  # as a kernel shows an interrupt: KeyboardInterrupt
            if out.get("ename") == "_CellTimeout":
                out["ename"] = "KeyboardInterrupt"
        if interrupted:
            timeouts.append(index)
            outputs.append(_output("error", timeout_error))
        cell["outputs"], cell["execution_count"] = outputs, count
        nb.setdefault("metadata", {})["grading_run"] = {"timeouts": list(timeouts)}
        _write(nb, folder)
    cap_outputs(nb)
    saved = _write(nb, folder)
    os.close(progress)
    return saved


def _write(nb: dict, folder: str) -> bool:
    """Save the notebook so far (absolute paths: the notebook may have changed directory). False if it
    could not be saved: the notebook filled its folder."""
    path = os.path.join(folder, "out.ipynb")
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(nb, f)
        os.replace(path + ".tmp", path)
        return True
    except OSError:
        return False


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


def _sweep() -> None:
    """End every process of the sandbox but this one and its init (pid 1): what a notebook started."""
    me = os.getpid()
    for _ in range(20):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
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


def _wait(pid: int, progress: int, cell_timeout: int, notebook_seconds: float) -> tuple[int, int | None, bool]:
    """Wait for the child; kill it if one cell runs past its timeout and the interrupt did not stop it
    (the cell ignored it, or caught it and went on), or the notebook past its time. Returns (exit
    status, the cell it was killed in or None, whether the notebook's time ran out)."""
    cell, buffer = None, b""
    deadline = time.monotonic() + cell_timeout + INTERRUPT_GRACE
    end = time.monotonic() + notebook_seconds
    with selectors.DefaultSelector() as sel:
        sel.register(progress, selectors.EVENT_READ)
        while True:
            if sel.select(1.0):
                chunk = os.read(progress, 4096)
                if not chunk:  # the child closed its end: it is ending
                    break
                buffer = (buffer + chunk)[-64:]
                lines = buffer.split(b"\n")
                if len(lines) > 1 and lines[-2].isdigit() and int(lines[-2]) != cell:
                    cell = int(lines[-2])
                    deadline = time.monotonic() + cell_timeout + INTERRUPT_GRACE
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:  # ended (what it started may still hold the pipe open)
                os.close(progress)
                return status, None, False
            now = time.monotonic()
            if now > deadline or now > end:
                os.kill(pid, signal.SIGKILL)
                os.close(progress)
                return os.waitpid(pid, 0)[1], cell, now > end
    os.close(progress)
    return os.waitpid(pid, 0)[1], None, False


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


def reset(workdir: str) -> dict:
    """Between two students, in the sandbox (--sweep): nothing of the last one stays. Every other process
    is ended, the writable folder (the notebooks' folders and $HOME: the only place a student can write)
    emptied and the IPC objects removed, then checked: {"clean": False, "left": [...]} if anything
    survived, and the grader then ends this sandbox and starts a new one."""
    _sweep()
    left = [f"process {p}" for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
    left += [f"file {name}" for name in _empty(workdir)]
    left += [f"ipc {name}" for name in _remove_ipc()]
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


def _collect(folder: str) -> dict:
    """What the grader reads back from a notebook's folder, in the reply itself: the executed notebook
    and the checks' records (regular files with plain names only, within MAX_REPLY_BYTES). The
    grader writes them into a folder of its own; it never opens anything the sandbox can change."""
    budget = MAX_REPLY_BYTES
    out = _read_regular(os.path.join(folder, "out.ipynb"), budget)
    budget -= len(out or b"")
    results: dict[str, str] = {}
    dropped = 0
    try:
        entries = sorted(os.scandir(os.path.join(folder, "results")), key=lambda e: e.name)
    except OSError:
        entries = []
    for entry in entries:
        data = _read_regular(entry.path, budget) if PLAIN_NAME.fullmatch(entry.name) and len(results) < MAX_FILES else None
        if data is None:
            dropped += 1
            continue
        budget -= len(data)
        results[entry.name] = base64.b64encode(data).decode()
    return {"out": out.decode("utf-8", "replace") if out is not None else None, "results": results,
            "dropped": dropped}


def _write_files(folder: str, files: dict) -> None:
    """The files the grader hands a notebook beside it ({"runs/x.pt": base64}: a trained model, the student's
    other notebooks), each path made of plain names only."""
    for rel, data in files.items():
        parts = str(rel).split("/")
        if not all(PLAIN_NAME.fullmatch(p) for p in parts) or parts[-1] == "in.ipynb":
            continue
        os.makedirs(os.path.join(folder, *parts[:-1]), exist_ok=True)
        with open(os.path.join(folder, *parts), "wb") as f:
            f.write(base64.b64decode(data))


def serve(cell_timeout: int, workdir: str, sweep: bool) -> int:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    warm_up()
    _dumpable(False)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # what the notebooks print outside their kernel goes nowhere
    real_exit = os._exit
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("reset"):
            replies.write(json.dumps(reset(workdir) if sweep else {"reset": True, "clean": False,
                                                                   "left": ["no sandbox to reset"]}) + "\n")
            continue
        name = job["folder"] if PLAIN_NAME.fullmatch(str(job["folder"])) else "notebook"
        folder = os.path.join(workdir, name)
        shutil.rmtree(folder, ignore_errors=True)  # (a notebook before could have made one of that name)
        os.mkdir(folder)
        with open(os.path.join(folder, "in.ipynb"), "w", encoding="utf-8") as f:
            json.dump(job["notebook"], f)
        _write_files(folder, job.get("files") or {})
        progress, progress_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _first_to_go()
            replies.close()
            os.close(progress)
            for fd in (0, 2):
                os.dup2(devnull, fd)
            code = 1
            try:
                code = 0 if run_notebook(folder, cell_timeout, progress_w) else FOLDER_FULL
            except BaseException:
                pass
            real_exit(code)
        os.close(progress_w)
        status, stuck, out_of_time = _wait(pid, progress, cell_timeout, float(job.get("seconds") or 600))
        if sweep:  # in the sandbox; without it, what the notebook started ends with the session (grading/sandbox.py)
            _sweep()
        reply = {"folder": name, "exit": os.waitstatus_to_exitcode(status), "stuck": stuck, "time_limit": out_of_time,
                 **_collect(folder)}
        shutil.rmtree(folder, ignore_errors=True)  # the space is the next notebook's
        replies.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), sys.argv[2], "--sweep" in sys.argv[3:]))
