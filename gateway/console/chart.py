"""Refusals by peer and reason over time, as server-rendered SVG (no script, no library).

One row per (peer, reason), the busiest first; one bar per time bucket, its
height the bucket's count relative to the busiest bucket of the chart. Each row
stands on a baseline (an empty bucket is no bar on it, not a missing row); a
time axis under the rows marks the window's edges and quarters, as time before
the chart was drawn (``-1 h``, ``-45 min`` ... ``now``), with the times in UTC
in the chart's title; the legend says what one bar covers and what the tallest
bar counts. SVG presentation attributes only: the page's CSP allows no inline
style.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.audit.record import AuditRecord
from gateway.console.pages import esc, span_text, utc

BUCKETS = 12
MAX_SERIES = 12
_LABEL_W, _BAR_W, _GAP, _ROW_H, _TOTAL_W = 300, 40, 4, 36, 56
_TOP = 22  # the legend's line
_TICKS = (0, 3, 6, 9, 12)  # bucket edges the axis labels (quarters of the window)
_INK, _FAINT, _BAR = "#333", "#888", "#b3261e"


@dataclass(frozen=True, slots=True)
class Series:
    """Refusals of one peer for one reason, counted per bucket."""

    peer: str
    reason: str
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        """All refusals of the series."""
        return sum(self.counts)


def bucket_refusals(
    records: Sequence[AuditRecord], start_ms: int, end_ms: int, buckets: int = BUCKETS
) -> list[Series]:
    """Refusals in ``[start_ms, end_ms)`` per (peer, reason) and bucket, busiest first."""
    width = bucket_ms(start_ms, end_ms, buckets)
    counts: dict[tuple[str, str], Counter[int]] = {}
    for rec in records:
        if rec.decision != "refuse" or not start_ms <= rec.time_unix_ms < end_ms:
            continue
        slot = min(buckets - 1, (rec.time_unix_ms - start_ms) // width)
        counts.setdefault((rec.peer_id or "-", rec.reason), Counter())[slot] += 1
    series = [
        Series(peer, reason, tuple(counter[i] for i in range(buckets)))
        for (peer, reason), counter in counts.items()
    ]
    series.sort(key=lambda s: (-s.total, s.peer, s.reason))
    return series[:MAX_SERIES]


def bucket_ms(start_ms: int, end_ms: int, buckets: int = BUCKETS) -> int:
    """How many milliseconds one bucket (one bar) covers."""
    return max(1, (end_ms - start_ms + buckets - 1) // buckets)


def render_chart(series: Sequence[Series], start_ms: int, end_ms: int) -> str:
    """The SVG of ``series`` (a short note when there is nothing to draw)."""
    if not series:
        return '<p class="empty">No refusals in this window.</p>'
    buckets = len(series[0].counts)
    peak = max(max(s.counts) for s in series) or 1
    plot_w = buckets * (_BAR_W + _GAP)
    width = _LABEL_W + plot_w + _TOTAL_W
    axis_y = _TOP + len(series) * _ROW_H
    height = axis_y + 34
    bar_ms = bucket_ms(start_ms, end_ms, buckets)
    parts = [
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>Refusals by peer and reason, {esc(utc(start_ms))} to {esc(utc(end_ms))} "
        f"(UTC)</title>",
        _text(0, 14, f"one bar: {_span(bar_ms)}; tallest bar: {peak}", _FAINT),
        _text(_LABEL_W + plot_w + 6, 14, "total", _FAINT),
    ]
    for row, one in enumerate(series):
        parts.extend(_row(one, _TOP + row * _ROW_H, peak, start_ms, bar_ms))
    parts.extend(_axis(axis_y, start_ms, end_ms, buckets))
    parts.append("</svg>")
    return "".join(parts)


def _row(one: Series, top: int, peak: int, start_ms: int, bar_ms: int) -> list[str]:
    base = top + _ROW_H - 4  # the row's baseline
    buckets = len(one.counts)
    parts = [
        _text(0, top + 15, _short(one.peer), _INK),
        _text(0, top + 29, one.reason, _INK),
        f'<line x1="{_LABEL_W}" y1="{base}" x2="{_LABEL_W + buckets * (_BAR_W + _GAP)}" '
        f'y2="{base}" stroke="{_FAINT}" stroke-width="1"/>',
    ]
    for i, count in enumerate(one.counts):
        if not count:
            continue
        bar = max(2, round((_ROW_H - 8) * count / peak))  # the tallest: the row's height
        x = _LABEL_W + i * (_BAR_W + _GAP)
        when = utc(start_ms + i * bar_ms)
        parts.append(
            f'<rect x="{x}" y="{base - bar}" width="{_BAR_W}" height="{bar}" fill="{_BAR}">'
            f"<title>{count} from {esc(when)}</title></rect>"
        )
    parts.append(_text(_LABEL_W + buckets * (_BAR_W + _GAP) + 6, top + 22, str(one.total), _INK))
    return parts


def _axis(y: int, start_ms: int, end_ms: int, buckets: int) -> list[str]:
    """The time axis: a line under the rows, ticks at the quarters, labels as time ago."""
    right = _LABEL_W + buckets * (_BAR_W + _GAP)
    parts = [
        f'<line x1="{_LABEL_W}" y1="{y}" x2="{right}" y2="{y}" stroke="{_INK}" stroke-width="1"/>'
    ]
    for edge in _TICKS:
        if edge > buckets:
            continue
        x = _LABEL_W + edge * (_BAR_W + _GAP) - (_GAP if edge == buckets else 0)
        ago_ms = (end_ms - start_ms) * (buckets - edge) // buckets
        label = "now" if edge == buckets else f"-{_span(ago_ms)}"
        anchor = "end" if edge == buckets else "start" if edge == 0 else "middle"
        parts.append(
            f'<line x1="{x}" y1="{y}" x2="{x}" y2="{y + 5}" stroke="{_INK}" stroke-width="1"/>'
        )
        parts.append(_text(x, y + 18, label, _FAINT, anchor))
    parts.append(_text(0, y + 18, "time (UTC, before now)", _FAINT))
    return parts


def _span(ms: int) -> str:
    """A span as an axis says it: whole days, hours or minutes when it is one (``1 h``)."""
    for unit, name in ((86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1000, "s")):
        if ms >= unit and ms % unit == 0:
            return f"{ms // unit} {name}"
    return span_text(ms / 1000)


def _text(x: int, y: int, content: str, fill: str, anchor: str = "start") -> str:
    return (
        f'<text x="{x}" y="{y}" font-size="12" fill="{fill}" text-anchor="{anchor}">'
        f"{esc(content)}</text>"
    )


def _short(peer: str) -> str:
    return peer if len(peer) <= 40 else peer[:18] + "…" + peer[-18:]
