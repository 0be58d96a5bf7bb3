"""An inbound call as every transport hands it to the pipeline, protocol-neutral."""

from __future__ import annotations

import hashlib
import re
import time
from typing import Final, Protocol

from pydantic import BaseModel

from capabilities.contract import Accepts
from capabilities.parts import Part
from gateway.identity.presented import PresentedTokens

REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
"""What a request id may be (a2agw.v1 ``request_id``, A2A ``message_id``)."""

_DEFAULT_DEADLINE_SECONDS = 30.0


class PendingPayload(Protocol):
    """A payload a transport measured but has not decoded to JSON yet (A2A ``data``).

    Decoding costs CPU that grows with the payload, so the pipeline measures
    ``size`` against the cap first and decodes only a call every check up to
    the payload cap has admitted (see ``DecisionPipeline.payload_decoded``).
    """

    @property
    def size(self) -> int:
        """The bytes the payload cap counts before decoding (an upper bound's stand-in)."""
        ...

    def decode(self, input_model: type[BaseModel]) -> bytes:
        """The payload's JSON bytes for the chosen version's input contract.

        Raises:
            GatewayError: the payload cannot become JSON (INVALID_REQUEST), or
                not for this contract (INVALID_INPUT); never quoting it.
        """
        ...


class InboundMessage(Protocol):
    """The A2A message a call came in: what only the chosen version can judge of it.

    ``check_parts`` runs once the version is chosen (``parts_accepted``), before
    anything of the message is decoded; ``parts`` once the call is admitted.
    """

    @property
    def context_id(self) -> str:
        """The message's context (the task's, for a follow-up)."""
        ...

    @property
    def answers(self) -> type[BaseModel] | None:
        """For a follow-up answering ``ctx.ask_input``: the model its content is validated
        against instead of the input model (None: the chosen version's input model)."""
        ...

    def check_parts(self, accepts: Accepts, input_model: type[BaseModel]) -> None:
        """Raise the refusal of parts the contract does not take (nothing decoded)."""
        ...

    def parts(self) -> tuple[Part, ...]:
        """Every part, typed (for ``ctx.parts``)."""
        ...


class InvokeCall:
    """One call to a capability, as the transport delivered it; read-only.

    Not a dataclass: its ``__init__`` hashes the payload (once: a copy is handed
    the digest it keeps), and the ``with_*`` methods are the only copies, each
    keeping the digest true (``dataclasses.replace`` would not know to).
    ``Final`` keeps every field read-only to the type checker; not frozen, for
    the cost of a frozen ``__init__`` (CONTRIBUTING.md, "Value classes built per
    call"). Its ``repr`` names ids, sizes and the digest, never the payload.

    Attributes:
        peer_cert_pem: The verified client certificate (None if absent).
        request_id: Caller's request id.
        capability: Capability name.
        version_constraint: Requested constraint text.
        payload: Raw JSON bytes, unparsed.
        deadline: ``time.monotonic()`` deadline (transport and request combined).
        task_id: Optional task id.
        step_id: Optional step id.
        idempotency_key: Optional idempotency key.
        malformed: The request bytes did not parse; refused as INVALID_REQUEST.
        problem: Why the transport could not turn the request into a call (for
            example an A2A message without a capability); refused as
            INVALID_REQUEST once the caller is identified. Never payload content.
        claimed_identity: The name of a field in which the request claims who
            is calling (an A2A metadata key such as ``a2agw.peer``); refused as
            UNAUTHENTICATED: only the TLS handshake names the caller.
        deadline_unix_ms: The absolute deadline the request itself carried, in
            Unix milliseconds (0: none). Already folded into ``deadline``; kept
            so a negative one is refused rather than read as "no deadline".
        pending_payload: A payload still to be decoded (``payload`` is then
            empty); the pipeline replaces the call with the decoded one.
        payload_sha256: Hex SHA-256 of ``payload`` (computed once, on
            construction); "" while the payload is pending.
        tokens: The bearer tokens the request presented (``Authorization``,
            ``A2AGW-User-Token``; None: neither), verified by ``identity``.
        message: The A2A message the call came in (None: an Invoke); kept
            after its pending payload is decoded.
    """

    __slots__ = (
        "capability",
        "claimed_identity",
        "deadline",
        "deadline_unix_ms",
        "idempotency_key",
        "malformed",
        "message",
        "payload",
        "payload_sha256",
        "peer_cert_pem",
        "pending_payload",
        "problem",
        "request_id",
        "step_id",
        "task_id",
        "tokens",
        "version_constraint",
    )

    def __init__(
        self,
        peer_cert_pem: bytes | None,
        request_id: str,
        capability: str,
        version_constraint: str,
        payload: bytes,
        deadline: float,
        task_id: str = "",
        step_id: str = "",
        idempotency_key: str = "",
        malformed: bool = False,
        problem: str = "",
        claimed_identity: str = "",
        deadline_unix_ms: int = 0,
        pending_payload: PendingPayload | None = None,
        payload_sha256: str | None = None,
        tokens: PresentedTokens | None = None,
        message: InboundMessage | None = None,
    ) -> None:
        # ``payload_sha256``: the digest of this very payload, already computed
        # (``with_deadline``); None hashes it.
        self.peer_cert_pem: Final[bytes | None] = peer_cert_pem
        self.request_id: Final[str] = request_id
        self.capability: Final[str] = capability
        self.version_constraint: Final[str] = version_constraint
        self.payload: Final[bytes] = payload
        self.deadline: Final[float] = deadline
        self.task_id: Final[str] = task_id
        self.step_id: Final[str] = step_id
        self.idempotency_key: Final[str] = idempotency_key
        self.malformed: Final[bool] = malformed
        self.problem: Final[str] = problem
        self.claimed_identity: Final[str] = claimed_identity
        self.deadline_unix_ms: Final[int] = deadline_unix_ms
        self.pending_payload: Final[PendingPayload | None] = pending_payload
        self.tokens: Final[PresentedTokens | None] = tokens
        self.message: Final[InboundMessage | None] = message
        # Needed by every audit record of the call and by the idempotency
        # claim: hash the payload once (a pending one once it is decoded).
        if payload_sha256 is None:
            pending = pending_payload is not None
            payload_sha256 = "" if pending else hashlib.sha256(payload).hexdigest()
        self.payload_sha256: Final[str] = payload_sha256

    def with_deadline(self, deadline: float) -> InvokeCall:
        """This call with another ``deadline``; its digest is kept, not computed again
        (a 256 KB payload's SHA-256 is ~0.2 ms on the event loop)."""
        return self._copy(
            self.payload, deadline, self.problem, self.pending_payload, self.payload_sha256
        )

    def with_problem(self, problem: str) -> InvokeCall:
        """This call with ``problem`` set (refused as INVALID_REQUEST); its digest is kept."""
        return self._copy(
            self.payload, self.deadline, problem, self.pending_payload, self.payload_sha256
        )

    def with_decoded_payload(self, payload: bytes) -> InvokeCall:
        """This call with its pending payload decoded to ``payload`` (hashed now)."""
        return self._copy(payload, self.deadline, self.problem, None, None)

    def _copy(
        self,
        payload: bytes,
        deadline: float,
        problem: str,
        pending_payload: PendingPayload | None,
        payload_sha256: str | None,
    ) -> InvokeCall:
        return InvokeCall(
            self.peer_cert_pem,
            self.request_id,
            self.capability,
            self.version_constraint,
            payload,
            deadline,
            self.task_id,
            self.step_id,
            self.idempotency_key,
            self.malformed,
            problem,
            self.claimed_identity,
            self.deadline_unix_ms,
            pending_payload,
            payload_sha256,
            self.tokens,
            self.message,
        )

    def __repr__(self) -> str:
        # Ids, names and sizes only: never the payload or the certificate.
        return (
            f"InvokeCall(request_id={self.request_id!r}, capability={self.capability!r}, "
            f"version_constraint={self.version_constraint!r}, payload_size={self.payload_size}, "
            f"payload_sha256={self.payload_sha256!r}, task_id={self.task_id!r}, "
            f"step_id={self.step_id!r})"
        )

    @property
    def payload_size(self) -> int:
        """Bytes the payload cap counts: the payload's, or the pending payload's measure."""
        pending = self.pending_payload
        return len(self.payload) if pending is None else pending.size


def deadline_from(transport_remaining: float | None, deadline_unix_ms: int) -> float:
    """Combine the gRPC deadline and the request's absolute deadline (monotonic).

    ``deadline_unix_ms`` of 0 means none; a negative one is not a deadline at
    all and is left out here: the pipeline refuses it (``well_formed_request``).
    """
    now = time.monotonic()
    candidates = [now + _DEFAULT_DEADLINE_SECONDS]
    if transport_remaining is not None:
        candidates.append(now + transport_remaining)
    if deadline_unix_ms > 0:
        candidates.append(now + (deadline_unix_ms / 1000.0 - time.time()))
    return min(candidates)
