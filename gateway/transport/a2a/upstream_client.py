"""Calling a skill of an upstream A2A agent and reading its answer.

This is the boundary where a2a-sdk, gRPC and httpx failures are translated:

* not reachable (connection refused or lost, TLS handshake failed, the server
  not holding a certificate for the upstream's SPIFFE ID) -> ``UpstreamUnavailable``
  (PEER_UNAVAILABLE; the audit detail names the cause);
* an answer that is not A2A (undecodable, an unknown payload) -> ``None``,
  which the capability's output check reports as INVALID_OUTPUT;
* anything else the upstream answered (an A2A error, a task that failed, was
  rejected or wants more input) -> ``UpstreamFailed``, a plain exception the
  capability runner reports as CAPABILITY_FAILED.

Timeouts are the capability runner's (CAPABILITY_TIMEOUT): the SDK's own
deadline is set a little later, so the cancellation comes from the runner.
"""

from __future__ import annotations

import json
import logging
import ssl
import uuid
from collections.abc import Sequence

import grpc
import httpx
from a2a.client import ClientCallContext
from a2a.types import Message, Part, Role, SendMessageRequest, StreamResponse, TaskState
from google.protobuf import json_format

from gateway.config import TlsSettings, UpstreamEntry
from gateway.errors import PeerIdentityMismatch, PeerUnavailable, UpstreamUnavailable
from gateway.transport.a2a.upstream_links import UpstreamLink, open_link
from gateway.transport.status import from_rpc_error
from gateway.transport.tls import TlsMaterial

_log = logging.getLogger(__name__)

SKILL_METADATA_KEY = "a2agw.skill"
"""Message metadata key carrying the upstream skill id (the only metadata sent)."""

SDK_DEADLINE_MARGIN_SECONDS = 1.0
"""The SDK call's own deadline trails the capability timeout by this much."""


class UpstreamFailed(Exception):
    """The upstream answered, but not with a completed result (never payload content)."""


class UpstreamClient:
    """One reused a2a-sdk client to one upstream; the connection opens on first use."""

    def __init__(self, entry: UpstreamEntry, tls: TlsMaterial, files: TlsSettings) -> None:
        self.entry = entry
        self._tls = tls
        self._files = files
        self._link: UpstreamLink | None = None

    @property
    def name(self) -> str:
        """The upstream's name (SPIFFE ID, else address or URL)."""
        return self.entry.name

    async def send(self, skill: str, parts: Sequence[Part], *, timeout: float) -> list[Part] | None:
        """Send one message to ``skill``; the answer's parts (None: no readable answer).

        Raises:
            UpstreamUnavailable: the upstream could not be reached (as the identity
                it must have).
            UpstreamFailed: it answered with an error or an unfinished/failed task.
        """
        if self._link is None:
            self._link = open_link(self.entry, self._tls, self._files)
        request = SendMessageRequest(
            message=Message(
                message_id=uuid.uuid4().hex,
                role=Role.ROLE_USER,
                parts=list(parts),
                metadata={SKILL_METADATA_KEY: skill},
            )
        )
        context = ClientCallContext(timeout=timeout + SDK_DEADLINE_MARGIN_SECONDS)
        try:
            async for event in self._link.client.send_message(request, context=context):
                return answer_parts(event)
        except UpstreamFailed:
            raise
        except Exception as err:
            if _undecodable(err):
                _log.warning("upstream %s sent an answer that is not A2A", self.name)
                return None
            raise self._translated(err) from err
        return None

    def _translated(self, err: Exception) -> Exception:
        unreachable = unreachable_cause(err)
        if unreachable is None:
            _log.warning("upstream %s answered %s", self.name, type(err).__name__)
            return UpstreamFailed(f"the upstream answered {type(err).__name__}")
        _log.warning("upstream %s unreachable: %s", self.name, unreachable)
        return UpstreamUnavailable(
            "the A2A agent behind this capability could not be reached",
            upstream=self.name,
            detail=unreachable,
        )

    def use_tls(self, tls: TlsMaterial) -> UpstreamLink | None:
        """Open later connections with ``tls`` (a rotated certificate).

        Returns the current connection, now detached, for the caller to close
        once the calls on it have had time to finish; the next call opens a
        new one.
        """
        self._tls = tls
        link, self._link = self._link, None
        return link

    async def close(self) -> None:
        """Close the connection (a later call would open a new one)."""
        link, self._link = self._link, None
        if link is not None:
            await link.aclose()


def answer_parts(event: StreamResponse) -> list[Part] | None:
    """The parts holding the answer: a message's, or a completed task's artifacts'
    (its status message's if it has no artifacts). None if the event is neither.

    Raises:
        UpstreamFailed: the task did not complete (failed, rejected, cancelled,
            waiting for input or authentication, still running).
    """
    kind = event.WhichOneof("payload")
    if kind == "message":
        return list(event.message.parts)
    if kind == "task":
        task = event.task
        if task.status.state != TaskState.TASK_STATE_COMPLETED:
            raise UpstreamFailed(f"upstream task ended {TaskState.Name(task.status.state)}")
        parts = [part for artifact in task.artifacts for part in artifact.parts]
        return parts or list(task.status.message.parts)
    return None


def unreachable_cause(err: BaseException) -> str | None:
    """Why ``err`` means the upstream was not reached (a reason code), or None."""
    chain = _chain(err)
    for cause in chain:
        if isinstance(cause, grpc.RpcError):
            mapped = from_rpc_error(cause)
            if isinstance(mapped, PeerIdentityMismatch):
                return PeerIdentityMismatch.reason
            return PeerUnavailable.reason if isinstance(mapped, PeerUnavailable) else None
        if isinstance(cause, ssl.SSLCertVerificationError):
            wrong_name = "hostname" in (cause.verify_message or "").lower()
            return PeerIdentityMismatch.reason if wrong_name else PeerUnavailable.reason
    # Connection refused, reset or closed without an answer; not a slow answer
    # (that is the runner's CAPABILITY_TIMEOUT).
    if any(
        isinstance(c, httpx.TransportError) and not isinstance(c, httpx.ReadTimeout) for c in chain
    ):
        return PeerUnavailable.reason
    return None


def _undecodable(err: BaseException) -> bool:
    undecodable = json.JSONDecodeError | httpx.DecodingError | json_format.ParseError
    return any(isinstance(c, undecodable) for c in _chain(err))


def _chain(err: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
