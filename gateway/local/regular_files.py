"""Reading a file an operator names, which must be a regular file (never a FIFO or device)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

NOT_REGULAR = "not a regular file"
"""The ``strerror`` of the OSError for a path that is no regular file."""


def read_regular_file(path: Path, limit: int = -1) -> bytes:
    """The bytes of ``path`` (at most ``limit`` of them, if given), refused unless it is a
    regular file.

    The file is opened without blocking, so a FIFO with no writer is refused
    instead of hanging the reader, and a device (``/dev/zero``) is not read.

    Raises:
        OSError: The file cannot be opened or read, or is not a regular file
            (``strerror`` "not a regular file"; ``FileNotFoundError`` if missing).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, NOT_REGULAR, str(path))
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(limit)
    finally:
        os.close(fd)
