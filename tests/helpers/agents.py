"""Shared test helpers: a session PKI, agents on loopback, audit inspection."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import grpc

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.registry import Capability, CapabilityRegistry, capability
from gateway.audit import AuditRecord, query_records
from gateway.config import AgentConfig
from gateway.devtools.pki import CertificateAuthority, issue
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader
from gateway.transport.tls import TlsMaterial, channel_options
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from policies.grants import PolicyDocument
from policies.policy_file import render_policy

TRUST_DOMAIN = "example.org"


def spiffe(name: str) -> str:
    """SPIFFE ID of a test agent."""
    return f"spiffe://{TRUST_DOMAIN}/agent/{name}"


def future(days: int = 30) -> str:
    return (datetime.now(UTC) + timedelta(days=days)).isoformat()


def grant(
    name: str,
    capabilities: list[str],
    *,
    max_payload_bytes: int = 65536,
    expires_at: str | None = None,
    max_risk: str | None = None,
) -> dict[str, Any]:
    """A grant entry for peer ``name``."""
    entry: dict[str, Any] = {
        "peer": spiffe(name),
        "capabilities": capabilities,
        "max_payload_bytes": max_payload_bytes,
        "expires_at": expires_at or future(),
    }
    if max_risk:
        entry["max_risk"] = max_risk
    return entry


def write_policy(
    path: Path, grants: list[dict[str, Any]], outbound: list[dict[str, Any]] | None = None
) -> Path:
    document = PolicyDocument.model_validate({"grants": grants, "outbound": outbound or []})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_policy(document))
    return path


@dataclass
class Pki:
    """The session's certificates: one CA, agents, and a foreign CA."""

    dir: Path
    ca: CertificateAuthority
    foreign_dir: Path

    def material(self, name: str) -> TlsMaterial:
        return TlsMaterial.from_files(
            self.dir / "ca.pem", self.dir / f"{name}.pem", self.dir / f"{name}.key"
        )

    def odd_material(
        self,
        *,
        uris: list[str],
        not_after: datetime | None = None,
        not_before: datetime | None = None,
    ) -> TlsMaterial:
        cert, key = self.ca.mint(uris=uris, not_before=not_before, not_after=not_after)
        return TlsMaterial(ca_pem=self.ca.certificate_pem(), cert_pem=cert, key_pem=key)

    def foreign_material(self, name: str) -> TlsMaterial:
        return TlsMaterial.from_files(
            self.foreign_dir / "ca.pem",
            self.foreign_dir / f"{name}.pem",
            self.foreign_dir / f"{name}.key",
        )

    def ensure(self, name: str) -> None:
        if not (self.dir / f"{name}.pem").exists():
            issue(self.dir, name)


def make_pki(base: Path) -> Pki:
    from gateway.devtools.pki import init_ca

    pki_dir, foreign = base / "pki", base / "foreign-pki"
    init_ca(pki_dir, TRUST_DOMAIN)
    for name in ("alice", "bob", "carol", "dave", "mallory"):
        issue(pki_dir, name)
    init_ca(foreign, TRUST_DOMAIN)
    issue(foreign, "bob")
    return Pki(dir=pki_dir, ca=CertificateAuthority.load(pki_dir), foreign_dir=foreign)


def agent_config(
    pki: Pki,
    base: Path,
    name: str,
    policy: Path,
    peers: list[tuple[str, str]] | None = None,
    modules: tuple[str, ...] = ("capabilities.builtin",),
    stores: dict[str, str] | None = None,
) -> AgentConfig:
    """A config on 127.0.0.1:0; ``stores`` overrides audit_db/state_db (e.g. with a DSN)."""
    pki.ensure(name)
    return AgentConfig.model_validate(
        {
            "id": spiffe(name),
            "listen": "127.0.0.1:0",
            "tls": {
                "ca": pki.dir / "ca.pem",
                "cert": pki.dir / f"{name}.pem",
                "key": pki.dir / f"{name}.key",
            },
            "policy": policy,
            "audit_db": base / f"{name}-audit.sqlite",
            "state_dir": base / f"{name}-state",
            "modules": list(modules),
            "peers": [{"id": peer_id, "address": address} for peer_id, address in peers or []],
            **(stores or {}),
        }
    )


class NoteInput(ContractModel):
    note: str


class NoteOutput(ContractModel):
    stored: int


@dataclass
class WriteCounter:
    """A write capability that counts how often its code really ran."""

    calls: int = 0
    seen_fields: list[frozenset[str]] = field(default_factory=list)

    def capability(self) -> Capability:
        @capability("notes.write", "1.0.0", risk="write", timeout=2.0, idempotent=True)
        async def write(inp: NoteInput, ctx: CallContext) -> NoteOutput:
            """Store a note (counts invocations)."""
            self.calls += 1
            self.seen_fields.append(frozenset(inp.model_fields_set))
            return NoteOutput(stored=self.calls)

        return write


def standard_registry(counter: WriteCounter, state_dir: Path) -> CapabilityRegistry:
    """Built-ins plus the counting write capability."""
    from capabilities.builtin import register
    from capabilities.loading import AgentEnvironment

    registry = CapabilityRegistry()
    state_dir.mkdir(parents=True, exist_ok=True)
    register(registry, AgentEnvironment("test", state_dir))
    registry.register(counter.capability())
    return registry


def audit_rows(db: Path) -> list[AuditRecord]:
    """All committed audit records, read through a separate read-only connection."""
    return query_records(open_audit_reader(db))


async def started(config: AgentConfig, registry: CapabilityRegistry | None = None) -> Agent:
    agent = Agent(config, registry)
    await agent.start(watch_policy=False)
    return agent


async def started_replicas(
    pki: Pki,
    tmp_path: Path,
    pg_dsn: str,
    policy: Path,
    capabilities: Iterable[Capability],
    configure: Callable[[AgentConfig], AgentConfig] = lambda config: config,
) -> list[Agent]:
    """Two replicas of ``alice`` sharing one PostgreSQL database (audit and state), each with
    the standard registry plus ``capabilities``; ``configure`` adjusts each config."""
    capabilities = list(capabilities)
    agents = []
    for n in range(2):
        base = tmp_path / f"replica-{n}"
        base.mkdir()
        config = agent_config(
            pki, base, "alice", policy, stores={"audit_db": pg_dsn, "state_db": pg_dsn}
        )
        registry = standard_registry(WriteCounter(), base / "kv")
        for cap in capabilities:
            registry.register(cap)
        agents.append(await started(configure(config), registry))
    return agents


# --- Plans: test capabilities that record what reached them, and agent meshes ---


class WaitInput(ContractModel):
    tag: str = ""


class WaitOutput(ContractModel):
    done: bool


class ProbeInput(ContractModel):
    peer: str = ""


class ProbeOutput(ContractModel):
    remaining: float
    hop_remaining: float = 0.0


@dataclass
class Probe:
    """Capabilities for plan tests: a gate that waits, and deadline probes.

    ``slow.wait`` sets ``started``, waits for ``release`` and sets ``cancelled``
    if its call is cancelled; ``deadline.probe`` records the time it had left;
    ``relay.ask`` calls ``deadline.probe`` on ``peer`` through ``ctx.call_peer``.
    """

    started: Any = None
    release: Any = None
    cancelled: Any = None
    remaining: list[float] = field(default_factory=list)
    waits: int = 0

    def __post_init__(self) -> None:
        import asyncio

        self.started, self.release, self.cancelled = (
            asyncio.Event(),
            asyncio.Event(),
            asyncio.Event(),
        )

    def capabilities(self) -> list[Capability]:
        import asyncio

        @capability("slow.wait", "1.0.0", risk="read", timeout=30.0, idempotent=True)
        async def wait(inp: WaitInput, ctx: CallContext) -> WaitOutput:
            """Wait until released."""
            self.waits += 1
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            return WaitOutput(done=True)

        @capability("deadline.probe", "1.0.0", risk="read", timeout=30.0)
        async def probe(inp: ProbeInput, ctx: CallContext) -> ProbeOutput:
            """Report the time left."""
            self.remaining.append(ctx.time_remaining())
            return ProbeOutput(remaining=ctx.time_remaining())

        @capability("relay.ask", "1.0.0", risk="read", timeout=30.0)
        async def relay(inp: ProbeInput, ctx: CallContext) -> ProbeOutput:
            """Ask ``peer`` for its time left, within this call's deadline."""
            assert ctx.call_peer is not None
            mine = ctx.time_remaining()
            answer = await ctx.call_peer(inp.peer, "deadline.probe", {})
            return ProbeOutput(remaining=float(answer["remaining"]), hop_remaining=mine)

        return [wait, probe, relay]


def mesh_registry(
    counter: WriteCounter, state_dir: Path, probe: Probe | None = None
) -> CapabilityRegistry:
    """Built-ins, the counting write capability, and (optionally) the probe capabilities."""
    registry = standard_registry(counter, state_dir)
    for cap in probe.capabilities() if probe else ():
        registry.register(cap)
    return registry


async def start_peer(
    pki: Pki,
    base: Path,
    name: str,
    registry: CapabilityRegistry,
    grants: list[dict[str, Any]],
    *,
    outbound: list[dict[str, Any]] | None = None,
    peers: list[Agent] | None = None,
    **agent_kwargs: Any,
) -> Agent:
    """An agent ``name`` with its own policy file, calling ``peers`` (in that order)."""
    policy = write_policy(base / f"{name}-policy.toml", grants, outbound)
    config = agent_config(
        pki, base, name, policy, [(peer.config.id, peer.address) for peer in peers or []]
    )
    agent = Agent(config, registry, **agent_kwargs)
    await agent.start(watch_policy=False)
    return agent


def outbound_rule(name: str, capabilities: list[str]) -> dict[str, Any]:
    """An ``[[outbound]]`` entry: this agent may send ``capabilities`` to ``name``."""
    return {"peer": spiffe(name), "capabilities": capabilities}


def raw_channel(pki: Pki, agent: Agent, caller: str) -> grpc.aio.Channel:
    """A plain grpc.aio channel to ``agent`` with ``caller``'s certificate (no PeerClient)."""
    material = pki.material(caller)
    return grpc.aio.secure_channel(
        agent.address, material.channel_credentials(), options=channel_options(agent.config.id)
    )


async def raw_invoke(
    pki: Pki,
    agent: Agent,
    caller: str,
    request: gateway_pb2.InvokeRequest,
    *,
    compression: grpc.Compression | None = None,
    metadata: tuple[tuple[str, str], ...] = (),
) -> grpc.aio.AioRpcError:
    """Send ``request`` as ``caller`` and return the error it must end with."""
    async with raw_channel(pki, agent, caller) as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        try:
            await stub.Invoke(request, timeout=10, compression=compression, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            return err
    raise AssertionError("the call succeeded but a refusal was expected")


ALICE_GRANTS = (
    grant(
        "bob",
        ["text.echo@^1", "text.search@^1", "notes.write@1", "kv.put@1", "kv.get"],
        max_payload_bytes=1024,
    ),
    grant("carol", ["text.echo", "notes.write"], max_risk="read"),
    grant("dave", ["text.echo"], expires_at="2020-01-01T00:00:00Z"),
)
"""What the default alice grants: bob a typical set, carol reads, dave an expired grant."""


class AgentFactory(Protocol):
    """``await make_agent(...)``: a started agent on 127.0.0.1:0, stopped after the test."""

    async def __call__(
        self,
        name: str = "alice",
        *,
        grants: Sequence[dict[str, Any]] = ALICE_GRANTS,
        outbound: Sequence[dict[str, Any]] = (),
        peers: Sequence[Agent | tuple[str, str]] = (),
        capabilities: Sequence[Capability] = (),
        registry: CapabilityRegistry | None = None,
        https: bool = False,
        stores: dict[str, str] | None = None,
        **settings: Any,
    ) -> Agent: ...
