"""The protocol-neutral request handler: decision pipeline → run → audit.

The gRPC servicer (``gateway.server.grpc_server``) only adapts the wire to this module.
Every call produces one outcome record; a call that ends in an error has it
committed before the error is returned. A call to a ``write`` or ``external``
capability also gets a write-ahead ``ADMITTED`` record, committed before the
capability runs, so no side effect happens that the log cannot show.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel

from capabilities.context import CallContext, CallEvents, PeerCall
from capabilities.contract import Risk
from capabilities.registry import CapabilityRegistry
from capabilities.runner import NOT_STARTED, CapabilityResult, run_capability
from gateway.audit import AuditLog, AuditRecord
from gateway.display import printable
from gateway.errors import (
    Cancelled,
    DeadlineExceeded,
    GatewayError,
    IdempotencyConflict,
    LimitRefusal,
    OutputTooLarge,
)
from gateway.identity import PresentedTokens, TokenIdentities
from gateway.identity.exchange import ActingFor
from gateway.inbound.call import REQUEST_ID, InvokeCall, deadline_from
from gateway.inbound.idempotency.store import IdempotencyStore, StoredAnswer
from gateway.inbound.in_flight import CallsInFlight, ProgressTap
from gateway.inbound.limits.admission import AdmissionControl, CallSlot, PeerCallLimits
from gateway.inbound.limits.refusal_log import LimitRefusalLog
from gateway.inbound.pipeline import (
    DecisionPipeline,
    EdgeSlot,
    Inbound,
    InFlight,
    PeerIssuerCheck,
    peer_id_from_cert,
)
from gateway.inbound.replay.mmap import ReplayTable
from gateway.inbound.replay.store import ReplayWindow
from gateway.telemetry.tracing import current_trace_id
from policies.decisions import Admission, visible_capabilities
from policies.grants import PeerGrant
from policies.store import PolicyStore

__all__ = [
    "ADMITTED",
    "AdmittedCall",
    "InvokeCall",
    "InvokeHandler",
    "InvokeOutcome",
    "PeerCallBinder",
    "deadline_from",
    "peer_id_from_cert",
]

ADMITTED = "ADMITTED"
"""Reason of the write-ahead record of a write/external call, committed before it runs."""
FOLLOW_UP = "follow-up message: input for its task"
"""Audit detail of a message that answered a running task's ``ctx.ask_input``."""

PeerCallBinder = Callable[[float, str, str, ActingFor | None], PeerCall]
"""Makes a capability's ``call_peer`` from (deadline, task_id, step_id, the user it acts for)."""


# Final fields, not frozen: see CONTRIBUTING.md, "Value classes built per call".
@dataclass(slots=True, unsafe_hash=True)
class AdmittedCall:
    """A call every check of the pipeline has passed; nothing has run yet.

    Attributes:
        call: The call as the transport delivered it.
        admission: Who, under which grant, served by which version.
        payload: The validated input.
        started: ``time.perf_counter()`` when the call arrived (audit latency).
        slot: Its in-flight places; ``run`` gives them back when the call ends.
    """

    call: Final[InvokeCall]
    admission: Final[Admission]
    payload: Final[BaseModel]
    started: Final[float]
    slot: Final[CallSlot | None] = None


# Final fields, not frozen: see CONTRIBUTING.md, "Value classes built per call".
@dataclass(slots=True, unsafe_hash=True)
class InvokeOutcome:
    """A successful Invoke's answer (``remembered``: the idempotency store's answer,
    served again without running the capability; sent as ``replayed`` on the wire)."""

    served_version: Final[str]
    payload: Final[bytes]
    evidence_sha256: Final[str]
    remembered: Final[bool] = False


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
        replay: ReplayWindow | None = None,
        limits: AdmissionControl | None = None,
        limit_refusals: LimitRefusalLog | None = None,
        peer_issuer: PeerIssuerCheck | None = None,
        tokens: TokenIdentities | None = None,
    ) -> None:
        self._registry = registry
        self._audit = audit
        self._idempotency = idempotency
        self._bind_peer_call = bind_peer_call
        self._running: set[asyncio.Future[object]] = set()
        """Tasks inside :meth:`run` (their outcome record is still to be queued)."""
        self.in_flight = CallsInFlight()
        """The calls inside :meth:`run`, one row each (the console's in-flight page)."""
        self.limits: AdmissionControl = limits if limits is not None else PeerCallLimits(256)
        """Per-peer rate/in-flight limits and the server-wide cap (``stats()``)."""
        self.limit_refusals = (
            limit_refusals if limit_refusals is not None else LimitRefusalLog(audit)
        )
        """Where limit refusals are audited, aggregated per peer and interval."""
        self.pipeline = DecisionPipeline(
            registry=registry,
            policies=policies,
            audit=audit,
            replay=replay if replay is not None else ReplayTable(None),
            limits=self.limits,
            peer_issuer=peer_issuer,
            tokens=tokens,
        )
        """The one decision path (every protocol's servicer goes through this handler)."""

    async def describe(
        self,
        peer_cert_pem: bytes | None,
        operation: str = "Describe",
        *,
        edge_slot: EdgeSlot | None = None,
        tokens: PresentedTokens | None = None,
    ) -> tuple[PeerGrant, list[Admission]]:
        """The caller's grant and the capabilities it may call (nothing else leaks).

        A refused Describe is audited like a refused Invoke (capability ``""``,
        detail ``operation``: ``Describe``, or the A2A method that asked).
        ``edge_slot``: as for :meth:`admit`; ``tokens``: the bearer tokens the
        request presented (``gateway.identity.presented``).
        """
        peer_id, grant = await self.admit_peer(
            peer_cert_pem, operation, edge_slot=edge_slot, tokens=tokens
        )
        return grant, [
            Admission(peer_id=peer_id, grant=grant, capability=cap)
            for cap in visible_capabilities(grant, self._registry)
        ]

    async def admit_peer(
        self,
        peer_cert_pem: bytes | None,
        operation: str,
        task_id: str = "",
        *,
        edge_slot: EdgeSlot | None = None,
        tokens: PresentedTokens | None = None,
    ) -> tuple[str, PeerGrant]:
        """The Describe prefix of the pipeline for a call that names no capability.

        Returns the caller's SPIFFE ID and live grant. A refusal is audited
        (detail ``operation``; limit refusals aggregated as for calls) and raised.
        The request takes a token of the peer's rate and must find room under
        its in-flight and the server's caps, like a call; it gives its slot back
        at once, as what follows is a short read of the agent's own state.
        ``edge_slot``: as for :meth:`admit`; ``tokens``: as for :meth:`describe`.
        """
        inbound = await self._admit_prefix(
            peer_cert_pem, operation, task_id, InFlight.ROOM, edge_slot=edge_slot, tokens=tokens
        )
        assert inbound.query is not None and inbound.query.grant is not None
        return inbound.peer_id, inbound.query.grant

    async def admit_task_reader(
        self,
        peer_cert_pem: bytes | None,
        operation: str,
        task_id: str,
        kind: InFlight,
        *,
        edge_slot: EdgeSlot | None = None,
        tokens: PresentedTokens | None = None,
    ) -> tuple[str, CallSlot]:
        """The Describe prefix for reading or following one's own tasks (``kind``).

        Returns the caller's SPIFFE ID and its slot: already given back for a
        poll, held for a subscription until the caller releases it.
        ``edge_slot``: as for :meth:`admit`; ``tokens``: as for :meth:`describe`.
        """
        inbound = await self._admit_prefix(
            peer_cert_pem, operation, task_id, kind, edge_slot=edge_slot, tokens=tokens
        )
        assert inbound.slot is not None
        return inbound.peer_id, inbound.slot

    async def admit_edge(
        self,
        peer_cert_pem: bytes | None,
        operation: str,
        kind: InFlight,
        *,
        tokens: PresentedTokens | None = None,
    ) -> tuple[str, PeerGrant, EdgeSlot]:
        """The Describe prefix for a transport that must hold the limits before it reads
        the request (the HTTP edge: nothing of a body is parsed before the rate holds).

        Returns the caller's SPIFFE ID, its live grant and the slot taken as
        ``kind`` (one token; refusals audited, limit refusals aggregated, as
        for any call). The slot is kept: pass it to the method that admits the
        request (``edge_slot=``), which adopts it instead of taking a second
        token, and call :meth:`EdgeSlot.release_unless_adopted` when the
        request ends.
        """
        inbound = await self._admit_prefix(
            peer_cert_pem, operation, "", kind, keep=True, tokens=tokens
        )
        assert inbound.query is not None and inbound.query.grant is not None
        assert inbound.slot is not None
        return inbound.peer_id, inbound.query.grant, EdgeSlot(inbound.slot, kind)

    async def _admit_prefix(
        self,
        peer_cert_pem: bytes | None,
        operation: str,
        task_id: str,
        kind: InFlight,
        *,
        edge_slot: EdgeSlot | None = None,
        keep: bool = False,
        tokens: PresentedTokens | None = None,
    ) -> Inbound:
        started = time.perf_counter()
        inbound = Inbound(
            InvokeCall(peer_cert_pem, "", "", "", b"", 0.0, task_id=task_id, tokens=tokens),
            in_flight=kind,
            edge_slot=edge_slot,
        )
        try:
            await self.pipeline.admit_describe(inbound)
        except GatewayError as refusal:
            await self._record_refusal(
                refusal,
                self._record(
                    inbound.call, inbound.peer_id, "", "refuse", refusal.reason, started, operation
                ),
            )
            if inbound.slot is not None:
                inbound.slot.release()
            raise
        except BaseException:
            if inbound.slot is not None:
                inbound.slot.release()
            raise
        if not keep and kind is not InFlight.HOLD and inbound.slot is not None:
            inbound.slot.release()
        return inbound

    async def _record_refusal(self, err: GatewayError, refusal: AuditRecord) -> None:
        # Limit refusals come in floods: aggregated (see limit_audit); every
        # other refusal is committed before its answer.
        if isinstance(err, LimitRefusal):
            await self.limit_refusals.record(refusal)
        else:
            await self._audit.record_durable(refusal)

    async def refuse(
        self, peer_id: str, error: GatewayError, operation: str, task_id: str = ""
    ) -> GatewayError:
        """Audit a refusal a transport decided after ``admit_peer``; returns ``error`` to raise.

        For what the pipeline cannot know: an operation or protocol version the
        transport does not offer, a task the caller does not own.
        """
        call = InvokeCall(None, "", "", "", b"", 0.0, task_id=task_id)
        detail = f"{operation}: {error.detail}" if error.detail else operation
        await self._audit.record_durable(
            self._record(call, peer_id, "", "refuse", error.reason, time.perf_counter(), detail)
        )
        return error

    async def abandon(self, admitted: AdmittedCall, error: GatewayError) -> None:
        """Audit an admitted call given up before it ran (decision ``allow``, as a call
        that failed: ``error``'s reason and detail). Its slot is the caller's to give back."""
        call, admission = admitted.call, admitted.admission
        served = str(admission.capability.version)
        await self._audit.record_durable(
            self._record(
                call,
                admission.peer_id,
                served,
                "allow",
                error.reason,
                admitted.started,
                error.detail,
            )
        )

    async def settle_follow_up(self, admitted: AdmittedCall, refusal: GatewayError | None) -> None:
        """Audit an admitted follow-up (a message answering a running task's ``ctx.ask_input``)
        once the task took it (``refusal`` None: ``allow``/``OK``) or could not (``refuse``:
        it stopped waiting meanwhile); give its slot back. The task's own run is audited
        when it ends, as any call.
        """
        call, admission = admitted.call, admitted.admission
        served = str(admission.capability.version)
        try:
            if refusal is None:
                record = self._record(
                    call, admission.peer_id, served, "allow", "OK", admitted.started, FOLLOW_UP
                )
                if admission.capability.contract.risk is Risk.READ:
                    self._audit.record(record)
                else:  # it resumes a capability that may write: committed first
                    await self._audit.record_durable(record)
            else:
                await self._audit.record_durable(
                    self._record(
                        call,
                        admission.peer_id,
                        "",
                        "refuse",
                        refusal.reason,
                        admitted.started,
                        f"{FOLLOW_UP}: {refusal.message}",
                    )
                )
        finally:
            if admitted.slot is not None:
                admitted.slot.release()

    async def invoke(self, call: InvokeCall) -> InvokeOutcome:
        """Run one call end to end; raises a GatewayError on refusal or failure."""
        return await self.run(await self.admit(call))

    async def admit(
        self,
        call: InvokeCall,
        *,
        edge_slot: EdgeSlot | None = None,
        in_flight: InFlight = InFlight.ROOM,
    ) -> AdmittedCall:
        """Every check of the pipeline; a refusal is audited and raised (nothing ran).

        A transport that answers refusals and failures differently (A2A: a gRPC
        error before admission, a failed task after it) calls ``admit`` and
        ``run`` itself; ``invoke`` is the two in a row. ``edge_slot``: the slot
        the transport took for this request before reading it
        (:meth:`admit_edge`); ``within_limits`` adopts it, so the request costs
        one token. ``in_flight``: POLL for a message that continues a running task
        (an answer to ``ctx.ask_input``): it needs no room under ``max_in_flight``,
        which its own task may hold.
        """
        started = time.perf_counter()
        inbound = Inbound(call, in_flight=in_flight, edge_slot=edge_slot)
        try:
            await self.pipeline.admit_call(inbound)
        except GatewayError as refusal:
            if inbound.slot is not None:  # refused by a check after within_limits
                inbound.slot.release()
            await self._record_refusal(
                refusal,
                self._record(  # the decoded call, if the refusal came after decoding
                    inbound.call,
                    inbound.peer_id,
                    "",
                    "refuse",
                    refusal.reason,
                    started,
                    refusal.detail,
                ),
            )
            raise
        except BaseException:
            if inbound.slot is not None:
                inbound.slot.release()
            raise
        assert inbound.payload is not None
        return AdmittedCall(inbound.call, inbound.admission, inbound.payload, started, inbound.slot)

    async def run(self, admitted: AdmittedCall, events: CallEvents | None = None) -> InvokeOutcome:
        """Run an admitted call; a failure is audited (decision ``allow``; ``refuse`` for
        an idempotency key reused with another payload, which runs nothing) and raised.

        The call's in-flight slot is given back when this returns or raises.
        ``events`` receives the capability's ``ctx.report_progress`` and
        ``ctx.emit_chunk`` (a streamed or background A2A task). A cancellation
        is audited ``CANCELLED`` with the text given to ``Task.cancel(msg)`` as
        its detail (who cancelled), then raised.
        """
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        call, admission = admitted.call, admitted.admission
        key, row = self.in_flight.start(
            admission.peer_id,
            admission.capability.name,
            str(admission.capability.version),
            task_id=call.task_id,
            request_id=call.request_id,
        )
        if events is not None:
            events = ProgressTap(events, self.in_flight, row)
        try:
            return await self._run(admitted, events)
        finally:
            self.in_flight.end(key)
            if task is not None:
                self._running.discard(task)
            if admitted.slot is not None:
                admitted.slot.release()

    async def wait_running(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until no call is inside :meth:`run`.

        At shutdown, after the server cancelled the calls still running: each
        queues its ``CANCELLED`` record as its cancellation unwinds, which must
        happen before the audit log closes.
        """
        if self._running:
            await asyncio.wait(set(self._running), timeout=timeout)

    async def _run(self, admitted: AdmittedCall, events: CallEvents | None) -> InvokeOutcome:
        call, admission, started = admitted.call, admitted.admission, admitted.started
        peer_id = admission.peer_id
        ctx = self._context(call, admission, events)
        served = str(admission.capability.version)
        if admission.capability.contract.risk is not Risk.READ:
            # Write-ahead: a side effect never happens without a committed record.
            try:
                await self._audit.record_durable(
                    self._record(call, peer_id, served, "allow", ADMITTED, started)
                )
            except asyncio.CancelledError as err:
                # Cut off while its ADMITTED record commits (a deadline, a hang-up,
                # CancelTask): that record lands all the same, so its outcome must too.
                self._record_cancelled(
                    call, peer_id, served, started, _cancel_detail(err, NOT_STARTED)
                )
                raise
        try:
            outcome = await self._execute(call, admission, admitted.payload, ctx)
        except GatewayError as failure:
            # A key reused with another payload is refused before anything runs, and
            # the caller is told so: the log says the same (after any ADMITTED record).
            decision = "refuse" if isinstance(failure, IdempotencyConflict) else "allow"
            await self._record_failure(
                self._record(
                    call, peer_id, served, decision, failure.reason, started, failure.detail
                )
            )
            raise
        except asyncio.CancelledError as err:
            self._record_cancelled(call, peer_id, served, started, _cancel_detail(err))
            raise
        self._audit.record(
            self._record(
                call,
                peer_id,
                served,
                "allow",
                "OK",
                started,
                "idempotent replay" if outcome.remembered else "",
            )
        )
        return outcome

    async def _record_failure(self, failure: AuditRecord) -> None:
        """Commit the record of an admitted call that failed, even if cancelled meanwhile."""
        try:
            await self._audit.record_durable(failure)
        except asyncio.CancelledError:
            # The call has already ended and its record lands all the same
            # (record_durable): a cancel now (CancelTask, shutdown) must not
            # make the answer say CANCELLED while the audit says the failure.
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()

    def _record_cancelled(
        self, call: InvokeCall, peer_id: str, served: str, started: float, detail: str
    ) -> None:
        """Queue an admitted call's ``CANCELLED`` record."""
        self._audit.record(
            self._record(call, peer_id, served, "allow", Cancelled.reason, started, detail)
        )

    def _context(
        self, call: InvokeCall, admission: Admission, events: CallEvents | None = None
    ) -> CallContext:
        acting = acting_for(call)
        return CallContext(
            peer_id=admission.peer_id,
            request_id=call.request_id,
            deadline=call.deadline,
            task_id=call.task_id,
            step_id=call.step_id,
            idempotency_key=call.idempotency_key,
            call_peer=(
                None
                if self._bind_peer_call is None
                else self._bind_peer_call(call.deadline, call.task_id, call.step_id, acting)
            ),
            events=events,
            message=call.message,
            user=None if acting is None else acting.user,
        )

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
        # A cancellation during the claim releases the key inside ``claim``
        # (nothing ran). From here to the capability's first line there is no
        # await, so any later CancelledError means the function had started.
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
            if err.detail != NOT_STARTED:
                self._idempotency.leave_in_doubt(ident)
                raise
            # Nothing ran: the key stays free for a retry.
            await self._idempotency.release(ident)
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
        on_behalf_of, actor_chain = _user_columns(call)
        return AuditRecord(
            time_unix_ms=int(time.time() * 1000),
            request_id=call.request_id if REQUEST_ID.fullmatch(call.request_id) else "",
            peer_id=peer_id,
            # Escaped as well as cut: a refused envelope can hold control or
            # bidi characters, and not every reader of the log escapes them.
            capability=_shown(call.capability),
            version_constraint=_shown(call.version_constraint),
            served_version=served,
            decision=decision,  # type: ignore[arg-type]
            reason=reason,
            payload_size=call.payload_size,
            payload_sha256=call.payload_sha256,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            task_id=_shown(call.task_id),
            step_id=_shown(call.step_id),
            detail=detail,
            trace_id=current_trace_id(),
            on_behalf_of=on_behalf_of,
            actor_chain=actor_chain,
        )


def acting_for(call: InvokeCall) -> ActingFor | None:
    """The user ``call`` acts for, with the token it came with (for calls onward)."""
    tokens = call.tokens
    if tokens is None or tokens.verified is None or tokens.verified.user is None:
        return None
    return ActingFor(tokens.verified.user, tokens.user)


NO_USER = ("", "")
"""What :func:`acting_user` gives for a call that acts for no user."""


def acting_user(call: InvokeCall) -> tuple[str, str]:
    """(subject, issuer) of the verified user ``call`` acts for (:data:`NO_USER`: none):
    what tells one user's A2A task from another's of the same caller."""
    return user_of(call.tokens)


def user_of(tokens: PresentedTokens | None) -> tuple[str, str]:
    """(subject, issuer) of the user ``tokens`` proved once the pipeline verified them
    (:data:`NO_USER`: none, or not verified)."""
    user = None if tokens is None or tokens.verified is None else tokens.verified.user
    return NO_USER if user is None else (user.subject, user.issuer)


def _user_columns(call: InvokeCall) -> tuple[str, str]:
    """The audit record's ``on_behalf_of`` and ``actor_chain`` for ``call``: its verified
    user's subject and actors (never a token), or two empty strings."""
    tokens = call.tokens
    if tokens is None or tokens.verified is None or tokens.verified.user is None:
        return "", ""
    user = tokens.verified.user
    actors = json.dumps(list(user.actors), separators=(",", ":"), ensure_ascii=True)
    return printable(user.subject[:256]), actors


def _cancel_detail(err: asyncio.CancelledError, note: str = "") -> str:
    """A cancelled call's audit detail: the text given to ``Task.cancel(msg)`` (who
    cancelled), then ``note`` (e.g. that the capability never started)."""
    given = str(err.args[0]) if err.args and isinstance(err.args[0], str) else ""
    return "; ".join(part for part in (given, note) if part)


def _shown(text: str) -> str:
    """A name or id of the call as its record holds it: cut to 128 characters, escaped."""
    # Most are empty (no task, no constraint): no slice, no scan.
    return printable(text[:128]) if text else ""
