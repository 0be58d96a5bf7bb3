"""An inbound call as every transport hands it to the pipeline, protocol-neutral."""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel

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


@dataclass(frozen=True, slots=True, init=False)
class InvokeCall:
    """One call to a capability, as the transport delivered it.

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
    """

    peer_cert_pem: bytes | None
    request_id: str
    capability: str
    version_constraint: str
    payload: bytes
    deadline: float
    task_id: str = ""
    step_id: str = ""
    idempotency_key: str = ""
    malformed: bool = False
    problem: str = ""
    claimed_identity: str = ""
    deadline_unix_ms: int = 0
    pending_payload: PendingPayload | None = None
    payload_sha256: str = field(init=False)

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
    ) -> None:
        # ``payload_sha256``: the digest of this very payload, already computed
        # (``with_deadline``); None hashes it. Written out (init=False) because
        # the generated __init__ stays Python even where this module is
        # compiled: ~35 k instructions a call.
        setter = object.__setattr__
        setter(self, "peer_cert_pem", peer_cert_pem)
        setter(self, "request_id", request_id)
        setter(self, "capability", capability)
        setter(self, "version_constraint", version_constraint)
        setter(self, "payload", payload)
        setter(self, "deadline", deadline)
        setter(self, "task_id", task_id)
        setter(self, "step_id", step_id)
        setter(self, "idempotency_key", idempotency_key)
        setter(self, "malformed", malformed)
        setter(self, "problem", problem)
        setter(self, "claimed_identity", claimed_identity)
        setter(self, "deadline_unix_ms", deadline_unix_ms)
        setter(self, "pending_payload", pending_payload)
        # Needed by every audit record of the call and by the idempotency
        # claim: hash the payload once (a pending one once it is decoded).
        if payload_sha256 is None:
            pending = pending_payload is not None
            payload_sha256 = "" if pending else hashlib.sha256(payload).hexdigest()
        setter(self, "payload_sha256", payload_sha256)

    def with_deadline(self, deadline: float) -> InvokeCall:
        """This call with another ``deadline``; its digest is kept, not computed again.

        ``dataclasses.replace`` would hash the payload a second time (a 256 KB
        payload: ~0.3 ms on the event loop); ``copy.copy`` cannot copy the
        compiled class (mypyc's native classes have no ``__reduce__`` that
        rebuilds them), so the call is built again with the digest it has.
        """
        return InvokeCall(
            self.peer_cert_pem,
            self.request_id,
            self.capability,
            self.version_constraint,
            self.payload,
            deadline,
            self.task_id,
            self.step_id,
            self.idempotency_key,
            self.malformed,
            self.problem,
            self.claimed_identity,
            self.deadline_unix_ms,
            self.pending_payload,
            payload_sha256=self.payload_sha256,
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
