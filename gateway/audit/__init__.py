"""Tamper-evident, append-only audit log of every gateway decision.

Records never carry payload content, only its size and SHA-256. They are
stored in SQLite (WAL) with a hash chain; :func:`verify_chain` names any
record that was modified, deleted, inserted or reordered, and a cut-off tail.
Signed checkpoints of the chain head, written outside the database, catch a
tail cut off together with a rewritten head (:func:`verify_checkpoints`).
"""

from gateway.audit.checkpoint_verify import CheckpointReport, verify_checkpoints
from gateway.audit.log import AuditLog
from gateway.audit.query import format_json_lines, format_table, parse_since, query_records
from gateway.audit.record import AuditRecord, Decision
from gateway.audit.verify import ChainProblem, VerifyReport, verify_chain

__all__ = [
    "AuditLog",
    "AuditRecord",
    "ChainProblem",
    "CheckpointReport",
    "Decision",
    "VerifyReport",
    "format_json_lines",
    "format_table",
    "parse_since",
    "query_records",
    "verify_chain",
    "verify_checkpoints",
]
