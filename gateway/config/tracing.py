"""``[tracing]``: spans and their OTLP export."""

from __future__ import annotations

import re

from pydantic import (
    Field,
    field_validator,
)

from gateway.config.addresses import (
    split_host_port,
)
from gateway.config.fields import FrozenTable


class TracingSettings(FrozenTable):
    """Spans of an agent (``[tracing]``).

    Without this section (or with ``enabled = false``) no span is recorded,
    but an incoming W3C ``traceparent`` is still carried to the next hop and
    its trace id stored in the audit log.

    Attributes:
        enabled: Record spans (the trace id of a call without an incoming
            ``traceparent`` is then new and stored in its audit record).
        sample_ratio: Share of new traces whose spans are recorded (0..1,
            default 1). A call that arrives with a ``traceparent`` follows
            the caller's sampling decision. Unsampled calls still get a trace
            id, carried to the next hop and stored in the audit record.
        otlp_endpoint: ``host:port`` of an OTLP/gRPC collector; spans are
            exported there in batches when set.
        otlp_insecure: Send OTLP without TLS (a collector on this machine).
        console: Also print each recorded span as one line on stderr, for
            people without a collector (default false).
    """

    enabled: bool = True
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    otlp_endpoint: str | None = None
    otlp_insecure: bool = True
    console: bool = False

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:  # the exporter also takes http://host:port
            split_host_port(re.sub(r"^https?://", "", value).rstrip("/"), lowest_port=1)
        return value
