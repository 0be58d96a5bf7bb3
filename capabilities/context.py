"""What a running capability may know about the call it serves."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol


class PeerCall(Protocol):
    """Calls a capability on a peer from inside a capability.

    Bound by the gateway to the current call: the outbound rules apply and the
    call's remaining time travels on as the peer call's deadline. Returns the
    peer's output; raises the gateway error the peer (or the policy) answered.
    """

    async def __call__(
        self, peer_id: str, capability: str, payload: dict[str, Any], *, constraint: str = ""
    ) -> Any: ...


@dataclass(frozen=True, slots=True)
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
    """

    peer_id: str
    request_id: str
    deadline: float
    task_id: str = ""
    step_id: str = ""
    idempotency_key: str = ""
    call_peer: PeerCall | None = None

    def time_remaining(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())
