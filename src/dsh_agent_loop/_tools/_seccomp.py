"""The seccomp filter of a confined command: no Unix-domain sockets of its own, no io_uring.

Why: the sandbox mounts the file system read-only, but connecting to a Unix-domain socket
needs no write access to it, so a command could still reach the Docker daemon (root on the
host), a local database, the session bus or an ssh-agent through their socket files (abstract
sockets are cut off with the network namespace, these are not). So ``socket(AF_UNIX, ...)``
fails with ``EPERM``; ``socketpair``, which reaches nothing outside, still works.
``io_uring_setup`` fails too: an io_uring ``IORING_OP_SOCKET`` would make sockets past the
filter. Programs fall back or report the error; those that need such a socket (``docker``,
``psql`` over its socket, ``ssh-add``) cannot work confined.

The program is classic BPF in the layout bwrap's ``--seccomp FD`` reads (``struct
sock_filter`` records, native byte order). System call numbers depend on the architecture:
the filter is built for x86_64, aarch64 and riscv64. A call made through another ABI (32-bit
compat, x32) kills the process: its numbers differ, and ``socketcall`` hides its arguments.
On other machines there is no filter (``docs/security.md`` says so).
"""

from __future__ import annotations

import errno
import os
import platform
import socket
import struct
import sys
from typing import Final, final

import attrs

__all__ = ["filter_fd", "filter_program"]

_LD_ABS: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE: Final = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET: Final = 0x06  # BPF_RET | BPF_K
_ALLOW: Final = 0x7FFF0000  # SECCOMP_RET_ALLOW
_DENY: Final = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO
_KILL: Final = 0x80000000  # SECCOMP_RET_KILL_PROCESS
_X32_BIT: Final = 0x40000000
_IO_URING_SETUP: Final = 425  # the same number on every architecture
#: Offsets in ``struct seccomp_data``: nr, arch, then the arguments (64 bits each).
_NR: Final = 0
_ARCH: Final = 4
_ARG0_LOW: Final = 16 if sys.byteorder == "little" else 20


@final
@attrs.frozen
class _Abi:
    arch: int
    """``AUDIT_ARCH_*``."""
    socket: int
    """``__NR_socket``."""
    x32: bool = False
    """Whether x32 numbers (bit 30 set) share this ``arch`` value."""


_ABIS: Final = {
    "x86_64": _Abi(arch=0xC000003E, socket=41, x32=True),
    "aarch64": _Abi(arch=0xC00000B7, socket=198),
    "riscv64": _Abi(arch=0xC00000F3, socket=198),
}


def filter_program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one's), or None where none is built."""
    abi = _ABIS.get(machine if machine is not None else platform.machine())
    if abi is None:
        return None
    # (code, value, where to go when true, when false): None is the next instruction.
    ops: list[tuple[int, int, str | None, str | None]] = [
        (_LD_ABS, _ARCH, None, None),
        (_JEQ, abi.arch, None, "kill"),
        (_LD_ABS, _NR, None, None),
    ]
    if abi.x32:
        ops.append((_JGE, _X32_BIT, "deny", None))
    ops += [
        (_JEQ, _IO_URING_SETUP, "deny", None),
        (_JEQ, abi.socket, None, "allow"),
        (_LD_ABS, _ARG0_LOW, None, None),
        (_JEQ, socket.AF_UNIX, "deny", "allow"),
    ]
    ends = {"allow": len(ops), "deny": len(ops) + 1, "kill": len(ops) + 2}

    def hop(at: int, label: str | None) -> int:
        return 0 if label is None else ends[label] - at - 1

    code = [
        struct.pack("=HBBI", op, hop(i, t), hop(i, f), k) for i, (op, k, t, f) in enumerate(ops)
    ]
    code += [struct.pack("=HBBI", _RET, 0, 0, k) for k in (_ALLOW, _DENY, _KILL)]
    return b"".join(code)


def filter_fd() -> int | None:
    """A pipe's read end holding the filter (for one bwrap: it reads it to the end), or None.

    The caller closes it once bwrap started.
    """
    program = filter_program()
    if program is None:
        return None
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, program)  # a few dozen bytes: the pipe's buffer holds them
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return read_fd
