"""How ``run_command`` confines a command: bubblewrap's command line, the environment, the checks.

The confinement (``docs/security.md``): the whole file system mounted read-only (``--ro-bind /
/``), fresh ``/dev`` and ``/proc``, a private ``/tmp`` (a tmpfs that goes with the command),
the agent's cwd bound writable in ``workspace-write`` (read-only in ``read-only``), then, over
it, every ``.git`` under the cwd and every protected path inside it bound read-only again
(later mounts win). Every namespace unshared (user, mount, PID, IPC, UTS, cgroup, and the
network unless ``Sandbox.network``), every capability dropped (bwrap run as root would keep
them, and with them ``mount -o remount,rw``), ``--die-with-parent``, ``--new-session`` (no
``TIOCSTI`` into the terminal); bwrap sets ``PR_SET_NO_NEW_PRIVS``; a seccomp filter refuses
new Unix-domain sockets and io_uring (``_tools/_seccomp.py``).

The environment is built here rather than with ``--clearenv``/``--setenv``: bwrap's argv is
readable by every local user (``ps``) and by the command itself (``/proc/1/cmdline``), so the
values travel only in bwrap's own environment, which is already the allow-list.

Bubblewrap is checked on every call, with the same command line and ``/bin/sh -c :`` (a few
milliseconds): a missing ``bwrap``, a kernel without unprivileged user namespaces or a mount
that fails is a ``SANDBOX_UNAVAILABLE`` error before the command runs — never an unconfined
run. Checking per call keeps no state and also catches a cwd or ``.git`` that changed.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final, final

import attrs
import trio

from .._sandbox import Sandbox, Workspace
from ._seccomp import filter_fd

__all__ = [
    "ENV_ALLOWED",
    "PROBE_TIMEOUT_S",
    "Confinement",
    "SandboxUnavailable",
    "bwrap_argv",
    "confined_environment",
    "is_protected",
    "looks_secret",
    "prepare",
    "probe",
]

#: Environment variables a confined command gets (names or globs), beside ``Sandbox.env``.
ENV_ALLOWED: Final = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "COLORTERM",
    "NO_COLOR",
    "TZ",
)
#: The private ``/tmp`` every confined command gets (also its ``TMPDIR``).
SANDBOX_TMP: Final = "/tmp"
#: How long the per-call check of bubblewrap may take.
PROBE_TIMEOUT_S: Final = 10.0
#: Most characters of bwrap's own complaint quoted in a ``SANDBOX_UNAVAILABLE`` result.
MAX_DETAIL_CHARS: Final = 1_000

_SECRET_NAME: Final = re.compile(
    r"PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|CREDENTIAL|PRIVATE|APIKEY|COOKIE"
    r"|(?:^|_)(?:KEY|KEYS|PAT|AUTH|SESSION|PASS)(?:_|$)"
)

_INSTALL: Final = (
    "Install bubblewrap (Debian, Ubuntu: `apt-get install bubblewrap`; Fedora, RHEL: "
    "`dnf install bubblewrap`; Arch: `pacman -S bubblewrap`), or opt out of the sandbox, which "
    'runs commands unconfined, as the user: `sandbox: off` in the config, `Sandbox(mode="off")` '
    "in code."
)


class SandboxUnavailable(Exception):
    """The sandbox cannot be set up here; the message says why and what to do."""


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a secret.

    ``*_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD*``, ``*_CREDENTIALS`` and their kin,
    in any case.
    """
    return _SECRET_NAME.search(name.upper()) is not None


def confined_environment(environ: Mapping[str, str], sandbox: Sandbox) -> dict[str, str]:
    """The environment of a confined command: the allow-list and the names ``sandbox`` adds.

    A variable that looks like a secret passes only when ``sandbox.env`` names it exactly;
    ``TMPDIR`` is the private ``/tmp`` unless named there.
    """
    named = set(sandbox.env)
    env = {
        name: value
        for name, value in environ.items()
        if name in named
        or (
            not looks_secret(name)
            and any(fnmatch.fnmatchcase(name, allowed) for allowed in ENV_ALLOWED)
        )
    }
    if "TMPDIR" not in named:
        env["TMPDIR"] = SANDBOX_TMP
    return env


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def is_protected(path: Path, protected: Iterable[Path]) -> bool:
    """Whether no tool may write ``path`` (a real path): in a ``.git``, or under ``protected``.

    ``.git`` is compared without case (a case-insensitive file system maps ``.GIT`` onto it).
    """
    if any(part.casefold() == ".git" for part in path.parts):
        return True
    return any(path == p or path.is_relative_to(p) for p in protected)


@final
@attrs.frozen
class Confinement:
    """One command's sandbox, prepared off the event loop (``prepare``)."""

    bwrap: str
    """The bubblewrap executable."""
    root: str
    """The agent's cwd, a real path."""
    writable: bool
    """Whether the cwd is bound writable."""
    read_only: tuple[str, ...]
    """Real paths inside the cwd bound read-only over it: ``.git`` entries, protected paths."""
    network: bool


def _git_entries(root: str) -> list[str]:
    """Every ``.git`` (directory, or a worktree's or submodule's pointer file) under ``root``.

    Symlinked directories are not entered (they may lead anywhere; outside the cwd the file
    system is read-only anyway).
    """
    found: list[str] = []
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name == ".git":
                        found.append(entry.path)
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue  # unreadable by the user, so by the command too
    return found


def prepare(root: Path, workspace: Workspace) -> Confinement:
    """Find bubblewrap and what to bind read-only inside ``root`` (blocking: in a thread).

    Raises:
        SandboxUnavailable: not Linux, or no ``bwrap`` on ``PATH``.
    """
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(
            "run_command confines commands with bubblewrap, which needs Linux (this is "
            f"{sys.platform}); the command was not run. To run commands unconfined, opt out "
            'of the sandbox: `sandbox: off` in the config, `Sandbox(mode="off")` in code.'
        )
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "run_command confines commands with bubblewrap (bwrap), which is not on PATH; "
            f"the command was not run. {_INSTALL}"
        )
    cwd = str(root)
    writable = workspace.sandbox.mode == "workspace-write" and ".git" not in root.parts
    read_only: set[str] = set()
    # Outside the cwd everything is read-only already; a symlink's target is what gets bound.
    for path in (*_git_entries(cwd), *workspace.protected):
        real = os.path.realpath(path)
        if _inside(cwd, real):
            writable = False  # the cwd is itself protected, or lies in a protected directory
        elif _inside(real, cwd) and os.path.lexists(real):
            read_only.add(real)
    return Confinement(
        bwrap=bwrap,
        root=cwd,
        writable=writable,
        read_only=tuple(sorted(read_only)),
        network=workspace.sandbox.network,
    )


def bwrap_argv(
    confinement: Confinement,
    command: str,
    info_fd: int | None = None,
    block_fd: int | None = None,
    *,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The bubblewrap command line running ``command`` in ``/bin/sh`` inside ``confinement``.

    Order matters: a later mount covers an earlier one. The cwd is bound again even when
    read-only, in case it lies under ``/tmp``, which the private tmpfs hides.
    """
    root = confinement.root
    argv = [confinement.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    argv += ["--tmpfs", SANDBOX_TMP]
    argv += ["--bind" if confinement.writable else "--ro-bind", root, root]
    for path in confinement.read_only:
        argv += ["--ro-bind", path, path]
    if root == "/":  # the cwd's bind covered the fresh /dev, /proc and /tmp: mount them again
        argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", SANDBOX_TMP]
    argv.append("--unshare-all")
    if confinement.network:
        argv.append("--share-net")
    argv += ["--cap-drop", "ALL", "--die-with-parent", "--new-session", "--chdir", root]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if block_fd is not None:
        argv += ["--block-fd", str(block_fd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return [*argv, "--", "/bin/sh", "-c", command]


async def _kill(process: trio.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def probe(confinement: Confinement, env: Mapping[str, str]) -> None:
    """Run ``/bin/sh -c :`` in ``confinement``: bubblewrap works here, with these mounts.

    Raises:
        SandboxUnavailable: bwrap could not start, failed, or did not answer in time.
    """
    seccomp = filter_fd()
    argv = bwrap_argv(confinement, ":", seccomp_fd=seccomp)
    detail = None
    with trio.move_on_after(PROBE_TIMEOUT_S):
        try:
            done = await trio.run_process(
                argv,
                cwd=confinement.root,
                env=env,
                pass_fds=() if seccomp is None else (seccomp,),
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                start_new_session=True,
                deliver_cancel=_kill,
            )
        except OSError as exc:
            detail = exc.strerror or str(exc)
        else:
            if done.returncode == 0:
                return
            output = (done.stderr or done.stdout).decode("utf-8", errors="replace").strip()
            detail = output[:MAX_DETAIL_CHARS] or f"exit code {done.returncode}"
        finally:
            if seccomp is not None:
                os.close(seccomp)
    if detail is None:
        detail = f"no answer within {PROBE_TIMEOUT_S:g}s"
    raise SandboxUnavailable(
        f"bubblewrap could not set up the sandbox ({detail}); the command was not run. "
        "Unprivileged user namespaces may be disabled (sysctl user.max_user_namespaces, "
        f"kernel.unprivileged_userns_clone, an AppArmor restriction). {_INSTALL}"
    )
