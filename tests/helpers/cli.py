"""The a2a-gateway command as a test runs it, and the files of an agent it serves.

``run_cli`` calls ``main([...])`` in this process, as the installed command would, with its
own standard streams and logging: most command tests use it, since a fresh interpreter
costs a second or more. ``run`` starts the command as its own process, for the end-to-end
tests of each command group and for what only a process shows (its environment, closed
standard streams, signals, capability modules imported from a config's folder).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.cli.main import main
from tests.helpers.agent_process import REPO, write_agent_toml
from tests.helpers.agents import Pki, write_policy


@dataclass(frozen=True)
class CliResult:
    """What a command left: its exit status and its two streams (as ``CompletedProcess``)."""

    returncode: int
    stdout: str
    stderr: str


_ONE_AT_A_TIME = threading.Lock()  # the standard streams and the root logger are global


def run_cli(*args: str, cwd: Path = REPO) -> CliResult:
    """``a2a-gateway ARGS`` in this process; from a coroutine, ``await run_cli_async(...)``."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_main(args, cwd)
    raise RuntimeError("run_cli inside a running event loop: await run_cli_async(...) instead")


async def run_cli_async(*args: str, cwd: Path = REPO) -> CliResult:
    """``run_cli`` in a worker thread, so the command's own event loop can run beside the test's."""
    return await asyncio.to_thread(_run_main, args, cwd)


def _run_main(args: Sequence[str], cwd: Path) -> CliResult:
    out, err = _stream("strict"), _stream("backslashreplace")
    with _ONE_AT_A_TIME, _own_logging(), contextlib.chdir(cwd):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as leaving:  # argparse's usage errors and --help
                code = leaving.code if isinstance(leaving.code, int) else 1
        out.flush(), err.flush()
    return CliResult(code, _text(out), _text(err))


def _stream(errors: str) -> io.TextIOWrapper:
    """A standard stream as a pipe gives one: UTF-8, stdout strict, stderr escaping."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors, newline="\n")


def _text(stream: io.TextIOWrapper) -> str:
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8", errors="backslashreplace")


@contextlib.contextmanager
def _own_logging() -> Iterator[None]:
    """An empty root logger, so ``main``'s ``basicConfig`` writes to the command's stderr."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()
    try:
        yield
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )


def agent_files(
    pki: Pki,
    base: Path,
    name: str,
    *,
    grants: Sequence[dict[str, Any]] = (),
    outbound: Sequence[dict[str, Any]] = (),
    peers: Sequence[tuple[str, str]] = (),
    modules: Sequence[str] = ("capabilities.builtin",),
) -> Path:
    """Policy and config files of agent ``name`` (listening on 127.0.0.1:0)."""
    policy = write_policy(base / f"{name}-policy.toml", list(grants), list(outbound))
    return write_agent_toml(
        base / f"{name}.toml",
        pki,
        name,
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=base / f"{name}-audit.sqlite",
        state_dir=base / f"{name}-state",
        peers=peers,
        modules=modules,
    )


def config_file(
    pki: Pki,
    base: Path,
    *,
    grants: list[dict[str, object]] | None = None,
    outbound: list[dict[str, object]] | None = None,
    peers: list[tuple[str, str]] | None = None,
    modules: tuple[str, ...] = ("capabilities.builtin",),
) -> Path:
    policy = write_policy(base / "alice-policy.toml", grants or [], outbound)
    return write_agent_toml(
        base / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=base / "alice-audit.sqlite",
        state_dir=base / "alice-state",
        peers=peers or [],
        modules=modules,
    )
