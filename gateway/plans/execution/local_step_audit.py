"""A plan step this agent runs itself is a call like any other: it is audited.

What a local step does not pass is the peer policy: grants say what *other*
identities may call here, and the caller of a local step is the agent itself,
running a plan its operator gave it. Its bounds are the plan's own (``max_risk``,
approval, budgets), checked before the step runs. What it shares with every
call is the record: a write (risk above ``read``) gets its write-ahead
``ADMITTED`` record committed before the capability runs, and every outcome
(``OK``, the failure's reason, ``CANCELLED``) is recorded with the plan's task
and step ids, peer = this agent, and the payload's size and digest, never its
content.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from capabilities.contract import Risk
from gateway.audit import AuditLog
from gateway.audit.record import AuditRecord
from gateway.errors import Cancelled, GatewayError
from gateway.telemetry.tracing import current_trace_id

ADMITTED = "ADMITTED"
LOCAL_STEP_DETAIL = "local plan step"
_T = TypeVar("_T")


class LocalStepAudit:
    """Writes the records of one local step attempt around its run."""

    def __init__(
        self,
        audit: AuditLog,
        *,
        agent_id: str,
        request_id: str,
        task_id: str,
        step_id: str,
        capability: str,
        constraint: str,
        served: str,
        payload: bytes,
    ) -> None:
        self._audit = audit
        self._started = time.perf_counter()
        self._fields = dict(
            request_id=request_id,
            peer_id=agent_id,
            capability=capability,
            version_constraint=constraint,
            served_version=served,
            payload_size=len(payload),
            payload_sha256=hashlib.sha256(payload).hexdigest(),
            task_id=task_id,
            step_id=step_id,
        )

    async def around(self, risk: Risk, run: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``run()`` with the write-ahead record first (writes) and its outcome after."""
        if risk is not Risk.READ:
            await self._audit.record_durable(self._record(ADMITTED))
        try:
            answer = await run()
        except GatewayError as err:
            await self._audit.record_durable(self._record(err.reason))
            raise
        except asyncio.CancelledError:
            self._audit.record(self._record(Cancelled.reason))
            raise
        self._audit.record(self._record("OK"))
        return answer

    def _record(self, reason: str) -> AuditRecord:
        return AuditRecord(
            time_unix_ms=int(time.time() * 1000),
            decision="allow",
            reason=reason,
            latency_ms=(time.perf_counter() - self._started) * 1000.0,
            detail=LOCAL_STEP_DETAIL,
            trace_id=current_trace_id(),
            **self._fields,  # type: ignore[arg-type]
        )
