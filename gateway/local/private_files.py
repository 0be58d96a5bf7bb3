"""State files only the agent's own user may read: files 0600, directories 0700.

State holds what callers must not see from another account: idempotency
records keep capability outputs, the audit log keeps who called what, task
stores keep plan results. Modes are set explicitly rather than left to the
umask (a umask of 022 or 000 would make them world-readable).

SQLite creates a database's ``-wal`` and ``-shm`` files with the mode of the
database file itself, so a database made private here keeps them private
too; side files left by an earlier run are tightened as well.

A file that exists is checked and tightened by its path, never opened: closing
any descriptor of a file drops every POSIX (``fcntl``) lock this process holds
on it, and SQLite's locks are such locks. Opening and closing a database that
another connection of this process holds (the console's live feed while the
audit writer reopens the log) dropped that connection's locks, so another
process took itself for the last one, checkpointed and deleted the ``-wal``
and ``-shm`` files in use: every record written afterwards went to a deleted
file.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

PRIVATE_FILE = 0o600
"""Mode of every state file: read and write for the owner only."""
PRIVATE_DIR = 0o700
"""Mode of every directory the agent creates for state."""
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")
"""Suffixes of the files SQLite keeps beside a database."""


def private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700.

    A directory that already exists is left as it is: it may be shared on
    purpose (``/var/lib``), and the files in it are private anyway.

    Raises:
        OSError: a directory cannot be created.
    """
    missing: list[Path] = []
    at = path
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            continue  # made meanwhile by a sibling worker: theirs to set
        os.chmod(directory, PRIVATE_DIR)  # mkdir's mode passes through the umask


def private_file(path: Path) -> None:
    """Create ``path`` (empty) with mode 0600 if missing; make it and its SQLite
    side files 0600 if they exist with a wider mode.

    Raises:
        OSError: the file cannot be created or its mode changed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    except FileExistsError:  # maybe open in this process: by its path only (see above)
        _tighten(path)
    else:  # a new file: no lock of this process is on it
        try:
            os.fchmod(fd, PRIVATE_FILE)  # the mode os.open was given passes through the umask
        finally:
            os.close(fd)
    for suffix in SQLITE_SIDE_FILES:
        try:
            _tighten(Path(f"{path}{suffix}"))
        except FileNotFoundError:
            continue


def connect_private(path: Path, **kwargs: Any) -> sqlite3.Connection:
    """``sqlite3.connect(path, **kwargs)`` on a file made private first.

    Raises:
        sqlite3.OperationalError: the file cannot be made private (the caller
            handles it like any other failure to open the database).
    """
    try:
        private_file(path)
    except OSError as err:
        raise sqlite3.OperationalError(f"cannot create it with mode 0600: {err.strerror}") from err
    conn: sqlite3.Connection = sqlite3.connect(path, **kwargs)
    return conn


def _tighten(path: Path) -> None:
    # Only when needed: a read-only file system refuses even a no-op chmod.
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & ~PRIVATE_FILE:
        os.chmod(path, mode & PRIVATE_FILE)
