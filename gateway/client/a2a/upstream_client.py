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
    NOT_SENT,
    exception_chain,
    grpc_cause,
    handshake_cause,
    http_cause,
)
from gateway.client.a2a.upstream_replies import ASKS, UpstreamAnswer
from gateway.client.a2a.upstream_tasks import (
    Abandon,
    StreamedTask,
    UpstreamCancels,
    followed,
    streamed,
)
from gateway.client.handshake import channel_connected
from gateway.config import TlsSettings, UpstreamEntry
from gateway.errors import GatewayError, UpstreamUnavailable
from gateway.transport.tls import TlsMaterial
from policies.identity import svid_dns_name

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
        if self._link is None:
            self._link = open_link(self.entry, self._tls, self._files)
        link = self._link
        if link.channel is not None and not await channel_connected(link.channel):
            raise self._unreachable(await self._why_not_connected(timeout))  # nothing was sent
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

    async def _why_not_connected(self, timeout: float) -> str:
        if self.entry.id is None or self.entry.address is None:  # plaintext: no identity
            return NOT_SENT
        context = client_tls_context(self._tls, self.entry.id, self._files)
        context.set_alpn_protocols(["h2"])
        name = svid_dns_name(self.entry.id)
        return await handshake_cause(self.entry.address, context, name, timeout)

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
        """Close the connection once the upstream cancels in flight have ended (each
        within ``CANCEL_SECONDS``); a later call would open a new one."""
        await self._cancels.wait()
        link, self._link = self._link, None
        if link is not None:
            await link.aclose()


def _undecodable(err: BaseException) -> bool:
    undecodable = (
        UnreadableAnswer | json.JSONDecodeError | httpx.DecodingError | json_format.ParseError
    )
    return any(isinstance(c, undecodable) for c in exception_chain(err))
