"""Webhooks as an SSRF door, shut: addresses, rebinding names, redirects, TLS, timeouts, retries.

Every test uses a real HTTPS receiver on 127.0.0.1 and the resolver seam of
deliveries (``Agent(push_resolver=...)``), so a name can be made to answer a
private, metadata or loopback address, or a different one on each lookup,
without touching the machine's DNS. Loopback is reachable only where bob's
grant names 127.0.0.1 itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from a2a.types import a2a_pb2

from gateway.audit import AuditRecord
from gateway.runtime.agent import Agent
from tests.a2a_support import A2APeer, data_request
from tests.push_receiver import ScriptedResolver, WebhookReceiver, with_push
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    standard_registry,
    write_policy,
)

FAST = {"retry_initial": 0.05, "retry_max": 0.1, "timeout": 2.0, "connect_timeout": 1.0}


async def start_alice(
    pki: Pki,
    base: Path,
    ca: Path,
    push_hosts: list[str],
    resolver: Any = None,
    **push: Any,
) -> Agent:
    policy = write_policy(
        base / "alice-policy.toml",
        [{**grant("bob", ["text.echo"]), "push_hosts": push_hosts}],
    )
    config = with_push(agent_config(pki, base, "alice", policy), ca, **{**FAST, **push})
    agent = Agent(
        config, standard_registry(WriteCounter(), base / "alice-state"), push_resolver=resolver
    )
    await agent.start(watch_policy=False)
    return agent


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[WebhookReceiver]:
    names = ("hooks.example.test", "rebind.test", "mixed.test")
    async with WebhookReceiver(tmp_path / "webhook", names) as webhook:
        yield webhook


async def echo_with_webhook(pki: Pki, agent: Agent, url: str) -> a2a_pb2.Task:
    """bob's blocking text.echo with a webhook at ``url`` (three events to push)."""
    request = data_request("text.echo", {"text": "hi"})
    request.configuration.task_push_notification_config.CopyFrom(
        a2a_pb2.TaskPushNotificationConfig(id="hook", url=url)
    )
    async with A2APeer(pki, agent, "bob") as bob:
        return await bob.send(request)


async def delivery_records(
    agent: Agent, count: int, done: Callable[[list[AuditRecord]], bool] | None = None
) -> list[AuditRecord]:
    """The delivery records, once there are ``count`` (bounded wait)."""
    for _ in range(1000):
        await agent.audit.flush()
        found = [r for r in audit_rows(agent.config.audit_db) if r.detail.startswith("A2A push")]
        if len(found) >= count and (done is None or done(found)):
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"fewer than {count} delivery records")


def outcome(record: AuditRecord) -> tuple[str, str]:
    return record.decision, record.reason


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (["127.0.0.1"], "loopback"),  # where the receiver really listens
        (["10.1.2.3"], "private"),
        (["169.254.169.254"], "metadata"),
        (["fd00:ec2::254"], "metadata"),
        (["100.64.0.1"], "shared"),
        (["::ffff:127.0.0.1"], "loopback"),  # IPv4-mapped IPv6
        (["64:ff9b::7f00:1"], "loopback"),  # NAT64 of 127.0.0.1
        (["0.0.0.0"], "unspecified"),
        (["93.184.216.34", "127.0.0.1"], "loopback"),  # one bad address spoils the answer
    ],
)
async def test_a_name_resolving_to_an_address_the_grant_does_not_name_is_refused(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver, answer: list[str], kind: str
) -> None:
    resolver = ScriptedResolver({"hooks.example.test": [answer]})
    agent = await start_alice(pki, tmp_path, receiver.ca, ["hooks.example.test"], resolver)
    try:
        task = await echo_with_webhook(pki, agent, receiver.url("hooks.example.test"))
        rows = await delivery_records(agent, 3)
    finally:
        await agent.stop()
    assert [outcome(r) for r in rows] == [("refuse", "PUSH_ADDRESS_REFUSED")] * 3
    bad = ipaddress.ip_address(next(a for a in answer if a != "93.184.216.34"))
    assert rows[0].detail == (
        f"A2A push config=hook host=hooks.example.test:{receiver.port} address={bad} "
        f"attempt=1/6 why={kind} gave_up"
    )
    assert {r.task_id for r in rows} == {task.id}
    assert receiver.received == []  # never connected
    assert resolver.lookups == ["hooks.example.test"] * 3  # one lookup per attempt


async def test_a_named_loopback_address_is_reached_with_the_names_certificate(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    resolver = ScriptedResolver({"hooks.example.test": [["127.0.0.1"]]})
    hosts = ["hooks.example.test", "127.0.0.1"]
    agent = await start_alice(pki, tmp_path, receiver.ca, hosts, resolver)
    try:
        await echo_with_webhook(pki, agent, receiver.url("hooks.example.test"))
        got = await receiver.wait(3)
        rows = await delivery_records(agent, 3)
    finally:
        await agent.stop()
    assert {d.headers["host"] for d in got} == {f"hooks.example.test:{receiver.port}"}
    assert [outcome(r) for r in rows] == [("allow", "OK")] * 3


async def test_a_rebinding_name_is_resolved_once_per_attempt_and_the_checked_address_pinned(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    # First answer: the (named) loopback address the receiver listens on; every
    # later lookup: the metadata service. A client that looked the name up again
    # between the check and the connection would connect to the second answer.
    resolver = ScriptedResolver({"rebind.test": [["127.0.0.1"], ["169.254.169.254"]]})
    hosts = ["rebind.test", "127.0.0.1"]
    agent = await start_alice(pki, tmp_path, receiver.ca, hosts, resolver)
    try:
        await echo_with_webhook(pki, agent, receiver.url("rebind.test"))
        rows = await delivery_records(agent, 3)
    finally:
        await agent.stop()
    assert [outcome(r) for r in rows] == [
        ("allow", "OK"),
        ("refuse", "PUSH_ADDRESS_REFUSED"),
        ("refuse", "PUSH_ADDRESS_REFUSED"),
    ]
    assert "address=127.0.0.1 " in rows[0].detail
    assert "address=169.254.169.254 " in rows[1].detail and "why=metadata" in rows[1].detail
    assert len(receiver.received) == 1
    assert receiver.received[0].headers["host"] == f"rebind.test:{receiver.port}"
    assert resolver.lookups == ["rebind.test"] * 3  # exactly one per attempt


async def test_a_redirect_is_not_followed_and_fails_the_delivery(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    async with WebhookReceiver(tmp_path / "target") as target:
        receiver.status, receiver.location = 302, target.url(path="/stolen")
        agent = await start_alice(pki, tmp_path, receiver.ca, ["127.0.0.1"])
        try:
            await echo_with_webhook(pki, agent, receiver.url())
            rows = await delivery_records(agent, 3)
        finally:
            await agent.stop()
        assert target.received == []
    assert [outcome(r) for r in rows] == [("allow", "PUSH_REDIRECT_REFUSED")] * 3
    assert rows[0].detail.endswith("attempt=1/6 status=302 gave_up")
    assert "stolen" not in " ".join(r.detail for r in rows)
    assert len(receiver.received) == 3


async def test_a_certificate_not_for_the_name_fails_and_is_retried_up_to_max_attempts(
    pki: Pki, tmp_path: Path
) -> None:
    # Its certificate names receiver.test and 127.0.0.1, not other.test.
    async with WebhookReceiver(tmp_path / "webhook") as receiver:
        resolver = ScriptedResolver({"other.test": [["127.0.0.1"]]})
        hosts = ["other.test", "127.0.0.1"]
        agent = await start_alice(pki, tmp_path, receiver.ca, hosts, resolver, max_attempts=2)
        try:
            await echo_with_webhook(pki, agent, receiver.url("other.test"))
            rows = await delivery_records(agent, 6)
        finally:
            await agent.stop()
        assert receiver.received == []
    assert {outcome(r) for r in rows} == {("allow", "PUSH_TLS_FAILED")}
    first = [r.detail.rsplit(" ", 1)[-1] for r in rows if "attempt=1/2" in r.detail]
    assert first and all(tail.startswith("retry_in_ms=") for tail in first)
    assert all(r.detail.endswith("gave_up") for r in rows if "attempt=2/2" in r.detail)


async def test_an_untrusted_receiver_ca_fails_tls(pki: Pki, tmp_path: Path) -> None:
    async with WebhookReceiver(tmp_path / "webhook") as receiver:
        other_ca = tmp_path / "other-ca.pem"
        other_ca.write_bytes((pki.dir / "ca.pem").read_bytes())
        agent = await start_alice(
            pki, tmp_path, other_ca, ["127.0.0.1"], max_attempts=1, system_roots=False
        )
        try:
            await echo_with_webhook(pki, agent, receiver.url())
            rows = await delivery_records(agent, 3)
        finally:
            await agent.stop()
        assert receiver.received == []
    assert [outcome(r) for r in rows] == [("allow", "PUSH_TLS_FAILED")] * 3


async def test_a_slow_receiver_times_out_and_a_failing_one_is_retried_until_it_answers(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    receiver.status = 503
    agent = await start_alice(pki, tmp_path, receiver.ca, ["127.0.0.1"], max_attempts=20)
    try:
        await echo_with_webhook(pki, agent, receiver.url())
        await receiver.wait(2)  # the first notification failed twice: now let it through
        receiver.status = 200
        rows = await delivery_records(
            agent, 3, lambda found: sum(r.reason == "OK" for r in found) == 3
        )
        receiver.delay, receiver.status = 5.0, 200
        await echo_with_webhook(pki, agent, receiver.url())
        slow = await delivery_records(
            agent, len(rows) + 1, lambda found: found[-1].reason == "PUSH_TIMEOUT"
        )
    finally:
        receiver.delay = 0.0
        await agent.stop()
    failed = [r for r in rows if r.reason == "PUSH_HTTP_STATUS"]
    assert len(failed) >= 2 and all("status=503 retry_in_ms=" in r.detail for r in failed)
    # In order: the first notification's retries, then the others, each once.
    assert [r.request_id for r in rows if r.reason == "OK"] == list(
        dict.fromkeys(r.request_id for r in rows)
    )
    assert "why=" in slow[-1].detail and "retry_in_ms=" in slow[-1].detail


async def test_a_client_error_is_not_retried(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    receiver.status = 404
    agent = await start_alice(pki, tmp_path, receiver.ca, ["127.0.0.1"])
    try:
        await echo_with_webhook(pki, agent, receiver.url())
        rows = await delivery_records(agent, 3)
    finally:
        await agent.stop()
    assert [outcome(r) for r in rows] == [("allow", "PUSH_HTTP_STATUS")] * 3
    assert all(r.detail.endswith("attempt=1/6 status=404 gave_up") for r in rows)


async def test_a_host_the_policy_no_longer_names_is_refused_at_delivery(
    pki: Pki, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    receiver.status = 503
    agent = await start_alice(pki, tmp_path, receiver.ca, ["127.0.0.1"], max_attempts=20)
    try:
        await echo_with_webhook(pki, agent, receiver.url())
        await receiver.wait(1)
        write_policy(agent.config.policy, [grant("bob", ["text.echo"])])  # push_hosts gone
        assert agent.policies.reload() is None
        rows = await delivery_records(
            agent, 1, lambda found: found[-1].reason == "PUSH_HOST_NOT_ALLOWED"
        )
    finally:
        await agent.stop()
    assert outcome(rows[-1]) == ("refuse", "PUSH_HOST_NOT_ALLOWED")
    assert rows[-1].detail.endswith("gave_up")
