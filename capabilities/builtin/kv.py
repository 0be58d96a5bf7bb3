"""``kv.put`` / ``kv.get``: a durable key-value store in SQLite.

``kv.put`` is a write capability marked idempotent: the gateway serves the
stored answer again for a repeated idempotency key, so a retried put lands once.
Each key carries a revision that counts the writes that really happened.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

from pydantic import Field

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.registry import Capability, capability


class PutInput(ContractModel):
    """A key and the value to store under it."""

    key: str = Field(min_length=1, max_length=256)
    value: str = Field(max_length=65_536)


class PutOutput(ContractModel):
    """The key and how many writes it has seen."""

    key: str
    revision: int = Field(ge=1)


class GetInput(ContractModel):
    """The key to read."""

    key: str = Field(min_length=1, max_length=256)


class GetOutput(ContractModel):
    """The stored value, if any."""

    key: str
    found: bool
    value: str = ""
    revision: int = 0


class KeyValueStore:
    """A tiny SQLite table of key → (value, revision); safe across threads."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        # Private like the agent's own state (0600 whatever the umask; SQLite
        # gives -wal/-shm the file's mode): values are callers' data.
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
            "revision INTEGER NOT NULL)"
        )

    def put(self, key: str, value: str) -> int:
        """Store ``value``; returns the key's new revision."""
        with self._lock:
            row = self._db.execute(
                "INSERT INTO kv (key, value, revision) VALUES (?, ?, 1) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, revision = revision + 1 "
                "RETURNING revision",
                (key, value),
            ).fetchone()
        return int(row[0])

    def get(self, key: str) -> tuple[str, int] | None:
        """The value and revision of ``key``, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT value, revision FROM kv WHERE key = ?", (key,)
            ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()


def make_kv_capabilities(store: KeyValueStore) -> list[Capability]:
    """``kv.put`` and ``kv.get`` bound to ``store``."""

    @capability("kv.put", "1.0.0", risk="write", timeout=5.0, idempotent=True)
    async def put(inp: PutInput, ctx: CallContext) -> PutOutput:
        """Store a value under a key (durable; a repeated idempotency key lands once)."""
        revision = await asyncio.to_thread(store.put, inp.key, inp.value)
        return PutOutput(key=inp.key, revision=revision)

    @capability("kv.get", "1.0.0", risk="read", timeout=5.0, idempotent=True)
    async def get(inp: GetInput, ctx: CallContext) -> GetOutput:
        """Read the value stored under a key."""
        found = await asyncio.to_thread(store.get, inp.key)
        if found is None:
            return GetOutput(key=inp.key, found=False)
        return GetOutput(key=inp.key, found=True, value=found[0], revision=found[1])

    return [put, get]
