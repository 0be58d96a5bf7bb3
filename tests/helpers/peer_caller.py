"""A peer that calls other peers on command: JSON lines in, JSON lines out.

Runs where a test cannot put its own event loop, e.g. inside a network
namespace, with the identity of an agent config::

    ip netns exec NS python -m tests.helpers.peer_caller --config bob.toml

It prints ``{"ready": true}``, then answers each stdin line such as::

    {"id": 1, "peer": "spiffe://example.org/agent/alice", "address": "10.231.1.1:7001",
     "capability": "text.echo", "payload": {"text": "hi"}, "timeout": 2.0}

with one line (lines are handled concurrently; match answers by ``id``)::

    {"id": 1, "ok": true, "output": {"text": "hi"}, "replayed": false, "elapsed": 0.01}
    {"id": 1, "ok": false, "reason": "DEADLINE_EXCEEDED", "message": "...", "elapsed": 2.0}

A failure that is not a GatewayError answers ``"reason": "UNEXPECTED"``. One
mTLS channel per (peer, address) is kept and reused. EOF on stdin ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from gateway.client.peer_client import PeerClient
from gateway.config import load_agent_config
from gateway.errors import GatewayError
from gateway.transport.tls import TlsMaterial


class _Caller:
    def __init__(self, config_path: Path) -> None:
        config = load_agent_config(config_path)
        self._tls = TlsMaterial.from_files(config.tls.ca, config.tls.cert, config.tls.key)
        self._clients: dict[tuple[str, str], PeerClient] = {}

    async def call(self, command: dict[str, Any]) -> dict[str, Any]:
        key = (str(command["peer"]), str(command["address"]))
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = PeerClient(key[0], key[1], self._tls)
        started = time.monotonic()
        try:
            result = await client.invoke(
                str(command["capability"]),
                command.get("payload", {}),
                timeout=float(command.get("timeout", 10.0)),
                idempotency_key=str(command.get("idempotency_key", "")),
            )
        except GatewayError as err:
            answer = {"ok": False, "reason": err.reason, "message": err.message}
        except Exception as err:  # the test must see it, not a dead process
            answer = {"ok": False, "reason": "UNEXPECTED", "message": repr(err)}
        else:
            answer = {"ok": True, "output": result.output(), "replayed": result.remembered}
        return {"id": command.get("id"), "elapsed": time.monotonic() - started, **answer}

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()


async def _run(config_path: Path) -> None:
    caller = _Caller(config_path)
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()

    async def answer(command: dict[str, Any]) -> None:
        print(json.dumps(await caller.call(command)), flush=True)

    print(json.dumps({"ready": True}), flush=True)
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip():
                task = asyncio.create_task(answer(json.loads(line)))
                pending.add(task)
                task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(pending, timeout=60)
    finally:
        await caller.close()


def main(argv: list[str] | None = None) -> int:
    """Serve commands until stdin closes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", type=Path, required=True, help="agent config (identity)")
    args = parser.parse_args(argv)
    asyncio.run(_run(args.config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
