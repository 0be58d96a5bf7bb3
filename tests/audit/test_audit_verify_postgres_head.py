"""``audit verify --agent`` on PostgreSQL reports a deleted chain head as tampering,
as it does without ``--agent`` and as SQLite does for its ``chain_head`` row."""

from __future__ import annotations

import psycopg
import pytest

from gateway.audit import AuditLog, AuditRecord
from gateway.cli.main import main
from gateway.storage import location, open_chain_writer

ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"


async def test_verify_of_one_agent_whose_head_row_was_deleted_names_the_tampering(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    log = AuditLog(open_chain_writer(location(pg_dsn), agent_id=ALICE))
    await log.start()
    for n in range(3):
        log.record(
            AuditRecord(
                time_unix_ms=1_700_000_000_000 + n,
                request_id=f"req-{n}",
                peer_id=BOB,
                capability="text.echo",
                version_constraint="",
                served_version="1.0.0",
                decision="allow",
                reason="OK",
                payload_size=10,
                payload_sha256=f"{n:064x}",
                latency_ms=0.5,
            )
        )
    await log.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM audit_heads WHERE agent_id = %s", (ALICE,))

    assert main(["audit", "verify", "--db", pg_dsn]) == 1
    whole = capsys.readouterr().out
    assert f"{ALICE}: seq 4: truncated: chain_head row is missing" in whole

    assert main(["audit", "verify", "--db", pg_dsn, "--agent", ALICE]) == 1
    captured = capsys.readouterr()
    assert f"{ALICE}: seq 4: truncated: chain_head row is missing" in captured.out
    assert "1 chain(s), 1 broken" in captured.out
