"""Asking a person before a step acts: approval requests, decisions and their binding.

A plan's ``approval.min_risk`` (or the agent's ``[plans] approval_min_risk``,
whichever is stricter) makes every step whose chosen route has that risk or
above wait: before anything is sent, the step runner looks for a decision that
binds to exactly this step, peer, version and input digest (the SHA-256 of
the minimal payload that would be sent). Without one, it records an
``ApprovalRequest`` and the task stops in ``waiting-approval``; a changed input
(or peer, or version) after an approval is a new request.

A decision is taken by ``decide`` (the CLI's ``tasks --approve/--deny``): it is
written to the agent's audit log first (who: local user and process; what: the
input digest; never values), then to the task store.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from capabilities.contract import Risk
from gateway.audit.record import AuditRecord
from gateway.outbound.router import encode_payload


class Decision(StrEnum):
    """Where an approval request stands."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"


APPROVED_REASON = "APPROVED"
"""Audit reason of an approval (a denial's is ``APPROVAL_DENIED``)."""


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What a step would send, and what a person decided about it.

    Attributes:
        step_id: The step.
        capability: The capability it would call.
        where: ``"local"`` or the peer's SPIFFE ID.
        version: The version that would serve.
        risk: The route's risk.
        input_sha256: Hex SHA-256 of the exact payload that would be sent.
        fields: Field name → size in bytes of its JSON value (never the values).
        decision: pending, approved or denied.
        decided_by: Who decided (``user@host pid N``), empty while pending.
        time_unix_ms: When it was requested, or decided.
    """

    step_id: str
    capability: str
    where: str
    version: str
    risk: str
    input_sha256: str
    fields: dict[str, int]
    decision: Decision = Decision.PENDING
    decided_by: str = ""
    time_unix_ms: int = 0

    def binds(self, other: ApprovalRequest) -> bool:
        """True if a decision on ``self`` covers ``other``: same step, place, version, input."""
        return (self.step_id, self.where, self.version, self.input_sha256) == (
            other.step_id,
            other.where,
            other.version,
            other.input_sha256,
        )

    def decided(self, decision: Decision, who: str, now_ms: int) -> ApprovalRequest:
        """A copy with ``decision`` taken by ``who``."""
        return replace(self, decision=decision, decided_by=who, time_unix_ms=now_ms)


class AwaitingApproval(Exception):
    """Raised by the step runner: the step needs ``request`` approved before it sends.

    Not a GatewayError: it is not a failure, and it never crosses the wire.
    """

    def __init__(self, request: ApprovalRequest) -> None:
        super().__init__(f"step {request.step_id!r} waits for approval")
        self.request = request


def threshold(plan_min: Risk | None, agent_min: Risk | None) -> Risk | None:
    """The stricter (lower) of the plan's and the agent's approval risk; None: no approval."""
    found = [risk for risk in (plan_min, agent_min) if risk is not None]
    return min(found, key=lambda risk: risk.rank) if found else None


def needs_approval(risk: Risk, minimum: Risk | None) -> bool:
    """True if a route of ``risk`` needs approval under ``minimum``."""
    return minimum is not None and risk.rank >= minimum.rank


def request_for(
    step_id: str, capability: str, where: str, version: str, risk: Risk, payload: dict[str, Any]
) -> ApprovalRequest:
    """The approval request for sending ``payload`` (sizes and digest only are kept)."""
    body = encode_payload(payload)
    sizes = {name: len(_compact(value)) for name, value in payload.items()}
    return ApprovalRequest(
        step_id=step_id,
        capability=capability,
        where=where,
        version=version,
        risk=risk.value,
        input_sha256=hashlib.sha256(body).hexdigest(),
        fields=sizes,
        time_unix_ms=int(time.time() * 1000),
    )


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def local_decider() -> str:
    """Who decides, as recorded: ``user@host pid N`` of this process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        user = f"uid{os.getuid()}"
    return f"{user}@{os.uname().nodename} pid {os.getpid()}"


def audit_record(
    agent_id: str, task_id: str, request: ApprovalRequest, *, approved: bool, who: str
) -> AuditRecord:
    """The audit record of a decision: who, and the digest of the input decided on."""
    return AuditRecord(
        time_unix_ms=int(time.time() * 1000),
        request_id=f"approval.{task_id}.{request.step_id}.{uuid.uuid4().hex[:8]}",
        peer_id=agent_id,
        capability=request.capability,
        version_constraint=f"={request.version}",
        served_version="",
        decision="allow" if approved else "refuse",
        reason=APPROVED_REASON if approved else "APPROVAL_DENIED",
        payload_size=sum(request.fields.values()),
        payload_sha256=request.input_sha256,
        latency_ms=0.0,
        task_id=task_id,
        step_id=request.step_id,
        detail=f"{'approved' if approved else 'denied'} by {who} for {request.where}",
    )
