"""``[audit_checkpoints]``: signed checkpoints of the audit chain head."""

from __future__ import annotations

from pathlib import Path

from pydantic import (
    Field,
)

from gateway.config.fields import FrozenTable


class AuditCheckpoints(FrozenTable):
    """Signed checkpoints of the audit chain head, written outside the database.

    Attributes:
        enabled: Write checkpoints (default). Without them a cut-off tail with
            a rewritten chain head goes unnoticed by ``audit verify``.
        every_records: Checkpoint after this many records since the last one.
        every_seconds: ...or after this long with records not yet covered.
        file: Append-only JSONL file; default ``<audit_db>.checkpoints.jsonl``
            (``<state_dir>/audit.checkpoints.jsonl`` when ``audit_db`` is a DSN).
    """

    enabled: bool = True
    every_records: int = Field(default=1000, ge=1)
    every_seconds: float = Field(default=60.0, gt=0)
    file: Path | None = None
