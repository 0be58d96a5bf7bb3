"""Agent configuration files (TOML), validated into frozen models.

Example::

    id = "spiffe://example.org/agent/alice"
    listen = "127.0.0.1:7001"
    policy = "alice-policy.toml"
    audit_db = "state/alice-audit.sqlite"
    state_dir = "state/alice"
    modules = ["capabilities.builtin"]
    idempotency_retention = "7d"   # the default: completed idempotency keys kept this long
    max_concurrent_calls = 256     # the default: calls at once, all peers (per worker)
    workers = 1                    # serving processes on the one port
    replay_window_ids = 2097152    # the default: request ids the replay window holds

    [tls]
    ca = "pki/ca.pem"
    cert = "pki/alice.pem"
    key = "pki/alice.key"
    expiry_warning = "7d"        # optional: warn when the certificate expires this soon
    # or, from the SPIFFE Workload API (a SPIRE agent), see docs/spire.md:
    # source = "workload-api"
    # socket = "unix:///run/spire/agent.sock"   # default: $SPIFFE_ENDPOINT_SOCKET

    [[peers]]
    id = "spiffe://example.org/agent/bob"
    address = "127.0.0.1:7002"

    [[upstreams]]                               # an existing A2A agent, fronted here
    id = "spiffe://example.org/agent/legacy"
    address = "127.0.0.1:50051"
    binding = "grpc"
    [[upstreams.skills]]
    skill = "echo"
    capability = "legacy.echo"
    version = "1.0.0"
    risk = "read"
    timeout = 5.0

    [plans]                      # optional
    approval_min_risk = "write"  # every plan's steps at this risk or above wait for approval

    [audit_checkpoints]          # optional; these are the defaults
    enabled = true
    every_records = 1000
    every_seconds = 60
    # file = "state/alice-audit.sqlite.checkpoints.jsonl"

    [a2a]                        # optional
    default_capability = "text.echo@^1"  # for A2A messages without a2agw.capability
    http_listen = "127.0.0.1:7443"   # A2A JSON-RPC and HTTP+JSON over HTTPS (off when absent)
    task_retention = "7d"        # finished A2A tasks older than this are deleted (the default)
    v0_3_compat = true           # also serve A2A 0.3 clients, behind the same checks (the default)

    [push]                       # optional; A2A push notifications, off unless enabled
    enabled = true               # the hosts a caller may name: its grant's push_hosts
    # ca = "pki/webhooks-ca.pem" # extra CAs trusted for webhook certificates (with the system's)

    [mcp]                        # optional; off unless configured
    listen = "127.0.0.1:7444"    # capabilities as MCP tools (Streamable HTTP at /mcp, mTLS)

    [[mcp_upstreams]]            # an MCP server, fronted here (or url = "https://...")
    name = "files"
    command = "mcp-files-server"
    [[mcp_upstreams.tools]]
    tool = "read_file"
    capability = "files.read"
    version = "1.0.0"
    risk = "read"
    timeout = 10.0

    [metrics]                    # optional; off unless configured
    listen = "127.0.0.1:9464"    # Prometheus text format at /metrics
    peer_labels = false          # peer ids as labels (cardinality: off by default)

    [tracing]                    # optional
    enabled = true               # spans (trace ids are carried and audited regardless)
    otlp_endpoint = "127.0.0.1:4317"   # OTLP/gRPC export of spans when set
    console = false              # true: also print spans on stderr

    [console]                    # optional; off unless configured
    listen = "127.0.0.1:9465"    # read-only pages for operators (see docs/console.md)

``pin_workers = true`` (Linux, with ``workers`` above 1) keeps each worker's event
loop on a CPU of its own. The example is parsed and validated by
``tests/unit/test_config_example.py``.

Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from gateway.config.a2a import A2ASettings
from gateway.config.addresses import (
    ListenAddress,
)
from gateway.config.audit_checkpoints import AuditCheckpoints
from gateway.config.console import ConsoleSettings
from gateway.config.fields import Duration, FrozenTable
from gateway.config.identity import IdentitySettings
from gateway.config.mcp import McpSettings, McpUpstreamEntry
from gateway.config.metrics import MetricsSettings
from gateway.config.peers import PeerEntry
from gateway.config.plans import PlanSettings
from gateway.config.push import PushSettings
from gateway.config.tls import TlsSettings, WorkloadApiTls
from gateway.config.tracing import TracingSettings
from gateway.config.upstreams import UpstreamEntry
from gateway.errors import AgentConfigError
from gateway.local.toml_files import parse_toml_model, read_text
from gateway.postgres.dsn import StoreLocation, local_file
from policies.identity import SpiffeId


class AgentConfig(FrozenTable):
    """Everything one agent needs to run.

    Attributes:
        id: The agent's SPIFFE ID (must match its certificate).
        listen: Address to serve on, e.g. ``127.0.0.1:7001``: port 0..65535
            (0 picks one); an IPv6 host in brackets (``[::1]:7001``).
        tls: Certificate files, or the SPIFFE Workload API (``source``).
        policy: Policy file (grants and outbound rules).
        audit_db: SQLite file of the audit log, or a PostgreSQL DSN
            (``postgresql://...``): one table shared by many agents, one hash
            chain per agent id.
        audit_sync: ``full`` (default): every audit commit is fsynced, so a
            refusal's record survives power loss before the caller hears of
            it. ``normal``: it survives a crash of the agent process but not
            of the machine; refusals then cost about as much as allowed calls.
        state_dir: Folder for durable state (idempotency records, built-in stores).
        state_db: Where tasks, idempotency keys and the replay window live:
            unset (default) keeps SQLite files under ``state_dir``; a
            PostgreSQL DSN shares them between replicas of this agent id.
        modules: Python modules that register capabilities.
        module_dir: Folder the ``modules`` are also imported from, after
            the normal import path (default: the config file's folder, so a
            module beside the config needs no ``PYTHONPATH``).
        peers: Known peers.
        upstreams: Existing A2A agents whose skills this agent serves.
        mcp: Serve the capabilities as MCP tools (``[mcp]``; None: not served).
        mcp_upstreams: MCP servers whose tools this agent serves.
        audit_checkpoints: Signed checkpoints of the audit log's head.
        plans: How this agent runs plans (``[plans]``).
        a2a: How this agent serves A2A and keeps its tasks (``[a2a]``).
        identity: Bearer tokens accepted beside certificates (``[identity.tokens]``,
            off by default; ``gateway.config.identity``, docs/identity.md).
        push: A2A push notifications to the callers' webhooks (``[push]``).
        max_concurrent_calls: Calls the agent runs at once, all peers
            together (default 256); a call above it is refused ``SERVER_BUSY``
            before any parsing.
        idempotency_retention: How long a completed idempotency key keeps its
            answer (default ``"7d"``); afterwards it is purged (at start and
            hourly) and the key may be used afresh. Keys in doubt are never
            purged: they stay until an operator resolves or releases them.
        audit_retry_seconds: After the audit log fails closed (full disk,
            read-only file, lock held), try to reopen it this often; once a
            write succeeds it records (and health says SERVING) again. None:
            stay failed until restarted.
        metrics: Prometheus endpoint (None: no metrics, near-zero cost).
        tracing: Spans and OTLP export (None: no spans; traceparent still carried).
        console: The read-only operator console in the browser (None: off).
        workers: Serving processes on the one ``listen`` port (default 1);
            more than one share it with ``SO_REUSEPORT`` and share the policy
            file, the audit chain, the idempotency keys and the replay window
            (see :mod:`gateway.runtime.supervisor`).
        pin_workers: With ``workers > 1``, pin worker i's event-loop thread
            to the i-th CPU this process may use (modulo their count), so
            workers stop migrating between cores (less CPU per call; Linux
            only). For a machine or cpuset given to this agent: a pinned
            worker cannot move away from a core that something else keeps
            busy. Default false.
        replay_window_ids: Request ids the replay window (a fixed table,
            48 bytes of memory an id, taken as it fills) holds at once
            (default 2,097,152: ~3,500 new ids/s sustained over its 600 s).
            A full window refuses new calls ``STATE_UNAVAILABLE`` rather than
            forget an id within its window. With ``workers > 1`` the shared
            file is made anew at this size when the supervisor starts if it
            was another size (ids are reloaded from the audit log). Not used
            with a PostgreSQL ``state_db``.
    """

    id: SpiffeId
    listen: ListenAddress = "127.0.0.1:0"
    tls: TlsSettings
    policy: Path
    audit_db: StoreLocation
    audit_sync: Literal["full", "normal"] = "full"
    state_dir: Path
    state_db: StoreLocation | None = None
    modules: tuple[str, ...] = ("capabilities.builtin",)
    module_dir: Path | None = None
    peers: tuple[PeerEntry, ...] = ()
    upstreams: tuple[UpstreamEntry, ...] = ()
    mcp: McpSettings | None = None
    mcp_upstreams: tuple[McpUpstreamEntry, ...] = ()
    audit_checkpoints: AuditCheckpoints = AuditCheckpoints()
    plans: PlanSettings = PlanSettings()
    a2a: A2ASettings = A2ASettings()
    identity: IdentitySettings = IdentitySettings()
    push: PushSettings = PushSettings()
    idempotency_retention: Duration = timedelta(days=7)
    max_concurrent_calls: int = Field(default=256, ge=1, le=100_000)
    audit_retry_seconds: float | None = Field(default=2.0, gt=0)
    metrics: MetricsSettings | None = None
    tracing: TracingSettings | None = None
    console: ConsoleSettings | None = None
    workers: int = Field(default=1, ge=1, le=256)
    pin_workers: bool = False
    replay_window_ids: int = Field(default=1 << 21, ge=1024, le=1 << 26)

    @property
    def idempotency_store(self) -> Path:
        """The SQLite file of the agent's idempotency keys."""
        return self.state_dir / "idempotency.sqlite"

    @property
    def checkpoint_file(self) -> Path:
        """Where audit checkpoints go: ``audit_checkpoints.file`` or next to ``audit_db``."""
        configured = self.audit_checkpoints.file
        if configured is not None:
            return configured
        audit_file = local_file(self.audit_db)
        if audit_file is None:
            return self.state_dir / "audit.checkpoints.jsonl"
        return audit_file.with_name(audit_file.name + ".checkpoints.jsonl")

    @model_validator(mode="after")
    def _positive_retention(self) -> AgentConfig:
        if self.idempotency_retention <= timedelta(0):
            raise ValueError("idempotency_retention must be positive")
        return self

    @model_validator(mode="after")
    def _one_https_server(self) -> AgentConfig:
        if self.a2a.http_listen is not None and self.workers > 1:
            raise ValueError("a2a.http_listen is served by one process: set workers = 1")
        return self

    @model_validator(mode="after")
    def _single_use_tokens_one_process(self) -> AgentConfig:
        tokens = self.identity.tokens
        if tokens is not None and self.workers > 1:
            if any(issuer.single_use_jti for issuer in tokens.issuers):
                raise ValueError(
                    "identity.tokens: single_use_jti is remembered by one process: set workers = 1"
                )
        return self

    @model_validator(mode="after")
    def _unique_peers(self) -> AgentConfig:
        ids = [peer.id for peer in self.peers]
        if len(ids) != len(set(ids)):
            raise ValueError("peers: a peer id appears twice")
        names = [upstream.name for upstream in self.upstreams]
        if len(names) != len(set(names)):
            raise ValueError("upstreams: the same upstream appears twice")
        if self.id in names:
            raise ValueError("upstreams: an upstream cannot be this agent itself")
        capabilities = [skill.capability for up in self.upstreams for skill in up.skills]
        if len(capabilities) != len(set(capabilities)):
            raise ValueError("upstreams: a capability name appears twice in upstreams.skills")
        return self

    @model_validator(mode="after")
    def _unique_mcp_upstreams(self) -> AgentConfig:
        names = [entry.name for entry in self.mcp_upstreams]
        if len(names) != len(set(names)):
            raise ValueError("mcp_upstreams: a name appears twice")
        capabilities = [
            *(skill.capability for up in self.upstreams for skill in up.skills),
            *(tool.capability for up in self.mcp_upstreams for tool in up.tools),
        ]
        if len(capabilities) != len(set(capabilities)):
            raise ValueError(
                "mcp_upstreams: a capability name appears twice in mcp_upstreams.tools "
                "or upstreams.skills"
            )
        if self.mcp is not None and self.workers > 1 and self.mcp.port == 0:
            raise ValueError("mcp.listen: with workers > 1 the workers share a fixed port, not 0")
        return self

    def peer(self, peer_id: str) -> PeerEntry:
        """The configured peer ``peer_id``; AgentConfigError if unknown."""
        for entry in self.peers:
            if entry.id == peer_id:
                return entry
        raise AgentConfigError(f"peer {peer_id} is not in this agent's [[peers]]")

    def resolved(self, base: Path) -> AgentConfig:
        """A copy with every relative path made absolute against ``base``."""

        def fix(path: Path) -> Path:
            # Made absolute, symlinks kept: a policy or certificate that is a symlink
            # (a mounted ConfigMap or Secret: file -> ..data/file) is re-read through
            # the link, so an update that swaps ..data is seen; resolved here, the
            # agent would keep watching the old target after the update deleted it.
            return path if path.is_absolute() else Path(os.path.abspath(base / path))

        def fix_store(where: StoreLocation) -> StoreLocation:
            file = local_file(where)
            return where if file is None else fix(file)

        return self.model_copy(
            update={
                "tls": self.tls
                if isinstance(self.tls, WorkloadApiTls)
                else self.tls.model_copy(
                    update={
                        "ca": fix(self.tls.ca),
                        "cert": fix(self.tls.cert),
                        "key": fix(self.tls.key),
                    }
                ),
                "policy": fix(self.policy),
                "identity": self.identity.resolved(fix),
                "module_dir": base if self.module_dir is None else fix(self.module_dir),
                "audit_db": fix_store(self.audit_db),
                "state_db": None if self.state_db is None else fix_store(self.state_db),
                "state_dir": fix(self.state_dir),
                "push": self.push.model_copy(
                    update={"ca": None if self.push.ca is None else fix(self.push.ca)}
                ),
                "mcp_upstreams": tuple(_resolved_mcp(entry, fix) for entry in self.mcp_upstreams),
                "audit_checkpoints": self.audit_checkpoints.model_copy(
                    update={
                        "file": None
                        if self.audit_checkpoints.file is None
                        else fix(self.audit_checkpoints.file)
                    }
                ),
            }
        )


def _resolved_mcp(entry: McpUpstreamEntry, fix: Callable[[Path], Path]) -> McpUpstreamEntry:
    """``entry`` with its folder, stderr file and a command given as a relative path made
    absolute (a bare command name is still looked up on ``PATH``)."""
    command = entry.command
    if command is not None and "/" in command:
        command = str(fix(Path(command)))
    return entry.model_copy(
        update={
            "command": command,
            "cwd": None if entry.cwd is None else fix(entry.cwd),
            "stderr_file": None if entry.stderr_file is None else fix(entry.stderr_file),
        }
    )


def load_agent_config(path: Path) -> AgentConfig:
    """Read and validate an agent config file; raises AgentConfigError (file, key, why)."""
    text = read_text(path, "agent config", AgentConfigError)
    config, _ = parse_toml_model(AgentConfig, text, str(path), AgentConfigError)
    return config.resolved(path.parent.resolve())
