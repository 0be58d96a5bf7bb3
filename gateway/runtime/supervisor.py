"""``workers = N``: N serving processes of one agent on one port.

``a2a-gateway serve`` with ``workers > 1`` runs this supervisor instead of an
agent. It starts worker 0 (``serve --worker 0``) on the configured address,
learns the port it bound (so ``listen = "host:0"`` works too), then starts
workers 1..N-1 on that port. Every worker binds with ``SO_REUSEPORT`` and the
kernel spreads new connections over them. ``[a2a] http_listen`` is served the
same way: worker 0 reports the HTTPS port it bound, the others join it, so
every worker lists the same URLs on the agent's cards. A request may land on
any worker: the A2A task store is shared, a task another worker runs is read,
followed and cancelled through it (:mod:`gateway.server.a2a.task_follow`,
``BackgroundTasks.cancel_elsewhere``).

What the workers share: the policy file (each watches it; SIGHUP is forwarded
to all), the audit chain (one SQLite file, each append re-reads the head
inside its write transaction), the idempotency keys (claims carry their owner
process; only claims of dead owners become ``in_doubt``), the replay window
(``replay.window`` in ``state_dir``, memory-mapped), the A2A and plan task
stores, and the per-peer limits and ``max_concurrent_calls`` (``limits.table``
in ``state_dir``, memory-mapped, made anew here before the first worker starts:
a grant's rate and in-flight cap and the server's cap hold across all workers;
a restarted worker frees the places its dead predecessor held). Per worker:
limit refusal counts and their aggregated audit records, the HTTPS connection
budget (each worker holds its own), metrics and audit checkpoints (worker 0
only).

With ``pin_workers`` the supervisor pins each worker's event-loop thread (its
main thread, once it is ready; threads it starts later inherit the CPU) to
one CPU of those the supervisor may use, worker i to the i-th modulo their
count, a restarted worker to the same one. Its gRPC and audit threads,
started before, may still run anywhere.

Only this agent's own workers share the ports: the caller holds the state
directory's lock (:mod:`gateway.runtime.instance_lock`) and every worker inherits it,
and before worker 0 starts a port another process listens on is refused, as are
two of ``listen``, ``[a2a] http_listen`` and ``[mcp] listen`` on one address
(with ``SO_REUSEPORT`` on both, the kernel would mix their connections).

Lifecycle: SIGTERM/SIGINT stop every worker gracefully, SIGHUP reloads them
all. A worker that dies is restarted on the same port, at most
``MAX_RESTARTS`` times within ``RESTART_WINDOW_SECONDS``; beyond that the
supervisor stops the others and exits 1. Before the first worker starts, every
claim an earlier run left behind is marked ``in_doubt`` (no worker runs yet).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from types import FrameType

from gateway.config import AgentConfig
from gateway.errors import AgentConfigError, StateUnavailable
from gateway.local.private_files import private_dir
from gateway.runtime.instance_lock import InstanceLock
from gateway.runtime.worker_ports import WorkerReady, check_ports_free, parse_ready_line
from gateway.storage import prepare_shared_files

MAX_RESTARTS = 5
RESTART_WINDOW_SECONDS = 60.0
READY_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 30.0


_CONFIG_REFUSED = 2
"""A worker's exit when it refuses its config (``serve``'s usage/config exit)."""


class Supervisor:
    """Starts, watches and stops the worker processes of one agent."""

    def __init__(self, config_path: Path, config: AgentConfig, lock: InstanceLock) -> None:
        """Prepare; ``lock`` (of ``config.state_dir``, held by the caller) goes to every worker."""
        self._config_path = config_path
        self._config = config
        self._lock = lock
        self._host = config.listen.rsplit(":", 1)[0]
        self._port = int(config.listen.rsplit(":", 1)[1])
        https = config.a2a.http_listen
        self._https_host = "" if https is None else https.rsplit(":", 1)[0]
        self._https_port = 0 if https is None else int(https.rsplit(":", 1)[1])
        self._https_url = ""
        self._workers: list[subprocess.Popen[str] | None] = [None] * config.workers
        self._config_refused = False
        """A worker exited ``_CONFIG_REFUSED`` before serving: the config is at fault."""
        self._restarts: deque[float] = deque()
        self._signals: deque[int] = deque()
        self._wake = threading.Event()
        self._cpus = sorted(os.sched_getaffinity(0)) if config.pin_workers else []

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (0) or until workers keep dying (1); 2 if a worker
        refused the config at start (as ``serve`` with one process does).

        Raises:
            AddressUnavailable: another process listens on a configured port.
            AgentConfigError: two listening settings name one address.
        """
        served = [("listen", self._host, self._port)]
        if self._https_host:
            served.append(("a2a.http_listen", self._https_host, self._https_port))
        mcp = self._config.mcp
        if mcp is not None:  # a fixed port with workers (see McpSettings)
            served.append(("mcp.listen", mcp.listen.rsplit(":", 1)[0], mcp.port))
        check_ports_free(served)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        try:
            self._prepare_shared_state()
        except StateUnavailable as err:
            print(f"error: {err.message}", file=sys.stderr, flush=True)
            return 1
        try:
            for index in range(len(self._workers)):
                self._start(index)
        except AgentConfigError as err:
            print(f"error: {err.message}", file=sys.stderr, flush=True)
            self._stop_all()
            # A worker refused the config (its error: line is above): the exit of a
            # one-process serve with that config, not a supervisor failure.
            return _CONFIG_REFUSED if self._config_refused else 1
        if self._https_url:  # as ``serve`` of one process says it, before the serving line
            print(f"a2a https on {self._https_url}", flush=True)
        print(
            f"{self._config.id} ({len(self._workers)} workers) serving on "
            f"{self._host}:{self._port}",
            flush=True,
        )
        return self._watch()

    def _prepare_shared_state(self) -> None:
        """Before any worker runs: earlier claims cut off, the replay window sized, limits anew."""
        private_dir(self._config.state_dir)
        prepare_shared_files(self._config)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals.append(signum)
        self._wake.set()

    def _start(self, index: int) -> None:
        command = [sys.executable, "-m", "gateway.cli.main", "serve"]
        command += ["--config", str(self._config_path), "--worker", str(index)]
        if self._port:
            command += ["--port", str(self._port)]
        if self._https_port:
            command += ["--https-port", str(self._https_port)]
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=(self._lock.fileno(),),  # held until the last worker is gone
        )
        self._workers[index] = proc
        ready = _read_ready(proc)
        if ready is None:
            proc.kill()
            proc.wait()
            self._config_refused = proc.returncode == _CONFIG_REFUSED
            raise AgentConfigError(f"worker {index} did not start (exit {proc.returncode})")
        self._port = ready.port
        if ready.https_url:
            self._https_url, self._https_port = ready.https_url, ready.https_port
        if self._cpus:
            # After the ready line: pinning only the loop thread leaves gRPC's
            # and the audit writer's threads free to use another core.
            os.sched_setaffinity(proc.pid, {self._cpus[index % len(self._cpus)]})
        print(f"worker {index} pid {proc.pid}", flush=True)
        threading.Thread(target=self._watch_exit, args=(proc,), daemon=True).start()

    def _watch_exit(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # a worker prints nothing more; keep its pipe drained
            sys.stdout.write(line)
        proc.wait()
        self._wake.set()

    def _watch(self) -> int:
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            while self._signals:
                signum = self._signals.popleft()
                if signum == signal.SIGHUP:
                    self._send_all(signal.SIGHUP)
                else:
                    return self._stop_all()
            for index, proc in enumerate(self._workers):
                if proc is not None and proc.poll() is not None:
                    if not self._may_restart():
                        print(
                            f"error: worker {index} exited {proc.returncode}; "
                            "too many restarts, stopping",
                            file=sys.stderr,
                            flush=True,
                        )
                        self._stop_all()
                        return 1
                    print(f"worker {index} exited {proc.returncode}; restarting", file=sys.stderr)
                    try:
                        self._start(index)
                    except AgentConfigError as err:
                        # E.g. the policy file is bad right now: the siblings serve on under
                        # the last good one, and the next round tries again (same budget).
                        print(f"error: {err.message}", file=sys.stderr, flush=True)

    def _may_restart(self) -> bool:
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > RESTART_WINDOW_SECONDS:
            self._restarts.popleft()
        self._restarts.append(now)
        return len(self._restarts) <= MAX_RESTARTS

    def _send_all(self, signum: int) -> None:
        for proc in self._workers:
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signum)

    def _stop_all(self) -> int:
        """SIGTERM every worker, wait (SIGKILL after the timeout); 0 if all ended cleanly."""
        self._send_all(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        clean = True
        for proc in self._workers:
            if proc is None:
                continue
            try:
                code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                code = proc.wait()
            clean = clean and code == 0
        return 0 if clean else 1


def _read_ready(proc: subprocess.Popen[str]) -> WorkerReady | None:
    """The ports of the worker's ready line; None if it exited or stayed silent."""
    assert proc.stdout is not None
    found: list[WorkerReady] = []

    def read() -> None:
        assert proc.stdout is not None
        ready = parse_ready_line(proc.stdout.readline())
        if ready is not None:
            found.append(ready)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(READY_TIMEOUT_SECONDS)
    return found[0] if found else None


def check_workers(config: AgentConfig) -> None:
    """Refuse a worker setup that cannot share one port.

    Raises:
        AgentConfigError: ``workers > 1`` on a platform without ``SO_REUSEPORT``,
            or ``pin_workers`` where CPU affinity cannot be set.
    """
    if config.workers > 1 and not hasattr(socket, "SO_REUSEPORT"):
        raise AgentConfigError("workers > 1 needs SO_REUSEPORT (Linux, BSD, macOS)")
    if config.pin_workers and not hasattr(os, "sched_setaffinity"):
        raise AgentConfigError("pin_workers needs CPU affinity (Linux)")
