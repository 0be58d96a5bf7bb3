"""One trace across a plan and two hops: spans in the SDK's in-memory exporter, ids in audit."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from capabilities.builtin.echo import echo
from capabilities.registry import CapabilityRegistry
from gateway.client.peer_client import PeerClient
from gateway.config import TracingSettings
from gateway.plans.document.model import Plan
from gateway.plans.task import PlanTaskState
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    Probe,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    mesh_registry,
    outbound_rule,
    spiffe,
    start_peer,
    write_policy,
)

SECRET = "secret goal text"


async def test_one_trace_id_from_plan_step_to_the_second_hop(pki: Pki, tmp_path: Path) -> None:
    spans = {name: InMemorySpanExporter() for name in ("alice", "bob", "carol")}
    probes = {name: Probe() for name in ("bob", "carol")}

    def registry(name: str) -> CapabilityRegistry:
        return mesh_registry(WriteCounter(), tmp_path / f"{name}-state", probes[name])

    carol = await start_peer(
        pki,
        tmp_path,
        "carol",
        registry("carol"),
        [grant("bob", ["deadline.probe"])],
        span_exporter=spans["carol"],
    )
    bob = await start_peer(
        pki,
        tmp_path,
        "bob",
        registry("bob"),
        [grant("alice", ["relay.ask"])],
        outbound=[outbound_rule("carol", ["deadline.probe"])],
        peers=[carol],
        span_exporter=spans["bob"],
    )
    alice_caps = CapabilityRegistry()
    alice_caps.register(echo)
    alice = await start_peer(
        pki,
        tmp_path,
        "alice",
        alice_caps,
        [],
        outbound=[outbound_rule("bob", ["relay.ask"])],
        peers=[bob],
        span_exporter=spans["alice"],
    )
    try:
        result = await alice.run(
            Plan.model_validate(
                {
                    "goal": SECRET,
                    "steps": [
                        {"id": "ask", "capability": "relay.ask", "input": {"peer": spiffe("carol")}}
                    ],
                }
            )
        )
        assert result.state is PlanTaskState.COMPLETED
        for agent in (alice, bob, carol):
            await agent.audit.flush()
    finally:
        for agent in (alice, bob, carol):
            await agent.stop(grace=0)

    finished = {name: exporter.get_finished_spans() for name, exporter in spans.items()}
    (root,) = [s for s in finished["alice"] if s.name == "plan"]
    (step,) = [s for s in finished["alice"] if s.name == "plan step"]
    trace_id = root.context.trace_id
    assert root.parent is None
    assert step.parent is not None and step.parent.span_id == root.context.span_id
    # Route discovery (Describe on bob), the step, and both hops: one trace.
    assert ("Describe", SpanKind.SERVER) in {(s.name, s.kind) for s in finished["bob"]}
    assert {s.context.trace_id for got in finished.values() for s in got} == {trace_id}
    names = {name: sorted({(s.name, s.kind) for s in got}) for name, got in finished.items()}
    assert ("peer call", SpanKind.CLIENT) in names["alice"]
    assert ("Invoke", SpanKind.SERVER) in names["bob"]
    assert ("peer call", SpanKind.CLIENT) in names["bob"]
    assert ("Invoke", SpanKind.SERVER) in names["carol"]
    # Each server span is a child of the caller's client span (traceparent carried).
    client_ids = {
        s.context.span_id for got in finished.values() for s in got if s.name == "peer call"
    }
    servers = [s for got in finished.values() for s in got if s.name == "Invoke"]
    assert servers and all(s.parent is not None and s.parent.span_id in client_ids for s in servers)
    for got in finished.values():  # ids, names, sizes, reason codes: never payload content
        for span in got:
            assert all(SECRET not in str(value) for value in (span.attributes or {}).values())

    hex_id = format(trace_id, "032x")
    bob_rows = [r for r in audit_rows(bob.config.audit_db) if r.capability == "relay.ask"]
    carol_rows = [r for r in audit_rows(carol.config.audit_db) if r.capability == "deadline.probe"]
    assert [(r.reason, r.trace_id) for r in bob_rows] == [("OK", hex_id)]
    assert [(r.reason, r.trace_id) for r in carol_rows] == [("OK", hex_id)]
    # alice only sent calls: her own log holds no record of them.
    assert audit_rows(alice.config.audit_db) == []


async def test_without_tracing_an_incoming_trace_id_is_still_carried_and_audited(
    pki: Pki, tmp_path: Path
) -> None:
    from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
    from tests.helpers.agents import raw_channel

    carol = await start_peer(
        pki,
        tmp_path,
        "carol",
        mesh_registry(WriteCounter(), tmp_path / "carol-state"),
        [grant("bob", ["text.echo"])],
    )
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    try:
        async with raw_channel(pki, carol, "bob") as channel:
            stub = gateway_pb2_grpc.PeerGatewayStub(channel)
            await stub.Invoke(
                gateway_pb2.InvokeRequest(
                    request_id="r-traced-1", capability="text.echo", payload=b'{"text":"x"}'
                ),
                timeout=10,
                metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),),
            )
        await carol.audit.flush()
    finally:
        await carol.stop(grace=0)
    assert carol.telemetry.tracing.enabled is False
    assert [(r.reason, r.trace_id) for r in audit_rows(carol.config.audit_db)] == [("OK", trace_id)]


async def test_an_unsampled_call_still_gets_a_trace_id_in_its_audit_record(
    pki: Pki, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "carol-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "carol", policy).model_copy(
        update={"tracing": TracingSettings(sample_ratio=0.0)}
    )
    exporter = InMemorySpanExporter()
    carol = Agent(
        config, mesh_registry(WriteCounter(), tmp_path / "carol-state"), span_exporter=exporter
    )
    await carol.start(watch_policy=False)
    try:
        async with PeerClient(carol.config.id, carol.address, pki.material("bob")) as bob:
            await bob.invoke("text.echo", {"text": "x"})
        await carol.audit.flush()
    finally:
        await carol.stop(grace=0)
    assert exporter.get_finished_spans() == ()  # nothing recorded...
    (row,) = audit_rows(config.audit_db)
    assert row.reason == "OK" and len(row.trace_id) == 32 and int(row.trace_id, 16) != 0


async def test_without_tracing_or_trace_context_calls_and_refusals_audit_no_trace_id(
    pki: Pki, tmp_path: Path
) -> None:
    from gateway.errors import CapabilityNotGranted
    from gateway.telemetry.tracing import carries_trace_context

    assert carries_trace_context((("user-agent", "x"), ("tracestate", "a=b")))
    assert not carries_trace_context((("user-agent", "x"),)) and not carries_trace_context(None)
    carol = await start_peer(
        pki,
        tmp_path,
        "carol",
        mesh_registry(WriteCounter(), tmp_path / "carol-state"),
        [grant("bob", ["text.echo"])],
    )
    try:
        async with PeerClient(carol.config.id, carol.address, pki.material("bob")) as bob:
            await bob.invoke("text.echo", {"text": "x"})
            with pytest.raises(CapabilityNotGranted):
                await bob.invoke("text.search", {"query": "x"})
        await carol.audit.flush()
    finally:
        await carol.stop(grace=0)
    assert carol.telemetry.tracing.enabled is False and carol.telemetry.metrics.enabled is False
    assert [(r.reason, r.trace_id) for r in audit_rows(carol.config.audit_db)] == [
        ("OK", ""),
        ("CAPABILITY_NOT_GRANTED", ""),
    ]
