"""The push outbox: it survives a restart, bounds each caller's backlog, and is shared by replicas.

Also: a fronted upstream's task pushes to the caller's webhook from the
gateway, and the caller's webhook never reaches the upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.types import a2a_pb2

from capabilities.registry import CapabilityRegistry
from gateway.audit import AuditRecord, query_records
from gateway.audit.filter import AuditFilter
from gateway.config import AgentConfig
from gateway.storage import location, open_audit_reader
from tests.a2a_support import A2APeer, data_request
from tests.a2a_upstream import SdkAgent, grpc_upstream
from tests.integration.a2a.test_a2a_long_tasks import poll_until, summary
from tests.integration.test_upstreams import LEGACY, bob_grants, skills
from tests.push_receiver import WebhookReceiver, with_push
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.task_capabilities import TaskGate

FAST = {"retry_initial": 0.05, "retry_max": 0.2, "max_attempts": 20}


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(tmp_path / "webhook") as webhook:
        yield webhook


def alice_config(
    pki: Pki, base: Path, ca: Path, stores: dict[str, str] | None = None, **push: Any
) -> AgentConfig:
    policy = write_policy(
        base / "alice-policy.toml",
        [{**grant("bob", ["text.echo", "job.chatty", "job.run"]), "push_hosts": ["127.0.0.1"]}],
    )
    plain = agent_config(pki, base, "alice", policy, stores=stores)
    return with_push(plain, ca, **{**FAST, **push})


def registry(base: Path, gate: TaskGate | None = None) -> CapabilityRegistry:
    found = standard_registry(WriteCounter(), base / "alice-state")
    for cap in (gate or TaskGate()).capabilities():
        found.register(cap)
    return found


def echo_request(url: str, config_id: str = "hook") -> a2a_pb2.SendMessageRequest:
    request = data_request("text.echo", {"text": "hi"})
    request.configuration.task_push_notification_config.CopyFrom(
        a2a_pb2.TaskPushNotificationConfig(id=config_id, url=url)
    )
    return request


def push_rows(rows: list[AuditRecord]) -> list[AuditRecord]:
    return [r for r in rows if r.detail.startswith("A2A push")]


async def test_undelivered_notifications_survive_a_restart(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver, stores: dict[str, str]
) -> None:
    receiver.status = 503
    config = alice_config(pki, tmp_path, receiver.ca, stores)
    first = await started(config, registry(tmp_path))
    try:
        async with A2APeer(pki, first, "bob") as bob:
            task = await bob.send(echo_request(receiver.url()))
        tried = (await receiver.wait(1))[0]
    finally:
        await first.stop()
    receiver.status = 200
    receiver.received.clear()
    second = await started(config, registry(tmp_path))
    try:
        got = await receiver.wait(3)
    finally:
        await second.stop()
    assert [summary(d.event()) for d in got] == [
        "status:WORKING",
        "artifact:output",
        "status:COMPLETED",
    ]
    # The very notification tried before the restart, with its id.
    assert got[0].body == tried.body
    ca = (pki.dir / "ca.pem").read_bytes()
    header = got[0].verified(ca, spiffe("alice"), receiver.url())
    assert header["jti"] == tried.verified(ca, spiffe("alice"), receiver.url())["jti"]
    assert all(getattr(d.event(), d.event().WhichOneof("payload")).task_id == task.id for d in got)


async def test_a_callers_backlog_is_bounded_and_what_is_dropped_is_counted(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    receiver.status = 503  # nothing leaves the outbox: the first two stay pending
    config = alice_config(
        pki, tmp_path, receiver.ca, max_pending_per_peer=2, retry_initial=30, retry_max=60
    )
    agent = await started(config, registry(tmp_path))
    try:
        async with A2APeer(pki, agent, "bob") as bob:
            request = data_request("job.chatty", {"tag": "c"})
            request.configuration.return_immediately = True
            request.configuration.task_push_notification_config.CopyFrom(
                a2a_pb2.TaskPushNotificationConfig(id="hook", url=receiver.url())
            )
            task = await bob.send(request)
            await poll_until(bob, task.id, a2a_pb2.TASK_STATE_COMPLETED)
    finally:
        await agent.stop()
    rows = audit_rows(config.audit_db)
    dropped = [r for r in rows if r.reason == "PUSH_BACKLOG_FULL"]
    assert dropped and {(r.decision, r.peer_id, r.task_id) for r in dropped} == {
        ("refuse", spiffe("bob"), task.id)
    }
    # WORKING, 500 progress texts, the output, COMPLETED: all but the first two dropped.
    assert sum(int(r.detail.rsplit("dropped=", 1)[1]) for r in dropped) == 503 - 2
    assert {d.body for d in receiver.received} <= {r.body for r in receiver.received[:2]}


async def test_a_config_made_on_one_replica_follows_the_task_running_on_the_other(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver, pg_dsn: str
) -> None:
    gate = TaskGate()
    stores = {"audit_db": pg_dsn, "state_db": pg_dsn}
    agents = []
    for n in range(2):
        base = tmp_path / f"replica-{n}"
        base.mkdir()
        agents.append(
            await started(alice_config(pki, base, receiver.ca, stores), registry(base, gate))
        )
    one, two = agents
    try:
        async with A2APeer(pki, one, "bob") as on_one, A2APeer(pki, two, "bob") as on_two:
            request = data_request("job.run", {"tag": "r"})
            request.configuration.return_immediately = True
            task = await on_one.send(request)
            await gate.started.wait()
            await on_two.client.create_task_push_notification_config(
                a2a_pb2.TaskPushNotificationConfig(id="late", task_id=task.id, url=receiver.url())
            )
            push = one.parts.push
            assert push is not None
            for _ in range(500):  # the running replica follows it within a second
                if push.notifier.follows(task.id):
                    break
                await asyncio.sleep(0.02)
            gate.release.set()
            got = await receiver.wait(2)
            await poll_until(on_two, task.id, a2a_pb2.TASK_STATE_COMPLETED)
    finally:
        for agent in agents:
            await agent.stop()
    assert [summary(d.event()) for d in got] == ["artifact:output", "status:COMPLETED"]
    reader = open_audit_reader(location(pg_dsn))
    rows = query_records(reader, AuditFilter(agent=spiffe("alice")))
    assert [r.reason for r in push_rows(rows)] == ["OK", "OK"]


class _Recording(SdkAgent):
    """The upstream, recording the configuration of every message it gets."""

    configurations: list[a2a_pb2.SendMessageConfiguration | None]

    def __init__(self) -> None:
        super().__init__()
        self.configurations = []

    def executor(self) -> AgentExecutor:
        inner, seen = super().executor(), self.configurations

        class Recording(AgentExecutor):
            async def execute(self, context: RequestContext, queue: EventQueue) -> None:
                seen.append(context.configuration)
                await inner.execute(context, queue)

            async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
                await inner.cancel(context, queue)

        return Recording()


async def test_a_fronted_upstreams_task_pushes_from_the_gateway_not_the_upstream(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    legacy = _Recording()
    async with grpc_upstream(legacy, pki, "legacy") as address:
        grants = [{**g, "push_hosts": ["127.0.0.1"]} for g in bob_grants()]
        policy = write_policy(tmp_path / "bob-policy.toml", grants)
        plain = agent_config(pki, tmp_path, "bob", policy)
        upstream = {"id": LEGACY, "binding": "grpc", "address": address, "skills": skills()}
        config = with_push(
            AgentConfig.model_validate({**plain.model_dump(), "upstreams": [upstream]}),
            receiver.ca,
        )
        bob = await started(config, CapabilityRegistry())
        try:
            async with A2APeer(pki, bob, "alice") as alice:
                request = data_request("legacy.echo", {"text": "hi"})
                request.configuration.task_push_notification_config.CopyFrom(
                    a2a_pb2.TaskPushNotificationConfig(id="hook", url=receiver.url())
                )
                task = await alice.send(request)
            got = await receiver.wait(3)
        finally:
            await bob.stop()
    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert [summary(d.event()) for d in got] == [
        "status:WORKING",
        "artifact:output",
        "status:COMPLETED",
    ]
    header = got[0].verified((pki.dir / "ca.pem").read_bytes(), spiffe("bob"), receiver.url())
    assert header["kid"] == spiffe("bob")
    assert len(legacy.configurations) == 1
    sent = legacy.configurations[0]
    assert sent is None or not sent.HasField("task_push_notification_config")
