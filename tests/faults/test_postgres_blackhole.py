"""A silent partition from PostgreSQL (data held, connections left open, no reset):
calls fail closed in bounded time, health turns NOT_SERVING, and the agent
recovers by itself once the link is back, without running a write twice."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from capabilities.registry import CapabilityRegistry
from gateway.audit import query_records, verify_chain
from gateway.audit.filter import AuditFilter
from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from gateway.postgres import source
from gateway.storage import location, open_audit_reader
from tests.helpers.agents import Pki, WriteCounter, agent_config, grant, started, write_policy
from tests.helpers.netproxy import TcpProxy
from tests.helpers.postgres import PostgresCluster

_DOWN = {"AUDIT_UNAVAILABLE", "STATE_UNAVAILABLE"}


async def test_a_silent_database_fails_closed_in_bounded_time_and_recovers(
    pki: Pki,
    tmp_path: Path,
    postgres_cluster: PostgresCluster,
    pg_dsn: str,
    counter: WriteCounter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(source, "ANSWER_SECONDS", 2.0, raising=False)
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["notes.write"])])
    registry = CapabilityRegistry()
    registry.register(counter.capability())
    async with TcpProxy("127.0.0.1", postgres_cluster.port) as proxy:
        dsn = pg_dsn.replace(f":{postgres_cluster.port}/", f":{proxy.listen_port}/")
        stores = {"audit_db": dsn, "state_db": dsn}
        agent = await started(agent_config(pki, tmp_path, "alice", policy, stores=stores), registry)
        try:
            async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
                await bob.invoke("notes.write", {"note": "a"})
                assert counter.calls == 1

                proxy.set_blackhole(True)
                started_at = time.monotonic()
                with pytest.raises(GatewayError) as refused:
                    await bob.invoke("notes.write", {"note": "b"}, timeout=30)
                assert refused.value.reason in _DOWN
                assert time.monotonic() - started_at < 15  # not the caller's deadline
                assert counter.calls == 1  # nothing ran
                for _ in range(60):  # the writer's probe gives up too: NOT_SERVING
                    if not agent.audit.healthy:
                        break
                    await asyncio.sleep(0.25)
                assert not agent.audit.healthy

                proxy.set_blackhole(False)
                for _ in range(120):
                    try:
                        await bob.invoke("notes.write", {"note": "c"})
                        break
                    except GatewayError as err:
                        assert err.reason in _DOWN
                        await asyncio.sleep(0.25)
                assert counter.calls == 2
                assert agent.audit.healthy
        finally:
            proxy.restore()
            await asyncio.wait_for(agent.stop(), 60)
    where = location(pg_dsn)
    assert verify_chain(open_audit_reader(where), agent.config.id).ok
    reasons = [
        r.reason
        for r in query_records(open_audit_reader(where), AuditFilter(agent=agent.config.id))
    ]
    assert reasons.count("ADMITTED") == reasons.count("OK") == 2
