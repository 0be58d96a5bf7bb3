"""The ``jti`` values of single-use tokens already presented, each kept until its token expires.

Bounded: at :data:`MAX_SPENT` live entries, expired ones are dropped first; if
none has expired, a new token is refused rather than an old one forgotten
(forgetting would let that token be presented again). Memory of this process
only: an issuer with ``single_use_jti`` needs ``workers = 1``.
"""

from __future__ import annotations

from gateway.errors import TokenInvalid

MAX_SPENT = 200_000
"""Most single-use tokens remembered at once (their ``exp`` bounds how long each stays)."""


class SpentTokenIds:
    """Remembers ``(issuer, jti)`` keys until their tokens expire."""

    def __init__(self, capacity: int = MAX_SPENT) -> None:
        self._until: dict[str, float] = {}
        self._capacity = capacity

    def first_use(self, key: str, until: float, now: float) -> bool:
        """True (and remembered until ``until``) the first time ``key`` is seen while live.

        Raises:
            TokenInvalid: the set is full of live entries (fails closed).
        """
        seen = self._until.get(key)
        if seen is not None and seen >= now:
            return False
        if len(self._until) >= self._capacity:
            self._until = {k: t for k, t in self._until.items() if t >= now}
            if len(self._until) >= self._capacity:
                raise TokenInvalid(
                    "too many single-use tokens are live at once; try again later",
                    detail="single-use jti set full",
                )
        self._until[key] = until
        return True
