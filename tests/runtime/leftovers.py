"""What a process leaves behind: the threads still running, the ports it listens on."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path


def listening_ports() -> set[int]:
    """The TCP ports this process listens on: its socket descriptors, found in the
    kernel's table in the LISTEN state (Linux /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor of the listing itself, closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def threads_left(before: set[threading.Thread]) -> list[str]:
    """The threads started since ``before`` that do not end (each given 10 s to).

    gRPC runs one poller thread per process while any ``grpc.aio`` object
    lives; a server that failed to bind is garbage in a reference cycle (the
    error's traceback and asyncio's task), so it is collected first.
    """
    gc.collect()
    started = [thread for thread in threading.enumerate() if thread not in before]
    for thread in started:
        thread.join(10.0)
    return [thread.name for thread in started if thread.is_alive()]
