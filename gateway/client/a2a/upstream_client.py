"""Calling a skill of an upstream A2A agent and reading its answer.

This is the boundary where a2a-sdk, gRPC and httpx failures are translated:

* not reachable (connection refused, TLS handshake failed, the server not
  holding a certificate for the upstream's SPIFFE ID: nothing was sent), or
  ``UNAVAILABLE``/the connection lost once the call may have been sent ->
  ``UpstreamUnavailable`` (PEER_UNAVAILABLE; the audit detail says which,
  decided from the connection, never from the upstream's words: see
  ``upstream_reach``);
* an answer that is not A2A (undecodable bytes, over the size ceiling, not a
  JSON-RPC response, an unknown payload) -> ``None``, which the capability's
  output check reports as INVALID_OUTPUT;
* anything else the upstream answered (an A2A error, any other status, a task
  that failed, was rejected or was cancelled) -> ``UpstreamFailed``, a plain
  exception the capability runner reports as CAPABILITY_FAILED.

A task waiting for its caller (``INPUT_REQUIRED``/``AUTH_REQUIRED``) is an
answer: the capability passes the question on, or gives the task up
(:meth:`UpstreamClient.abandon`). One :class:`Conversation` carries a
caller's messages to one upstream task, with the ids ``upstream_ids`` chooses.

The gateway's own errors raised while the answer is passed on (a streamed
chunk over the caller's cap: ``OutputTooLarge``) are not the upstream's
answer: they pass through unchanged, and the runner reports them as for a
local capability (CAPABILITY_FAILED, the audit detail their reason).

Timeouts are the capability runner's (CAPABILITY_TIMEOUT): the SDK's own
deadline is set a little later, so the cancellation comes from the runner.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from a2a.client import ClientCallContext
from a2a.types import Role, SendMessageRequest, StreamResponse, TaskState
from google.protobuf import json_format

from capabilities.context import CallEvents
from capabilities.parts import Part
from gateway.client.a2a.upstream_answers import UnreadableAnswer
from gateway.client.a2a.upstream_ids import UpstreamIds
from gateway.client.a2a.upstream_links import UpstreamLink, client_tls_context, open_link
from gateway.client.a2a.upstream_parts import fill_wire_part
from gateway.client.a2a.upstream_reach import (
    exception_chain,
    grpc_cause,
    http_cause,
    identity_cause,
)
from gateway.client.a2a.upstream_replies import ASKS, UpstreamAnswer
from gateway.client.a2a.upstream_tasks import (
    Abandon,
    StreamedTask,
    UpstreamCancels,
    followed,
    streamed,
)
from gateway.client.handshake import ServerIdentity, channel_connected, probe_server_identity
from gateway.client.spiffe_relay import SpiffeRelay
from gateway.config import TlsSettings, UpstreamEntry
from gateway.errors import GatewayError, UpstreamUnavailable
from gateway.transport.tls import TlsMaterial

_log = logging.getLogger(__name__)

SKILL_METADATA_KEY = "a2agw.skill"
"""Message metadata key carrying the upstream skill id (the only metadata sent)."""

SDK_DEADLINE_MARGIN_SECONDS = 1.0
"""The SDK call's own deadline trails the capability timeout by this much."""


class UpstreamFailed(Exception):
    """The upstream answered, but not with a result (never payload content)."""


@dataclass(slots=True)
class Conversation:
    """One caller's messages to one upstream task (a first message and its follow-ups).

    Attributes:
        abandon: How the call gives up on the upstream task (once, until its time ends).
        caller: The caller's SPIFFE ID ("" for none: ids are then not remembered).
        context_id: The caller's context id ("" for none).
        task_id: The upstream task the next message continues ("" for a new one).
        task_context: That task's context, as the upstream named it.
        seen: What the conversation's streams collected.
    """

    abandon: Abandon
    caller: str = ""
    context_id: str = ""
    task_id: str = ""
    task_context: str = ""
    seen: StreamedTask = field(default_factory=StreamedTask)


class UpstreamClient:
    """One reused a2a-sdk client to one upstream; the connection opens on first use."""

    def __init__(self, entry: UpstreamEntry, tls: TlsMaterial, files: TlsSettings) -> None:
        self.entry = entry
        self._tls = tls
        self._files = files
        self._link: UpstreamLink | None = None
        self._relay: SpiffeRelay | None = None
        self._switching = asyncio.Lock()
        self._cancels = UpstreamCancels()
        self._ids = UpstreamIds()

    @property
    def name(self) -> str:
        """The upstream's name (SPIFFE ID, else address or URL)."""
        return self.entry.name

    def conversation(self, timeout: float, caller: str = "", context_id: str = "") -> Conversation:
        """A new conversation of ``caller`` (in its context ``context_id``), its time
        ending ``timeout`` seconds from now (the capability's)."""
        until = asyncio.get_running_loop().time() + timeout
        return Conversation(Abandon(self._cancels, until), caller, context_id)

    async def send(
        self,
        skill: str,
        parts: Sequence[Part],
        *,
        timeout: float,
        events: CallEvents | None = None,
        conversation: Conversation | None = None,
        message_id: str = "",
        text_chunks: bool = False,
    ) -> UpstreamAnswer | None:
        """Send one message to ``skill``; the upstream's answer (None: no readable answer).

        The answer is a Message, a completed task, or a task that waits for its
        caller; ``conversation`` (one made here if None) then continues that
        task with its next message. Sent with ``return_immediately``: a task
        the upstream is still running is followed until it ends or waits
        (polled, its status texts passed to ``events`` as progress, cancelled
        upstream if this call is cancelled, times out or fails). With
        ``streaming = true`` and ``events`` (the caller follows its task) it is
        streamed instead, events passed on as they come (text chunks as text
        with ``text_chunks``); see ``upstream_tasks``.

        Raises:
            UpstreamUnavailable: the upstream could not be reached as the identity
                it must have (nothing was sent), or answered UNAVAILABLE or was
                lost once the call may have been sent; the detail says which.
            UpstreamFailed: it answered with an error, or a task that failed, was
                rejected or cancelled, or did not say how it ends.
            GatewayError: raised by ``events`` (a chunk over the caller's cap), unchanged.
        """
        # Before any await: the runner's timeout for this call ends about now + timeout.
        talk = conversation if conversation is not None else self.conversation(timeout)
        streams = events is not None and self.entry.streaming
        link = await self._connected_link(timeout, streams=streams)
        request = self._request(talk, skill, parts, message_id)
        context = ClientCallContext(timeout=timeout + SDK_DEADLINE_MARGIN_SECONDS)
        progress = None if events is None else events.progress
        event: StreamResponse | None = None
        try:
            if link.streaming is not None and events is not None:
                event = await streamed(
                    link.streaming,
                    request,
                    events,
                    context,
                    talk.abandon,
                    seen=talk.seen,
                    text_chunks=text_chunks,
                )
            elif link.sends is not None:  # gRPC: the one call without the SDK client
                first = await link.sends.send(request, timeout + SDK_DEADLINE_MARGIN_SECONDS)
                event = await followed(
                    link.client, first, progress, timeout, talk.abandon, talk.task_id
                )
            else:
                async for first in link.client.send_message(request, context=context):
                    event = await followed(
                        link.client, first, progress, timeout, talk.abandon, talk.task_id
                    )
                    break
        except (UpstreamFailed, GatewayError):  # GatewayError: ours, e.g. OutputTooLarge
            raise
        except Exception as err:
            if _undecodable(err):
                _log.warning("upstream %s sent an answer that is not A2A", self.name)
                return None
            raise self._translated(err) from err
        return None if event is None else self._settled(talk, event)

    def _request(
        self, talk: Conversation, skill: str, parts: Sequence[Part], message_id: str
    ) -> SendMessageRequest:
        """The request carrying ``parts`` (built in place: a built message would be copied)."""
        request = SendMessageRequest()
        message = request.message
        message.message_id = self._ids.message_id(talk.caller, message_id)
        message.role = Role.ROLE_USER
        if talk.task_id:
            message.task_id = talk.task_id
        context_id = talk.task_context or self._ids.context_id(talk.caller, talk.context_id)
        if context_id:
            message.context_id = context_id
        for part in parts:
            fill_wire_part(message.parts.add(), part)
        message.metadata[SKILL_METADATA_KEY] = skill
        request.configuration.return_immediately = True
        return request

    def _settled(self, talk: Conversation, event: StreamResponse) -> UpstreamAnswer | None:
        """``event`` as the answer, ``talk`` ready for a follow-up if its task waits.

        Raises:
            UpstreamFailed: a task that did not complete and does not wait.
        """
        answer = UpstreamAnswer(event)
        kind = event.WhichOneof("payload")
        if kind not in ("message", "task"):
            return None
        self._ids.remember_context(talk.caller, talk.context_id, answer.context_id)
        if kind == "task":
            state = event.task.status.state
            waits = state in ASKS
            talk.task_id = answer.task_id if waits else ""  # the one task a follow-up continues
            if waits:
                talk.task_context = answer.context_id
            elif state != TaskState.TASK_STATE_COMPLETED:
                raise UpstreamFailed(f"upstream task ended {TaskState.Name(state)}")
        return answer

    async def abandon(self, conversation: Conversation, ended_by: BaseException | None) -> None:
        """Give up on the conversation's upstream task (cancelled upstream, once), the
        call being left by ``ended_by`` (None: it goes on, without that task)."""
        if not conversation.task_id or self._link is None:
            return
        client = self._link.client
        if ended_by is None:
            conversation.abandon.start(client, conversation.task_id)
        else:
            await conversation.abandon.task(client, conversation.task_id, ended_by)

    def _translated(self, err: Exception) -> Exception:
        cause = grpc_cause(err) if self.entry.binding == "grpc" else http_cause(err)
        if cause is None:
            _log.warning("upstream %s answered %s", self.name, type(err).__name__)
            return UpstreamFailed(f"the upstream answered {type(err).__name__}")
        return self._unreachable(cause)

    def _unreachable(self, cause: str) -> UpstreamUnavailable:
        _log.warning("upstream %s unreachable: %s", self.name, cause)
        return UpstreamUnavailable(
            "the A2A agent behind this capability could not be reached",
            upstream=self.name,
            detail=cause,
        )

    async def _connected_link(self, timeout: float, *, streams: bool = False) -> UpstreamLink:
        """The link, the gRPC channel the call goes on READY (a JSON-RPC link connects
        per request): the SDK client's for a stream, else the one of ``link.sends``.

        A channel that cannot connect to an upstream whose certificate holds its
        SPIFFE ID without the derived DNS name is replaced, once, by one
        through a relay that pins the URI SAN.

        Raises:
            UpstreamUnavailable: it could not connect (nothing was sent).
        """
        loop = asyncio.get_running_loop()
        started, relayed = loop.time(), self._relay is not None
        if self._link is None:
            self._link = open_link(self.entry, self._tls, self._files, self._relay_target())
        link = self._link
        channel = link.channel if streams or link.sends is None else link.sends.channel
        if channel is None or await channel_connected(channel):
            return link
        identity = await self._identity(timeout - (loop.time() - started))
        if identity is ServerIdentity.EXPECTED_URI_ONLY and not relayed:
            await self._use_relay()
            return await self._connected_link(timeout - (loop.time() - started), streams=streams)
        raise self._unreachable(identity_cause(identity))  # nothing was sent

    async def _identity(self, timeout: float) -> ServerIdentity:
        if self.entry.id is None or self.entry.address is None or timeout <= 0:
            return ServerIdentity.UNKNOWN  # plaintext: no identity
        context = client_tls_context(self._tls, self.entry.id, self._files)
        context.set_alpn_protocols(["h2"])
        return await probe_server_identity(self.entry.address, context, self.entry.id, timeout)

    async def _use_relay(self) -> None:
        async with self._switching:
            if self._relay is None:
                await self._start_relay()

    async def _start_relay(self) -> None:
        assert self.entry.id is not None and self.entry.address is not None
        context = client_tls_context(self._tls, self.entry.id, self._files)
        context.set_alpn_protocols(["h2"])
        relay = SpiffeRelay(self.entry.address, context)
        await relay.start()
        self._relay = relay
        link, self._link = self._link, None
        if link is not None:
            await link.aclose()  # it never connected: nothing is in flight on it

    def _relay_target(self) -> str | None:
        return self._relay.target if self._relay is not None else None

    def use_tls(self, tls: TlsMaterial) -> UpstreamLink | None:
        """Open later connections with ``tls`` (a rotated certificate).

        Returns the current connection, now detached, for the caller to close
        once the calls on it have had time to finish; the next call opens a
        new one.
        """
        self._tls = tls
        if self._relay is not None and self.entry.id is not None:
            context = client_tls_context(tls, self.entry.id, self._files)
            context.set_alpn_protocols(["h2"])
            self._relay.use_context(context)
        link, self._link = self._link, None
        return link

    async def close(self) -> None:
        """Close the connection once the upstream cancels in flight have ended (each
        within ``CANCEL_SECONDS``); a later call would open a new one."""
        await self._cancels.wait()
        link, self._link = self._link, None
        if link is not None:
            await link.aclose()
        relay, self._relay = self._relay, None
        if relay is not None:
            await relay.close()


def _undecodable(err: BaseException) -> bool:
    undecodable = (
        UnreadableAnswer | json.JSONDecodeError | httpx.DecodingError | json_format.ParseError
    )
    return any(isinstance(c, undecodable) for c in exception_chain(err))
