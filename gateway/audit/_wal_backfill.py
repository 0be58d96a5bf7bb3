"""Copying an audit log's WAL back into its database file, off the writer thread.

SQLite's automatic checkpoint runs inside the COMMIT that crosses its
threshold: that commit, every refusal waiting on it and every record queued
behind it wait for the WAL's pages to be written into the database file and
for two more fsyncs (milliseconds, against a fraction of one for a commit).
Allowed calls never wait on a commit, refused ones always do: these stalls
made refusals the slower kind of call under load.

Here a thread of its own, on its own connection, runs the checkpoint
(SQLite's name; :mod:`gateway.audit.checkpoint` is about signed chain heads)
whenever the writer has committed enough since the last one. SQLite lets a
checkpoint run beside a writer, so no commit waits for it. ``PASSIVE`` never
waits for a lock: one that cannot copy everything now (a reader in another
process, a checkpoint of another process) copies the rest next time. The
writer's own connection keeps SQLite's automatic checkpoint (at SQLite's
default threshold): by the time it fires, this thread has copied nearly every
frame, so the commit that crosses it copies only the last few. Under a steady
stream of commits that backstop is also what lets SQLite start the WAL over
(it needs one moment with every frame copied), so the file stays small and
commits keep overwriting blocks it already has, which is cheaper to fsync.

Durability is unchanged: with ``synchronous = FULL`` this connection syncs
the WAL before copying and the database file before SQLite may reuse the WAL.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

_log = logging.getLogger(__name__)

BACKSTOP_PAGES = 1000
"""``wal_autocheckpoint`` of the writer's connection (SQLite's default)."""


class WalBackfill:
    """A thread that checkpoints one SQLite WAL file every ``every_commits`` commits."""

    def __init__(self, path: Path, *, synchronous: str, every_commits: int = 32) -> None:
        self._path = path
        self._synchronous = synchronous
        self._every = every_commits
        self._since = 0
        self._pending = False
        self._due = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (its connection is opened there)."""
        self._stopping, self._since, self._pending = False, 0, False
        self._thread = threading.Thread(target=self._run, name="audit-wal-backfill", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """Count one commit of the writer; wake the thread when a checkpoint is due."""
        self._since += 1
        if self._since >= self._every:
            self._since, self._pending = 0, True
            self._due.set()

    def stop(self) -> None:
        """Stop the thread after the checkpoint in progress or due (idempotent)."""
        if self._thread is None:
            return
        self._stopping = True
        self._due.set()
        self._thread.join()
        self._thread = None

    def _run(self) -> None:
        try:
            # mode=rw: never create a database the writer did not (a removed file stays removed).
            uri = f"{self._path.resolve().as_uri()}?mode=rw"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        except sqlite3.Error as err:
            _log.warning("audit log %s: WAL backfill not running: %s", self._path, err)
            return
        try:
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            while True:
                self._due.wait()
                self._due.clear()
                if self._pending:
                    self._pending = False
                    self._checkpoint(conn)
                if self._stopping:
                    return
        except sqlite3.Error as err:
            _log.warning("audit log %s: WAL backfill stopped: %s", self._path, err)
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # all: no open statement
        except sqlite3.Error as err:
            # Nothing committed is at risk (it is in the WAL), and the writer's
            # backstop checkpoint bounds the WAL meanwhile; a broken file fails
            # the writer's own next commit.
            _log.warning("audit log %s: WAL checkpoint failed: %s", self._path, err)
