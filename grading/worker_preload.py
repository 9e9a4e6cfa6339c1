"""What the process that this machine's grading workers are forked from imports first (`engine.WORKER_PRELOAD`):
the grader, so that every worker starts with it imported instead of importing it itself.

multiprocessing's forkserver ends if a module it preloads raises anything but ImportError, and then no worker
starts and the run waits for them. Here a grader that cannot be imported is left for each worker to import again,
where the student's task records what failed, as it would without the preload."""
import contextlib

with contextlib.suppress(Exception):
    import grading.worker  # noqa: F401
