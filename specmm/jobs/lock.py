"""One writer per output: an exclusive `fcntl.flock` on a lock file next to it.

The lock belongs to an open file description, so the kernel drops it when the process dies however it dies
(SIGKILL included): a killed job never leaves a stale lock behind. The holder writes its PID into the file so
a refused second run can name the job it is waiting for. The lock file itself stays (deleting it would let
a third process lock a fresh inode while the second still waits on the old one).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class JobLockedError(ValueError):
    """Another running process holds the output's lock."""


class OutputLock:
    """`with OutputLock(lock_path, "--out", output):` holds the lock for the block, or raises JobLockedError."""

    def __init__(self, lock_path: str | Path, argument: str = "--out", output: str | Path | None = None):
        self.path = Path(lock_path)
        self.argument = argument
        self.output = Path(output) if output is not None else self.path
        self.fd: int | None = None

    def acquire(self) -> OutputLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:  # named by the output the user gave, not by the hidden lock file
            raise ValueError(f"{self.argument}: {self.output} cannot be written ({err.strerror or err}); choose "
                             "another output") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise JobLockedError(
                f"{self.argument}: {self.output} is being written by another specmm job (PID {holder}, lock "
                f"{self.path}); wait for it to finish, or choose another output") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


__all__ = ["JobLockedError", "OutputLock"]
