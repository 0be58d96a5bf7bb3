"""``a2a-gateway demo``: three agents on loopback, allowed calls, refusals, the audit trail.

Everything is made in a temporary folder (PKI, policies, configs, SQLite files)
and removed afterwards; nothing needs to be prepared or started by hand.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from capabilities.loading import AgentEnvironment
from capabilities.registry import CapabilityRegistry
from gateway.audit import format_table, query_records, verify_chain
from gateway.audit.filter import AuditFilter
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig, PeerEntry
from gateway.devtools.demo_plan import (
    DEMO_GRANTED,
    DEMO_OUTBOUND,
    register_demo_capabilities,
    run_plan_demo,
)
from gateway.devtools.pki import init_ca, issue
from gateway.errors import GatewayError
from gateway.postgres.dsn import StoreLocation
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader
from gateway.transport.tls import TlsMaterial
from policies.grants import PolicyDocument
from policies.policy_file import render_policy

TRUST_DOMAIN = "demo.a2agw"
AGENTS = ("alice", "bob", "carol")


def _id(name: str) -> str:
    return f"spiffe://{TRUST_DOMAIN}/agent/{name}"


def _policies(expires: str, expired: str) -> dict[str, dict[str, Any]]:
    """Who may call what on each agent (deny by default)."""
    return {
        "alice": {
            "grants": [
                {
                    "peer": _id("bob"),
                    "capabilities": ["text.search@^1", "text.echo", "kv.put@1"],
                    "max_payload_bytes": 512,
                    "expires_at": expires,
                },
                {
                    "peer": _id("carol"),
                    "capabilities": ["text.search@^1", "kv.put"],
                    "max_payload_bytes": 4096,
                    "expires_at": expires,
                    "max_risk": "read",
                },
                {
                    "peer": _id("dave"),
                    "capabilities": ["text.echo"],
                    "max_payload_bytes": 4096,
                    "expires_at": expired,
                },
            ],
            "outbound": [
                {"peer": _id(peer), "capabilities": caps} for peer, caps in DEMO_OUTBOUND.items()
            ],
        },
        "bob": {
            "grants": [
                {
                    "peer": _id("alice"),
                    "capabilities": ["text.echo", *DEMO_GRANTED],
                    "max_payload_bytes": 4096,
                    "expires_at": expires,
                }
            ]
        },
        "carol": {
            "grants": [
                {
                    "peer": _id("alice"),
                    "capabilities": ["kv.get", "kv.put", *DEMO_GRANTED],
                    "max_payload_bytes": 4096,
                    "expires_at": expires,
                }
            ]
        },
    }


def write_demo_files(base: Path, postgres: str | None = None) -> dict[str, AgentConfig]:
    """PKI, policies and configs for alice, bob and carol under ``base``.

    With ``postgres`` (a DSN) all three keep audit and state in that database:
    one audit table, one chain per agent.
    """
    pki = base / "pki"
    init_ca(pki, TRUST_DOMAIN)
    for name in (*AGENTS, "dave", "mallory"):
        issue(pki, name)
    now = datetime.now(UTC)
    policies = _policies(
        (now + timedelta(days=1)).isoformat(), (now - timedelta(days=1)).isoformat()
    )
    configs = {}
    for name in AGENTS:
        policy_path = base / f"{name}-policy.toml"
        policy_path.write_text(render_policy(PolicyDocument.model_validate(policies[name])))
        configs[name] = AgentConfig.model_validate(
            {
                "id": _id(name),
                "listen": "127.0.0.1:0",
                "tls": {
                    "ca": pki / "ca.pem",
                    "cert": pki / f"{name}.pem",
                    "key": pki / f"{name}.key",
                },
                "policy": policy_path,
                "audit_db": postgres or base / f"{name}-audit.sqlite",
                "state_dir": base / f"{name}-state",
                "state_db": postgres,
            }
        )
    return configs


@dataclass
class _Scene:
    agents: dict[str, Agent]
    pki: Path

    def client(self, caller: str, target: str) -> PeerClient:
        agent = self.agents[target]
        if caller in self.agents:
            return self.agents[caller].client(agent.config.id, agent.address)
        tls = TlsMaterial.from_files(
            self.pki / "ca.pem", self.pki / f"{caller}.pem", self.pki / f"{caller}.key"
        )
        return PeerClient(agent.config.id, agent.address, tls)

    async def call(
        self,
        caller: str,
        target: str,
        capability: str,
        payload: bytes | dict[str, Any],
        *,
        constraint: str = "",
        key: str = "",
        expect: str = "OK",
    ) -> None:
        client = self.client(caller, target)
        label = f"{caller:>7} → {target:<6} {capability}{'@' + constraint if constraint else ''}"
        try:
            result = await client.invoke(
                capability, payload, constraint=constraint, idempotency_key=key, timeout=5.0
            )
            outcome = f"OK  v{result.served_version} {_short(result.output())}"
            outcome += " (replayed, no second write)" if result.remembered else ""
            reason = "OK"
        except GatewayError as err:
            outcome, reason = f"REFUSED {err.reason}", err.reason
        finally:
            if caller not in self.agents:
                await client.close()
        mark = "" if reason == expect else f"   (!! expected {expect})"
        print(f"  {label:<44} {outcome}{mark}")
        if reason != expect:
            raise SystemExit(f"demo: {label} gave {reason}, expected {expect}")


def _short(output: Any) -> str:
    text = json.dumps(output, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


async def run_demo(postgres: str | None = None) -> int:
    """Run the scripted demo; returns 0 when every call ended as expected.

    Args:
        postgres: A PostgreSQL DSN for every agent's audit and state (None: SQLite files).
    """
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="a2a-gateway-demo-") as tmp:
        base = Path(tmp)
        configs = write_demo_files(base, postgres)
        agents = await _start_agents(configs)
        try:
            print("A2A Peer Gateway demo: three agents on loopback, mTLS with SPIFFE IDs")
            for name, agent in agents.items():
                print(f"  {name:<6} {agent.config.id} on {agent.address}")
            scene = _Scene(agents, base / "pki")
            await _script(scene)
            names = {agent.config.id: name for name, agent in agents.items()}
            planned = await run_plan_demo(agents["alice"], names)
            await agents["alice"].audit.flush()
            _show_audit(configs["alice"].audit_db, configs["alice"].id, started)
        finally:
            for agent in agents.values():
                await agent.stop()
        report = verify_chain(open_audit_reader(configs["alice"].audit_db), configs["alice"].id)
        print(
            f"\naudit chain of alice: {'intact' if report.ok else 'BROKEN'} "
            f"({report.records} records)"
        )
        return 0 if report.ok and planned else 1


async def _start_agents(configs: dict[str, AgentConfig]) -> dict[str, Agent]:
    """bob and carol (with the plan demo's capabilities), then alice knowing their addresses."""
    agents: dict[str, Agent] = {}
    for name in ("bob", "carol"):
        agents[name] = Agent(configs[name], _registry_with_demo(configs[name]))
        await agents[name].start(watch_policy=False)
    peers = [{"id": a.config.id, "address": a.address} for a in agents.values()]
    alice = Agent(
        configs["alice"].model_copy(
            update={"peers": tuple(PeerEntry.model_validate(p) for p in peers)}
        )
    )
    await alice.start(watch_policy=False)
    return {"alice": alice, **agents}


def _registry_with_demo(config: AgentConfig) -> CapabilityRegistry:
    from capabilities.builtin import register

    registry = CapabilityRegistry()
    config.state_dir.mkdir(parents=True, exist_ok=True)
    register(registry, AgentEnvironment(config.id, config.state_dir))
    return register_demo_capabilities(registry)


async def _script(scene: _Scene) -> None:
    print("\nAllowed calls")
    await scene.call(
        "bob", "alice", "text.search", {"query": "audit hash chain", "limit": 2}, constraint="^1"
    )
    await scene.call("bob", "alice", "kv.put", {"key": "greeting", "value": "hello"}, key="put-1")
    await scene.call("bob", "alice", "kv.put", {"key": "greeting", "value": "hello"}, key="put-1")
    await scene.call("alice", "carol", "kv.get", {"key": "missing"})
    print("\nRefused calls (no capability code runs; each is audited before the answer)")
    await scene.call("mallory", "alice", "text.echo", {"text": "hi"}, expect="UNKNOWN_PEER")
    await scene.call("dave", "alice", "text.echo", {"text": "hi"}, expect="GRANT_EXPIRED")
    await scene.call("bob", "alice", "kv.get", {"key": "greeting"}, expect="CAPABILITY_NOT_GRANTED")
    await scene.call(
        "bob",
        "alice",
        "text.search",
        {"query": "x"},
        constraint="^2",
        expect="VERSION_NOT_AVAILABLE",
    )
    await scene.call(
        "carol", "alice", "kv.put", {"key": "k", "value": "v"}, expect="RISK_NOT_GRANTED"
    )
    await scene.call("bob", "alice", "text.echo", {"text": "x" * 600}, expect="PAYLOAD_TOO_LARGE")
    await scene.call(
        "bob", "alice", "text.search", {"query": "x", "admin": True}, expect="INVALID_INPUT"
    )
    await scene.call("bob", "carol", "kv.get", {"key": "k"}, expect="UNKNOWN_PEER")


def _show_audit(db: StoreLocation, agent: str, started: float) -> None:
    name = db.name if isinstance(db, Path) else str(db)
    print(f"\nRefusals in alice's audit log ({name}; no payload content is stored):")
    # A shared database also holds earlier runs: show this one's.
    this_run = timedelta(seconds=time.time() - started)
    wanted = AuditFilter(agent=agent, refusals_only=True, since=this_run)
    print(format_table(query_records(open_audit_reader(db), wanted)))
