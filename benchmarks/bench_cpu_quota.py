"""The trained-model mark on a slow machine: notebook 05's `shapes` run trained on the whole machine and under
a CPU quota, side by side.

    sudo .venv/bin/python benchmarks/bench_cpu_quota.py [--quota 0.33] [--steps 700]

Trains the solution's model as notebook 05 does (its configuration, seed 0, `grading.notebooks.trained_checkpoint`)
twice, each in a process of its own: once as it is, once in a cgroup whose CPU quota is `--quota` of one core
(a third by default: a slow laptop or a shared Colab CPU). Prints, per run, the steps trained and the time, then
whether the two checkpoints hold the same weights and the share of each trained-model case's scenes (public and
hidden) that each model captions exactly right, which is what the marks are made of.

Needs root and the cgroup CPU controller (cgroup v2's cpu.max, or v1's cpu.cfs_quota_us).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ("import sys; from pathlib import Path; from grading import notebooks; "
         "notebooks.trained_checkpoint(Path(sys.argv[1]), steps=int(sys.argv[2]))")


NO_QUOTA = 3  # the exit status when this machine cannot set a CPU quota (not root, no cgroup CPU controller)
V2, V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")


def can_set_quota() -> bool:
    if os.geteuid() != 0:
        return False
    if (V2 / "cgroup.controllers").exists():
        return "cpu" in (V2 / "cgroup.controllers").read_text().split()
    return (V1 / "cpu.cfs_quota_us").exists()


def quota_cgroup(share: float) -> Path:
    """A new cgroup limited to `share` of one CPU; its cgroup.procs file takes a process."""
    name = f"bench-cpu-quota-{os.getpid()}"
    v2 = V2
    if (v2 / "cgroup.controllers").exists():
        group = v2 / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{int(share * 100000)} 100000")
    else:
        group = V1 / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(share * 100000)))
    return group


def train(path: Path, steps: int, group: Path | None) -> float:
    """Train into `path` in a child process (in `group` from its first instruction, if given); the seconds taken."""
    def enter_group():
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", TRAIN, str(path), str(steps)], cwd=ROOT, env=env, check=True,
                   preexec_fn=enter_group)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quota", type=float, default=1 / 3, help="share of one CPU for the slow run (default 1/3)")
    ap.add_argument("--steps", type=int, default=700)
    args = ap.parse_args()
    from grading.cases.captioning.training import trained_shares

    if not can_set_quota():
        print("this machine cannot set a CPU quota here: run as root where the cgroup CPU controller is mounted")
        sys.exit(NO_QUOTA)
    group = quota_cgroup(args.quota)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = {"whole machine": (Path(tmp) / "fast.pt", None),
                    f"quota {args.quota:.2f} CPU": (Path(tmp) / "slow.pt", group)}
            shares = {}
            for label, (path, cgroup) in runs.items():
                seconds = train(path, args.steps, cgroup)
                history = torch.load(path, weights_only=True)["extra"]["history"]
                shares[label] = trained_shares(path)
                print(f"{label:>16}: {len(history['step'])} of {args.steps} steps in {seconds:.0f} s, final loss "
                      f"{history['loss'][-1]:.4f}; exactly right: " +
                      ", ".join(f"{name} {share:.0%}" for name, share in shares[label].items()), flush=True)
            fast, slow = (torch.load(p, weights_only=True)["state_dict"] for p, _ in runs.values())
            same = fast.keys() == slow.keys() and all(torch.equal(fast[k], slow[k]) for k in fast)
            print(f"same weights: {same}; same shares: {len({tuple(s.values()) for s in shares.values()}) == 1}")
    finally:
        group.rmdir()


if __name__ == "__main__":
    main()
