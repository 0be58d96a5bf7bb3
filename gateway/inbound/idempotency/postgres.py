"""Idempotency keys in PostgreSQL, shared by every replica of one agent id.

The same states and answers as the SQLite store (claimed, in_doubt, done;
see :mod:`gateway.inbound.idempotency.store`), with two differences a fleet needs:

* A claim is ``INSERT ... ON CONFLICT DO NOTHING``: of two replicas getting
  the same key at once exactly one inserts the row and runs the write; the
  other reads the row and answers as a retry would (in doubt, or the answer).
* Opening the store does not mark every ``claimed`` row in doubt (other
  replicas' attempts may be running): only claims whose owner process is gone
  (:func:`gateway.local.process_owner.holder_gone`) or older than ``STALE_CLAIM``.
  Either way a retry of such a key gets ``IDEMPOTENCY_IN_DOUBT``, never a
  second write.
"""

from __future__ import annotations

import logging
import secrets
import time
from datetime import timedelta

from gateway.errors import IdempotencyConflict, IdempotencyInDoubt
from gateway.inbound.idempotency.store import IdempotencyStore, Ident, StoredAnswer
from gateway.local.process_owner import holder_gone
from gateway.postgres.pool import Connection, StatePool

_log = logging.getLogger(__name__)
STALE_CLAIM = timedelta(hours=1)
"""A claim older than this is marked in doubt whoever holds it (no call lasts as long)."""

_KEY = "agent_id = %s AND peer = %s AND capability = %s AND key = %s"


def _now_ms() -> int:
    return int(time.time() * 1000)


class PostgresIdempotencyStore(IdempotencyStore):
    """An :class:`~gateway.inbound.idempotency.store.IdempotencyStore` whose rows live in the
    shared ``idempotency`` table."""

    def __init__(self, pool: StatePool, agent_id: str) -> None:
        """``agent_id``'s keys, reached through ``pool`` (the factory's, "idempotency store")."""
        super().__init__()  # the in-process coordination; the rows live in the table
        self._agent = agent_id
        self._pool = pool

    def mark_cut_off_claims(self) -> int:
        """Mark in doubt the claims of processes that are gone (or stale); returns how many."""

        def work(conn: Connection) -> int:
            rows = conn.execute(
                "SELECT peer, capability, key, claim_owner, updated_unix_ms FROM idempotency "
                "WHERE agent_id = %s AND state = 'claimed'",
                (self._agent,),
            ).fetchall()
            stale_ms = _now_ms() - int(STALE_CLAIM.total_seconds() * 1000)
            cut = [
                (str(r[0]), str(r[1]), str(r[2]))
                for r in rows
                if holder_gone(str(r[3])) or int(str(r[4])) < stale_ms
            ]
            for ident in cut:
                conn.execute(
                    "UPDATE idempotency SET state = 'in_doubt', updated_unix_ms = %s "
                    f"WHERE {_KEY} AND state = 'claimed'",
                    (_now_ms(), self._agent, *ident),
                )
            return len(cut)

        cut_off = self._pool.run(work)
        if cut_off:
            _log.warning("idempotency store: %d key(s) in doubt from attempts cut off", cut_off)
        return cut_off

    async def purge_completed(self, older_than: timedelta) -> int:
        await self._run(self.mark_cut_off_claims)
        return await super().purge_completed(older_than)

    def close(self) -> None:
        self._pool.close()

    def _claim_row(
        self, ident: Ident, request_sha256: str, served_version: str
    ) -> StoredAnswer | None:
        claim_id = secrets.token_hex(8)

        def work(conn: Connection) -> tuple[object, ...] | None:
            inserted = conn.execute(
                "INSERT INTO idempotency (agent_id, peer, capability, key, request_sha256, "
                "state, served_version, claim_id, claim_owner, updated_unix_ms) "
                "VALUES (%s, %s, %s, %s, %s, 'claimed', %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING RETURNING 1",
                (
                    self._agent,
                    *ident,
                    request_sha256,
                    served_version,
                    claim_id,
                    self._owner,
                    _now_ms(),
                ),
            ).fetchone()
            if inserted is not None:
                return None
            found = conn.execute(
                "SELECT request_sha256, state, served_version, payload, evidence_sha256 "
                f"FROM idempotency WHERE {_KEY}",
                (self._agent, *ident),
            ).fetchone()
            return () if found is None else found

        row = self._pool.run(work)
        if row is None:
            self._claims[ident] = claim_id
            return None
        if not row:  # released between the two statements (each sees a new snapshot): retry
            return self._claim_row(ident, request_sha256, served_version)
        if row[1] != "done":
            if row[0] != request_sha256:
                raise IdempotencyConflict("idempotency key already used with a different payload")
            raise IdempotencyInDoubt(
                "an earlier attempt with this key was cut off; its effect is unknown"
            )
        payload = row[3]
        assert isinstance(payload, bytes)
        return StoredAnswer(str(row[0]), str(row[2]), payload, str(row[4]))

    def _complete_row(self, ident: Ident, answer: StoredAnswer) -> None:
        self._pool.run(
            lambda conn: conn.execute(
                "UPDATE idempotency SET state = 'done', served_version = %s, payload = %s, "
                f"evidence_sha256 = %s, updated_unix_ms = %s WHERE {_KEY}",
                (
                    answer.served_version,
                    answer.payload,
                    answer.evidence_sha256,
                    _now_ms(),
                    self._agent,
                    *ident,
                ),
            )
        )

    def _delete_claim(self, ident: Ident) -> None:
        self._pool.run(
            lambda conn: conn.execute(
                f"DELETE FROM idempotency WHERE {_KEY} AND state = 'claimed'",
                (self._agent, *ident),
            )
        )

    def _mark_in_doubt(self, ident: Ident, claim_id: str) -> None:
        try:
            self._pool.run(
                lambda conn: conn.execute(
                    "UPDATE idempotency SET state = 'in_doubt', updated_unix_ms = %s "
                    f"WHERE {_KEY} AND state = 'claimed' AND claim_id = %s",
                    (_now_ms(), self._agent, *ident, claim_id),
                )
            )
        except Exception as err:  # stays 'claimed': still refused, never rerun
            _log.warning("idempotency store: cannot mark a key in doubt: %s", err)

    def _purge_rows(self, cutoff_ms: int) -> int:
        return self._pool.run(
            lambda conn: (
                conn.execute(
                    "DELETE FROM idempotency WHERE agent_id = %s AND state = 'done' "
                    "AND updated_unix_ms < %s",
                    (self._agent, cutoff_ms),
                ).rowcount
            )
        )
