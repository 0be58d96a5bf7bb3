"""A small asyncio TCP proxy for fault tests: added latency, loss-like stalls, partitions, cuts.

In-process::

    async with TcpProxy("127.0.0.1", server_port) as proxy:
        proxy.faults.latency = 0.3      # seconds added to every chunk, each direction
        proxy.cut()                     # reset every connection; refuse new ones
        proxy.restore()

As a process (e.g. inside a network namespace), controlled by JSON lines on stdin::

    python -m tests.helpers.netproxy --listen 10.231.5.1:7100 --target 10.231.6.2:7001
    # prints {"listening": "10.231.5.1:7100"}; then each stdin line such as
    # {"latency": 0.5}, {"loss": 0.2}, {"blackhole": true}, {"cut": true}, {"restore": true}
    # is applied and answered with {"ok": true, ...the current knobs...}; EOF stops it.
    # An "id" key is echoed back in the answer.

A TCP proxy cannot drop packets (the kernel below it retransmits), so ``loss``
is modelled as what loss looks like to an application: a chunk is held back for
``retransmit_delay`` extra seconds, and everything behind it waits too (order
is kept). ``blackhole`` holds all data with connections left open (a silent
partition); ``cut`` resets them (a peer or middlebox that went away). Random
choices come from a seeded generator, so a run is repeatable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import struct
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

_CHUNK = 65536
_QUEUE_CHUNKS = 256  # per direction; back-pressure beyond this


@dataclass
class LinkFaults:
    """The knobs of a proxy; change them at any time, they apply to the next chunk.

    Attributes:
        latency: Seconds added to every chunk, in each direction.
        loss: Probability that a chunk is "lost" and arrives ``retransmit_delay`` late.
        retransmit_delay: Extra seconds a lost chunk takes.
    """

    latency: float = 0.0
    loss: float = 0.0
    retransmit_delay: float = 0.2

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ValueError when a knob is out of range."""
        if self.latency < 0 or self.retransmit_delay < 0:
            raise ValueError("latency and retransmit_delay must be >= 0")
        if not 0.0 <= self.loss <= 1.0:
            raise ValueError("loss must be within [0, 1]")


class _Connection:
    """One proxied client connection: two directions, each a reader and a delayed writer."""

    def __init__(
        self, proxy: TcpProxy, client: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        self._proxy = proxy
        self._client = client
        self._upstream: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        reader, writer = self._client
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self._proxy.target_host, self._proxy.target_port
            )
        except OSError:
            _reset(writer)
            return
        self._upstream = up_writer
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
            self._tasks.append(asyncio.create_task(self._read(source, queue)))
            self._tasks.append(asyncio.create_task(self._deliver(queue, sink)))
        try:
            done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            self.reset()
            raise
        failed = any(not t.cancelled() and t.exception() is not None for t in done)
        if failed or len(done) < len(self._tasks):
            self.reset()
        else:
            writer.close()
            up_writer.close()

    def reset(self) -> None:
        """Abort both sides with a TCP reset and stop the pumps."""
        for task in self._tasks:
            task.cancel()
        _reset(self._client[1])
        if self._upstream is not None:
            _reset(self._upstream)

    async def _read(
        self, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes] | None]
    ) -> None:
        loop = asyncio.get_running_loop()
        last_due = 0.0
        while data := await reader.read(_CHUNK):
            # Never before the previous chunk: a stream keeps its order.
            last_due = max(loop.time() + self._proxy.delay_for_chunk(), last_due)
            await queue.put((last_due, data))
        await queue.put(None)

    async def _deliver(
        self, queue: asyncio.Queue[tuple[float, bytes] | None], writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        while (item := await queue.get()) is not None:
            due, data = item
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            await self._proxy.flowing.wait()
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class TcpProxy:
    """Forwards TCP connections from a listening address to a target, with faults.

    Attributes:
        faults: The current knobs (mutable).
        accepted: Connections accepted so far (including ones reset by a cut).
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        seed: int = 0,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.faults = LinkFaults()
        self.accepted = 0
        self._random = random.Random(seed)
        self._cut = False
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.flowing = asyncio.Event()
        """Set while data may flow; cleared by a blackhole."""
        self.flowing.set()

    @property
    def address(self) -> str:
        """``host:port`` clients should connect to (after start)."""
        return f"{self.listen_host}:{self.listen_port}"

    @property
    def is_cut(self) -> bool:
        """True between :meth:`cut` and :meth:`restore`."""
        return self._cut

    @property
    def blackholed(self) -> bool:
        """True while :meth:`set_blackhole` holds all data."""
        return not self.flowing.is_set()

    async def start(self) -> int:
        """Start listening; returns the bound port."""
        self._server = await asyncio.start_server(
            self._accept, self.listen_host, self.listen_port, reuse_address=True
        )
        self.listen_port = int(self._server.sockets[0].getsockname()[1])
        return self.listen_port

    async def close(self) -> None:
        """Stop listening and reset every connection."""
        if self._server is not None:
            self._server.close()
        self._reset_all()
        if self._tasks:  # reset connections end their tasks; cancel only stragglers
            _, stragglers = await asyncio.wait(list(self._tasks), timeout=2.0)
            for task in stragglers:
                task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    def delay_for_chunk(self) -> float:
        """The delay of the next chunk under the current faults."""
        self.faults.check()
        delay = self.faults.latency
        if self.faults.loss and self._random.random() < self.faults.loss:
            delay += self.faults.retransmit_delay
        return delay

    def set_blackhole(self, on: bool) -> None:
        """Hold (True) or release (False) all data; connections stay open."""
        if on:
            self.flowing.clear()
        else:
            self.flowing.set()

    def cut(self) -> None:
        """Reset every connection and refuse (reset) new ones until :meth:`restore`."""
        self._cut = True
        self._reset_all()

    def restore(self) -> None:
        """Accept connections again and clear every fault."""
        self._cut = False
        self.faults = LinkFaults()
        self.set_blackhole(False)

    def _reset_all(self) -> None:
        for conn in list(self._connections):
            conn.reset()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._cut:
            _reset(writer)
            return
        conn = _Connection(self, (reader, writer))
        self._connections.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await conn.run()
        finally:
            self._connections.discard(conn)
            if task is not None:
                self._tasks.discard(task)

    async def __aenter__(self) -> TcpProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


_KNOBS = ("latency", "loss", "retransmit_delay")
_COMMANDS = frozenset({*_KNOBS, "blackhole", "cut", "restore", "id"})


def apply_command(proxy: TcpProxy, command: dict[str, Any]) -> dict[str, Any]:
    """Apply one control command (see the module docstring); returns the new state.

    Raises:
        ValueError: an unknown key or a knob out of range (nothing is applied).
    """
    if unknown := set(command) - _COMMANDS:
        raise ValueError(f"unknown proxy command keys: {sorted(unknown)}")
    proxy.faults = replace(
        proxy.faults, **{knob: float(command[knob]) for knob in _KNOBS if knob in command}
    )
    if "blackhole" in command:
        proxy.set_blackhole(bool(command["blackhole"]))
    if command.get("cut"):
        proxy.cut()
    if command.get("restore"):
        proxy.restore()
    return {
        "id": command.get("id"),
        "ok": True,
        "cut": proxy.is_cut,
        "blackhole": proxy.blackholed,
        "accepted": proxy.accepted,
        **asdict(proxy.faults),
    }


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def _serve(listen: str, target: str, seed: int) -> None:
    (listen_host, listen_port), (target_host, target_port) = _split(listen), _split(target)
    proxy = TcpProxy(
        target_host, target_port, listen_host=listen_host, listen_port=listen_port, seed=seed
    )
    await proxy.start()
    print(json.dumps({"listening": proxy.address}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if not line.strip():
                continue
            try:
                command = json.loads(line)
                reply = apply_command(proxy, command)
            except (ValueError, TypeError, AttributeError) as err:
                reply = {"ok": False, "error": str(err)}
            print(json.dumps(reply), flush=True)
    finally:
        await proxy.close()


def main(argv: list[str] | None = None) -> int:
    """Run a proxy until stdin closes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--seed", type=int, default=0, help="seed of the loss generator")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.listen, args.target, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
