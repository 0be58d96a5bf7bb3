"""What a running capability may know about the call it serves."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeVar, overload

from pydantic import BaseModel

from capabilities.parts import PART_TYPES, Answer, Part, TextPart

AskState = Literal["input-required", "auth-required"]
"""The state a task shows while it waits for the caller's answer."""
_M = TypeVar("_M", bound=BaseModel)
MAX_PROGRESS_CHARS = 4096
"""Progress text longer than this is cut, on every door (an A2A status, an MCP notification)."""


class PeerCall(Protocol):
    """Calls a capability on a peer from inside a capability.

    Bound by the gateway to the current call: the outbound rules apply and the
    call's remaining time travels on as the peer call's deadline. Returns the
    peer's output; raises the gateway error the peer (or the policy) answered.
    """

    async def __call__(
        self, peer_id: str, capability: str, payload: dict[str, Any], *, constraint: str = ""
    ) -> Any: ...


class MessageView(Protocol):
    """The A2A message a call came in, as a capability may read it (``ctx.parts``)."""

    @property
    def context_id(self) -> str:
        """The conversation the message belongs to."""
        ...

    def parts(self) -> tuple[Part, ...]:
        """Every part, typed (built when first asked for)."""
        ...


class CallUser(Protocol):
    """The user a call acts for, as a verified user token proved it (never the token).

    The gateway's ``policies.users.OnBehalfOf`` is one.
    """

    @property
    def subject(self) -> str:
        """The user's ``sub`` (what the audit record's ``on_behalf_of`` holds)."""
        ...

    @property
    def issuer(self) -> str:
        """The issuer that vouched for the user."""
        ...

    @property
    def claims(self) -> Mapping[str, Any]:
        """The token's claims, read-only."""
        ...

    @property
    def actors(self) -> tuple[str, ...]:
        """The actor chain, nearest first: the calling agent's SPIFFE ID, then earlier ones."""
        ...


class CallEvents(Protocol):
    """Where a capability's progress reports and output chunks go (a streamed A2A task).

    Bound by the gateway for calls whose caller can see them (an A2A task run
    in the background or streamed); other calls have none and the ``ctx``
    methods below do nothing.
    """

    async def progress(self, text: str) -> None:
        """One status message (``TASK_STATE_WORKING``) holding ``text``."""
        ...

    async def chunk(self, data: dict[str, Any] | str) -> None:
        """One chunk of output (an artifact update): a JSON object, or text."""
        ...

    async def ask(
        self, prompt: tuple[Part, ...], state: AskState, schema: type[BaseModel] | None
    ) -> Any:
        """Wait for the caller's next message on the task; ``schema``'s instance, or an
        :class:`~capabilities.parts.Answer` without one."""
        ...


# Final fields, not frozen: see CONTRIBUTING.md, "Value classes built per call".
@dataclass(slots=True, unsafe_hash=True)
class CallContext:
    """Facts about one call, handed to the capability function.

    Attributes:
        peer_id: SPIFFE ID of the caller, proven by its mTLS certificate.
        request_id: The caller's request id.
        deadline: ``time.monotonic()`` value by which the call must finish.
        task_id: Task the call belongs to, if any.
        step_id: Plan step the call serves, if any.
        idempotency_key: The caller's idempotency key, if any.
        call_peer: Calls further peers within this call's deadline (None if the
            agent offers no outbound calls).
        events: Where :meth:`report_progress` and :meth:`emit_chunk` go (None:
            nobody watches this call, and both do nothing), and :meth:`ask_input`.
        message: The A2A message the call came in (None for Invoke); read it
            through :attr:`parts` and :attr:`context_id`.
        user: The user the call acts for, as a verified user token proved it
            (subject, issuer, claims, actor chain; never the token), or None.
            ``call_peer`` carries that user on: each peer gets a token made for it.
    """

    peer_id: Final[str]
    request_id: Final[str]
    deadline: Final[float]
    task_id: Final[str] = ""
    step_id: Final[str] = ""
    idempotency_key: Final[str] = ""
    call_peer: Final[PeerCall | None] = None
    events: Final[CallEvents | None] = None
    message: Final[MessageView | None] = None
    user: Final[CallUser | None] = None

    @property
    def message_id(self) -> str:
        """The id of the message that started the call (its request id)."""
        return self.request_id

    @property
    def context_id(self) -> str:
        """The A2A context the call belongs to ("" for Invoke). Chosen by the caller (or
        for it): key anything kept per conversation by ``(peer_id, context_id)``, since
        another caller may use the same text."""
        return "" if self.message is None else self.message.context_id

    @property
    def parts(self) -> tuple[Part, ...]:
        """Every part of the A2A message, typed, file bytes included (none for Invoke)."""
        return () if self.message is None else self.message.parts()

    async def report_progress(self, text: str) -> None:
        """Tell a watching caller how the work goes (a status update of its task).

        ``text`` is sent as it is, so it holds payload content only if you put
        it there; it is never logged or audited. Text past
        :data:`MAX_PROGRESS_CHARS` characters is cut. Without a watcher (a plain
        Invoke or a blocking SendMessage) this does nothing.
        """
        if self.events is not None:
            await self.events.progress(text[:MAX_PROGRESS_CHARS])

    async def emit_chunk(self, data: dict[str, Any] | str) -> None:
        """Stream one piece of output (a JSON object, or text) to a watching caller.

        Chunks are sent as artifact updates before the final output, which the
        capability still returns as usual (and which alone is validated against
        the output contract and kept on the task). Their total size counts
        against the caller's ``max_payload_bytes``; going over it fails the call
        (``CAPABILITY_FAILED``, audit detail ``OUTPUT_TOO_LARGE``). Without a
        watcher this does nothing.
        """
        if self.events is not None:
            await self.events.chunk(data)

    @overload
    async def ask_input(
        self, prompt: str | Sequence[Part], *, schema: type[_M], state: AskState = ...
    ) -> _M: ...

    @overload
    async def ask_input(
        self, prompt: str | Sequence[Part], *, schema: None = None, state: AskState = ...
    ) -> Answer: ...

    async def ask_input(
        self,
        prompt: str | Sequence[Part],
        *,
        schema: type[BaseModel] | None = None,
        state: AskState = "input-required",
    ) -> Any:
        """Ask the caller for more input and wait for its answer (A2A tasks only).

        The task goes ``TASK_STATE_INPUT_REQUIRED`` (``state="auth-required"``:
        ``TASK_STATE_AUTH_REQUIRED``) with ``prompt`` (text, or parts) as its
        status message; a blocking SendMessage answers the task in that state,
        streams see it. The caller's next message on the task passes the whole
        decision order and must be accepted by the contract's ``accepts``; its
        content is validated against ``schema`` as a first message's is against
        the input model (a refusal leaves the task waiting), and the validated
        ``schema`` instance is returned. Without ``schema`` the whole message is
        returned (an :class:`~capabilities.parts.Answer`). The contract timeout
        and CancelTask still hold while it waits.

        Raises:
            RuntimeError: the contract does not declare ``asks_input``, or the
                call did not come as an A2A message (a plain Invoke).
        """
        parts = (TextPart(prompt),) if isinstance(prompt, str) else tuple(prompt)
        if not parts or not all(isinstance(part, PART_TYPES) for part in parts):
            raise TypeError("ctx.ask_input: the prompt is a str or a sequence of parts")
        if state not in ("input-required", "auth-required"):
            raise ValueError("ctx.ask_input: state is 'input-required' or 'auth-required'")
        if self.events is None:
            raise RuntimeError(
                "ctx.ask_input works only over A2A, for a capability declared with asks_input=True"
            )
        return await self.events.ask(parts, state, schema)

    def time_remaining(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())
