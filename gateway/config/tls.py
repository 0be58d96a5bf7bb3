"""``[tls]``: the agent's certificate, from files or from the SPIFFE Workload API."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    field_validator,
)

from gateway.config.fields import ExpiryWindow, FrozenTable, LifetimeShare


class TlsFiles(FrozenTable):
    """Paths of the agent's PEM files (``[tls]``, ``source = "files"``, the default).

    Attributes:
        source: ``"files"``: certificate, key and CA come from these files.
        ca: Trust root used to verify peers.
        cert: The agent's certificate (its SPIFFE ID must equal the agent id).
        key: The agent's private key.
        expiry_warning: Warn (log line and stat) when the agent's own
            certificate expires within this span (default ``"7d"``), or within
            this share of its lifetime (``"25%"``): at start, on every reload
            and once a day. The files are re-read on SIGHUP and when they
            change; see ``gateway.transport.live_tls``.
    """

    source: Literal["files"] = "files"
    ca: Path
    cert: Path
    key: Path
    expiry_warning: ExpiryWindow = timedelta(days=7)


_SOCKET_SCHEME = "unix://"


class WorkloadApiTls(FrozenTable):
    """Identity from the SPIFFE Workload API (``[tls] source = "workload-api"``).

    The local SPIRE agent (or any Workload API server) pushes the agent's
    X.509-SVID and the trust bundles (its own trust domain's and federated
    ones); each update is checked and applied live, like a file rotation. See
    ``gateway.transport.workload_api`` and ``docs/spire.md``.

    Attributes:
        source: ``"workload-api"``.
        socket: The Workload API endpoint, ``unix:///path/to/agent.sock``.
            Unset: the ``SPIFFE_ENDPOINT_SOCKET`` environment variable, as
            the SPIFFE Workload API specification says.
        start_timeout: How long the agent waits at start for its first SVID
            (the SPIRE agent may still be attesting it); then it refuses to
            start.
        expiry_warning: Warn (log line and stat) when the SVID in force
            has less than this share of its lifetime left (default ``"25%"``),
            or expires within a span (``"5m"``). SPIRE rotates an SVID at half
            its lifetime, so a quarter left means rotation has stopped, however
            short the SVIDs are (a fixed ``"5m"`` would warn of every
            ten-minute SVID just before its rotation).
    """

    source: Literal["workload-api"]
    socket: str | None = None
    start_timeout: float = Field(default=10.0, gt=0, le=600)
    expiry_warning: ExpiryWindow = LifetimeShare(25.0)

    @field_validator("socket")
    @classmethod
    def _unix_socket(cls, value: str | None) -> str | None:
        if value is not None:
            check_workload_api_socket(value)
        return value


def check_workload_api_socket(value: str) -> str:
    """``value`` if it is a ``unix:///absolute/path`` Workload API address.

    Raises:
        ValueError: another scheme (``tcp://`` is not supported here), or a
            relative or empty path.
    """
    if not value.startswith(_SOCKET_SCHEME) or not value[len(_SOCKET_SCHEME) :].startswith("/"):
        raise ValueError(
            f"{value!r}: expected unix:///absolute/path/to/agent.sock "
            "(the only Workload API address supported)"
        )
    return value


def _tls_source(value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("source", "files"))
    return str(getattr(value, "source", "files"))


TlsSettings = Annotated[
    Annotated[TlsFiles, Tag("files")] | Annotated[WorkloadApiTls, Tag("workload-api")],
    Discriminator(_tls_source),
]
"""``[tls]``: certificate files (default) or the SPIFFE Workload API."""
