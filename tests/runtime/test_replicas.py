"""Two replicas of one agent identity sharing PostgreSQL: keys, replay window, audit chain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from capabilities.registry import CapabilityRegistry
from gateway.audit import query_records, verify_chain
from gateway.audit.filter import AuditFilter
from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from gateway.storage import location, open_audit_reader
from tests.helpers.agents import Pki, WriteCounter, agent_config, grant, started, write_policy


@pytest.fixture
async def replicas(
    pki: Pki, tmp_path: Path, pg_dsn: str, counter: WriteCounter
) -> AsyncIterator[list[Agent]]:
    """alice twice: same identity, policy and database; own port and state_dir each."""
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["notes.write"])])
    registry = CapabilityRegistry()
    registry.register(counter.capability())
    agents = []
    for n in range(2):
        base = tmp_path / f"replica-{n}"
        base.mkdir()
        config = agent_config(
            pki, base, "alice", policy, stores={"audit_db": pg_dsn, "state_db": pg_dsn}
        )
        agents.append(await started(config, registry))
    yield agents
    for agent in agents:
        await agent.stop()


async def _client(pki: Pki, agent: Agent) -> PeerClient:
    return PeerClient(agent.config.id, agent.address, pki.material("bob"))


async def test_a_retry_on_the_other_replica_gets_the_stored_answer(
    pki: Pki, replicas: list[Agent], counter: WriteCounter
) -> None:
    one, two = [await _client(pki, agent) for agent in replicas]
    async with one, two:
        first = await one.invoke("notes.write", {"note": "a"}, idempotency_key="k-1")
        again = await two.invoke("notes.write", {"note": "a"}, idempotency_key="k-1")
    assert counter.calls == 1
    assert (first.remembered, again.remembered) == (False, True)
    assert again.payload == first.payload


async def test_the_same_key_on_both_replicas_at_once_runs_once(
    pki: Pki, replicas: list[Agent], counter: WriteCounter
) -> None:
    one, two = [await _client(pki, agent) for agent in replicas]
    async with one, two:
        calls = [
            client.invoke("notes.write", {"note": "x"}, idempotency_key=f"same-{i}")
            for i in range(20)
            for client in (one, two)
        ]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert counter.calls == 20  # one write per key, never two
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, GatewayError)
            assert outcome.reason == "IDEMPOTENCY_IN_DOUBT"  # the other replica was mid-run


async def test_a_request_id_used_on_one_replica_is_refused_on_the_other(
    pki: Pki, replicas: list[Agent], counter: WriteCounter
) -> None:
    one, two = [await _client(pki, agent) for agent in replicas]
    async with one, two:
        await one.invoke("notes.write", {"note": "a"}, request_id="only-once")
        with pytest.raises(GatewayError) as info:
            await two.invoke("notes.write", {"note": "a"}, request_id="only-once")
    assert info.value.reason == "REPLAYED_REQUEST"
    assert counter.calls == 1


async def test_both_replicas_append_to_one_intact_chain(
    pki: Pki, replicas: list[Agent], pg_dsn: str
) -> None:
    one, two = [await _client(pki, agent) for agent in replicas]
    async with one, two:
        await asyncio.gather(
            *(c.invoke("notes.write", {"note": "a"}) for _ in range(25) for c in (one, two))
        )
    for agent in replicas:
        await agent.audit.flush()
    dsn = location(pg_dsn)
    records = query_records(open_audit_reader(dsn), AuditFilter(agent=replicas[0].config.id))
    report = verify_chain(open_audit_reader(dsn), replicas[0].config.id)
    assert report.ok and report.records == len(records) == 100  # ADMITTED + OK per call
    assert sorted(r.seq for r in records) == list(range(1, 101))
