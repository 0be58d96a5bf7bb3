"""What an A2A request must be before any method looks at it, and its plain fields.

The gRPC binding carries the protocol version in metadata ``a2a-version``
(spec 10.2); a missing value means 0.3 (spec 3.6), which this agent does not
speak. A request that did not parse, or that names a tenant, is refused too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import struct_pb2, timestamp_pb2
from grpc import aio

from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ProtocolVersionNotSupported,
    Unauthenticated,
)
from gateway.inbound.call import REQUEST_ID
from gateway.server.a2a.messages import CONTEXT_ID_RULE, claimed_identity
from gateway.server.a2a.task_store.store import DEFAULT_PAGE_SIZE, TaskFilter, TaskOutcome
from gateway.server.received import MalformedRequest

SERVICE_NAME = "lf.a2a.v1.A2AService"
VERSION_METADATA = "a2a-version"
"""gRPC metadata key of the A2A protocol version; missing means 0.3."""

_MIN_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z
_MAX_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z
_STATES = {
    a2a_pb2.TASK_STATE_COMPLETED: TaskOutcome.COMPLETED,
    a2a_pb2.TASK_STATE_FAILED: TaskOutcome.FAILED,
    a2a_pb2.TASK_STATE_CANCELED: TaskOutcome.CANCELED,
    a2a_pb2.TASK_STATE_SUBMITTED: TaskOutcome.SUBMITTED,
    a2a_pb2.TASK_STATE_WORKING: TaskOutcome.WORKING,
    a2a_pb2.TASK_STATE_INPUT_REQUIRED: TaskOutcome.INPUT_REQUIRED,
    a2a_pb2.TASK_STATE_AUTH_REQUIRED: TaskOutcome.AUTH_REQUIRED,
}


def protocol_version(context: aio.ServicerContext[Any, Any]) -> str:
    """The caller's ``a2a-version`` ("0.3" when absent, as the spec says)."""
    metadata: Iterable[tuple[str, Any]] = context.invocation_metadata() or ()
    for key, value in metadata:
        if key == VERSION_METADATA:
            return str(value).strip()
    return "0.3"


def speaks_1_0(version: str) -> bool:
    """True for ``1``, ``1.0`` and ``1.0.N``: the spec matches Major.Minor, ignoring patch.

    A2A 1.0, 3.6.2: an agent processes a request with the semantics of the
    version it names, or answers VersionNotSupportedError; this agent has
    only 1.0's (so ``1.1`` is refused, as the a2a-sdk's own servers do).
    """
    major, dot, rest = version.partition(".")
    return major == "1" and (not dot or rest.partition(".")[0] == "0")


def request_problem(request: object, version: str, operation: str) -> GatewayError | None:
    """Why this agent refuses ``request`` whatever the method (None if it does not)."""
    if not speaks_1_0(version):
        return ProtocolVersionNotSupported(
            f"A2A version {version[:16]!r} is not supported; this agent speaks 1.0"
        )
    if isinstance(request, MalformedRequest):
        return InvalidRequest(f"the request is not a valid {SERVICE_NAME} {operation}")
    if getattr(request, "tenant", ""):
        return InvalidRequest("tenants are not supported by this agent; send an empty tenant")
    metadata = getattr(request, "metadata", None)
    if isinstance(metadata, struct_pb2.Struct) and (claimed := claimed_identity(metadata)):
        return identity_claim_refusal(claimed)
    return None


def identity_claim_refusal(key: str) -> Unauthenticated:
    """The refusal of a request whose metadata ``key`` claims who is calling."""
    return Unauthenticated(
        f"the caller is identified by its TLS client certificate only; remove the metadata {key}"
    )


def task_filter(request: a2a_pb2.ListTasksRequest) -> TaskFilter | None:
    """What ListTasks asks for; None when it asks for a state no task here is ever in.

    Raises:
        InvalidRequest: a ``context_id`` that is not an id, or a
            ``status_timestamp_after`` that is not a valid Timestamp (the page
            token is the store's to judge).
    """
    if request.context_id and not REQUEST_ID.fullmatch(request.context_id):
        raise InvalidRequest(CONTEXT_ID_RULE)
    updated_after_ms = 0
    if request.HasField("status_timestamp_after"):
        updated_after_ms = _timestamp_ms(request.status_timestamp_after)
    state: TaskOutcome | None = None
    if request.status != a2a_pb2.TASK_STATE_UNSPECIFIED:
        state = _STATES.get(request.status)
        if state is None:
            return None
    return TaskFilter(
        context_id=request.context_id,
        state=state,
        updated_after_ms=updated_after_ms,
        page_size=request.page_size if request.HasField("page_size") else DEFAULT_PAGE_SIZE,
        page_token=request.page_token,
    )


def _timestamp_ms(timestamp: timestamp_pb2.Timestamp) -> int:
    # The Timestamp rule (years 1-9999, nanos 0..999999999): outside it the
    # milliseconds overflow the stores' 64-bit integers.
    if not (_MIN_SECONDS <= timestamp.seconds <= _MAX_SECONDS and 0 <= timestamp.nanos < 10**9):
        raise InvalidRequest(
            "status_timestamp_after must be a valid Timestamp (years 1-9999, nanos < 1e9)"
        )
    return int(timestamp.ToMilliseconds())


def task_id_of(request: object) -> str:
    """The task id a request names, if it is fit for an audit record ("" otherwise)."""
    # A push-config request's ``id`` is the config's; its task is ``task_id``.
    return safe_id(str(getattr(request, "task_id", "") or getattr(request, "id", "")))


def safe_id(task_id: str) -> str:
    """``task_id`` if it has the form of an id, else "" (audit records hold ids only)."""
    return task_id if REQUEST_ID.fullmatch(task_id) else ""
