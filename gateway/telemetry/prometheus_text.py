"""The Prometheus text exposition format (0.0.4) of OpenTelemetry SDK metrics data.

Rendered here rather than by ``opentelemetry-exporter-prometheus``: that
exporter registers with ``prometheus_client``'s process-wide registry, and
several agents (each with its own MeterProvider) run in one process in tests
and in the demo.

The output is always valid exposition text, whatever the attributes: a label
name outside ``[a-zA-Z_][a-zA-Z0-9_]*`` (the SDK's own overflow series is
labelled ``otel.metric.overflow``) has every other character replaced by
``_``, because Prometheus rejects a whole scrape over one bad line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.util.types import AttributeValue

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_NOT_IN_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def render(data: MetricsData | None) -> str:
    """Every metric of ``data`` in the text format (one ``# TYPE`` block per name)."""
    if data is None:
        return ""
    lines: list[str] = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                lines.extend(_metric_lines(metric))
    return "\n".join(lines) + ("\n" if lines else "")


def _metric_lines(metric: Metric) -> Iterable[str]:
    data = metric.data
    name = metric.name
    if isinstance(data, Sum):
        kind = "counter" if data.is_monotonic else "gauge"
        if data.is_monotonic and not name.endswith("_total"):
            name += "_total"
        yield from _header(name, kind, metric.description)
        for point in data.data_points:
            yield _sample(name, point.attributes, _number(point))
    elif isinstance(data, Gauge):
        yield from _header(name, "gauge", metric.description)
        for point in data.data_points:
            yield _sample(name, point.attributes, _number(point))
    elif isinstance(data, Histogram):
        yield from _header(name, "histogram", metric.description)
        for hist in data.data_points:
            yield from _histogram_lines(name, hist)


def _header(name: str, kind: str, description: str | None) -> Iterable[str]:
    text = (description or "").replace("\\", "\\\\").replace("\n", "\\n")
    yield f"# HELP {name} {text}"
    yield f"# TYPE {name} {kind}"


def _histogram_lines(name: str, point: HistogramDataPoint) -> Iterable[str]:
    cumulative = 0
    for bound, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
        cumulative += count
        yield _sample(f"{name}_bucket", point.attributes, cumulative, le=_value(bound))
    yield _sample(f"{name}_bucket", point.attributes, point.count, le="+Inf")
    yield _sample(f"{name}_sum", point.attributes, point.sum)
    yield _sample(f"{name}_count", point.attributes, point.count)


def _number(point: NumberDataPoint) -> float | int:
    return point.value


def _sample(
    name: str,
    attributes: Mapping[str, AttributeValue] | None,
    value: float | int,
    le: str | None = None,
) -> str:
    labels = [f'{label_name(key)}="{_escape(str(val))}"' for key, val in (attributes or {}).items()]
    if le is not None:
        labels.append(f'le="{le}"')
    body = "{" + ",".join(labels) + "}" if labels else ""
    return f"{name}{body} {_value(value)}"


def label_name(key: str) -> str:
    """``key`` as a legal Prometheus label name (illegal characters become ``_``)."""
    name = _NOT_IN_LABEL_NAME.sub("_", key)
    return name if name and not name[0].isdigit() else f"_{name}"


def _value(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
