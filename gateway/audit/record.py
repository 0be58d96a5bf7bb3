"""One audit record: a gateway decision, described without payload content."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Literal

Decision = Literal["allow", "refuse"]
"""What the gateway decided for a call."""

DECISIONS: frozenset[str] = frozenset({"allow", "refuse"})


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One gateway decision (allowed or refused).

    The record describes the payload only by its size and SHA-256 digest; it has
    no field that could carry payload content.
    """

    time_unix_ms: int
    """When the decision was made, milliseconds since the Unix epoch (UTC)."""
    request_id: str
    """The caller's request id."""
    peer_id: str
    """The caller's SPIFFE ID; ``""`` when the caller was not authenticated."""
    capability: str
    """The capability the caller asked for."""
    version_constraint: str
    """The version constraint the caller sent, verbatim."""
    served_version: str
    """The version that served the call; ``""`` when none did."""
    decision: Decision
    """``"allow"`` or ``"refuse"``."""
    reason: str
    """``"OK"`` for an allowed call that succeeded, else a reason code."""
    payload_size: int
    """Size of the raw request payload in bytes."""
    payload_sha256: str
    """Hex SHA-256 digest of the raw request payload."""
    latency_ms: float
    """Time from arrival to decision (or completion), in milliseconds."""
    task_id: str = ""
    """Task id, if the call belongs to a task."""
    step_id: str = ""
    """Plan step id, if the call belongs to a plan step."""
    detail: str = ""
    """The true reason behind an ambiguous refusal; never payload content."""
    seq: int = 0
    """Position in the log, assigned when stored (0 before)."""

    def to_json_dict(self) -> dict[str, object]:
        """All fields as a JSON-ready dict (keys are the field names)."""
        return asdict(self)


def normalized(rec: AuditRecord) -> AuditRecord:
    """``rec`` with every field coerced to its declared type.

    Coercion makes the hash computed before storing equal the hash recomputed
    from the stored row (e.g. an ``int`` latency comes back from SQLite as a
    ``float``).

    Raises:
        ValueError: A field cannot be coerced, the decision is unknown, or the
            latency is not finite.
        TypeError: A field has a type that cannot be coerced at all.
    """
    if rec.decision not in DECISIONS:
        raise ValueError(f"decision must be 'allow' or 'refuse', not {rec.decision!r}")
    latency = float(rec.latency_ms)
    if not math.isfinite(latency):
        raise ValueError(f"latency_ms must be finite, not {latency!r}")
    return replace(
        rec,
        time_unix_ms=_as_int(rec.time_unix_ms, "time_unix_ms"),
        request_id=_as_str(rec.request_id, "request_id"),
        peer_id=_as_str(rec.peer_id, "peer_id"),
        capability=_as_str(rec.capability, "capability"),
        version_constraint=_as_str(rec.version_constraint, "version_constraint"),
        served_version=_as_str(rec.served_version, "served_version"),
        reason=_as_str(rec.reason, "reason"),
        payload_size=_as_int(rec.payload_size, "payload_size"),
        payload_sha256=_as_str(rec.payload_sha256, "payload_sha256"),
        latency_ms=latency,
        task_id=_as_str(rec.task_id, "task_id"),
        step_id=_as_str(rec.step_id, "step_id"),
        detail=_as_str(rec.detail, "detail"),
    )


def _as_str(value: object, name: str) -> str:
    # str() would turn anything (even bytes) into text; only real text is accepted.
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, not {type(value).__name__}")
    return value


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be int, not {type(value).__name__}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    return int(value)
