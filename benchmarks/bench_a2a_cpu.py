"""CPU (or instructions) per A2A SendMessage, in one process: for decisions on a loaded machine.

Run ``python benchmarks/bench_a2a_cpu.py --calls 400`` (a few seconds). One event
loop holds a real gateway :class:`~gateway.runtime.agent.Agent` (the workspace of
``bench_invoke.py``: full policy, ``audit_sync = "full"``, task table) or, with
``--target sdk``, the a2a-sdk echo agent of ``bench_a2a.py``, and a gRPC client
sending ``--calls`` SendMessage of one ``data`` part ``{"text": ...}`` of
``--size`` bytes one at a time (after ``--warmup`` calls). It prints the CPU time
of the whole process (client, server and their threads) and the wall time per
call. Both move by 10-30% between runs here; for a steady number run it under
callgrind, which counts every thread's instructions::

    valgrind --tool=callgrind --dump-before=getpgrp --callgrind-out-file=cg.out \\
        python benchmarks/bench_a2a_cpu.py --calls 40
    callgrind_annotate cg.out.2 | grep "PROGRAM TOTALS"   # the calls only

The measured calls are cut out by ``os.getpgrp()`` before and after them
(nothing else here calls it), so part 2 holds exactly those calls. Under
valgrind SHA-256 runs without the CPU's SHA instructions, so the digests weigh
several times what they do natively.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from a2a.types import a2a_pb2, a2a_pb2_grpc
from bench_a2a import VERSION_METADATA, send_request, start_sdk_server
from bench_invoke import echo_payload, make_workspace
from grpc import aio

from gateway.runtime.agent import Agent
from gateway.transport.tls import channel_options


async def measure(calls: int, warmup: int, size: int, target: str) -> tuple[float, float]:
    """CPU and wall seconds per call over ``calls`` sequential SendMessage calls."""
    with tempfile.TemporaryDirectory(prefix="bench-a2a-cpu-") as tmp:
        ws = make_workspace(Path(tmp), size, "full")
        agent = Agent(ws.config)
        await agent.start(watch_policy=False)
        port, sdk = agent.port, None
        if target == "sdk":
            sdk, port = await start_sdk_server(agent.tls, ws.config.id)
        channel = aio.secure_channel(
            f"127.0.0.1:{port}",
            ws.caller_tls.channel_credentials(),
            options=channel_options(ws.config.id),
        )
        stub = a2a_pb2_grpc.A2AServiceStub(channel)  # type: ignore[no-untyped-call]
        request = send_request(echo_payload(size))

        async def one() -> None:
            request.message.message_id = uuid.uuid4().hex
            reply = await stub.SendMessage(request, metadata=VERSION_METADATA)
            if reply.task.status.state != a2a_pb2.TASK_STATE_COMPLETED:
                raise RuntimeError(f"task state {reply.task.status.state}")

        try:
            for _ in range(warmup):
                await one()
            os.getpgrp()  # callgrind: the calls start here
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(calls):
                await one()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            os.getpgrp()  # callgrind: and end here
        finally:
            await channel.close()
            if sdk is not None:
                await sdk.stop(1.0)
            await agent.stop(1.0)
    return cpu / calls, wall / calls


def main(argv: list[str] | None = None) -> int:
    """Parse the options, measure, print one line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="measured calls")
    parser.add_argument("--warmup", type=int, default=20, help="calls before measuring")
    parser.add_argument("--size", type=int, default=256 * 1024, help="payload bytes")
    parser.add_argument("--target", choices=("gateway", "sdk"), default="gateway")
    args = parser.parse_args(argv)
    cpu, wall = asyncio.run(measure(args.calls, args.warmup, args.size, args.target))
    print(
        f"{args.target} {args.size} B x {args.calls}: "
        f"cpu/call {cpu * 1000:.3f} ms  wall/call {wall * 1000:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
