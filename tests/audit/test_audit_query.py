"""query_records filters, the table and JSON-lines renderings, and parse_since."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.audit import (
    AuditLog,
    AuditRecord,
    format_json_lines,
    format_table,
    parse_since,
    query_records,
)
from gateway.audit.filter import AuditFilter
from gateway.audit.query import recent_request_ids
from gateway.errors import ConfigError
from gateway.postgres.dsn import StoreLocation
from gateway.storage import open_audit_reader
from tests.helpers.audit_logs import AGENT

RecordFactory = Callable[..., AuditRecord]
ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"
HOUR_MS = 3_600_000
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def db_path(any_db: StoreLocation) -> StoreLocation:
    """These filters must hold for both backends."""
    return any_db


@pytest.fixture
async def stored(audit_log: AuditLog, make_record: RecordFactory) -> list[AuditRecord]:
    """Six records (stored, seqs 1..6) mixing peers, capabilities, decisions and ages."""
    now = int(time.time() * 1000)
    written = [
        make_record(peer_id=ALICE, capability="summarize", time_unix_ms=now - 3 * HOUR_MS),
        make_record(
            peer_id=BOB,
            capability="summarize",
            decision="refuse",
            reason="UNKNOWN_PEER",
            time_unix_ms=now - 2 * HOUR_MS,
        ),
        make_record(peer_id=ALICE, capability="translate", time_unix_ms=now - 30 * 60_000),
        make_record(
            peer_id=ALICE,
            capability="translate",
            decision="refuse",
            reason="RISK_NOT_GRANTED",
            time_unix_ms=now - 5 * 60_000,
        ),
        make_record(
            peer_id="",
            capability="summarize",
            decision="refuse",
            reason="UNAUTHENTICATED",
            served_version="",
            time_unix_ms=now - 60_000,
        ),
        make_record(peer_id=BOB, capability="translate", time_unix_ms=now, trace_id=TRACE),
    ]
    for rec in written:
        audit_log.record(rec)
    await audit_log.flush()
    return [dataclasses.replace(rec, seq=i) for i, rec in enumerate(written, 1)]


def seqs(records: list[AuditRecord]) -> list[int]:
    return [rec.seq for rec in records]


async def test_no_filter_returns_all_in_seq_order(db_path: Path, stored: list[AuditRecord]) -> None:
    assert query_records(open_audit_reader(db_path)) == stored


async def test_refusals_only(db_path: Path, stored: list[AuditRecord]) -> None:
    assert seqs(query_records(open_audit_reader(db_path), AuditFilter(refusals_only=True))) == [
        2,
        4,
        5,
    ]


async def test_peer_filter(db_path: Path, stored: list[AuditRecord]) -> None:
    assert seqs(query_records(open_audit_reader(db_path), AuditFilter(peer=ALICE))) == [1, 3, 4]
    assert seqs(query_records(open_audit_reader(db_path), AuditFilter(peer=""))) == [5]


async def test_capability_filter(db_path: Path, stored: list[AuditRecord]) -> None:
    assert seqs(query_records(open_audit_reader(db_path), AuditFilter(capability="translate"))) == [
        3,
        4,
        6,
    ]


async def test_since_filter(db_path: Path, stored: list[AuditRecord]) -> None:
    assert seqs(
        query_records(open_audit_reader(db_path), AuditFilter(since=timedelta(hours=1)))
    ) == [3, 4, 5, 6]
    assert seqs(
        query_records(open_audit_reader(db_path), AuditFilter(since=parse_since("10m")))
    ) == [4, 5, 6]


async def test_filters_combine(db_path: Path, stored: list[AuditRecord]) -> None:
    found = query_records(
        open_audit_reader(db_path),
        AuditFilter(refusals_only=True, peer=ALICE, capability="translate"),
    )

    assert found == [stored[3]]


async def test_limit_keeps_the_most_recent(db_path: Path, stored: list[AuditRecord]) -> None:
    assert seqs(query_records(open_audit_reader(db_path), AuditFilter(limit=2))) == [5, 6]
    assert seqs(
        query_records(open_audit_reader(db_path), AuditFilter(refusals_only=True, limit=2))
    ) == [4, 5]
    assert query_records(open_audit_reader(db_path), AuditFilter(limit=0)) == []


async def test_filter_by_trace_id(stored: list[AuditRecord], db_path: Path) -> None:
    assert seqs(query_records(open_audit_reader(db_path), AuditFilter(trace_id=TRACE))) == [6]
    assert seqs(query_records(open_audit_reader(db_path), AuditFilter(trace_id=TRACE.upper()))) == [
        6
    ]
    assert query_records(open_audit_reader(db_path), AuditFilter(trace_id="0" * 32)) == []
    table = format_table(query_records(open_audit_reader(db_path))).splitlines()
    assert table[6].split()[-1] == TRACE and table[1].split()[-1] == "-"
    assert [json.loads(line)["trace_id"] for line in format_json_lines(stored).splitlines()] == [
        "", "", "", "", "", TRACE,
    ]  # fmt: skip


async def test_recent_request_ids_newest_first_allowed_and_named_refusals(
    db_path: Path, stored: list[AuditRecord]
) -> None:
    def recent(limit: int, refusals: frozenset[str]) -> list[tuple[str, str, int]]:
        return list(
            recent_request_ids(
                open_audit_reader(db_path),
                agent=AGENT,
                since=timedelta(hours=1),
                limit=limit,
                refusals=refusals,
            )
        )

    def row(rec: AuditRecord) -> tuple[str, str, int]:
        return (rec.peer_id, rec.request_id, rec.time_unix_ms)

    named = frozenset({"RISK_NOT_GRANTED"})
    assert recent(10, named) == [row(stored[5]), row(stored[3]), row(stored[2])]
    assert recent(2, named) == [row(stored[5]), row(stored[3])]
    assert recent(10, frozenset()) == [row(stored[5]), row(stored[2])]
    assert recent(0, named) == []


async def test_recent_request_ids_stream_past_one_page(
    db_path: Path, audit_log: AuditLog, make_record: RecordFactory
) -> None:
    written = [make_record(request_id=f"id-{n}") for n in range(10_005)]
    for rec in written:
        audit_log.record(rec)
    await audit_log.flush()

    found = recent_request_ids(
        open_audit_reader(db_path), agent=AGENT, since=timedelta(hours=1), limit=20_000, refusals=()
    )

    assert [request_id for _, request_id, _ in found] == [
        f"id-{n}" for n in reversed(range(10_005))
    ]


def test_negative_limit_is_a_config_error(db_path: Path) -> None:
    with pytest.raises(ConfigError):
        query_records(open_audit_reader(db_path), AuditFilter(limit=-1))


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        query_records(open_audit_reader(tmp_path / "nope.db"))


async def test_format_table(stored: list[AuditRecord]) -> None:
    table = format_table(stored)
    lines = table.splitlines()

    assert lines[0].split() == [
        "TIME", "(UTC)", "PEER", "CAPABILITY", "CONSTRAINT", "SERVED",
        "DECISION", "REASON", "SIZE", "LATENCY", "MS", "REQUEST", "ID", "TRACE", "ID",
    ]  # fmt: skip
    assert len(lines) == 1 + len(stored)
    for reason in ("OK", "UNKNOWN_PEER", "RISK_NOT_GRANTED", "UNAUTHENTICATED"):
        assert reason in table
    assert stored[0].request_id in lines[1]
    assert lines[1].split()[0].endswith("Z")


def test_format_table_time_is_utc_iso_with_ms(make_record: RecordFactory) -> None:
    rec = make_record(time_unix_ms=1_700_000_000_123, latency_ms=12.34)

    row = format_table([rec]).splitlines()[1]

    assert row.startswith("2023-11-14T22:13:20.123Z  ")
    assert " 12.3 " in row


def test_format_table_of_nothing_is_the_header() -> None:
    assert format_table([]).startswith("TIME (UTC)")
    assert len(format_table([]).splitlines()) == 1


async def test_format_json_lines_parse_back(stored: list[AuditRecord]) -> None:
    lines = format_json_lines(stored).splitlines()

    assert [json.loads(line) for line in lines] == [rec.to_json_dict() for rec in stored]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        (" 15m ", timedelta(minutes=15)),
    ],
)
def test_parse_since_accepts(text: str, expected: timedelta) -> None:
    assert parse_since(text) == expected


@pytest.mark.parametrize(
    "text", ["", "10", "m", "10x", "-5m", "1.5h", "0m", "10 m", "1h30m", "10M"]
)
def test_parse_since_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="since"):
        parse_since(text)


@pytest.mark.parametrize(
    "text", ["1000000000d", "99999999999d", "999999999d", "740000d", "9" * 5000 + "s"]
)
def test_parse_since_refuses_a_window_reaching_before_the_year_1(text: str) -> None:
    with pytest.raises(ConfigError, match=r"too far back \(it reaches before the year 1\)$"):
        parse_since(text)
    assert parse_since("730000d") == timedelta(days=730_000)  # back to the year 27 or so
