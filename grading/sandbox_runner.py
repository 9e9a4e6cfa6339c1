"""What runs inside the grading sandbox: one notebook, top to bottom, in a fresh kernel.

    python sandbox_runner.py IN.ipynb OUT.ipynb CELL_TIMEOUT

A standalone script (it imports nothing of the grader, which does not exist inside the sandbox):
`grading/sandbox.py` mounts it read-only into the sandbox and starts it there with
``$COURSE_RESULTS_DIR`` set, so every ``check`` records what the student's code did instead of
judging it; the judge outside reads those records. Nothing here decides a grade. Ending the kernel
is refused (it would lose every later cell), and outputs are capped before the notebook is written.
"""
from __future__ import annotations

import sys

MAX_TEXT = 20_000  # characters of text kept per output
MAX_IMAGE = 400_000  # bytes (base64) of one image kept
MAX_NOTEBOOK_OUTPUTS = 1_000_000  # characters of all outputs of the notebook kept


# Run in the kernel before the notebook: `exit()`, `quit()`, `os._exit`, `os.abort` and signals raise
# SystemExit (an error in that cell) instead of ending the kernel.
REFUSE_EXIT = [
    "import os as _os",
    "def _refuse(*a, **k): raise SystemExit('ending the process is disabled while grading')",
    "_os._exit = _os.abort = _os.kill = _os.killpg = _refuse",
    "get_ipython().ask_exit = _refuse",
    "exit = quit = _refuse",
]


def cap_outputs(nb) -> None:
    """Keep the notebook small: long texts cut, big images dropped, the total bounded."""
    budget = MAX_NOTEBOOK_OUTPUTS
    for cell in nb.cells:
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


def main(src: str, dest: str, cell_timeout: int) -> int:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.read(src, as_version=4)
    # a cell over its time is interrupted and marked with this error; the next cells still run
    timed_out = {"ename": "CellTimeoutError", "evalue": f"the cell took longer than {cell_timeout} s", "traceback": []}
    timeouts = []

    def note_timeout(cell, cell_index, execute_reply):  # the timeout's reply is not an output: add one
        if (execute_reply or {}).get("content", {}).get("ename") == "CellTimeoutError":
            timeouts.append(cell_index)
            cell.outputs.append(nbformat.v4.new_output("error", **timed_out))

    client = NotebookClient(
        nb, kernel_name="python3", timeout=cell_timeout, allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout=timed_out, on_cell_executed=note_timeout,
        extra_arguments=["--HistoryManager.hist_file=:memory:", f"--IPKernelApp.exec_lines={REFUSE_EXIT!r}"])
    stopped = ""
    try:
        client.execute()
    except (DeadKernelError, CellTimeoutError, RuntimeError) as exc:
        stopped = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    nb.metadata["grading_run"] = {"stopped": stopped, "timeouts": timeouts}
    cap_outputs(nb)
    nbformat.write(nb, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
