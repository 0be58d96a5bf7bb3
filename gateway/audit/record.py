"""One audit record: a gateway decision, described without payload content."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, fields
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
    trace_id: str = ""
    """W3C trace id (32 hex digits) of the call's trace; ``""`` when it had none."""
    on_behalf_of: str = ""
    """The subject (``sub``) of the user the call acted for, proven by a verified user
    token; ``""`` when none. Never the token itself."""
    actor_chain: str = ""
    """The agents acting for that user, nearest first (the caller, then each earlier
    one), as a compact JSON array of strings; ``""`` when the call carried no user."""

    def to_json_dict(self) -> dict[str, object]:
        """All fields as a JSON-ready dict (keys are the field names)."""
        # Not dataclasses.asdict: it deep-copies every value, and the writer
        # thread calls this once per record.
        return dict(zip(FIELD_NAMES, _ALL_FIELDS(self), strict=True))


FIELD_NAMES: tuple[str, ...] = tuple(field.name for field in fields(AuditRecord))
"""Every field of AuditRecord, in declaration order."""


_ALL_FIELDS = operator.attrgetter(*FIELD_NAMES)


_COUNT_FIELDS = ("time_unix_ms", "payload_size", "seq")
_TEXT_FIELDS = tuple(name for name in FIELD_NAMES if name not in (*_COUNT_FIELDS, "latency_ms"))


def checked_fields(rec: AuditRecord) -> dict[str, object]:
    """``rec.to_json_dict()`` with every value checked and coerced to its declared type.

    Coercion makes the hash computed before storing equal the hash recomputed
    from the stored row (e.g. an ``int`` latency comes back from SQLite as a
    ``float``).

    Raises:
        ValueError: The decision is unknown, a count is fractional, or the
            latency is not finite.
        TypeError: A field has the wrong type.
    """
    # Runs on the audit writer thread for every record, holding the GIL the
    # event loop needs: the common case (exact types) costs one type() each.
    values = rec.to_json_dict()
    if values["decision"] not in DECISIONS:
        raise ValueError(f"decision must be 'allow' or 'refuse', not {rec.decision!r}")
    for name in _TEXT_FIELDS:
        _as_str(values[name], name)
    for name in _COUNT_FIELDS:
        if type(values[name]) is not int:
            values[name] = _as_int(values[name], name)
    latency = values["latency_ms"]
    if type(latency) is not float:
        latency = float(_as_number(latency, "latency_ms"))
    if not math.isfinite(latency):
        raise ValueError(f"latency_ms must be finite, not {latency!r}")
    values["latency_ms"] = latency
    return values


def _as_str(value: object, name: str) -> str:
    # str() would turn anything (even bytes) into text; only real text is accepted.
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, not {type(value).__name__}")
    return value


def _as_number(value: object, name: str) -> int | float:
    # bool is an int subclass, and float() would parse strings: refuse both.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    return value


def _as_int(value: object, name: str) -> int:
    value = _as_number(value, name)
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    return int(value)
