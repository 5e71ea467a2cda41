"""``SqliteStore``'s proof of life: a lock each owning process holds on ``<database>-owners``.

Why. An owner row names its process by host and pid, and a process used to judge another dead
when that pid was gone (or named a process with another start time). Two containers that share
a volume and a hostname but not a PID namespace see each other's pids as absent, or as some
other process: each would judge the other's live owner dead and take its session over. A pid
means nothing outside its namespace; a lock held by the kernel does: all of them share the
file's inode.

The rule. A process that takes ownership first locks one byte of ``<database>-owners`` (an
open-file-description lock, ``F_OFD_SETLK``, exclusive), at an offset of its own: its *slot*,
drawn at random in 1 .. 2**62 and kept if free. Its owner rows carry that slot. An owner row
with a slot is live exactly while some process holds a lock on that byte (``F_OFD_GETLK``,
whichever PID namespace asks), and the kernel drops the lock when the process dies, however it
dies: a crashed owner is replaced at once, across namespaces too. A row whose slot is this
store's own is live (a second handle on a session in one store conflicts). No pid is ever
compared across namespaces: rows with a slot are judged by the lock alone.

Details. The descriptor is opened ``O_CLOEXEC`` and lives until the store's ``aclose`` drops
the lock, which it does only once no owner row carries the slot (a handle left open keeps its
session owned, and the lock with it, until it is released and the store closed again, or the
process ends); a store used again locks again, preferring its old slot. A store dropped
without ``aclose`` closes the descriptor when it is garbage-collected (its handles, which
reach it, are gone by then). Open-file-description
locks belong to the descriptor's open file, not to the process, so closing some other
descriptor of the file (which drops a process's classic POSIX locks) leaves them alone; a child
forked without ``exec`` shares the lock, so the owner then looks alive until both are gone (the
safe side). Nothing is written to the file: it stays empty and never grows. A new one takes the
database file's permission bits, as SQLite's ``-wal`` and ``-shm`` do. Rows without a slot
(written by earlier versions of the library) are judged by host, pid and start time as before;
so are rows on a system without ``F_OFD_SETLK`` (not Linux), where this lock is not taken.
Like the rest of SQLite in WAL mode, it needs every process of the file on one kernel (a local
disk or a volume shared by containers), not a network file system.

Every method runs in the store's writer thread, under its writer lock: never two at once.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import struct
import weakref
from typing import Final, final

__all__ = ["SUFFIX", "OwnerLock"]

#: The lock file is the database path plus this.
SUFFIX: Final = "-owners"
#: Slots are drawn in 1 .. 2**62 (a byte offset; ``off_t`` is signed 64-bit).
_SLOTS: Final = 2**62
#: Random slots tried before giving up (each a 1-in-2**62 collision with a live one).
_TRIES: Final = 8
#: ``struct flock`` on Linux: l_type, l_whence, l_start, l_len, l_pid (and padding).
_FLOCK: Final = "hhqqi4x"
_SETLK: Final = getattr(fcntl, "F_OFD_SETLK", None)
_GETLK: Final = getattr(fcntl, "F_OFD_GETLK", None)


def _request(kind: int, slot: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, slot, 1, 0)


@final
class OwnerLock:
    """This store's slot in ``<database>-owners``, and who else holds one.

    Args:
        database: The database file's path.
    """

    def __init__(self, database: str) -> None:
        self._database = database
        self.path = database + SUFFIX
        """The lock file."""
        self._fd: int | None = None
        self._closer: weakref.finalize[[int], OwnerLock] | None = None
        """Closes the descriptor if this object is dropped unclosed (its store never closed)."""
        self._slot: int | None = None
        """The slot held (or last held: tried first when locking again)."""

    @property
    def held_slot(self) -> int | None:
        """The slot this store holds locked now, or None."""
        return None if self._fd is None else self._slot

    @property
    def supported(self) -> bool:
        """Open-file-description locks exist here (Linux)."""
        return _SETLK is not None and _GETLK is not None

    def slot(self) -> int | None:
        """This store's slot, locked first if it is not held; None where unsupported.

        Raises:
            OSError: the lock file cannot be opened, or no slot could be locked.
        """
        if _SETLK is None or _GETLK is None:
            return None
        if self._fd is None:
            fd = self._open()
            try:
                self._slot = self._lock(fd)
            except BaseException:
                os.close(fd)
                raise
            self._fd, self._closer = fd, weakref.finalize(self, os.close, fd)
        return self._slot

    def held(self, slot: int) -> bool:
        """Whether some live process (this one included) holds ``slot``.

        Raises:
            OSError: the lock file cannot be opened, or the kernel refused the query.
        """
        mine = self.slot()
        if slot == mine:
            return True
        assert self._fd is not None
        assert _GETLK is not None
        answer = fcntl.fcntl(self._fd, _GETLK, _request(fcntl.F_WRLCK, slot))
        kind: int = struct.unpack(_FLOCK, answer)[0]
        return kind != fcntl.F_UNLCK

    def close(self) -> None:
        """Drop the lock (closing its descriptor); ``slot`` locks it again."""
        closer, self._fd, self._closer = self._closer, None, None
        if closer is not None:
            closer()  # (closes once: a finalizer that ran is dead)

    def _open(self) -> int:
        """Open the lock file; a new one gets the database file's permission bits."""
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            mode = os.stat(self._database).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o600
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            return os.open(self.path, flags)
        try:
            os.fchmod(fd, mode)  # the umask may have taken bits away
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _lock(self, fd: int) -> int:
        """Lock a free slot on ``fd``: the old one if free, else a random one."""
        assert _SETLK is not None
        candidates = [self._slot] if self._slot is not None else []
        candidates += [1 + secrets.randbelow(_SLOTS - 1) for _ in range(_TRIES)]
        for slot in candidates:
            try:
                fcntl.fcntl(fd, _SETLK, _request(fcntl.F_WRLCK, slot))
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                continue
            return slot
        raise OSError(errno.EAGAIN, f"{self.path}: no free owner slot in {_TRIES} tries")
