"""Network namespaces joined by veth pairs, for tests that need separate hosts (root only).

::

    reason = netns_unavailable_reason()      # None when namespaces work here
    with NetLab() as lab:
        a, b = lab.namespace("a"), lab.namespace("b")
        link = lab.veth(a, "10.231.7.1", b, "10.231.7.2")
        proc = a.popen([sys.executable, "-m", "gateway.cli.main", "serve", ...])
        link.set_up(False)                   # cut the cable (a's end)
    # every namespace is deleted and every process it started is killed, even on failure

Veth ends are created directly inside their namespaces, so the test host's own
namespace gets no interface, address or route, and concurrent runs cannot
collide: namespace names carry the process id, and addresses only exist inside
the namespaces of one lab.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from functools import cache
from typing import Any

_IP_TIMEOUT = 10.0
_ids = itertools.count(1)


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message holds the command and its stderr."""


def ip(*args: str) -> str:
    """Run ``ip ARGS``; returns stdout, raises NetnsError on failure."""
    result = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False
    )
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


@cache
def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (not root, no ``ip``, add refused), else None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"a2a-probe-{os.getpid()}"
    try:
        ip("netns", "add", probe)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as err:
        return f"ip netns add is not permitted here: {err}"
    try:
        ip("netns", "del", probe)
    except (NetnsError, OSError, subprocess.TimeoutExpired):
        pass
    return None


@dataclass
class Namespace:
    """One network namespace of a :class:`NetLab`."""

    name: str
    lab: NetLab

    def exec_args(self, args: list[str]) -> list[str]:
        """``args`` prefixed so they run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *args]

    def run(
        self, args: list[str], *, timeout: float = 60.0, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` inside the namespace to completion (output captured as text)."""
        return subprocess.run(
            self.exec_args(args), capture_output=True, text=True, timeout=timeout, check=False, **kw
        )

    def popen(self, args: list[str], **kw: Any) -> subprocess.Popen[str]:
        """Start ``args`` inside the namespace; the lab kills it on exit.

        ``ip netns exec`` execs the command, so the returned pid is the command's.
        """
        proc: subprocess.Popen[str] = subprocess.Popen(self.exec_args(args), text=True, **kw)
        self.lab.processes.append(proc)
        return proc


@dataclass
class VethLink:
    """A veth pair: ``left`` end in one namespace, ``right`` in another."""

    left: Namespace
    left_dev: str
    left_addr: str
    right: Namespace
    right_dev: str
    right_addr: str

    def set_up(self, up: bool, *, side: str = "left") -> None:
        """``ip link set DEV up|down`` on one end (the other end loses carrier)."""
        ns, dev = (self.left, self.left_dev) if side == "left" else (self.right, self.right_dev)
        ip("-n", ns.name, "link", "set", dev, "up" if up else "down")


class NetLab:
    """Namespaces and links made for one test; :meth:`close` removes all of them."""

    def __init__(self, tag: str = "a2a") -> None:
        self._prefix = f"{tag}-{os.getpid()}-{next(_ids)}"
        self.namespaces: list[Namespace] = []
        self.processes: list[subprocess.Popen[str]] = []
        self._devs = itertools.count(0)

    def namespace(self, short: str) -> Namespace:
        """A fresh namespace with loopback up."""
        ns = Namespace(f"{self._prefix}-{short}", self)
        ip("netns", "add", ns.name)
        self.namespaces.append(ns)
        ip("-n", ns.name, "link", "set", "lo", "up")
        return ns

    def veth(
        self, left: Namespace, left_addr: str, right: Namespace, right_addr: str, prefix: int = 24
    ) -> VethLink:
        """A veth pair between two namespaces, addressed and up."""
        n = next(self._devs)
        link = VethLink(left, f"veth{n}l", left_addr, right, f"veth{n}r", right_addr)
        ip(
            "link", "add", link.left_dev, "netns", left.name, "type", "veth",
            "peer", "name", link.right_dev, "netns", right.name,
        )  # fmt: skip
        for ns, dev, addr in (
            (left, link.left_dev, left_addr),
            (right, link.right_dev, right_addr),
        ):
            ip("-n", ns.name, "addr", "add", f"{addr}/{prefix}", "dev", dev)
            ip("-n", ns.name, "link", "set", dev, "up")
        return link

    def close(self) -> None:
        """Kill the lab's processes (by pid), then delete its namespaces (and their links)."""
        for proc in self.processes:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        errors = []
        for ns in reversed(self.namespaces):
            try:
                ip("netns", "del", ns.name)
            except (NetnsError, subprocess.TimeoutExpired) as err:
                errors.append(str(err))
        self.namespaces.clear()
        if errors:
            raise NetnsError("; ".join(errors))

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
