"""Agents as real processes (``python -m gateway.cli.main serve``), config files.

Every process started here is ended by its pid in a ``finally`` (or by the
:class:`tests.helpers.netns.NetLab` that started it), and every wait is bounded.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from tests.helpers.agents import Pki, spiffe, write_policy

REPO = Path(__file__).resolve().parents[2]
SERVE_START_TIMEOUT = 60.0  # python start-up on a busy 2-core runner is slow, never this slow


def write_agent_toml(
    path: Path,
    pki: Pki,
    name: str,
    *,
    listen: str,
    policy: Path,
    audit_db: Path | str,
    state_dir: Path,
    peers: Sequence[tuple[str, str]] = (),
    modules: Sequence[str] = ("capabilities.builtin",),
    state_db: str | None = None,
) -> Path:
    """Write an agent config file for ``serve`` (absolute paths or DSNs); returns ``path``."""
    pki.ensure(name)
    lines = [
        f'id = "{spiffe(name)}"',
        f'listen = "{listen}"',
        f'policy = "{policy}"',
        f'audit_db = "{audit_db}"',
        f'state_dir = "{state_dir}"',
        *([f'state_db = "{state_db}"'] if state_db else []),
        "modules = [" + ", ".join(f'"{m}"' for m in modules) + "]",
        "",
        "[tls]",
        f'ca = "{pki.dir / "ca.pem"}"',
        f'cert = "{pki.dir / (name + ".pem")}"',
        f'key = "{pki.dir / (name + ".key")}"',
        "",
    ]
    for peer, address in peers:
        lines += ["[[peers]]", f'id = "{spiffe(peer)}"', f'address = "{address}"', ""]
    path.write_text("\n".join(lines))
    return path


WORKER_TEST_MODULES = (
    "capabilities.builtin",
    "tests.helpers.crash_window",
    "tests.helpers.worker_pid",
)
"""Capabilities of the workers tests: built-ins, the counting write, ``worker.pid``."""


def two_worker_agent(
    pki: Pki, tmp_path: Path, grants: Sequence[dict[str, object]], *, pin: bool = False
) -> AgentProcess:
    """alice as ``workers = 2`` (``pin_workers`` if ``pin``) under ``grants``, not started."""
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "policy.toml", list(grants)),
        audit_db=tmp_path / "audit.sqlite",
        state_dir=tmp_path / "state",
        modules=WORKER_TEST_MODULES,
    )
    pinning = "pin_workers = true\n" if pin else ""
    config.write_text("workers = 2\n" + pinning + config.read_text())
    return AgentProcess(config)


class LineReader:
    """Reads a pipe's lines on a thread so waiting for one can be bounded."""

    def __init__(self, pipe: object) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        thread = threading.Thread(target=self._pump, args=(pipe,), daemon=True)
        thread.start()

    def _pump(self, pipe: object) -> None:
        try:
            for line in pipe:  # type: ignore[attr-defined]
                self._lines.put(line)
        except (OSError, ValueError):
            pass
        finally:
            self._lines.put(None)

    def next_line(self, timeout: float) -> str | None:
        """The next line (without newline), or None at EOF; TimeoutError after ``timeout``."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no line within {timeout:g}s") from None
        if line is None:
            self._lines.put(None)  # stay at EOF for later readers
            return None
        self.seen.append(line)
        return line.rstrip("\n")


Launcher = Callable[..., "subprocess.Popen[str]"]


def _plain_popen(args: list[str], **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(args, text=True, **kw)  # type: ignore[call-overload, no-any-return]


class AgentProcess:
    """``python -m gateway.cli.main serve --config CONFIG`` as a child process.

    ``launch`` starts the command (default: plainly; pass ``Namespace.popen`` to
    run it inside a network namespace).
    """

    def __init__(self, config: Path, launch: Launcher = _plain_popen) -> None:
        self.config = config
        self._launch = launch
        self.proc: subprocess.Popen[str] | None = None
        self.stdout: LineReader | None = None
        self.stderr: LineReader | None = None
        self.address = ""
        self.https_url = ""
        """``https://HOST:PORT`` from the ``a2a https on`` line, when ``[a2a] http_listen`` is set."""

    def spawn(self) -> None:
        """Start the process without waiting for it to serve."""
        self.proc = self._launch(
            [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
        )
        self.stdout, self.stderr = LineReader(self.proc.stdout), LineReader(self.proc.stderr)

    def wait_serving(self, timeout: float = SERVE_START_TIMEOUT) -> str:
        """Wait for the ``serving on ADDRESS`` line; returns ADDRESS.

        Raises:
            AssertionError: the process exited or never said it serves (stderr attached).
        """
        assert self.stdout is not None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.stdout.next_line(left)
            except TimeoutError:
                break
            if line is None:
                break
            if line.startswith("a2a https on "):
                self.https_url = line.removeprefix("a2a https on ").strip()
            if " serving on " in line:
                self.address = line.rsplit(" serving on ", 1)[1].strip()
                return self.address
        raise AssertionError(f"agent {self.config.name} did not start serving: {self.errors()}")

    def start(self, timeout: float = SERVE_START_TIMEOUT) -> str:
        """Spawn and wait until it serves; returns its address."""
        self.spawn()
        return self.wait_serving(timeout)

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to end on its own; returns its exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def errors(self, wait: float = 0.0) -> str:
        """What the process wrote to stderr so far (after up to ``wait`` s for EOF)."""
        if self.stderr is None:
            return ""
        end = time.monotonic() + wait
        while wait and (left := end - time.monotonic()) > 0:
            try:
                if self.stderr.next_line(left) is None:
                    break
            except TimeoutError:
                break
        return "".join(self.stderr.seen)

    def kill(self) -> None:
        """SIGKILL, by pid; waits until it is gone."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM (graceful stop), by pid; returns the exit code (kills if it hangs)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"agent {self.config.name} ignored SIGTERM") from None
        return self.proc.returncode

    def ensure_stopped(self) -> None:
        """For ``finally`` blocks: kill if still running, never raise."""
        try:
            self.kill()
        except (OSError, subprocess.TimeoutExpired):
            pass


MAX_WORKER_CHANNELS = 32
"""Connections opened to reach both workers (the kernel spreads connections; a bound, never
asserted)."""


def worker_pids(agent: AgentProcess) -> list[int]:
    """The pids the supervisor announced (``worker I pid P``), in order."""
    assert agent.stdout is not None
    return [int(line.split()[-1]) for line in agent.stdout.seen if line.startswith("worker ")]


async def one_client_per_worker(
    pki: Pki, address: str, opened: list[PeerClient], caller: str = "bob"
) -> dict[int, PeerClient]:
    """``caller``'s clients, one new connection each, until both workers answered
    ``worker.pid``: {pid: client}; every client opened is appended to ``opened`` (for
    closing). A refused ``worker.pid`` fails the test: the setup needs both workers."""
    by_pid: dict[int, PeerClient] = {}
    for _ in range(MAX_WORKER_CHANNELS):
        client = PeerClient(spiffe("alice"), address, pki.material(caller))
        opened.append(client)
        try:
            result = await client.invoke("worker.pid", {})
        except GatewayError as err:
            raise AssertionError(err.reason) from err
        by_pid.setdefault(int(result.output()["pid"]), client)
        if len(by_pid) == 2:
            break
    return by_pid
