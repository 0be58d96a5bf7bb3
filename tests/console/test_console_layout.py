"""What the console draws, checked without a browser: the refusals chart and cut cells."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.audit.record import AuditRecord
from gateway.console import pages
from gateway.console.chart import bucket_refusals, render_chart
from gateway.console.pages import cell, span_text

HOUR_MS = 3_600_000
END_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z
BOB, CAROL = "spiffe://example.org/agent/bob", "spiffe://example.org/agent/carol"


def refusal(peer: str, reason: str, ms_before_end: int) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=END_MS - ms_before_end,
        request_id="r",
        peer_id=peer,
        capability="kv.get",
        version_constraint="",
        served_version="",
        decision="refuse",
        reason=reason,
        payload_size=0,
        payload_sha256="",
        latency_ms=0.1,
    )


def test_the_chart_has_a_time_axis_a_baseline_per_row_and_a_legend() -> None:
    records = [
        refusal(BOB, "CAPABILITY_NOT_GRANTED", 50 * 60_000),  # bucket 2 of 12
        refusal(BOB, "CAPABILITY_NOT_GRANTED", 1000),  # the last bucket
        refusal(BOB, "CAPABILITY_NOT_GRANTED", 2000),
        refusal(CAROL, "RATE_LIMITED", 20 * 60_000),
    ]
    series = bucket_refusals(records, END_MS - HOUR_MS, END_MS)
    assert [(s.peer, s.reason, s.total) for s in series] == [
        (BOB, "CAPABILITY_NOT_GRANTED", 3),
        (CAROL, "RATE_LIMITED", 1),
    ]
    svg = render_chart(series, END_MS - HOUR_MS, END_MS)
    labels = re.findall(r"<text [^>]*>([^<]*)</text>", svg)
    assert "one bar: 5 min; tallest bar: 2" in labels
    for tick in ("-1 h", "-45 min", "-30 min", "-15 min", "now"):
        assert tick in labels, tick
    assert "time (UTC, before now)" in labels
    # One baseline per row and the axis: three horizontal lines as wide as the plot.
    assert len(re.findall(r'<line x1="300" y1="(\d+)" x2="828" y2="\1"', svg)) == 3
    bars = re.findall(r"<rect [^>]*><title>([^<]*)</title>", svg)
    assert bars == [
        "1 from 2027-01-15T07:10:00.000Z",
        "2 from 2027-01-15T07:55:00.000Z",
        "1 from 2027-01-15T07:40:00.000Z",
    ]  # empty buckets draw nothing on the baseline
    assert "2027-01-15T07:00:00.000Z to 2027-01-15T08:00:00.000Z (UTC)" in svg


def test_no_refusals_say_so() -> None:
    assert render_chart([], END_MS - HOUR_MS, END_MS) == (
        '<p class="empty">No refusals in this window.</p>'
    )


def test_long_values_are_cut_in_the_middle_with_the_whole_in_the_title() -> None:
    assert cell("short", 10) == "short"
    long = "spiffe://example.org/agent/a-rather-long-name-for-an-agent"
    shown = cell(long, 32)
    assert shown == (f'<span title="{long}">spiffe://exampl…ame-for-an-agent</span>')
    assert cell("<b>\u202e" + "x" * 40, 12) == (
        '<span title="&lt;b&gt;\\u202e' + "x" * 40 + '">&lt;b&gt;\\u…xxxxxx</span>'
    )  # escaped, bidi made visible, before it is cut


def test_the_live_script_cuts_cells_to_the_widths_the_server_uses() -> None:
    script = (Path(pages.__file__).parent / "static" / "console.js").read_text()
    found = re.search(r"const SHOWN = \{ ([^}]*) \};", script)
    assert found is not None
    widths = dict(item.split(": ") for item in found.group(1).split(", "))
    assert {key: int(value) for key, value in widths.items()} == pages.SHOWN


def test_spans_read_as_people_say_them() -> None:
    assert [span_text(s) for s in (0.42, 9.96, 12, 245, 7380)] == [
        "0.4 s",
        "10.0 s",
        "12 s",
        "4 min 05 s",
        "2 h 03 min",
    ]
