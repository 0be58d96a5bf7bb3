"""Structured logs: one JSON object per line, multi-line messages kept in one event.

Fields: ``time``, ``level``, ``logger``, ``event`` (the message), ``agent``
(set once per process), the current ``trace_id``, and ``peer``,
``capability``, ``reason`` when a log call passes them in ``extra``.
Messages hold ids, names, paths and reason codes, never payload content,
keys or certificates (the code that logs never formats those in). JSON
escaping (``json.dumps``) makes every control character harmless.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from gateway.telemetry.tracing import current_trace_id

CONTEXT_FIELDS = ("agent", "peer", "capability", "reason")
"""``extra`` keys copied into the event when a log call passes them."""


class JsonFormatter(logging.Formatter):
    """Formats each record as one line of JSON."""

    def __init__(self, agent: str = "") -> None:
        super().__init__()
        self.agent = agent

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON object (no newline inside, ever)."""
        event: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
            "agent": self.agent,
        }
        for key in CONTEXT_FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                event[key] = str(value)
        trace_id = current_trace_id()
        if trace_id:
            event["trace_id"] = trace_id
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event, ensure_ascii=True, separators=(",", ":"))


def name_agent(agent_id: str) -> None:
    """Put ``agent_id`` into every JSON log line from now on (the process serves one agent)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonFormatter):
            handler.formatter.agent = agent_id
