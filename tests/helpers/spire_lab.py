"""A real SPIRE deployment for tests: spire-server and spire-agents on unix sockets.

Binaries: ``scripts/build_spire.sh`` builds SPIRE v1.13.3 from its Go module into
``${A2AGW_TOOLS:-/var/cache/a2agw/tools}/spire-1.13.3/bin`` (``.ci/run`` runs it;
here it runs when the binaries are missing and Go is present). Without Go the
tests skip, saying so.

Layout: one spire-server per trust domain (``join_token`` node attestation,
SQLite datastore, in-memory keys, all in a short temp dir because unix socket
paths are limited to 107 bytes); one spire-agent per gateway agent, each with
its own Workload API socket. Every gateway agent runs in the test process (one
uid), so the ``unix`` workload attestor cannot tell them apart: each entry is
parented to one spire-agent's node id instead, and that agent's socket hands out
exactly that entry's SVID (``unix:uid:<our uid>``).

Every process started here is ended by its pid (``close``), every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from spiffe import WorkloadApiClient
from spiffe.errors import PySpiffeError

from gateway.config import AgentConfig
from gateway.errors import ConfigError
from gateway.runtime.agent import Agent
from gateway.transport.tls import TlsMaterial
from gateway.transport.workload_api import material_from_context
from policies.identity import svid_dns_name
from tests.helpers.agents import (
    WriteCounter,
    spiffe,
    standard_registry,
    write_policy,
)

REPO = Path(__file__).resolve().parents[2]
SPIRE_VERSION = "1.13.3"
SVID_TTL_SECONDS = 20
"""Short enough that SPIRE rotates each SVID (at half its lifetime) during a test."""
_WAIT_SECONDS = 60.0


def spire_bin() -> Path:
    """The folder holding spire-server and spire-agent, built if missing (skips without Go)."""
    tools = Path(os.environ.get("A2AGW_TOOLS", "/var/cache/a2agw/tools"))
    folder = tools / f"spire-{SPIRE_VERSION}" / "bin"
    if (folder / "spire-server").exists() and (folder / "spire-agent").exists():
        return folder
    go = Path("/usr/local/go/bin/go")
    if not go.exists() and shutil.which("go") is None:
        pytest.skip("Go is not installed: SPIRE cannot be built (scripts/build_spire.sh)")
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "build_spire.sh")],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return Path(built.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_until(ready: object, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _WAIT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited {proc.returncode}: {log.read_text()[-3000:]}")
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not ready in {_WAIT_SECONDS}s: {log.read_text()[-3000:]}")


@dataclass
class SpireServer:
    """One spire-server of ``trust_domain`` under ``base``."""

    bin: Path
    base: Path
    trust_domain: str
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.base / "server.sock"

    def start(self) -> None:
        self.port = free_port()
        data = self.base / "server-data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.base / "server.conf"
        config.write_text(
            f"""
server {{
  bind_address = "127.0.0.1"
  bind_port = "{self.port}"
  socket_path = "{self.socket}"
  trust_domain = "{self.trust_domain}"
  data_dir = "{data}"
  log_level = "WARN"
  ca_ttl = "1h"
  agent_ttl = "1h"
  default_x509_svid_ttl = "{SVID_TTL_SECONDS}s"
}}
plugins {{
  DataStore "sql" {{
    plugin_data {{
      database_type = "sqlite3"
      connection_string = "{data}/datastore.sqlite3"
    }}
  }}
  KeyManager "memory" {{ plugin_data {{}} }}
  NodeAttestor "join_token" {{ plugin_data {{}} }}
}}
"""
        )
        log = self.base / "server.log"
        self.proc = subprocess.Popen(
            [str(self.bin / "spire-server"), "run", "-config", str(config)],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        _wait_until(self._healthy, "spire-server", self.proc, log)

    def _healthy(self) -> bool:
        result = self.run("healthcheck", check=False)
        return result.returncode == 0

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``spire-server ARGS -socketPath ...``."""
        flags = next((i for i, arg in enumerate(args) if arg.startswith("-")), len(args))
        sub, rest = list(args[:flags]), list(args[flags:])  # socketPath after the subcommand
        result = subprocess.run(
            [str(self.bin / "spire-server"), *sub, "-socketPath", str(self.socket), *rest],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert result.returncode == 0, f"spire-server {args}: {result.stderr}{result.stdout}"
        return result

    def join_token(self) -> str:
        out = self.run("token", "generate").stdout
        return out.split("Token:", 1)[1].strip().split()[0]

    def bundle_pem(self) -> str:
        return self.run("bundle", "show").stdout

    def federate_with(self, other: SpireServer) -> None:
        """Trust ``other``'s bundle (set statically: no bundle endpoint needed)."""
        path = self.base / f"{other.trust_domain}.bundle.json"
        path.write_text(other.run("bundle", "show", "-format", "spiffe").stdout)
        self.run(
            "bundle",
            "set",
            "-format",
            "spiffe",
            "-id",
            f"spiffe://{other.trust_domain}",
            "-path",
            str(path),
        )

    def entry_id(self, spiffe_id: str) -> str:
        out = self.run("entry", "show", "-spiffeID", spiffe_id).stdout
        return out.split("Entry ID", 1)[1].split(":", 1)[1].split()[0]

    def register(
        self,
        parent: str,
        spiffe_id: str,
        *,
        dns: bool = True,
        federates_with: tuple[str, ...] = (),
        update: bool = False,
    ) -> None:
        """An entry for ``spiffe_id`` under node ``parent`` (with the derived DNS name);
        ``update``: change the existing entry to this."""
        head = ["entry", "update", "-entryID", self.entry_id(spiffe_id)] if update else []
        args = [
            *(head or ["entry", "create"]),
            "-parentID",
            parent,
            "-spiffeID",
            spiffe_id,
            "-selector",
            f"unix:uid:{os.getuid()}",
            "-x509SVIDTTL",
            str(SVID_TTL_SECONDS),
        ]
        if dns:
            args += ["-dns", svid_dns_name(spiffe_id)]
        for domain in federates_with:
            args += ["-federatesWith", f"spiffe://{domain}"]
        self.run(*args)

    def stop(self) -> None:
        _terminate(self.proc)
        self.proc = None


@dataclass
class SpireAgent:
    """One spire-agent attested to ``server`` with a join token; its own Workload API socket."""

    server: SpireServer
    name: str
    node_id: str = ""
    proc: subprocess.Popen[bytes] | None = None
    _token: str = field(default="", repr=False)

    @property
    def socket(self) -> Path:
        return self.server.base / f"{self.name}.sock"

    @property
    def address(self) -> str:
        """The Workload API address as ``[tls] socket`` takes it."""
        return f"unix://{self.socket}"

    def start(self) -> None:
        """Attest (first start) or restart with the node's existing data."""
        server = self.server
        if not self._token:
            self._token = server.join_token()
            self.node_id = f"spiffe://{server.trust_domain}/spire/agent/join_token/{self._token}"
        bundle = server.base / "bundle.pem"
        bundle.write_text(server.bundle_pem())
        data = server.base / f"{self.name}-data"
        data.mkdir(exist_ok=True)
        config = server.base / f"{self.name}.conf"
        config.write_text(
            f"""
agent {{
  data_dir = "{data}"
  log_level = "WARN"
  server_address = "127.0.0.1"
  server_port = "{server.port}"
  socket_path = "{self.socket}"
  trust_bundle_path = "{bundle}"
  trust_domain = "{server.trust_domain}"
  join_token = "{self._token}"
}}
plugins {{
  NodeAttestor "join_token" {{ plugin_data {{}} }}
  KeyManager "disk" {{ plugin_data {{ directory = "{data}" }} }}
  WorkloadAttestor "unix" {{ plugin_data {{}} }}
}}
"""
        )
        log = server.base / f"{self.name}.log"
        self.proc = subprocess.Popen(
            [str(server.bin / "spire-agent"), "run", "-config", str(config)],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        _wait_until(self._healthy, f"spire-agent {self.name}", self.proc, log)

    def _healthy(self) -> bool:
        result = subprocess.run(
            [str(self.server.bin / "spire-agent"), "healthcheck", "-socketPath", str(self.socket)],
            capture_output=True,
            timeout=30,
            check=False,
        )
        return result.returncode == 0

    def stop(self) -> None:
        _terminate(self.proc)
        self.proc = None


def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


@dataclass
class SpireLab:
    """Servers and agents of one test module, all stopped by ``close``."""

    bin: Path
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="spire-", dir="/tmp")))
    servers: list[SpireServer] = field(default_factory=list)
    agents: list[SpireAgent] = field(default_factory=list)

    def server(self, trust_domain: str) -> SpireServer:
        base = self.base / trust_domain.split(".")[0]
        base.mkdir()
        server = SpireServer(self.bin, base, trust_domain)
        self.servers.append(server)
        server.start()
        return server

    def agent(self, server: SpireServer, name: str) -> SpireAgent:
        agent = SpireAgent(server, name)
        self.agents.append(agent)
        agent.start()
        return agent

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.base, ignore_errors=True)


OTHER_DOMAIN = "other.test"
DAVE = f"spiffe://{OTHER_DOMAIN}/agent/dave"


@dataclass
class Spire:
    """The running deployment."""

    lab: SpireLab
    server: SpireServer
    other: SpireServer
    alice_node: SpireAgent
    bob_node: SpireAgent
    dave_node: SpireAgent


ALICE, BOB, CAROL = spiffe("alice"), spiffe("bob"), spiffe("carol")


def workload_config(
    base: Path,
    agent_id: str,
    socket_address: str | None,
    grants: list[dict[str, Any]],
    peers: Sequence[Agent] = (),
) -> AgentConfig:
    """An agent config with ``[tls] source = "workload-api"`` (``socket`` omitted: from env)."""
    name = agent_id.rsplit("/", 1)[1]
    tls: dict[str, Any] = {"source": "workload-api", "start_timeout": 40, "expiry_warning": "1s"}
    if socket_address is not None:
        tls["socket"] = socket_address
    return AgentConfig.model_validate(
        {
            "id": agent_id,
            "tls": tls,
            "policy": write_policy(base / f"{name}-policy.toml", grants),
            "audit_db": base / f"{name}-audit.sqlite",
            "state_dir": base / f"{name}-state",
            "peers": [{"id": peer.config.id, "address": peer.address} for peer in peers],
            "audit_checkpoints": {"every_records": 1},
        }
    )


async def start_agent(config: AgentConfig, counter: WriteCounter | None = None) -> Agent:
    registry = standard_registry(counter or WriteCounter(), config.state_dir)
    agent = Agent(config, registry)
    await agent.start(watch_policy=False)
    return agent


async def eventually(condition: Callable[[], bool], what: str, seconds: float = 45.0) -> None:
    """Wait, bounded, until ``condition()`` holds."""
    for _ in range(int(seconds / 0.2)):
        if condition():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"never happened: {what}")


async def svid_of(node: SpireAgent, spiffe_id: str) -> TlsMaterial:
    """The SVID ``node`` hands out now (bounded wait while it is attested)."""
    problem: Exception | None = None
    for _ in range(120):
        try:
            with WorkloadApiClient(node.address, default_timeout=5) as client:
                return material_from_context(client.fetch_x509_context(), spiffe_id)
        except (PySpiffeError, ConfigError) as err:
            problem = err
        await asyncio.sleep(0.5)
    raise AssertionError(f"no SVID for {spiffe_id}: {problem}")
