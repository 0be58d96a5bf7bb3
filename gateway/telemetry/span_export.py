"""Where spans go besides the collector: backoff around OTLP, one-line spans on stderr.

An unreachable collector must not flood the agent's log: the OTLP exporter
logs an error (and retry warnings) for every batch, every few seconds, for
as long as the collector is away. :class:`BackoffExporter` reports the first
failure once, as a warning, then drops batches without trying for a pause
that doubles up to five minutes, and says once when the collector answers
again (with how many spans were dropped meanwhile). The OTLP exporter's own
per-batch failure lines are filtered out: this is the one place that says it.

:class:`StderrSpanExporter` prints each span as one escaped line, for people
without a collector (``[tracing] console = true``): name, trace and span
ids, parent, duration, status and attributes (ids, names, sizes and reason
codes; never payload content).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gateway.display import printable

_log = logging.getLogger(__name__)
OTLP_LOGGER = "opentelemetry.exporter.otlp.proto.grpc.exporter"
_OTLP_FAILURE_LINES = ("Failed to export", "Transient error")
FIRST_PAUSE_SECONDS = 5.0
MAX_PAUSE_SECONDS = 300.0


class _OtlpFailureFilter(logging.Filter):
    """Drops the OTLP exporter's per-batch failure lines (BackoffExporter reports instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_OTLP_FAILURE_LINES)


_FILTER = _OtlpFailureFilter()


class BackoffExporter(SpanExporter):
    """Wraps an exporter: a failing one is reported once, then left alone for a growing pause."""

    def __init__(
        self,
        inner: SpanExporter,
        endpoint: str,
        *,
        first_pause: float = FIRST_PAUSE_SECONDS,
        max_pause: float = MAX_PAUSE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner, self._endpoint = inner, endpoint
        self._first, self._max, self._clock = first_pause, max_pause, clock
        self._lock = threading.Lock()
        self._failures = 0
        self._dropped = 0
        self._resume_at = 0.0
        self.attempts = 0
        """Batches handed to the inner exporter (the rest were dropped during a pause)."""
        logging.getLogger(OTLP_LOGGER).addFilter(_FILTER)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export ``spans``, or drop them while the collector is in a pause."""
        with self._lock:
            if self._clock() < self._resume_at:
                self._dropped += len(spans)
                return SpanExportResult.FAILURE
            self.attempts += 1
        result = self._inner.export(spans)
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                if self._failures:
                    _log.warning(
                        "tracing: OTLP collector %s reachable again (%d spans dropped meanwhile)",
                        self._endpoint,
                        self._dropped,
                    )
                self._failures = self._dropped = 0
                return result
            self._failures += 1
            self._dropped += len(spans)
            pause = min(self._max, self._first * 2 ** (self._failures - 1))
            self._resume_at = self._clock() + pause
            if self._failures == 1:
                _log.warning(
                    "tracing: OTLP collector %s unreachable; spans are dropped and export is "
                    "retried with a growing pause (up to %gs)",
                    self._endpoint,
                    self._max,
                )
            return result

    def shutdown(self) -> None:
        """Shut the inner exporter down."""
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the inner exporter."""
        return self._inner.force_flush(timeout_millis)


class StderrSpanExporter(SpanExporter):
    """Prints each span as one escaped line on stderr (``[tracing] console = true``)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write one line per span."""
        stream = sys.stderr  # looked up each time: the process may have replaced it
        try:
            stream.write("".join(span_line(span) + "\n" for span in spans))
            stream.flush()
        except (OSError, ValueError):
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def span_line(span: ReadableSpan) -> str:
    """``span NAME trace=… span=… parent=… 1.2ms STATUS key=value …``, escaped into one line."""
    context = span.context
    trace_id = format(context.trace_id, "032x") if context else "-"
    span_id = format(context.span_id, "016x") if context else "-"
    parent = format(span.parent.span_id, "016x") if span.parent else "-"
    took = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    attributes = " ".join(
        key + "=" + _text(value) for key, value in sorted((span.attributes or {}).items())
    )
    return printable(
        f"span {span.name} trace={trace_id} span={span_id} parent={parent} {took:.1f}ms "
        f"{span.status.status_code.name} {attributes}".rstrip()
    )


def _text(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(_text(item) for item in value)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
