"""Verify an audit log's hash chain and say what was tampered with, by seq.

How each tampering shows (``written seq`` is the seq a record was hashed
with, found by recomputing its hash)::

    modified    the row's hash matches no seq (a field was edited), or a
                rehashed row no longer matches its successor's prev_hash or
                the chain head
    deleted     a written seq below the last one is held by no row
    inserted    a row that belongs to no written seq: its hash matches none
                and its seq is taken by a renumbered original or lies beyond
                the chain head; or a valid-looking fork nothing links to
    reordered   rows whose written seqs are a permutation of their stored seqs
    truncated   the chain head counts more records than the last one present
                (also when its hash names an earlier record: a cut tail
                with a rewritten hash); a head counting fewer than the
                record its hash names is ``modified`` there, unless the
                rows were renumbered to end at the count (a deletion or
                insertion, reported as such)

Rows renumbered only to make room for an inserted row (or to close the gap
of a deleted one) are explained by that problem, not reported again. A log
rewritten wholesale, head included, cannot be detected from the database
alone: signed checkpoints kept outside it
(:mod:`gateway.audit.checkpoint_verify`) catch that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gateway.audit.chain import GENESIS_HASH, fields_hash
from gateway.audit.record import AuditRecord
from gateway.audit.store.sqlite_schema import record_from_row

if TYPE_CHECKING:
    from gateway.audit.store.store import AuditReader

ProblemKind = Literal[
    "modified",
    "deleted",
    "inserted",
    "reordered",
    "truncated",
    "ends_before_checkpoint",
    "checkpoint_mismatch",
    "checkpoint_bad_signature",
    "checkpoint_unreadable",
]
"""What went wrong; the ``checkpoint_*`` kinds and ``ends_before_checkpoint``
come from :func:`gateway.audit.checkpoint_verify.verify_checkpoints`."""


@dataclass(frozen=True)
class ChainProblem:
    """One place where the log differs from what was written."""

    seq: int
    """Stored seq of the offending row (for deleted/truncated: the first missing seq;
    for checkpoint problems: the checkpoint's seq, 0 if unreadable)."""
    kind: ProblemKind
    """What happened there."""
    message: str
    """A sentence for humans."""


@dataclass(frozen=True)
class VerifyReport:
    """The result of :func:`verify_chain`."""

    records: int
    """Rows present in the log."""
    problems: tuple[ChainProblem, ...]
    """Problems found, ordered by seq; empty when the chain is intact."""

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


@dataclass(slots=True, eq=False)
class _Row:
    record: AuditRecord
    prev_hash: str
    record_hash: str
    written: int | None = None

    @property
    def seq(self) -> int:
        return self.record.seq


def verify_chain(reader: AuditReader, agent: str | None = None) -> VerifyReport:
    """Check every record of the store ``reader`` reads against its hash chain.

    Reads only; the log may be in use by a gateway meanwhile. A store of many
    chains checks ``agent``'s (``agent`` may be left out when it holds one
    chain only; see :func:`gateway.audit.store.postgres.verify_agent_chains` for all
    of them).

    Raises:
        ConfigError: The store is missing, unreadable, or not an audit log.
    """
    return reader.verify(agent)


def verify_rows(raw: Sequence[Sequence[Any]], head: tuple[int, str] | None) -> VerifyReport:
    """Check one chain given as rows (record columns, then prev and record hash) in
    seq order and its head (count, last hash); any storage reads its rows this way."""
    rows = [_Row(record_from_row(r), str(r[-2]), str(r[-1])) for r in raw]
    return VerifyReport(len(rows), _ChainAnalysis(rows, head).problems())


class _ChainAnalysis:
    """One pass over a loaded log; see the module docstring for the rules."""

    def __init__(self, rows: list[_Row], head: tuple[int, str] | None) -> None:
        self._rows = rows
        self._head = head
        self._stored_count = 0 if head is None else head[0]
        self._by_hash: dict[str, _Row] = {}
        for row in rows:
            self._by_hash.setdefault(row.record_hash, row)
        self._linked = {row.prev_hash for row in rows} | ({head[1]} if head else set())
        self._found: list[ChainProblem] = []
        self._reported: set[int] = set()

    def problems(self) -> tuple[ChainProblem, ...]:
        _resolve_written_seqs(self._rows, self._by_hash)
        self._anchor_head()
        authentic = self._authentic_rows()
        taken = frozenset(authentic)
        positions = set(taken)
        for row in self._rows:
            if row.written is None and self._is_modified(row, taken):
                positions.add(row.seq)
        self._check_links(authentic)
        self._check_missing(positions)
        self._check_head(authentic)
        self._check_moves(authentic)
        return tuple(sorted(self._found, key=lambda p: (p.seq, p.kind)))

    def _anchor_head(self) -> None:
        # The head's hash outranks its count: a count edited to hide a deletion
        # must not turn the records after it into insertions.
        if self._head is None:
            return
        last = self._by_hash.get(self._head[1])
        if last is not None and last.written is not None:
            self._head = (last.written, self._head[1])
            self._check_head_count(last, last.written)

    def _check_head_count(self, last: _Row, anchored: int) -> None:
        """Report a head whose count matches neither its hash's record nor the stored rows.

        A count that still names the last stored row goes with renumbered rows
        (a deletion or insertion, reported as such); any other count was edited
        alone, or the tail was cut and the hash rewritten: the writer refuses to
        open such a log, so it is never intact.
        """
        count = self._stored_count
        if count == anchored or count == max(row.seq for row in self._rows):
            return
        if count > anchored:
            self._report(
                last.seq + 1,
                "truncated",
                f"chain head counts {count} records but ends at the record written as "
                f"{anchored}; seqs {anchored + 1}..{count} are missing",
            )
        else:
            self._report(
                last.seq,
                "modified",
                f"chain head counts {count} records but ends at the record written as {anchored}",
            )

    def _report(self, seq: int, kind: ProblemKind, message: str) -> None:
        self._found.append(ChainProblem(seq, kind, message))
        self._reported.add(seq)

    def _authentic_rows(self) -> dict[int, _Row]:
        """Rows that verify, by written seq; forks and rows past the head are reported."""
        claims: dict[int, list[_Row]] = {}
        for row in self._rows:
            if row.written is not None:
                claims.setdefault(row.written, []).append(row)
        limit = self._head[0] if self._head else None
        authentic: dict[int, _Row] = {}
        for written, rivals in sorted(claims.items()):
            keep = self._pick_original(rivals)
            for row in rivals:
                if row is not keep:
                    self._report(row.seq, "inserted", f"seq {row.seq} forks the chain at {written}")
            if limit is not None and written > limit:
                self._report(keep.seq, "inserted", f"seq {keep.seq} is beyond the chain head")
            else:
                authentic[written] = keep
        return authentic

    def _pick_original(self, rivals: list[_Row]) -> _Row:
        linked = [row for row in rivals if row.record_hash in self._linked]
        pool = linked if len(linked) == 1 else (linked or rivals)
        in_place = [row for row in pool if row.seq == row.written]
        return (in_place or sorted(pool, key=lambda row: row.seq))[0]

    def _is_modified(self, row: _Row, taken: frozenset[int]) -> bool:
        """Report an unverifiable row; True if it is an edited original (holds its seq)."""
        if row.seq in taken:
            self._report(
                row.seq, "inserted", f"seq {row.seq} is not in the chain; its original was moved"
            )
        elif self._head is not None and row.seq > self._head[0]:
            self._report(row.seq, "inserted", f"seq {row.seq} is beyond the chain head")
        else:
            self._report(row.seq, "modified", f"seq {row.seq} does not match its record hash")
            return True
        return False

    def _check_links(self, authentic: dict[int, _Row]) -> None:
        for written, row in sorted(authentic.items()):
            if written == 1:
                if row.prev_hash != GENESIS_HASH:
                    self._report(row.seq, "modified", f"seq {row.seq} does not start the chain")
                continue
            before = authentic.get(written - 1)
            if before is None or before.record_hash == row.prev_hash:
                continue  # missing or unverifiable predecessor: reported on its own
            if before.seq not in self._reported:
                self._report(
                    before.seq,
                    "modified",
                    f"seq {before.seq} was rehashed: seq {row.seq} does not chain onto it",
                )

    def _check_missing(self, positions: set[int]) -> None:
        last = max(positions, default=0)
        for first, end in _gaps(positions):
            span = f"seq {first}" if first == end else f"seqs {first}..{end}"
            self._report(first, "deleted", f"{span} missing from the chain")
        if self._head is None:
            if self._rows:
                self._report(last + 1, "truncated", "chain_head row is missing")
        elif self._head[0] > last:
            self._report(
                last + 1,
                "truncated",
                f"chain head counts {self._head[0]} records; seqs {last + 1}.. are missing",
            )

    def _check_head(self, authentic: dict[int, _Row]) -> None:
        if self._head is None or self._head[0] == 0:
            return
        count, last_hash = self._head
        last = authentic.get(count)
        if last is not None and last.record_hash != last_hash and last.seq not in self._reported:
            self._report(
                last.seq, "modified", f"seq {last.seq} was rehashed: chain head does not match"
            )

    def _check_moves(self, authentic: dict[int, _Row]) -> None:
        # stored seq -> written seq of each moved row; an injective map, so its
        # components are cycles (a reordering) or chains (a shift).
        target = {row.seq: written for written, row in authentic.items() if written != row.seq}
        seen: set[int] = set()
        shifted: list[int] = []
        for start in target:
            if start in seen:
                continue
            path, cur = [], start
            while cur in target and cur not in seen:
                seen.add(cur)
                path.append(cur)
                cur = target[cur]
            if cur == start:
                for seq in path:
                    self._report(
                        seq, "reordered", f"seq {seq} holds the record written as {target[seq]}"
                    )
            else:
                shifted.extend(path)
        if shifted and not any(p.kind in ("inserted", "deleted") for p in self._found):
            for seq in shifted:
                self._report(
                    seq, "reordered", f"seq {seq} holds the record written as {target[seq]}"
                )


def _resolve_written_seqs(rows: list[_Row], by_hash: dict[str, _Row]) -> None:
    """Set each row's ``written`` seq: its own if it verifies, else one that does."""
    pending: list[_Row] = []
    for row in rows:
        if _hashes_as(row, row.seq):
            row.written = row.seq
        else:
            pending.append(row)
    progress = True
    while pending and progress:
        progress = False
        still: list[_Row] = []
        for row in pending:
            found = next((s for s in _candidates(row, by_hash) if _hashes_as(row, s)), None)
            if found is None:
                still.append(row)
            else:
                row.written, progress = found, True
        pending = still


def _candidates(row: _Row, by_hash: dict[str, _Row]) -> list[int]:
    # A renumbered record was written right after the record its prev_hash names.
    found = [1] if row.prev_hash == GENESIS_HASH else []
    before = by_hash.get(row.prev_hash)
    if before is not None and before.written is not None:
        found.append(before.written + 1)
    return [*found, row.seq - 1, row.seq + 1]


def _hashes_as(row: _Row, seq: int) -> bool:
    fields = row.record.to_json_dict()
    fields["seq"] = seq
    try:
        return fields_hash(row.prev_hash, fields) == row.record_hash
    except (TypeError, ValueError):
        return False  # a stored value no canonical form accepts: edited


def _gaps(positions: set[int]) -> list[tuple[int, int]]:
    """The runs ``(first, last)`` of seqs from 1 up to ``max(positions)`` not in ``positions``.

    Computed between neighbours, never by listing every seq: a row edited to
    seq 2**62 must cost one gap, not memory for 2**62 numbers.
    """
    gaps: list[tuple[int, int]] = []
    expected = 1
    for seq in sorted(seq for seq in positions if seq >= 1):
        if seq > expected:
            gaps.append((expected, seq - 1))
        expected = max(expected, seq + 1)
    return gaps
