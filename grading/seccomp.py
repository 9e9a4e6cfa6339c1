"""The system calls a sandbox may not make: a seccomp filter for bubblewrap's `--seccomp FD`.

Namespaces give each sandbox its own processes, network, IPC objects and files, but some kernel state is
per *user*, and a user outlives its sandbox (the next sandbox that takes its uid; every sandbox of a
grader that is not root runs as that grader's user): a key added to that user's keyring would be read there.
POSIX message queues live in the IPC namespace, which a warm sandbox keeps from one student to the next. So, as Docker's
default profile does, the filter refuses (EPERM):

- the kernel keyring: add_key, request_key, keyctl;
- POSIX message queues: mq_open and the calls that use one;
- new namespaces: unshare, setns, and clone with a CLONE_NEW* flag (a user namespace would give the student
  capabilities inside it, and with them mounts of their own), and clone with CLONE_PARENT (a process that is
  its parent's sibling); clone3, whose flags a filter cannot read, says ENOSYS, so the C library falls back
  to clone (Docker does the same);
- bpf, perf_event_open, userfaultfd and io_uring: no notebook needs them, and they are the kernel's largest
  attack surface for an unprivileged user.

Every other call is allowed. Calls of another ABI (32-bit, x32) are refused: nothing in the sandbox uses them.
The program is classic BPF (struct sock_filter), written here without libseccomp.
"""
from __future__ import annotations

import errno
import os
import platform
import struct
import tempfile

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000
# name: (x86_64, aarch64) system call numbers
REFUSED = {
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182), "mq_timedreceive": (243, 183),
    "mq_notify": (244, 184), "mq_getsetattr": (245, 185),
    "unshare": (272, 97), "setns": (308, 268),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
}
CLONE = (56, 220)
CLONE3 = (435, 435)
# CLONE_NEWNS ... CLONE_NEWNET, and CLONE_PARENT: a child of the process's parent (a kernel's is the kernel
# starter, which would report it as one of its kernels)
CLONE_REFUSED = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00008000

# classic BPF
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
NR, ARCH, ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg 0's low 32 bits: little-endian)


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for this machine's architecture (x86_64 or aarch64); ValueError for another."""
    machine = machine or platform.machine()
    if machine not in AUDIT_ARCH:
        raise ValueError(f"no seccomp filter for {machine}: the sandbox supports x86_64 and aarch64")
    col = 0 if machine == "x86_64" else 1
    refused = sorted({numbers[col] for numbers in REFUSED.values()})
    deny = RET_ERRNO | errno.EPERM
    # after the list: clone3 -> ENOSYS; clone with a namespace flag -> EPERM; everything else allowed
    tail = [
        _insn(JEQ_K, CLONE3[col], jt=0, jf=1), _insn(RET_K, RET_ERRNO | errno.ENOSYS),
        _insn(JEQ_K, CLONE[col], jt=0, jf=2),
        _insn(LD_W_ABS, ARG0), _insn(JSET_K, CLONE_REFUSED, jt=1, jf=0),
        _insn(RET_K, RET_ALLOW),
        _insn(RET_K, deny),
    ]
    # each refused number jumps to the final `deny` (its jt counts the instructions in between)
    body = [_insn(JEQ_K, nr, jt=len(refused) - 1 - i + len(tail) - 1) for i, nr in enumerate(refused)]
    head = [_insn(LD_W_ABS, ARCH), _insn(JEQ_K, AUDIT_ARCH[machine], jt=1, jf=0), _insn(RET_K, deny),
            _insn(LD_W_ABS, NR)]
    if machine == "x86_64":
        head.append(_insn(JGE_K, X32_SYSCALL_BIT, jt=len(body) + len(tail) - 1, jf=0))
    return b"".join(head + body + tail)


def filter_file() -> int:
    """An open file descriptor holding the program, at offset 0, for `bwrap --seccomp FD` (the caller closes it)."""
    fd, path = tempfile.mkstemp(prefix="seccomp-")
    os.unlink(path)
    os.write(fd, program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
