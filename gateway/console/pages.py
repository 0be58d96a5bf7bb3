"""HTML of the console: one layout, tables, links; every value escaped on the way in.

Ids and names come from peers (a SPIFFE ID, a capability name, a request
id): each goes through ``printable`` (control and bidi characters become
visible escapes) and then ``html.escape``, so no value can add markup,
forge a row or reorder the page. Nothing here ever receives payload content.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from urllib.parse import urlencode

from gateway.audit.record import AuditRecord
from gateway.display import printable

NAV: tuple[tuple[str, str], ...] = (
    ("/", "Live decisions"),
    ("/refusals", "Refusals"),
    ("/grants", "Grants"),
    ("/certificate", "Certificate"),
    ("/upstreams", "Upstreams"),
    ("/audit", "Audit chain"),
    ("/tasks", "In flight"),
)

DECISION_COLUMNS = (
    "Time (UTC)",
    "Peer",
    "Capability",
    "Version",
    "Decision",
    "Reason",
    "Size",
    "ms",
    "Request id",
    "Trace id",
)
"""The live table's columns; ``static/console.js`` fills the same ones, cut the same way."""
SHOWN = {"peer": 32, "capability": 32, "request_id": 14, "trace_id": 9}
"""Characters a cell of the live table shows (the whole value in its ``title``), so the table
fits a 1280 px wide window; ``static/console.js`` cuts to the same widths."""
FILTERS = ("peer", "capability", "reason", "since", "trace")


def esc(value: object) -> str:
    """A value as HTML text: printable, then escaped (quotes too, for attributes)."""
    return html.escape(printable(str(value)), quote=True)


def cell(value: str, shown: int) -> str:
    """``value`` cut to ``shown`` characters (an ellipsis in the middle), the whole value in
    its ``title`` (what the browser shows on hover), both escaped."""
    text = printable(value)
    if len(text) <= shown:
        return html.escape(text, quote=True)
    half = (shown - 1) // 2
    short = text[:half] + "…" + text[-(shown - 1 - half) :]
    return f'<span title="{html.escape(text, quote=True)}">{html.escape(short, quote=True)}</span>'


def span_text(seconds: float) -> str:
    """A duration as people read it: ``0.4 s``, ``12 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if seconds < 10:
        return f"{max(0.0, seconds):.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def href(path: str, params: Mapping[str, str]) -> str:
    """An escaped same-origin link target with the non-empty ``params``."""
    query = urlencode({k: v for k, v in params.items() if v})
    return esc(f"{path}?{query}" if query else path)


def utc(time_unix_ms: int | float) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC (said so, past what a datetime holds)."""
    try:
        moment = datetime.fromtimestamp(time_unix_ms / 1000, tz=UTC)
    except (OverflowError, ValueError, OSError):
        # Readers refuse such records; a chart's start a hair before the year 1
        # (a window given to the second) must still not take the page down.
        return f"{time_unix_ms} ms since the epoch (out of range)"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def layout(title: str, active: str, agent_id: str, body: str, *, refresh: int = 0) -> str:
    """A whole page: header with the agent's id, navigation, ``body`` (already HTML).

    ``refresh``: the browser loads the page again every that many seconds (0: never).
    """
    current = ' class="active"'
    nav = "".join(
        f'<a href="{path}"{current if path == active else ""}>{esc(name)}</a>' for path, name in NAV
    )
    reload = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{reload}<title>{esc(title)} · a2a-gateway console</title>"
        '<link rel="stylesheet" href="/static/console.css">'
        '<script src="/static/console.js" defer></script></head><body>'
        f'<header><h1>a2a-gateway console</h1><p class="agent">{esc(agent_id)}</p>'
        f"<nav>{nav}</nav></header><main><h2>{esc(title)}</h2>{body}</main></body></html>\n"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], body_id: str = "") -> str:
    """A table; ``rows`` hold cells that are already HTML (made with :func:`esc`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{esc(body_id)}"' if body_id else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody{ident}>{body}</tbody></table>"


def clock(moment: str) -> str:
    """``HH:MM:SS.mmm`` of an ISO 8601 time from :func:`utc` (anything else as it is)."""
    return moment[11:23] if moment[10:11] == "T" else moment


def trace_link(trace_id: str, shown: int = 32) -> str:
    """A link to every record of the trace (``-`` without one), its id cut to ``shown``."""
    if not trace_id:
        return "-"
    target = href("/", {"trace": trace_id})
    return (
        f'<a class="trace" href="{target}" data-trace="{esc(trace_id)}">{cell(trace_id, shown)}</a>'
    )


def decision_cells(rec: AuditRecord) -> list[str]:
    """The cells of one decision row (the same columns the live script fills in)."""
    moment = utc(rec.time_unix_ms)
    return [
        f'<span title="{esc(moment)}">{esc(clock(moment))}</span>',
        cell(rec.peer_id or "-", SHOWN["peer"]),
        cell(rec.capability or "-", SHOWN["capability"]),
        esc(f"{rec.version_constraint or '*'} → {rec.served_version or '-'}"),
        f'<span class="{esc(rec.decision)}">{esc(rec.decision)}</span>',
        esc(rec.reason),
        esc(rec.payload_size),
        esc(f"{rec.latency_ms:.1f}"),
        cell(rec.request_id or "-", SHOWN["request_id"]),
        trace_link(rec.trace_id, SHOWN["trace_id"]),
    ]


def filter_form(action: str, values: Mapping[str, str], problem: str = "") -> str:
    """The GET form of the filters (peer, capability, reason, since)."""
    fields = "".join(
        f'<label>{esc(name)} <input name="{name}" value="{esc(values.get(name, ""))}"'
        f' placeholder="{"e.g. 10m" if name == "since" else ""}"></label>'
        for name in FILTERS[:4]
    )
    trace = values.get("trace", "")
    keep = f'<input type="hidden" name="trace" value="{esc(trace)}">' if trace else ""
    note = problem_note(problem) if problem else ""
    form = f'<form class="filters" method="get" action="{esc(action)}">'
    return f"{form}{fields}{keep}<button>Filter</button></form>{note}"


def problem_note(problem: str) -> str:
    """A problem the page ran into, as a highlighted paragraph."""
    return f'<p class="problem">{esc(problem)}</p>'


def facts(rows: Sequence[tuple[str, str]]) -> str:
    """A definition list of (name, already-HTML value) pairs."""
    items = "".join(f"<dt>{esc(name)}</dt><dd>{value}</dd>" for name, value in rows)
    return f'<dl class="facts">{items}</dl>'
