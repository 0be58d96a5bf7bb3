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

    [a2a]                        # optional
    default_capability = "text.echo@^1"  # for A2A messages without a2agw.capability

    [audit_checkpoints]          # optional; these are the defaults
    enabled = true
    every_records = 1000
    every_seconds = 60
    # file = "state/alice-audit.sqlite.checkpoints.jsonl"

    [a2a]                        # optional
    http_listen = "127.0.0.1:7443"   # A2A JSON-RPC and HTTP+JSON over HTTPS (off when absent)
    task_retention = "7d"        # finished A2A tasks older than this are deleted (the default)
    v0_3_compat = true           # also serve A2A 0.3 clients, behind the same checks (the default)

    [metrics]                    # optional; off unless configured
    listen = "127.0.0.1:9464"    # Prometheus text format at /metrics
    peer_labels = false          # peer ids as labels (cardinality: off by default)

    [tracing]                    # optional
    enabled = true               # spans (trace ids are carried and audited regardless)
    otlp_endpoint = "127.0.0.1:4317"   # OTLP/gRPC export of spans when set
    console = false              # true: also print spans on stderr

    [console]                    # optional; off unless configured
    listen = "127.0.0.1:9465"    # read-only pages for operators (see docs/console.md)

Top-level ``idempotency_retention = "7d"`` (default) sets how long completed
idempotency keys are kept; ``max_concurrent_calls = 256`` (default) caps the
calls the agent runs at once, all peers together (per worker process);
``workers = 2`` runs two serving processes on the one port; ``pin_workers = true`` (Linux)
keeps each worker's event loop on a CPU of its own; ``replay_window_ids = 2097152``
(default) is how many request ids the replay window holds at once.

Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import ipaddress
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from capabilities.contract import CapabilityName, Risk, is_capability_name
from capabilities.schema_models import SchemaNotSupported, contract_model
from capabilities.versions import Version, VersionConstraint, VersionSyntaxError
from gateway.display import has_unsafe_characters
from gateway.errors import AgentConfigError
from gateway.host_port import DialAddress, ListenAddress, https_base_url_problem, split_host_port
from gateway.postgres.dsn import StoreLocation, local_file
from policies.identity import SpiffeId
from policies.policy_file import parse_toml_model, read_text

_DURATION = re.compile(r"([1-9][0-9]{0,8})([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _duration(value: object) -> object:
    if isinstance(value, str) and value.startswith("P"):
        return value  # ISO 8601, as model_dump_json writes a timedelta: pydantic parses it
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
    """Paths of the agent's PEM files (``[tls]``, ``source = "files"``, the default).

    Attributes:
        source: ``"files"``: certificate, key and CA come from these files.
        ca: Trust root used to verify peers.
        cert: The agent's certificate (its SPIFFE ID must equal the agent id).
        key: The agent's private key.
        expiry_warning: Warn (log line and stat) when the agent's own
            certificate expires within this span (default ``"7d"``): at start,
            on every reload and once a day. The files are re-read on SIGHUP
            and when they change; see ``gateway.transport.live_tls``.
    """

    source: Literal["files"] = "files"
    ca: Path
    cert: Path
    key: Path
    expiry_warning: Duration = timedelta(days=7)


_SOCKET_SCHEME = "unix://"


class WorkloadApiTls(_Frozen):
    """Identity from the SPIFFE Workload API (``[tls] source = "workload-api"``).

    The local SPIRE agent (or any Workload API server) pushes the agent's
    X.509-SVID and the trust bundles (its own trust domain's and federated
    ones); each update is checked and applied live, like a file rotation. See
    ``gateway.transport.workload_api`` and ``docs/spire.md``.

    Attributes:
        source: ``"workload-api"``.
        socket: The Workload API endpoint, ``unix:///path/to/agent.sock``.
            Unset: the ``SPIFFE_ENDPOINT_SOCKET`` environment variable, as
            the SPIFFE Workload API specification says.
        start_timeout: How long the agent waits at start for its first SVID
            (the SPIRE agent may still be attesting it); then it refuses to
            start.
        expiry_warning: Warn (log line and stat) when the SVID in force
            expires within this span (default ``"5m"``): SPIRE rotates an SVID
            at half its lifetime, so an SVID this close to its end means
            rotation has stopped.
    """

    source: Literal["workload-api"]
    socket: str | None = None
    start_timeout: float = Field(default=10.0, gt=0, le=600)
    expiry_warning: Duration = timedelta(minutes=5)

    @field_validator("socket")
    @classmethod
    def _unix_socket(cls, value: str | None) -> str | None:
        if value is not None:
            check_workload_api_socket(value)
        return value


def check_workload_api_socket(value: str) -> str:
    """``value`` if it is a ``unix:///absolute/path`` Workload API address.

    Raises:
        ValueError: another scheme (``tcp://`` is not supported here), or a
            relative or empty path.
    """
    if not value.startswith(_SOCKET_SCHEME) or not value[len(_SOCKET_SCHEME) :].startswith("/"):
        raise ValueError(
            f"{value!r}: expected unix:///absolute/path/to/agent.sock "
            "(the only Workload API address supported)"
        )
    return value


def _tls_source(value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("source", "files"))
    return str(getattr(value, "source", "files"))


TlsSettings = Annotated[
    Annotated[TlsFiles, Tag("files")] | Annotated[WorkloadApiTls, Tag("workload-api")],
    Discriminator(_tls_source),
]
"""``[tls]``: certificate files (default) or the SPIFFE Workload API."""


class AuditCheckpoints(_Frozen):
    """Signed checkpoints of the audit chain head, written outside the database.

    Attributes:
        enabled: Write checkpoints (default). Without them a cut-off tail with
            a rewritten chain head goes unnoticed by ``audit verify``.
        every_records: Checkpoint after this many records since the last one.
        every_seconds: ...or after this long with records not yet covered.
        file: Append-only JSONL file; default ``<audit_db>.checkpoints.jsonl``
            (``<state_dir>/audit.checkpoints.jsonl`` when ``audit_db`` is a DSN).
    """

    enabled: bool = True
    every_records: int = Field(default=1000, ge=1)
    every_seconds: float = Field(default=60.0, gt=0)
    file: Path | None = None


class PlanSettings(_Frozen):
    """How this agent runs plans.

    Attributes:
        approval_min_risk: Steps whose route has this risk or above wait for a
            person's approval (``a2a-gateway tasks --approve``) in every plan this
            agent runs, whatever the plan says (None: only plans that ask).
    """

    approval_min_risk: Risk | None = None


class A2ASettings(_Frozen):
    """How this agent serves A2A (``[a2a]``; the gRPC binding is always served).

    Attributes:
        http_listen: ``HOST:PORT`` serving the JSON-RPC and HTTP+JSON bindings
            over HTTPS (port 0 picks one). None (default): not served.
        http_url: ``https://NAME[:PORT]`` clients use, as the cards list it
            (default: ``https://HOST:PORT`` of ``http_listen`` as bound), for
            an agent that listens on ``0.0.0.0`` or behind a name.
        grpc_address: ``NAME:PORT`` clients use for the gRPC binding, as the
            cards list it (default: ``listen``'s host and the bound port), for
            an agent that listens on ``0.0.0.0`` or behind a name.
        default_capability: ``NAME`` or ``NAME@CONSTRAINT`` called for a
            SendMessage whose metadata names no capability (``a2agw.capability``),
            so a client that knows nothing of this gateway can still call the
            agent; the caller's grant decides as for any call. None: such a
            message is refused ``INVALID_REQUEST``.
        task_retention: Finished tasks (completed, failed, canceled) that last
            changed longer ago than this are deleted, at start and hourly
            (default ``"7d"``); ``GetTask`` then answers ``TASK_NOT_FOUND``.
            Unfinished tasks are never deleted.
        v0_3_compat: Also serve A2A 0.3 clients on the HTTP bindings (JSON-RPC
            ``message/send`` ..., REST ``/v1/...``), translated to 1.0 by the
            a2a-sdk's compat layer before the same servicer decides, and list
            the 0.3 interfaces (and v0.3 card fields) on the cards. Default
            True: most deployed A2A clients speak 0.3, and the translation
            adds no authority (docs/a2a-v0_3.md).
        stream_send_timeout: Seconds one write of an SSE stream may wait for
            its client to read (default 30, at most 3600): a stream whose client
            stops reading is ended then, so it holds no connection and buffer
            for longer (docs/a2a-http.md).
    """

    http_listen: ListenAddress | None = None
    http_url: str | None = None
    grpc_address: DialAddress | None = None
    default_capability: str | None = None
    task_retention: Duration = timedelta(days=7)
    v0_3_compat: bool = True
    stream_send_timeout: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)

    @field_validator("default_capability")
    @classmethod
    def _capability_and_constraint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if has_unsafe_characters(value) or value != value.strip():
            raise ValueError("default_capability holds whitespace or a control character")
        name, _, constraint = value.partition("@")
        if not is_capability_name(name):
            raise ValueError(f"default_capability: {name!r} is not a dotted lowercase name")
        try:
            VersionConstraint.parse(constraint)
        except VersionSyntaxError as err:
            raise ValueError(f"default_capability: version constraint: {err}") from err
        return value

    @model_validator(mode="after")
    def _positive_retention(self) -> A2ASettings:
        if self.task_retention <= timedelta(0):
            raise ValueError("task_retention must be positive")
        return self

    @field_validator("http_url")
    @classmethod
    def _https_url(cls, value: str | None) -> str | None:
        problem = None if value is None else https_base_url_problem(value)
        if problem is not None:
            raise ValueError(f"a2a.http_url {value!r}: expected https://NAME[:PORT] ({problem})")
        return value


class PeerEntry(_Frozen):
    """A peer this agent may call.

    Attributes:
        id: The peer's SPIFFE ID; its server certificate must carry it.
        address: ``host:port`` of its gateway.
    """

    id: SpiffeId
    address: DialAddress


_SKILL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


class UpstreamSkill(_Frozen):
    """One skill of an upstream A2A agent, served here as a local capability.

    Attributes:
        skill: The upstream's skill id (1-128 of ``A-Za-z0-9._:/-``); sent to it
            as message metadata ``a2agw.skill``.
        capability: The capability name it becomes here (e.g. ``legacy.echo``).
        version: That capability's ``MAJOR.MINOR.PATCH`` version.
        risk: ``read``, ``write`` or ``external``, as grants see it.
        timeout: Seconds one call may take, the upstream's answer included.
        idempotent: True if calling the skill twice with the same input is harmless.
        description: What it does, for peers (Describe, the A2A card).
        input_schema: JSON Schema (object, the subset of
            ``capabilities.schema_models``) of the input; the validated object is
            sent as one ``data`` part. Default: ``{"text": string}``, sent as
            one text part.
        output_schema: JSON Schema of the output, read from the answer's first
            ``data`` part. Default: ``{"text": string}``, the answer's text
            parts joined.
    """

    skill: str
    capability: CapabilityName
    version: str
    risk: Risk
    timeout: float = Field(gt=0, le=3600)
    idempotent: bool = False
    description: str = Field(default="", max_length=2000)
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None

    @field_validator("skill")
    @classmethod
    def _skill_id(cls, value: str) -> str:
        if not _SKILL_ID.fullmatch(value):
            raise ValueError("must be 1-128 characters of A-Za-z0-9._:/- (starting alphanumeric)")
        return value

    @field_validator("version")
    @classmethod
    def _semver(cls, value: str) -> str:
        try:
            Version.parse(value)
        except VersionSyntaxError as err:
            raise ValueError(str(err)) from err
        return value

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _supported_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            try:
                contract_model("Checked", value)
            except SchemaNotSupported as err:
                raise ValueError(f"unsupported JSON Schema: {err}") from err
        return value


class UpstreamEntry(_Frozen):
    """An existing A2A agent whose skills this agent serves as its own capabilities.

    Attributes:
        id: The upstream's SPIFFE ID: it is called over mTLS with this agent's
            certificate and must present a certificate for this ID. Omit only
            for plaintext to a loopback address.
        binding: ``grpc`` (``address``) or ``jsonrpc`` (``url``).
        address: ``host:port`` of its gRPC A2A service (binding ``grpc``).
        url: Its JSON-RPC endpoint, ``https://...`` (needs ``id``) or
            ``http://`` to a loopback address (binding ``jsonrpc``).
        skills: The skills served here (at least one).
        streaming: It serves ``SendStreamingMessage`` (gRPC server stream, or
            JSON-RPC over SSE): a call whose caller follows its A2A task
            (streamed or in the background) is streamed from it, its status
            texts and output chunks passed on as they come (default false:
            one message, its task polled to the end).
    """

    id: SpiffeId | None = None
    binding: Literal["grpc", "jsonrpc"] = "grpc"
    address: DialAddress | None = None
    url: str | None = Field(default=None, min_length=8, max_length=2000)
    skills: tuple[UpstreamSkill, ...] = Field(min_length=1)
    streaming: bool = False

    @property
    def name(self) -> str:
        """How logs and audit details name it: its SPIFFE ID, else its address or URL."""
        return self.id or self.address or self.url or ""

    @property
    def plaintext(self) -> bool:
        """True when calls to it are not protected by TLS (loopback only)."""
        return self.id is None

    @model_validator(mode="after")
    def _consistent(self) -> UpstreamEntry:
        if self.binding == "grpc":
            if self.address is None or self.url is not None:
                raise ValueError("binding grpc takes address (host:port), not url")
            host = self.address.rsplit(":", 1)[0].strip("[]")
            if self.id is None and not _is_loopback(host):
                raise ValueError("id: required unless address is a loopback IP (plaintext)")
        else:
            if self.url is None or self.address is not None:
                raise ValueError("binding jsonrpc takes url, not address")
            self._check_url(self.url)
        skills = [entry.skill for entry in self.skills]
        if len(skills) != len(set(skills)):
            raise ValueError("skills: a skill id appears twice")
        return self

    def _check_url(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url: must be http:// or https:// with a host")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError("url: no credentials, query or fragment")
        if parts.scheme == "https" and self.id is None:
            raise ValueError("id: required for an https url (the server's identity is checked)")
        if parts.scheme == "http":
            if self.id is not None:
                raise ValueError("url: http:// cannot prove the id; use https:// or omit id")
            if not _is_loopback(parts.hostname):
                raise ValueError("url: plaintext http:// only to a loopback IP")


class MetricsSettings(_Frozen):
    """The Prometheus endpoint of an agent (``[metrics]``; absent: no metrics at all).

    Attributes:
        listen: ``host:port`` serving the Prometheus text format at ``/metrics``.
            Must be a loopback IP literal unless ``allow_remote`` is true.
        peer_labels: Add the caller's SPIFFE ID as a ``peer`` label to the
            decision and duration metrics. Off by default: one series per peer
            and capability grows without bound with the number of peers.
        allow_remote: Permit a non-loopback ``listen`` (metrics show which
            capabilities are used and how often; keep them off open networks).
    """

    listen: ListenAddress = "127.0.0.1:9464"
    peer_labels: bool = False
    allow_remote: bool = False

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> MetricsSettings:
        host = self.listen.rpartition(":")[0]
        if not self.allow_remote and not _is_loopback(host.strip("[]")):
            raise ValueError(
                f"metrics.listen {self.listen!r} is not a loopback address; "
                "set metrics.allow_remote = true to serve metrics beyond this machine"
            )
        return self


class TracingSettings(_Frozen):
    """Spans of an agent (``[tracing]``).

    Without this section (or with ``enabled = false``) no span is recorded,
    but an incoming W3C ``traceparent`` is still carried to the next hop and
    its trace id stored in the audit log.

    Attributes:
        enabled: Record spans (the trace id of a call without an incoming
            ``traceparent`` is then new and stored in its audit record).
        sample_ratio: Share of new traces whose spans are recorded (0..1,
            default 1). A call that arrives with a ``traceparent`` follows
            the caller's sampling decision. Unsampled calls still get a trace
            id, carried to the next hop and stored in the audit record.
        otlp_endpoint: ``host:port`` of an OTLP/gRPC collector; spans are
            exported there in batches when set.
        otlp_insecure: Send OTLP without TLS (a collector on this machine).
        console: Also print each recorded span as one line on stderr, for
            people without a collector (default false).
    """

    enabled: bool = True
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    otlp_endpoint: str | None = None
    otlp_insecure: bool = True
    console: bool = False

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:  # the exporter also takes http://host:port
            split_host_port(re.sub(r"^https?://", "", value).rstrip("/"), lowest_port=1)
        return value


class ConsoleSettings(_Frozen):
    """The read-only operator console in the browser (``[console]``; absent: off).

    Attributes:
        listen: ``host:port`` of its HTTP listener (port 0 picks one). Must be
            a loopback IP literal unless ``allow_remote`` is true.
        allow_remote: Serve beyond this machine. Then the listener speaks
            TLS with the agent's certificate and requires a client
            certificate from the agent's CA whose SPIFFE ID is in ``operators``.
        operators: SPIFFE IDs allowed to open the console remotely (required
            with ``allow_remote``; meaningless without it, so refused there).
    """

    listen: ListenAddress = "127.0.0.1:9465"
    allow_remote: bool = False
    operators: tuple[SpiffeId, ...] = ()

    @model_validator(mode="after")
    def _loopback_unless_operators(self) -> ConsoleSettings:
        host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"console.listen {self.listen!r}: expected host:port")
        if self.allow_remote and not self.operators:
            raise ValueError(
                "console.allow_remote needs console.operators: the SPIFFE IDs whose client "
                "certificates may open it"
            )
        if not self.allow_remote and self.operators:
            raise ValueError("console.operators only apply with console.allow_remote = true")
        if not self.allow_remote and not _is_loopback(host.strip("[]")):
            raise ValueError(
                f"console.listen {self.listen!r} is not a loopback address; set "
                "console.allow_remote = true (and console.operators) to serve it remotely"
            )
        return self


def _is_loopback(host: str) -> bool:
    # IP literals only: a name such as "localhost" is whatever the resolver says.
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AgentConfig(_Frozen):
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
        audit_checkpoints: Signed checkpoints of the audit log's head.
        plans: How this agent runs plans (``[plans]``).
        a2a: How this agent serves A2A and keeps its tasks (``[a2a]``).
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
            (see :mod:`gateway.supervisor`).
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
    audit_checkpoints: AuditCheckpoints = AuditCheckpoints()
    plans: PlanSettings = PlanSettings()
    a2a: A2ASettings = A2ASettings()
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
                "module_dir": base if self.module_dir is None else fix(self.module_dir),
                "audit_db": fix_store(self.audit_db),
                "state_db": None if self.state_db is None else fix_store(self.state_db),
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
