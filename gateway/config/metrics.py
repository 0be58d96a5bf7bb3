"""``[metrics]``: the Prometheus endpoint."""

from __future__ import annotations

from pydantic import (
    model_validator,
)

from gateway.config.addresses import (
    ListenAddress,
    is_loopback_literal,
)
from gateway.config.fields import FrozenTable


class MetricsSettings(FrozenTable):
    """The Prometheus endpoint of an agent (``[metrics]``; absent: no metrics at all).

    Attributes:
        listen: ``host:port`` serving the Prometheus text format at ``/metrics``.
            Must be a loopback IP literal unless ``allow_remote`` is true.
        peer_labels: Add the caller's SPIFFE ID as a ``peer`` label to the
            decision and duration metrics. Off by default: one series per peer
            and capability grows without bound with the number of peers.
        allow_remote: Permit a non-loopback ``listen`` (metrics show which
            capabilities are used and how often; keep them off open networks).
    """

    listen: ListenAddress = "127.0.0.1:9464"
    peer_labels: bool = False
    allow_remote: bool = False

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> MetricsSettings:
        host = self.listen.rpartition(":")[0]
        if not self.allow_remote and not is_loopback_literal(host.strip("[]")):
            raise ValueError(
                f"metrics.listen {self.listen!r} is not a loopback address; "
                "set metrics.allow_remote = true to serve metrics beyond this machine"
            )
        return self
