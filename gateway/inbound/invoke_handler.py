"""The protocol-neutral request handler: identity → policy → validation → run → audit.

The gRPC servicer (``gateway.transport.server``) only adapts the wire to this module.
Every call produces one outcome record; a call that ends in an error has it
committed before the error is returned. A call to a ``write`` or ``external``
capability also gets a write-ahead ``ADMITTED`` record, committed before the
capability runs, so no side effect happens that the log cannot show.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

from pydantic import BaseModel, ValidationError

from capabilities.context import CallContext, PeerCall
from capabilities.contract import Risk
from capabilities.registry import CapabilityRegistry
from capabilities.runner import NOT_STARTED, CapabilityResult, run_capability
from capabilities.versions import VersionConstraint, VersionSyntaxError
from gateway.audit import AuditLog, AuditRecord
from gateway.errors import (
    AuditUnavailable,
    Cancelled,
    DeadlineExceeded,
    GatewayError,
    InvalidInput,
    InvalidRequest,
    OutputTooLarge,
    ReplayedRequest,
    Unauthenticated,
)
from gateway.inbound.idempotency import IdempotencyStore, StoredAnswer
from gateway.inbound.replay import ReplayGuard
from policies.decisions import Admission, admit, callable_capabilities
from policies.grants import PeerGrant
from policies.identity import spiffe_id_from_pem
from policies.store import PolicyStore

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_DEFAULT_DEADLINE_SECONDS = 30.0
ADMITTED = "ADMITTED"
"""Reason of the write-ahead record of a write/external call, committed before it runs."""

PeerCallBinder = Callable[[float, str, str], PeerCall]
"""Makes a capability's ``call_peer`` from (deadline, task_id, step_id)."""


@dataclass(frozen=True, slots=True)
class InvokeCall:
    """One Invoke, as the transport delivered it.

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
        payload_sha256: Hex SHA-256 of ``payload`` (computed once, on construction).
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
    payload_sha256: str = field(init=False)

    def __post_init__(self) -> None:
        # Needed by every audit record of the call and by the idempotency
        # claim: hash the payload once.
        object.__setattr__(self, "payload_sha256", hashlib.sha256(self.payload).hexdigest())


@dataclass(frozen=True, slots=True)
class InvokeOutcome:
    """A successful Invoke's answer."""

    served_version: str
    payload: bytes
    evidence_sha256: str
    replayed: bool = False


def peer_id_from_cert(pem: bytes | None) -> str:
    """The caller's SPIFFE ID from its verified certificate; Unauthenticated otherwise."""
    if not pem:
        raise Unauthenticated("no verified client certificate")
    return spiffe_id_from_pem(pem)


def deadline_from(transport_remaining: float | None, deadline_unix_ms: int) -> float:
    """Combine the gRPC deadline and the request's absolute deadline (monotonic)."""
    now = time.monotonic()
    candidates = [now + _DEFAULT_DEADLINE_SECONDS]
    if transport_remaining is not None:
        candidates.append(now + transport_remaining)
    if deadline_unix_ms > 0:
        candidates.append(now + (deadline_unix_ms / 1000.0 - time.time()))
    return min(candidates)


class InvokeHandler:
    """Decides, runs and audits calls for one agent."""

    def __init__(
        self,
        *,
        registry: CapabilityRegistry,
        policies: PolicyStore,
        audit: AuditLog,
        idempotency: IdempotencyStore,
        bind_peer_call: PeerCallBinder | None = None,
        replay: ReplayGuard | None = None,
    ) -> None:
        self._registry = registry
        self._policies = policies
        self._audit = audit
        self._idempotency = idempotency
        self._bind_peer_call = bind_peer_call
        self._replay = replay if replay is not None else ReplayGuard()

    async def describe(self, peer_cert_pem: bytes | None) -> tuple[PeerGrant, list[Admission]]:
        """The caller's grant and the capabilities it may call (nothing else leaks).

        A refused Describe is audited like a refused Invoke (capability ``""``,
        detail ``Describe``).
        """
        started = time.perf_counter()
        peer_id = ""
        try:
            if not self._audit.healthy:
                raise AuditUnavailable("the audit log cannot record; refusing work")
            peer_id = peer_id_from_cert(peer_cert_pem)
            grant, caps = callable_capabilities(
                self._policies.current, self._registry, peer_id, datetime.now(UTC)
            )
        except GatewayError as err:
            call = InvokeCall(peer_cert_pem, "", "", "", b"", 0.0)
            await self._audit.record_durable(
                self._record(call, peer_id, "", "refuse", err.reason, started, "Describe")
            )
            raise
        return grant, [Admission(peer_id=peer_id, grant=grant, capability=cap) for cap in caps]

    async def invoke(self, call: InvokeCall) -> InvokeOutcome:
        """Run one call end to end; raises a GatewayError on refusal or failure."""
        started = time.perf_counter()
        peer_id = ""
        try:
            if not self._audit.healthy:
                raise AuditUnavailable("the audit log cannot record; refusing work")
            peer_id = peer_id_from_cert(call.peer_cert_pem)
            if call.malformed:
                raise InvalidRequest("the request is not a valid a2agw.v1.InvokeRequest")
            admission = self._admit(call, peer_id)
            payload, ctx = self._prepare(call, admission)
        except GatewayError as err:
            await self._audit.record_durable(
                self._record(call, peer_id, "", "refuse", err.reason, started, err.detail)
            )
            raise
        served = str(admission.capability.version)
        if admission.capability.contract.risk is not Risk.READ:
            # Write-ahead: a side effect never happens without a committed record.
            await self._audit.record_durable(
                self._record(call, peer_id, served, "allow", ADMITTED, started)
            )
        try:
            outcome = await self._execute(call, admission, payload, ctx)
        except GatewayError as err:
            await self._audit.record_durable(
                self._record(call, peer_id, served, "allow", err.reason, started, err.detail)
            )
            raise
        except asyncio.CancelledError:
            self._audit.record(
                self._record(call, peer_id, served, "allow", Cancelled.reason, started)
            )
            raise
        self._audit.record(
            self._record(
                call,
                peer_id,
                served,
                "allow",
                "OK",
                started,
                "idempotent replay" if outcome.replayed else "",
            )
        )
        return outcome

    def _admit(self, call: InvokeCall, peer_id: str) -> Admission:
        if not _REQUEST_ID.fullmatch(call.request_id):
            raise InvalidRequest("request_id must be 1-128 characters of [A-Za-z0-9._:-]")
        try:
            constraint = VersionConstraint.parse(call.version_constraint)
        except VersionSyntaxError as err:
            raise InvalidRequest(f"version constraint: {err}") from err
        admission = admit(
            self._policies.current,
            self._registry,
            peer_id=peer_id,
            capability=call.capability,
            constraint=constraint,
            payload_size=len(call.payload),
            now=datetime.now(UTC),
        )
        if not self._replay.first_sighting(peer_id, call.request_id):
            raise ReplayedRequest("this request id was already used by this peer")
        return admission

    def _prepare(self, call: InvokeCall, admission: Admission) -> tuple[BaseModel, CallContext]:
        contract = admission.capability.contract
        try:
            payload = contract.input_model.model_validate_json(call.payload)
        except ValidationError as err:
            raise InvalidInput(_describe_input_error(err, contract.input_model)) from err
        if call.deadline <= time.monotonic():
            raise DeadlineExceeded("the call's deadline had passed before it could run")
        ctx = CallContext(
            peer_id=admission.peer_id,
            request_id=call.request_id,
            deadline=call.deadline,
            task_id=call.task_id,
            step_id=call.step_id,
            idempotency_key=call.idempotency_key,
            call_peer=(
                None
                if self._bind_peer_call is None
                else self._bind_peer_call(call.deadline, call.task_id, call.step_id)
            ),
        )
        return payload, ctx

    async def _execute(
        self, call: InvokeCall, admission: Admission, payload: BaseModel, ctx: CallContext
    ) -> InvokeOutcome:
        if call.idempotency_key and admission.capability.contract.risk is not Risk.READ:
            return await self._run_once(call, admission, payload, ctx)
        result = await run_capability(admission.capability, payload, ctx)
        return self._outcome(admission, result)

    async def _run_once(
        self, call: InvokeCall, admission: Admission, payload: BaseModel, ctx: CallContext
    ) -> InvokeOutcome:
        ident = (admission.peer_id, admission.capability.name, call.idempotency_key)
        request_sha = call.payload_sha256
        stored = await self._idempotency.claim(
            ident, request_sha, str(admission.capability.version)
        )
        if stored is not None:
            return self._within_cap(
                admission,
                InvokeOutcome(stored.served_version, stored.payload, stored.evidence_sha256, True),
            )
        try:
            result = await run_capability(admission.capability, payload, ctx)
        except DeadlineExceeded as err:
            if err.detail == NOT_STARTED:  # nothing ran: the key stays free for a retry
                await self._idempotency.release(ident)
            else:
                self._idempotency.leave_in_doubt(ident)
            raise
        except BaseException:
            self._idempotency.leave_in_doubt(ident)
            raise
        served = str(admission.capability.version)
        # Stored before the cap check: the write happened, so a retry must get
        # this same answer (or the same OUTPUT_TOO_LARGE), never a second write.
        await self._idempotency.complete(
            ident, StoredAnswer(request_sha, served, result.payload, result.evidence_sha256)
        )
        return self._within_cap(
            admission, InvokeOutcome(served, result.payload, result.evidence_sha256)
        )

    def _outcome(self, admission: Admission, result: CapabilityResult) -> InvokeOutcome:
        outcome = InvokeOutcome(
            str(admission.capability.version), result.payload, result.evidence_sha256
        )
        return self._within_cap(admission, outcome)

    @staticmethod
    def _within_cap(admission: Admission, outcome: InvokeOutcome) -> InvokeOutcome:
        cap = admission.grant.max_payload_bytes
        if len(outcome.payload) > cap:
            done = (
                " (it ran; a retry with this key gets the same answer)"
                if (admission.capability.contract.risk is not Risk.READ)
                else ""
            )
            raise OutputTooLarge(
                f"output is {len(outcome.payload)} bytes; this peer's cap is {cap}{done}"
            )
        return outcome

    @staticmethod
    def _record(
        call: InvokeCall,
        peer_id: str,
        served: str,
        decision: str,
        reason: str,
        started: float,
        detail: str = "",
    ) -> AuditRecord:
        return AuditRecord(
            time_unix_ms=int(time.time() * 1000),
            request_id=call.request_id if _REQUEST_ID.fullmatch(call.request_id) else "",
            peer_id=peer_id,
            capability=call.capability[:128],
            version_constraint=call.version_constraint[:128],
            served_version=served,
            decision=decision,  # type: ignore[arg-type]
            reason=reason,
            payload_size=len(call.payload),
            payload_sha256=call.payload_sha256,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            task_id=call.task_id[:128],
            step_id=call.step_id[:128],
            detail=detail,
        )


def _describe_input_error(err: ValidationError, model: type[BaseModel]) -> str:
    # Locations and error kinds only: pydantic's messages can echo input values,
    # and an unknown key is payload content, so only declared names are shown.
    declared = _declared_names(model)
    problems = []
    for problem in err.errors(include_url=False, include_input=False)[:5]:
        parts = [
            str(part) if isinstance(part, int) or part in declared else "<unknown field>"
            for part in problem["loc"]
        ]
        problems.append(f"{'.'.join(parts) or '(payload)'}: {problem['type']}")
    more = err.error_count() - len(problems)
    suffix = f" (+{more} more)" if more > 0 else ""
    return "input does not match the contract: " + "; ".join(problems) + suffix


@lru_cache(maxsize=512)
def _declared_names(model: type[BaseModel]) -> frozenset[str]:
    """Every property name the model's JSON Schema declares, at any depth."""
    names: set[str] = set()
    pending: list[object] = [model.model_json_schema()]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            properties = node.get("properties")
            if isinstance(properties, dict):
                names.update(properties)
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return frozenset(names)
