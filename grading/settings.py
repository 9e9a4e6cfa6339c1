"""The settings of a grading run, each with one name, one default and one help text.

    Limits      what one notebook may use in its sandbox (cell_seconds, notebook_seconds, memory_mb, ...)
    Settings    a run's settings: its Limits, the sandbox on or off, warm sandboxes, workers, a Dask scheduler

`python -m grading autograde`'s options are made from these fields (`add_options`, `from_options`: `--cell-seconds`
is `Limits.cell_seconds`), a run carries them to every student's grading in its `grading.course.GradingRun` (never
as configuration text), and the sandbox (grading/sandbox.py) takes its `Limits` whole. A setting is added here and
nowhere else.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field


def _setting(default, help: str, off: str = ""):
    """A field with its help text (`off`: what the command line's --no-... option does, for a setting on by default)."""
    return field(default=default, metadata={"help": help, "off": off})


@dataclass(frozen=True)
class Limits:
    """What one notebook may use in its sandbox."""

    cell_seconds: int = _setting(30, "seconds one cell may run before it is interrupted (training cells are cut "
                                     "short while grading)")
    notebook_seconds: int = _setting(600, "seconds a whole notebook may run before its sandbox is killed")
    memory_mb: int = _setting(4096, "memory of a student's sandbox, all its processes together (MiB)")
    cpus: float = _setting(1.0, "CPUs' worth of time a student's sandbox may use per second (0: no limit)")
    processes: int = _setting(512, "processes and threads a student's sandbox may have at once")
    file_mb: int = _setting(256, "the largest file a notebook may write (MiB)")
    scratch_mb: int = _setting(1024, "the notebooks' folder in the sandbox, a tmpfs of its own (MiB)")


@dataclass(frozen=True)
class Settings:
    """How a run grades (what it grades, and where the results go, are autograde's arguments)."""

    limits: Limits = Limits()
    isolate: bool = _setting(True, "run student code in the sandbox (bubblewrap)",
                             off="run student code without the sandbox (where bubblewrap cannot be installed); "
                                 "every row is flagged")
    reuse_sandbox: bool = _setting(True, "keep a student's sandbox warm for the worker's next student, once a "
                                         "reset has emptied it and found nothing left",
                                   off="start a new sandbox for every student")
    workers: int = _setting(1, "worker processes on this machine (more than 1 needs --db)")
    scheduler: str | None = _setting(None, "tcp://HOST:PORT of a running Dask cluster to grade on (needs --db)")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser) -> None:
    """The command line's options for `Settings`: one per field of `Limits`, `--workers`, `--scheduler`,
    `--no-sandbox` and `--no-reuse-sandbox`."""
    for f in dataclasses.fields(Limits):
        parser.add_argument(_option(f.name), type=type(f.default), default=f.default,
                            help=f"{f.metadata['help']} (default {f.default})")
    for f in dataclasses.fields(Settings):
        if f.name == "limits":
            continue
        if isinstance(f.default, bool):  # on by default: the option turns it off
            parser.add_argument(_option("no_" + ("sandbox" if f.name == "isolate" else f.name)), dest=f.name,
                                action="store_false", help=f.metadata["off"])
        else:
            parser.add_argument(_option(f.name), type=int if isinstance(f.default, int) else str, default=f.default,
                                help=f.metadata["help"])


def from_options(args: argparse.Namespace) -> Settings:
    """The `Settings` of parsed options (`add_options`)."""
    limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
    return Settings(limits=limits, **{f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)
                                      if f.name != "limits"})

