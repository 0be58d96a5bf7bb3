"""The ports the workers of one agent share: checked before, reported once bound, passed on.

Before worker 0 starts, the supervisor checks that no other process listens
on the configured ports (:func:`check_ports_free`). Worker 0 binds them (port 0
picks one) and says which in its first stdout line (:func:`ready_line`); the
supervisor reads it (:func:`parse_ready_line`) and starts every other worker on
those ports (:func:`worker_config`), so all bind the same ones with
``SO_REUSEPORT`` and list the same URLs on their cards.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass

from gateway.config import AgentConfig
from gateway.errors import AddressUnavailable, AgentConfigError

READY_MARK = " ready on "
"""A worker's first stdout line: ``worker I ready on HOST:PORT`` (see :func:`ready_line`)."""
HTTPS_MARK = " https on "
"""Then, on the same line when it serves ``[a2a] http_listen``: `` https on https://HOST:PORT``."""


@dataclass(frozen=True)
class WorkerReady:
    """What a worker's ready line says it bound.

    Attributes:
        port: The gRPC port.
        https_url: ``https://HOST:PORT`` of the A2A HTTP bindings ("" when not served).
    """

    port: int
    https_url: str = ""

    @property
    def https_port(self) -> int:
        """The HTTPS port (0 when not served)."""
        return int(self.https_url.rsplit(":", 1)[1]) if self.https_url else 0


def ready_line(index: int, address: str, https_url: str) -> str:
    """The line worker ``index`` prints once it serves (its bound addresses)."""
    https = f"{HTTPS_MARK}{https_url}" if https_url else ""
    return f"worker {index}{READY_MARK}{address}{https}"


def parse_ready_line(line: str) -> WorkerReady | None:
    """The ports a :func:`ready_line` names; None for any other line."""
    if READY_MARK not in line:
        return None
    address, _, https_url = line.strip().partition(HTTPS_MARK)
    return WorkerReady(int(address.rsplit(":", 1)[1]), https_url)


def worker_config(config: AgentConfig, port: int | None, https_port: int | None) -> AgentConfig:
    """``config`` on the ports the supervisor resolved (None: as configured).

    Every worker binds the same ports, so all list the same URLs on their cards.
    """
    if port is not None:
        host = config.listen.rsplit(":", 1)[0]
        config = config.model_copy(update={"listen": f"{host}:{port}"})
    https = config.a2a.http_listen
    if https_port is not None and https is not None:
        listen = f"{https.rsplit(':', 1)[0]}:{https_port}"
        config = config.model_copy(
            update={"a2a": config.a2a.model_copy(update={"http_listen": listen})}
        )
    return config


def check_ports_free(served: list[tuple[str, str, int]]) -> None:
    """Refuse a port another process listens on before worker 0 joins it.

    Workers bind with ``SO_REUSEPORT``, so the kernel would let them share a
    port with a foreign process that also set it, or their gRPC port with
    their own HTTPS port. Each ``(setting, host, port)`` is probed without it
    (``SO_REUSEADDR`` only: a connection in TIME_WAIT is no listener), every
    probe held until all are bound, so two settings on one address clash here.
    Port 0 is not probed (the kernel picks a free one).

    Raises:
        AgentConfigError: a host does not resolve, or two settings name one address.
        AddressUnavailable: something listens on one of them already.
    """
    probes: dict[tuple[object, ...], str] = {}  # address -> the setting that named it
    with contextlib.ExitStack() as held:
        for setting, host, port in served:
            if port == 0:
                continue
            family, kind, proto, address = _passive_address(setting, host, port)
            if address in probes:
                raise AgentConfigError(
                    f"{setting} {host}:{port} is the address of {probes[address]}: "
                    "give each its own port"
                )
            probes[address] = setting
            probe = held.enter_context(socket.socket(family, kind, proto))
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as err:
                raise AddressUnavailable(
                    f"{setting} {host}:{port}: {err.strerror} (another process listens there; "
                    "only this agent's own workers may share its ports)"
                ) from err


def _passive_address(
    setting: str, host: str, port: int
) -> tuple[socket.AddressFamily, socket.SocketKind, int, tuple[object, ...]]:
    """The first address ``host:port`` binds to (family, type, protocol, sockaddr).

    Raises:
        AgentConfigError: ``host`` does not resolve.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as err:
        raise AgentConfigError(f"{setting} {host}:{port}: {err.strerror}") from err
    return family, kind, proto, address
