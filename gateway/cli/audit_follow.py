"""``a2a-gateway audit --follow``: print records as they commit, until interrupted.

Lines are written (and flushed) as each poll finds records, so a pipe sees
them at once. Table lines use fixed column widths (the widths of a whole
table are not known in advance); every cell is escaped as in ``audit``'s
table. Ctrl-C ends it (the CLI boundary turns the interrupt into exit 130);
SIGTERM and a reader that goes away (``| head``) end it with exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import TextIO

from gateway.audit import parse_since
from gateway.audit.filter import AuditFilter
from gateway.audit.follow import AuditFeed
from gateway.audit.query import TABLE_COLUMNS, table_cells
from gateway.audit.store.postgres import AgentRecord
from gateway.display import json_for_terminals, printable
from gateway.storage import open_audit_feed, open_audit_reader

POLL_SECONDS = 0.2
"""How often the store is asked for new records (a cheap indexed range read)."""

_WIDTHS = (24, 38, 18, 10, 8, 8, 24, 6, 10, 36, 32)
"""Column widths of a followed table (a longer cell widens only its own line)."""


def audit_filter(args: argparse.Namespace) -> AuditFilter:
    """The records ``audit`` (listed, summed up or followed) is asked for by its options."""
    return AuditFilter(
        agent=args.agent,
        refusals_only=args.refusals,
        peer=args.peer,
        capability=args.capability,
        trace_id=args.trace,
        since=parse_since(args.since) if args.since is not None else None,
    )


def follow(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``audit --follow`` with the parsed ``audit`` arguments until stopped.

    Returns 0 after SIGTERM or once nobody reads the output any more.

    Raises:
        ConfigError: The store cannot be opened or read.
        KeyboardInterrupt: Ctrl-C (the CLI boundary exits 130).
    """
    stream = out or sys.stdout
    shared = open_audit_reader(args.db).many_chains
    feed = open_audit_feed(args.db, audit_filter(args))
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        if not args.json:
            stream.write(_header(shared) + "\n")
            stream.flush()
        _pump(feed, stream, json_lines=args.json, shared=shared)
    except BrokenPipeError:
        # Nobody reads any more: stop quietly, and keep the exit-time flush from complaining.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except _Stopped:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        feed.close()
    return 0


class _Stopped(Exception):
    """SIGTERM arrived: the follow ends like a finished command."""


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise _Stopped


def _pump(feed: AuditFeed, stream: TextIO, *, json_lines: bool, shared: bool) -> None:
    while True:
        entries = feed.poll()
        if entries:
            stream.write(
                "".join(render_line(e, json_lines=json_lines, shared=shared) for e in entries)
            )
            stream.flush()
        time.sleep(POLL_SECONDS)


def _header(shared: bool) -> str:
    titles = [title for title, _ in TABLE_COLUMNS]
    return _row(["AGENT", *titles] if shared else titles, shared)


def render_line(entry: AgentRecord, *, json_lines: bool, shared: bool) -> str:
    """One followed record as a table line or a JSON line (with ``agent_id`` if shared)."""
    if json_lines:
        data = entry.record.to_json_dict()
        if shared:
            data = {"agent_id": entry.agent_id, **data}
        text = json.dumps(data, sort_keys=True, ensure_ascii=False)
        return json_for_terminals(text) + "\n"
    cells = table_cells(entry.record)
    return _row([printable(entry.agent_id), *cells] if shared else cells, shared) + "\n"


def _row(cells: list[str], shared: bool) -> str:
    widths = ((38,) if shared else ()) + _WIDTHS
    aligns = (("<",) if shared else ()) + tuple(align for _, align in TABLE_COLUMNS)
    return "  ".join(
        f"{cell:{align}{width}}" for cell, align, width in zip(cells, aligns, widths, strict=True)
    ).rstrip()
