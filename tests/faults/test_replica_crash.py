"""SIGKILL of one replica mid-write: the retry on the other replica never writes again.

Two ``serve`` processes of alice share PostgreSQL (audit and state). bob's
write (``notes.append`` of ``tests.helpers.crash_window``: side effect first,
then it lingers) reaches replica A, which is killed after the side effect and
before any answer. bob retries on replica B with the same idempotency key.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError, IdempotencyInDoubt
from tests.helpers.agent_process import AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, write_policy
from tests.helpers.crash_window import appended_lines

POLL_ROUNDS = 400  # x 0.05 s: a bound for a slow runner, never asserted


def _replica(pki: Pki, tmp_path: Path, name: str, policy: Path, dsn: str) -> AgentProcess:
    config = write_agent_toml(
        tmp_path / f"{name}.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=dsn,
        state_dir=tmp_path / f"{name}-state",
        modules=("capabilities.builtin", "tests.helpers.crash_window"),
        state_db=dsn,
    )
    return AgentProcess(config)


def _all_appends(tmp_path: Path) -> list[str]:
    return [line for n in ("a", "b") for line in appended_lines(tmp_path / f"{n}-state")]


async def test_retry_on_the_other_replica_after_sigkill_never_writes_twice(
    pki: Pki, tmp_path: Path, pg_dsn: str
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["notes.append"])])
    a, b = (_replica(pki, tmp_path, n, policy, pg_dsn) for n in ("a", "b"))
    bob = pki.material("bob")
    try:
        a.spawn()
        b.spawn()
        to_a = PeerClient(spiffe("alice"), a.wait_serving(), bob)
        to_b = PeerClient(spiffe("alice"), b.wait_serving(), bob)
        async with to_a, to_b:
            first = asyncio.create_task(
                to_a.invoke("notes.append", {"note": "n1"}, idempotency_key="k1", timeout=30.0)
            )
            for _ in range(POLL_ROUNDS):  # until the side effect is durable on A
                if _all_appends(tmp_path) or first.done():
                    break
                await asyncio.sleep(0.05)
            assert _all_appends(tmp_path) == ["n1"]
            a.kill()  # after the write, before its answer and its idempotency record
            with pytest.raises(GatewayError):
                await first

            with pytest.raises(IdempotencyInDoubt):
                await to_b.invoke("notes.append", {"note": "n1"}, idempotency_key="k1")
            # A fresh key is served normally by the surviving replica.
            await to_b.invoke("notes.append", {"note": "n2"}, idempotency_key="k2")
        assert sorted(_all_appends(tmp_path)) == ["n1", "n2"], "a write ran twice for one key"
    finally:
        a.ensure_stopped()
        b.ensure_stopped()
    with psycopg.connect(pg_dsn) as conn:
        states = dict(conn.execute("SELECT key, state FROM idempotency").fetchall())
    assert states["k2"] == "done"
    assert states["k1"] in ("claimed", "in_doubt")  # never done: its outcome is unknown
