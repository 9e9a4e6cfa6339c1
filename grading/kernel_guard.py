"""Loaded into every grading kernel before a notebook runs (and into the clean room).

Student code that ends the process (`exit()`, `quit()`, `os._exit`, `os.abort`, killing its own
process) would otherwise kill the kernel and lose the grades of every later cell. Here those calls
raise SystemExit instead, which IPython reports as an error in that cell and then carries on.
"""
import os


def _refuse(*args, **kwargs):
    raise SystemExit("ending the process is disabled while grading")


os._exit = _refuse
os.abort = _refuse
os.kill = _refuse  # no signals at all: not to itself, nor to the grader that started it
os.killpg = _refuse

try:  # inside IPython: `exit()`/`quit()` ask the kernel to shut down
    _ip = get_ipython()  # noqa: F821 - defined in IPython
    _ip.ask_exit = _refuse
    _ip.user_ns["exit"] = _ip.user_ns["quit"] = _refuse
except NameError:
    import builtins

    builtins.exit = builtins.quit = _refuse
