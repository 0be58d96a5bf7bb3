"""One serving instance per state directory: ``<state_dir>/serve.lock``.

gRPC binds with ``SO_REUSEPORT`` unless told otherwise, so a second
``a2a-gateway serve`` of the same config used to start silently on the same
port: the kernel split the connections between two processes with separate
limits, replay windows and idempotency claims. Now ``serve`` (or the
supervisor of ``workers > 1``) takes an exclusive ``flock`` on this file
before it opens any state and holds it for its whole life; a second instance
is refused with the first one's pid. The supervisor passes the locked file to
its workers, so the lock lasts until the last process of the instance is
gone (an orphaned worker still serving keeps it). The kernel drops the lock
when those processes die, however they die: a stale file never blocks a
restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from gateway.errors import AgentConfigError
from gateway.local.private_files import private_dir

LOCK_FILE = "serve.lock"


class InstanceLock:
    """The held lock of one serving instance; released by :meth:`release` or at exit."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path
        """The lock file."""

    @classmethod
    def acquire(cls, state_dir: Path) -> InstanceLock:
        """Lock ``state_dir`` for this process and write its pid into the lock file.

        Raises:
            AgentConfigError: another instance holds it (its pid in the message,
                if it wrote one), or the file cannot be opened.
        """
        path = state_dir / LOCK_FILE
        try:
            private_dir(state_dir)  # 0700, as the agent makes it: the lock comes first
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise AgentConfigError(f"state_dir lock {path}: {err.strerror or err}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _pid_in(fd)
            os.close(fd)
            raise AgentConfigError(
                f"another a2a-gateway serve ({holder}) already serves with state_dir "
                f"{state_dir} (lock {path}); stop it first"
            ) from err
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        return cls(fd, path)

    def fileno(self) -> int:
        """The locked descriptor (the supervisor hands it to its workers)."""
        if self._fd is None:
            raise ValueError("instance lock released")
        return self._fd

    def release(self) -> None:
        """Unlock (idempotent); the file stays, it is harmless unlocked."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _pid_in(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        if text.isdigit():
            return f"pid {int(text)}"
    return "pid unknown"
