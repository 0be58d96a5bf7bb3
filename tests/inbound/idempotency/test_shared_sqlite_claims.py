"""Idempotency claims in the SQLite file shared by worker processes.

Two store objects on one file stand in for two workers (each has its own
connection, as each worker process does); the process tests are in
tests/runtime/test_workers.py, the replay window's in
tests/inbound/replay/test_replay_table.py.
"""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import pytest

from gateway.errors import IdempotencyInDoubt
from gateway.inbound.idempotency.sqlite import SqliteIdempotencyStore
from gateway.inbound.idempotency.store import StoredAnswer

IDENT = ("spiffe://example.org/agent/bob", "notes.append", "k1")


async def test_one_key_claimed_once_across_stores_and_answer_shared(tmp_path: Path) -> None:
    path = tmp_path / "idempotency.sqlite"
    first = SqliteIdempotencyStore(path, shared=True)
    second = SqliteIdempotencyStore(path, shared=True)
    try:
        assert await first.claim(IDENT, "sha") is None  # first holds the claim
        with pytest.raises(IdempotencyInDoubt):  # the sibling never runs it a second time
            await second.claim(IDENT, "sha")
        answer = StoredAnswer("sha", "1.0.0", b'{"appended":1}', "e" * 64)
        await first.complete(IDENT, answer)
        assert await second.claim(IDENT, "sha") == answer
    finally:
        first.close()
        second.close()


def test_shared_open_marks_only_claims_of_dead_owners(tmp_path: Path) -> None:
    path = tmp_path / "idempotency.sqlite"
    SqliteIdempotencyStore(path).close()  # creates the schema
    host = socket.gethostname()
    db = sqlite3.connect(path)
    with db:
        for key, owner in (("dead", f"{host}:999999999:n"), ("live", f"{host}:1:n")):
            db.execute(
                "INSERT INTO idempotency (peer, capability, key, request_sha256, state, "
                "claim_owner, updated_unix_ms) VALUES ('p', 'c', ?, 's', 'claimed', ?, 1)",
                (key, owner),
            )
    db.close()
    SqliteIdempotencyStore(path, shared=True).close()
    db = sqlite3.connect(path)
    states = dict(db.execute("SELECT key, state FROM idempotency").fetchall())
    db.close()
    assert states == {"dead": "in_doubt", "live": "claimed"}  # pid 1 is alive
    SqliteIdempotencyStore(path).close()  # exclusive open: every claim is from an earlier run
    db = sqlite3.connect(path)
    states = dict(db.execute("SELECT key, state FROM idempotency").fetchall())
    db.close()
    assert states == {"dead": "in_doubt", "live": "in_doubt"}
