"""Where a fronted A2A call's time goes: the direct call, the gateway's own, and the hop.

Run ``python benchmarks/bench_fronted_split.py`` (about 20 s). The a2a-sdk echo
agent of ``bench_a2a_paths`` runs in a child process; a real gateway
:class:`~gateway.runtime.agent.Agent` fronting it over gRPC (``[[upstreams]]``, full
policy and audit) and the client run in this process. One call at a time,
``--calls`` each (after a tenth as warm-up), taking turns in ``--rounds`` rounds
(the order rotated each round, so a load that drifts hits every target alike),
p50 of:

* ``direct``: SendMessage to the sdk agent from a raw A2A stub;
* ``fronted``: the same through the gateway (``sdk.echo``);
* ``gateway_echo``: the gateway's own ``text.echo`` (a whole gateway call, no hop);
* ``upstream_send``: inside ``fronted``, the gateway's call to the upstream
  (``UpstreamClient.send``: the a2a-sdk client, its channel, the sdk agent);
* ``raw_proxy``: the same call through a pass-through ``grpc.aio`` proxy in this
  process (mTLS both sides, the request's bytes forwarded as they came, no
  parsing, policy or audit): the least one more gRPC hop in Python costs.

``direct / raw_proxy`` is the ceiling of ``fronted/direct`` for any gateway that
fronts the agent over one more ``grpc.aio`` hop in Python on this machine.

``fronted - upstream_send`` is what the gateway adds around the hop, and
``upstream_send - direct`` what the a2a-sdk client adds over a raw stub. Client
and gateway share one event loop here, so the absolute times are not those of
``bench_a2a_paths.py`` (separate processes); the split is what this is for.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import bench_a2a_paths as paths
import grpc
from a2a.types import a2a_pb2, a2a_pb2_grpc
from bench_a2a import ServerProcess
from bench_invoke import make_workspace
from grpc import aio

import gateway.client.a2a.upstream_client as upstream_client
from gateway.devtools.pki import issue
from gateway.runtime.agent import Agent
from gateway.transport.tls import channel_options, server_options

VERSION = (("a2a-version", "1.0"),)
SEND_MESSAGE = "/lf.a2a.v1.A2AService/SendMessage"


async def start_raw_proxy(tls: Any, upstream: aio.Channel) -> tuple[aio.Server, int]:
    """A ``grpc.aio`` server forwarding SendMessage bytes to ``upstream``, untouched."""
    forward = upstream.unary_unary(SEND_MESSAGE)  # no serializers: bytes in, bytes out

    async def send(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        return await forward(request, metadata=VERSION, timeout=10)  # type: ignore[no-any-return]

    handler = grpc.method_handlers_generic_handler(
        "lf.a2a.v1.A2AService", {"SendMessage": grpc.unary_unary_rpc_method_handler(send)}
    )
    server = aio.server(options=server_options())
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    return server, port


def message(capability: str, *, data: bool) -> a2a_pb2.SendMessageRequest:
    """One message of ``hello`` for ``capability``: a data part ``{"text": ...}`` or text."""
    request = a2a_pb2.SendMessageRequest()
    request.message.message_id = uuid.uuid4().hex
    request.message.role = a2a_pb2.ROLE_USER
    part = request.message.parts.add()
    if data:
        part.data.struct_value.update({"text": "hello"})
    else:
        part.text = "hello"
    request.message.metadata["a2agw.capability"] = capability
    return request


async def timed_ms(stub: Any, capability: str, calls: int, *, data: bool = False) -> list[float]:
    """Milliseconds of each of ``calls`` sequential SendMessage."""
    times = []
    for _ in range(calls):
        request = message(capability, data=data)
        start = time.perf_counter()
        await stub.SendMessage(request, metadata=VERSION, timeout=10)
        times.append((time.perf_counter() - start) * 1e3)
    return times


async def measure(base: Path, calls: int, rounds: int) -> dict[str, float]:
    """The five p50s (see the module doc), the targets taking turns round by round."""
    ws = make_workspace(base, paths.PAYLOAD_CAP // 2, "full")
    paths.grant_both(ws)
    issue(base / "pki", paths.LEGACY)
    issue(base / "pki", paths.LEGACY_HTTP)
    sends: list[float] = []
    real_send = upstream_client.UpstreamClient.send

    async def timed_send(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await real_send(self, *args, **kwargs)
        finally:
            sends.append((time.perf_counter() - start) * 1e3)

    upstream_client.UpstreamClient.send = timed_send  # type: ignore[method-assign]
    sdk = ServerProcess(ws.config, paths.serve_sdk)
    try:
        ports = sdk.start()
        agent = Agent(paths.fronting_config(ws.config, ports))
        await agent.start(watch_policy=False)

        def channel(port: int, server_id: str) -> aio.Channel:
            credentials = ws.caller_tls.channel_credentials()
            return aio.secure_channel(
                f"127.0.0.1:{port}", credentials, options=channel_options(server_id)
            )

        to_sdk = channel(ports["sdk_port"], paths.LEGACY_ID)
        to_gateway = channel(agent.port, ws.config.id)
        proxy_to_sdk = channel(ports["sdk_port"], paths.LEGACY_ID)  # its own, as the gateway's
        proxy, proxy_port = await start_raw_proxy(agent.tls, proxy_to_sdk)
        to_proxy = channel(proxy_port, ws.config.id)
        try:
            sdk_stub = a2a_pb2_grpc.A2AServiceStub(to_sdk)  # type: ignore[no-untyped-call]
            gateway_stub = a2a_pb2_grpc.A2AServiceStub(to_gateway)  # type: ignore[no-untyped-call]
            proxy_stub = a2a_pb2_grpc.A2AServiceStub(to_proxy)  # type: ignore[no-untyped-call]
            fronted = paths.FRONTED["grpc"]
            targets = {
                "direct": (sdk_stub, fronted, False),
                "fronted": (gateway_stub, fronted, False),
                "gateway_echo": (gateway_stub, "text.echo", True),
                "raw_proxy": (proxy_stub, fronted, False),
            }
            for stub, capability, data in targets.values():  # warm-up: channels, caches
                await timed_ms(stub, capability, max(10, calls // 10), data=data)
            sends.clear()
            times: dict[str, list[float]] = {name: [] for name in targets}
            names = list(targets)
            per_round = max(1, calls // rounds)
            for number in range(rounds):  # a drifting load hits every target alike
                for name in names[number % len(names) :] + names[: number % len(names)]:
                    stub, capability, data = targets[name]
                    times[name] += await timed_ms(stub, capability, per_round, data=data)
            result = {name: statistics.median(samples) for name, samples in times.items()}
            result["upstream_send"] = statistics.median(sends)
        finally:
            for open_channel in (to_sdk, to_gateway, to_proxy, proxy_to_sdk):
                await open_channel.close()
            await proxy.stop(1.0)
            await agent.stop(1.0)
    finally:
        sdk.stop()
        upstream_client.UpstreamClient.send = real_send  # type: ignore[method-assign]
    return result


def main(argv: list[str] | None = None) -> int:
    """Run once and print the split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per target (default 300)")
    parser.add_argument("--rounds", type=int, default=6, help="turns each target takes (default 6)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-fronted-") as tmp:
        result = asyncio.run(measure(Path(tmp), args.calls, max(1, args.rounds)))
    print(f"fronted A2A call, 256 B-ish text, {args.calls} sequential calls each, p50 ms:")
    for name in ("direct", "fronted", "gateway_echo", "upstream_send", "raw_proxy"):
        print(f"  {name:<14} {result[name]:7.3f}")
    added = result["fronted"] - result["upstream_send"]
    client = result["upstream_send"] - result["direct"]
    print(
        f"  gateway around the hop {added:.3f} ms; a2a-sdk client over a raw stub {client:.3f} ms"
    )
    print(f"  fronted/direct {result['direct'] / result['fronted']:.2f} (one at a time)")
    print(
        f"  raw pass-through proxy/direct {result['direct'] / result['raw_proxy']:.2f}: "
        "the ceiling of fronted/direct for one more grpc.aio hop in Python"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
