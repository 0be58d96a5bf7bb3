"""Agent configuration files (TOML), validated into frozen models.

Example::

    id = "spiffe://example.org/agent/alice"
    listen = "127.0.0.1:7001"
    policy = "alice-policy.toml"
    audit_db = "state/alice-audit.sqlite"
    state_dir = "state/alice"
    modules = ["capabilities.builtin"]

    [tls]
    ca = "pki/ca.pem"
    cert = "pki/alice.pem"
    key = "pki/alice.key"

    [[peers]]
    id = "spiffe://example.org/agent/bob"
    address = "127.0.0.1:7002"

    [audit_checkpoints]          # optional; these are the defaults
    enabled = true
    every_records = 1000
    every_seconds = 60
    # file = "state/alice-audit.sqlite.checkpoints.jsonl"

Top-level ``idempotency_retention = "7d"`` (default) sets how long completed
idempotency keys are kept.

Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from gateway.errors import AgentConfigError
from policies.identity import SpiffeId
from policies.policy_file import parse_toml_model, read_text

_DURATION = re.compile(r"([1-9][0-9]{0,8})([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _duration(value: object) -> object:
    if isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{value!r}: expected a positive number and a unit s, m, h or d")
        return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    return value


Duration = Annotated[timedelta, BeforeValidator(_duration)]
"""A positive span written like ``"30s"``, ``"10m"``, ``"2h"`` or ``"7d"``."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsFiles(_Frozen):
    """Paths of the agent's PEM files.

    Attributes:
        ca: Trust root used to verify peers.
        cert: The agent's certificate (its SPIFFE ID must equal the agent id).
        key: The agent's private key.
    """

    ca: Path
    cert: Path
    key: Path


class AuditCheckpoints(_Frozen):
    """Signed checkpoints of the audit chain head, written outside the database.

    Attributes:
        enabled: Write checkpoints (default). Without them a cut-off tail with
            a rewritten chain head goes unnoticed by ``audit verify``.
        every_records: Checkpoint after this many records since the last one.
        every_seconds: ...or after this long with records not yet covered.
        file: Append-only JSONL file; default ``<audit_db>.checkpoints.jsonl``.
    """

    enabled: bool = True
    every_records: int = Field(default=1000, ge=1)
    every_seconds: float = Field(default=60.0, gt=0)
    file: Path | None = None


class PeerEntry(_Frozen):
    """A peer this agent may call.

    Attributes:
        id: The peer's SPIFFE ID; its server certificate must carry it.
        address: ``host:port`` of its gateway.
    """

    id: SpiffeId
    address: str = Field(min_length=3)


class AgentConfig(_Frozen):
    """Everything one agent needs to run.

    Attributes:
        id: The agent's SPIFFE ID (must match its certificate).
        listen: Address to serve on, e.g. ``127.0.0.1:7001`` (port 0 picks one).
        tls: Certificate files.
        policy: Policy file (grants and outbound rules).
        audit_db: SQLite file of the audit log.
        audit_sync: ``full`` (default): every audit commit is fsynced, so a
            refusal's record survives power loss before the caller hears of
            it. ``normal``: it survives a crash of the agent process but not
            of the machine; refusals then cost about as much as allowed calls.
        state_dir: Folder for durable state (idempotency records, built-in stores).
        modules: Python modules that register capabilities.
        peers: Known peers.
        audit_checkpoints: Signed checkpoints of the audit log's head.
        idempotency_retention: How long a completed idempotency key keeps its
            answer (default ``"7d"``); afterwards it is purged (at start and
            hourly) and the key may be used afresh. Keys in doubt are never
            purged: they stay until an operator resolves or releases them.
    """

    id: SpiffeId
    listen: str = "127.0.0.1:0"
    tls: TlsFiles
    policy: Path
    audit_db: Path
    audit_sync: Literal["full", "normal"] = "full"
    state_dir: Path
    modules: tuple[str, ...] = ("capabilities.builtin",)
    peers: tuple[PeerEntry, ...] = ()
    audit_checkpoints: AuditCheckpoints = AuditCheckpoints()
    idempotency_retention: Duration = timedelta(days=7)

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
        return self.audit_db.with_name(self.audit_db.name + ".checkpoints.jsonl")

    @model_validator(mode="after")
    def _positive_retention(self) -> AgentConfig:
        if self.idempotency_retention <= timedelta(0):
            raise ValueError("idempotency_retention must be positive")
        return self

    @model_validator(mode="after")
    def _unique_peers(self) -> AgentConfig:
        ids = [peer.id for peer in self.peers]
        if len(ids) != len(set(ids)):
            raise ValueError("peers: a peer id appears twice")
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
            return path if path.is_absolute() else (base / path).resolve()

        return self.model_copy(
            update={
                "tls": TlsFiles(
                    ca=fix(self.tls.ca), cert=fix(self.tls.cert), key=fix(self.tls.key)
                ),
                "policy": fix(self.policy),
                "audit_db": fix(self.audit_db),
                "state_dir": fix(self.state_dir),
                "audit_checkpoints": self.audit_checkpoints.model_copy(
                    update={
                        "file": None
                        if self.audit_checkpoints.file is None
                        else fix(self.audit_checkpoints.file)
                    }
                ),
            }
        )


def load_agent_config(path: Path) -> AgentConfig:
    """Read and validate an agent config file; raises AgentConfigError (file, key, why)."""
    text = read_text(path, "agent config", AgentConfigError)
    config, _ = parse_toml_model(AgentConfig, text, str(path), AgentConfigError)
    return config.resolved(path.parent.resolve())
