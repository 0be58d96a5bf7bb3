"""The agent's identity from the SPIFFE Workload API (a local SPIRE agent).

``[tls] source = "workload-api"``: the X.509-SVID carrying the agent's ``id``
and the trust bundles (the agent's own trust domain first, then every
federated one) come from the Workload API on a unix socket, and every update
it pushes is offered to :class:`~gateway.transport.live_tls.LiveTls`, which
applies the same checks and the same "keep the old set on a bad update" rule
as a file rotation.

Invariants:
- The agent does not start without a first SVID that passes the checks
  (waiting up to ``start_timeout`` for it: the SPIRE agent may still be
  attesting the workload).
- The Workload API lost later: the agent keeps serving with the last good
  SVID, logs that it did, and reconnects with a growing pause (at most
  ``_MAX_BACKOFF_SECONDS``). Once that SVID expires the health check
  ``own certificate`` fails (``NOT_SERVING``) and one log line says why.
- Only the SVID whose SPIFFE ID is the agent's ``id`` is used, whatever
  else the workload is entitled to.

py-spiffe's client streams on a thread of its own; its callbacks only hand
the update to the event loop, where everything else happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from spiffe import WorkloadApiClient
from spiffe.errors import PySpiffeError
from spiffe.workloadapi.workload_api_client import StreamCancelHandler
from spiffe.workloadapi.x509_context import X509Context

from gateway.config import WorkloadApiTls, check_workload_api_socket
from gateway.errors import AgentConfigError, ConfigError
from gateway.runtime.stopping import cancel_and_wait
from gateway.transport.live_tls import LiveTls
from gateway.transport.tls import TlsMaterial
from policies.identity import svid_dns_name, trust_domain_of

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

SOCKET_ENV = "SPIFFE_ENDPOINT_SOCKET"
"""The environment variable the SPIFFE Workload API specification names for the socket."""

_START_RETRY_SECONDS = 0.5
_MAX_BACKOFF_SECONDS = 5.0
_SUPERVISE_EVERY_SECONDS = 1.0


def workload_api_socket(configured: str | None) -> str:
    """The Workload API address: ``[tls] socket``, else ``$SPIFFE_ENDPOINT_SOCKET``.

    Raises:
        AgentConfigError: neither is set, or the address is not ``unix:///path``.
    """
    value = configured or os.environ.get(SOCKET_ENV, "")
    if not value:
        raise AgentConfigError(
            f'[tls] source = "workload-api" needs socket = "unix:///path/to/agent.sock" '
            f"or the {SOCKET_ENV} environment variable"
        )
    try:
        return check_workload_api_socket(value)
    except ValueError as err:
        raise AgentConfigError(f"Workload API socket {err}") from err


def fetch_material(socket: str, agent_id: str, timeout: float) -> TlsMaterial:
    """One answer of the Workload API at ``socket``, taken as the agent takes it.

    Raises:
        PySpiffeError: the Workload API did not answer within ``timeout``.
        ConfigError: it answered without an SVID for ``agent_id``.
    """
    with WorkloadApiClient(socket, default_timeout=timeout) as client:
        return material_from_context(client.fetch_x509_context(), agent_id)


def material_from_context(context: X509Context, agent_id: str) -> TlsMaterial:
    """The agent's SVID (the one for ``agent_id``) and every bundle, as PEM.

    Several registration entries may give the workload SVIDs of ``agent_id``
    (in an order that varies): the first that carries the DNS name derived from
    it is taken (gRPC clients that verify only a host name need it), else the
    first; either serves, since clients pin the URI SAN.

    Raises:
        ConfigError: the update holds no SVID for ``agent_id`` (names those it holds).
    """
    mine = [svid for svid in context.x509_svids if str(svid.spiffe_id) == agent_id]
    if not mine:
        held = ", ".join(sorted({str(svid.spiffe_id) for svid in context.x509_svids})) or "none"
        raise ConfigError(
            f"the Workload API holds no SVID for {agent_id} (it holds: {held}); "
            "check the SPIRE registration entry's SPIFFE ID and selectors"
        )
    name = svid_dns_name(agent_id)
    svid = next((svid for svid in mine if _carries_dns_name(svid.leaf, name)), mine[0])
    cert_pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in svid.cert_chain)
    key_pem = svid.private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    own = trust_domain_of(agent_id)
    bundles = sorted(
        (
            (bundle.trust_domain.name, _bundle_pem(bundle.x509_authorities))
            for bundle in context.x509_bundle_set.bundles
        ),
        key=lambda item: (item[0] != own, item[0]),  # own trust domain first
    )
    return TlsMaterial(
        ca_pem=b"".join(pem for _, pem in bundles),
        cert_pem=cert_pem,
        key_pem=key_pem,
        bundles=tuple(bundles),
    )


def _carries_dns_name(leaf: x509.Certificate, name: str) -> bool:
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (x509.ExtensionNotFound, ValueError):
        return False
    return name in san.get_values_for_type(x509.DNSName)


def _bundle_pem(authorities: Iterable[x509.Certificate]) -> bytes:
    certificates = sorted(authorities, key=lambda c: c.serial_number)  # a stable order
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


class WorkloadApiFeed:
    """The Workload API connection of one agent: the first SVID, then a live stream.

    Args:
        agent_id: The SPIFFE ID the SVID must carry.
        settings: ``[tls]`` with ``source = "workload-api"``.

    Raises:
        AgentConfigError: no socket configured, the Workload API unreachable,
            or no SVID for ``agent_id`` within ``settings.start_timeout``.
    """

    def __init__(self, agent_id: str, settings: WorkloadApiTls) -> None:
        self._agent_id = agent_id
        self.socket = workload_api_socket(settings.socket)
        self.first = self._first_material(settings.start_timeout)
        """The first SVID and bundles (checked again by :class:`LiveTls`)."""
        self.connected = True
        """False from a broken stream until the next update arrives."""
        self._live: LiveTls | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stream: tuple[WorkloadApiClient, StreamCancelHandler] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._backoff = _START_RETRY_SECONDS
        self._retry_at = 0.0
        self._said_expired = False
        self._generation = 0

    def _first_material(self, timeout: float) -> TlsMaterial:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._fetch_once(max(0.1, deadline - time.monotonic()))
            except (PySpiffeError, ConfigError) as err:
                problem = err.message if isinstance(err, ConfigError) else str(err)
                if time.monotonic() + _START_RETRY_SECONDS >= deadline:
                    raise AgentConfigError(
                        f"no identity from the Workload API at {self.socket} "
                        f"within {timeout:g}s: {problem}"
                    ) from err
            time.sleep(_START_RETRY_SECONDS)

    def _fetch_once(self, timeout: float) -> TlsMaterial:
        return fetch_material(self.socket, self._agent_id, timeout)

    def start(self, live: LiveTls) -> None:
        """Stream updates into ``live`` (from the event loop the agent runs on)."""
        self._live = live
        self._loop = asyncio.get_running_loop()
        self._open_stream()
        self._supervisor = asyncio.create_task(self._supervise())

    async def stop(self) -> None:
        """Stop streaming and close the connection."""
        if self._supervisor is not None:
            await cancel_and_wait(self._supervisor)
            self._supervisor = None
        self._close_stream()

    def _open_stream(self) -> None:
        self._close_stream()
        try:
            client = WorkloadApiClient(self.socket)
        except PySpiffeError as err:  # the socket file is gone: try again later
            self._broken(err)
            return
        self._generation += 1
        handler = client.stream_x509_contexts(
            on_success=self._from_thread(self._updated, self._generation),
            on_error=self._from_thread(self._broken, self._generation),
            retry_connect=False,  # reconnecting is ours, so a lost API is seen and logged
        )
        self._stream = (client, handler)

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            client, handler = stream
            handler.cancel()
            client.close()

    def _from_thread(self, callback: Callable[[_T], None], generation: int) -> Callable[[_T], None]:
        loop = self._loop
        assert loop is not None

        def current(value: _T) -> None:
            # A closed stream's last words, queued before it closed, are not news.
            if generation == self._generation and self._stream is not None:
                callback(value)

        def hand_over(value: _T) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(current, value)

        return hand_over

    def _updated(self, context: X509Context) -> None:
        live = self._live
        assert live is not None
        if not self.connected:
            _log.warning("Workload API at %s reachable again", self.socket)
        self.connected, self._backoff, self._said_expired = True, _START_RETRY_SECONDS, False
        live.offer(lambda: material_from_context(context, self._agent_id))

    def _broken(self, err: Exception) -> None:
        live = self._live
        assert live is not None
        if self.connected:
            facts = live.facts
            _log.error(
                "Workload API at %s lost (%s): keeping SVID serial %x until it expires at %s; "
                "health NOT_SERVING after that",
                self.socket,
                err,
                facts.serial,
                facts.not_after.isoformat(),
            )
        self.connected = False
        self._close_stream()
        self._schedule_retry()

    def _schedule_retry(self) -> None:
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, _MAX_BACKOFF_SECONDS)

    async def _supervise(self) -> None:
        live = self._live
        assert live is not None
        while True:
            await asyncio.sleep(_SUPERVISE_EVERY_SECONDS)
            try:
                if not self.connected and self._stream is None:
                    if time.monotonic() >= self._retry_at:
                        self._open_stream()
                live.warn_if_expiring(once=True)
                self._say_if_expired(live)
            except Exception:  # never let one bad round stop reconnecting
                _log.exception("Workload API watch failed a round; trying again")

    def _say_if_expired(self, live: LiveTls) -> None:
        if self.connected or self._said_expired or live.valid_now():
            return
        self._said_expired = True
        facts = live.facts
        _log.error(
            "own SVID serial %x expired at %s and the Workload API at %s is unreachable: "
            "NOT_SERVING until it delivers a new SVID",
            facts.serial,
            facts.not_after.isoformat(),
            self.socket,
        )
