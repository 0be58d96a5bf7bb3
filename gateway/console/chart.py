"""Refusals by peer and reason over time, as server-rendered SVG (no script, no library).

One row per (peer, reason), the busiest first; one bar per time bucket, its
height the bucket's count relative to the busiest bucket of the chart. SVG
presentation attributes only: the page's CSP allows no inline style.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.audit.record import AuditRecord
from gateway.console.pages import esc, utc

BUCKETS = 12
MAX_SERIES = 12
_LABEL_W, _BAR_W, _GAP, _ROW_H = 360, 28, 4, 26


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
    width = max(1, (end_ms - start_ms + buckets - 1) // buckets)
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


def render_chart(series: Sequence[Series], start_ms: int, end_ms: int) -> str:
    """The SVG of ``series`` (a short note when there is nothing to draw)."""
    if not series:
        return '<p class="empty">No refusals in this window.</p>'
    buckets = len(series[0].counts)
    peak = max(max(s.counts) for s in series) or 1
    width = _LABEL_W + buckets * (_BAR_W + _GAP) + 60
    height = (len(series) + 1) * _ROW_H + 10
    parts = [
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>Refusals by peer and reason, {esc(utc(start_ms))} to {esc(utc(end_ms))}</title>",
    ]
    for row, one in enumerate(series):
        top = row * _ROW_H + 4
        parts.append(
            f'<text x="0" y="{top + 16}" font-size="12" fill="#333">'
            f"{esc(_short(one.peer))} · {esc(one.reason)}</text>"
        )
        for i, count in enumerate(one.counts):
            bar = 0 if not count else max(2, round((_ROW_H - 6) * count / peak))
            x = _LABEL_W + i * (_BAR_W + _GAP)
            parts.append(
                f'<rect x="{x}" y="{top + _ROW_H - 6 - bar}" width="{_BAR_W}" height="{bar}" '
                f'fill="#b3261e"><title>{count}</title></rect>'
            )
        parts.append(
            f'<text x="{_LABEL_W + buckets * (_BAR_W + _GAP) + 6}" y="{top + 16}" '
            f'font-size="12" fill="#333">{one.total}</text>'
        )
    axis = len(series) * _ROW_H + 18
    parts.append(
        f'<text x="{_LABEL_W}" y="{axis}" font-size="11" fill="#666">{esc(utc(start_ms))}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _short(peer: str) -> str:
    return peer if len(peer) <= 48 else peer[:22] + "…" + peer[-22:]
