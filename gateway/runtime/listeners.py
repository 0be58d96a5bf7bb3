"""The agent's servers as services: each is built and bound when it starts.

Building a server is not free of I/O (``grpc.aio.server()`` starts gRPC's
poller thread; the HTTPS context writes the key to a private temporary file
for :mod:`ssl`), so composing an agent only gathers what they serve, and a
start that fails leaves no server behind to stop.
"""

from __future__ import annotations

from capabilities.registry import CapabilityRegistry
from gateway.config import AgentConfig
from gateway.config.addresses import is_loopback_literal
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.runtime.endpoints import Endpoints
from gateway.server.a2a import A2AServicer
from gateway.server.a2a_http import A2AHttpServer, HttpEdge
from gateway.server.a2a_http.protocol import ConnectionBudget
from gateway.server.grpc_server import GatewayServer
from gateway.server.mcp import McpEdge, McpHttpsServer, SdkMcpServer
from gateway.server.mcp.edge import ENVELOPE_BYTES
from gateway.telemetry import Telemetry
from gateway.transport.live_tls import LiveTls
from gateway.transport.tls import TlsMaterial
from policies.grants import MAX_PAYLOAD_CEILING


class GrpcServing:
    """The gRPC server: PeerGateway, A2A and health on ``listen``, mTLS from ``LiveTls``."""

    name = "gRPC server"

    def __init__(
        self,
        config: AgentConfig,
        handler: InvokeHandler,
        tls: LiveTls,
        a2a: A2AServicer,
        telemetry: Telemetry,
        endpoints: Endpoints,
    ) -> None:
        self._config = config
        self._handler = handler
        self._tls = tls
        self._a2a = a2a
        self._telemetry = telemetry
        self._endpoints = endpoints
        self._server: GatewayServer | None = None

    async def start(self) -> None:
        """Bind ``listen`` and serve; the port goes to the endpoints.

        Raises:
            AddressUnavailable: the address cannot be bound.
        """
        server = GatewayServer(
            self._config.id,
            self._handler,
            self._tls,
            self._a2a,
            self._telemetry,
            reuse_port=self._config.workers > 1,  # sibling workers share the port
        )
        self._endpoints.grpc_port = await server.start(self._config.listen)
        self._server = server

    async def set_serving(self, serving: bool) -> None:
        """Publish SERVING or NOT_SERVING on the health service (nothing before start)."""
        if self._server is not None:
            await self._server.set_serving(serving)

    async def enter_shutdown(self) -> None:
        """NOT_SERVING from now on, for good (calls in flight still finish)."""
        if self._server is not None:
            await self._server.enter_shutdown()

    async def stop(self, grace: float) -> None:
        """Stop accepting; calls in flight get ``grace`` seconds, then are cancelled."""
        server, self._server = self._server, None  # gRPC's poller thread goes with the last
        if server is not None:
            await server.stop(grace)


class HttpsServing:
    """The A2A JSON-RPC and HTTP+JSON bindings over HTTPS on ``[a2a] http_listen``."""

    name = "A2A HTTPS bindings"

    def __init__(self, listen: str, edge: HttpEdge, tls: LiveTls, endpoints: Endpoints) -> None:
        self._listen = listen
        self._edge = edge
        self._tls = tls
        self._endpoints = endpoints
        self._server: A2AHttpServer | None = None

    @property
    def budget(self) -> ConnectionBudget | None:
        """The server's connections and their bounds (None before start)."""
        return None if self._server is None else self._server.budget

    def use_tls(self, material: TlsMaterial) -> None:
        """New handshakes present ``material`` (a rotated certificate)."""
        if self._server is not None:
            self._server.use_tls(material)

    async def start(self) -> None:
        """Bind and serve; the host and port go to the endpoints.

        Raises:
            AddressUnavailable: the address cannot be bound.
            ConfigError: the address is malformed, or uvicorn would not start.
        """
        server = A2AHttpServer(self._edge.app(), self._tls.current)
        await server.start(self._listen)
        self._server = server
        self._endpoints.https_host, self._endpoints.https_port = server.host, server.port

    async def stop(self, grace: float) -> None:
        """Stop accepting; requests in flight get ``grace`` seconds."""
        if self._server is not None:
            await self._server.stop(grace)


class McpServing:
    """The capabilities as MCP tools over HTTPS on ``[mcp] listen`` (same handler and audit)."""

    name = "MCP HTTPS server"

    def __init__(
        self,
        config: AgentConfig,
        handler: InvokeHandler,
        registry: CapabilityRegistry,
        tls: LiveTls,
    ) -> None:
        assert config.mcp is not None
        self._config = config
        self._settings = config.mcp
        self._handler = handler
        self._registry = registry
        self._tls = tls
        self._server: McpHttpsServer | None = None
        self._sdk: SdkMcpServer | None = None
        self.edge: McpEdge | None = None
        """The ``/mcp`` app (after start)."""

    @property
    def url(self) -> str:
        """``https://HOST:PORT/mcp`` ("" before start)."""
        if self._server is None:
            return ""
        host = self._server.host
        return f"https://{f'[{host}]' if ':' in host else host}:{self._server.port}/mcp"

    @property
    def budget(self) -> ConnectionBudget | None:
        """The server's connections and their bounds (None before start)."""
        return None if self._server is None else self._server.budget

    def use_tls(self, material: TlsMaterial) -> None:
        """New handshakes present ``material`` (a rotated certificate)."""
        if self._server is not None:
            self._server.use_tls(material)

    async def start(self) -> None:
        """Run the SDK's session manager, bind and serve.

        Raises:
            AddressUnavailable: the address cannot be bound.
        """
        sdk = SdkMcpServer(self._config.id, 2 * MAX_PAYLOAD_CEILING + ENVELOPE_BYTES)
        host = self._settings.listen.rsplit(":", 1)[0].strip("[]")
        edge = McpEdge(
            self._handler,
            self._registry,
            sdk,
            send_timeout=self._settings.stream_send_timeout,
            loopback=is_loopback_literal(host) or host.lower() == "localhost",
        )
        await sdk.start()
        server = McpHttpsServer(edge, self._tls.current)
        try:
            await server.start(self._settings.listen, reuse_port=self._config.workers > 1)
        except BaseException:
            await sdk.stop()
            raise
        self._sdk, self._server, self.edge = sdk, server, edge

    async def stop(self, grace: float) -> None:
        """Stop accepting; requests in flight get ``grace`` seconds; then the SDK's manager."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        sdk, self._sdk = self._sdk, None
        if sdk is not None:
            await sdk.stop()
