"""Agents on separate hosts (network namespaces): mTLS across them, latency, loss, a cut link.

Topology, all inside namespaces this module creates (the test host's own
namespace gets no address or route)::

        ns "a" (alice :7001)                        ns "b" (bob :7002, caller)
        10.231.1.1 ────────── direct veth ────────── 10.231.1.2
        10.231.2.1 ── veth ── ns "p" (proxy) ── veth ── 10.231.3.2
                         10.231.2.2   10.231.3.1:7100 → 10.231.2.1:7001

alice and bob run ``python -m gateway.cli.main serve`` inside their namespaces;
bob's calls come from ``tests.helpers.peer_caller`` (bob's identity) in "b"; the
proxy (``python -m tests.helpers.netproxy``) adds latency and loss. The certificates
carry no 10.231.x.x SAN: the client checks the server by the DNS name derived
from the expected SPIFFE ID, so connecting by any address works.

"Never hangs": each failing call must answer by its deadline plus a generous
allowance (a hang detector for a loaded 2-core runner, not a speed test).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import query_records
from gateway.client.peer_client import PeerClient
from gateway.errors import DeadlineExceeded, GatewayError, PeerUnavailable
from gateway.storage import open_audit_reader
from tests.helpers.agent_process import (
    REPO,
    SERVE_START_TIMEOUT,
    AgentProcess,
    LineReader,
    write_agent_toml,
)
from tests.helpers.agents import Pki, grant, spiffe, write_policy
from tests.helpers.netns import Namespace, NetLab, VethLink, netns_unavailable_reason
from tests.helpers.netproxy import TcpProxy

ALICE_PORT, BOB_PORT, PROXY_PORT = 7001, 7002, 7100
ALICE_DIRECT = f"10.231.1.1:{ALICE_PORT}"
BOB_DIRECT = f"10.231.1.2:{BOB_PORT}"
ALICE_VIA_PROXY = f"10.231.3.1:{PROXY_PORT}"
HANG_ALLOWANCE = 8.0  # seconds past a deadline before a call counts as hung
LINK_FAILURES = {"PEER_UNAVAILABLE", "DEADLINE_EXCEEDED"}


class JsonLineProcess:
    """A child that takes one JSON command per stdin line and answers one JSON line."""

    def __init__(self, ns: Namespace, args: list[str]) -> None:
        import subprocess

        self.proc = ns.popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO
        )
        self._out, self._err = LineReader(self.proc.stdout), LineReader(self.proc.stderr)
        self._next_id = 0

    def read(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._out.next_line(timeout)
        except TimeoutError:
            raise AssertionError(f"no answer within {timeout:g}s") from None
        assert line is not None, f"process ended: {''.join(self._err.seen)}"
        return dict(json.loads(line))

    def send(self, command: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        self._next_id += 1
        self.proc.stdin.write(json.dumps({"id": self._next_id, **command}) + "\n")
        self.proc.stdin.flush()
        return self._next_id

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


class Caller(JsonLineProcess):
    """bob's caller (``tests.helpers.peer_caller``) inside namespace "b"."""

    def call(
        self,
        capability: str = "text.echo",
        payload: dict[str, Any] | None = None,
        *,
        address: str = ALICE_DIRECT,
        peer: str = "alice",
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """One call, answered (bounded: the deadline plus HANG_ALLOWANCE)."""
        self.start_call(capability, payload, address=address, peer=peer, timeout=timeout)
        return self.answer(timeout)

    def start_call(
        self,
        capability: str = "text.echo",
        payload: dict[str, Any] | None = None,
        *,
        address: str = ALICE_DIRECT,
        peer: str = "alice",
        timeout: float = 10.0,
    ) -> None:
        self.send(
            {
                "peer": spiffe(peer),
                "address": address,
                "capability": capability,
                "payload": payload if payload is not None else {"text": "ping"},
                "timeout": timeout,
            }
        )

    def answer(self, timeout: float) -> dict[str, Any]:
        answer = self.read(timeout + HANG_ALLOWANCE)
        assert answer.get("reason") != "UNEXPECTED", answer
        return answer


class Proxy(JsonLineProcess):
    """``python -m tests.helpers.netproxy`` inside namespace "p"."""

    def set(self, **knobs: Any) -> dict[str, Any]:
        self.send(knobs)
        reply = self.read(10.0)
        assert reply.get("ok"), reply
        return reply


@dataclass
class Hosts:
    lab: NetLab
    a: Namespace
    b: Namespace
    direct: VethLink  # a <-> b
    proxy_upstream: VethLink  # a <-> p
    caller: Caller
    proxy: Proxy
    alice: AgentProcess
    bob: AgentProcess
    tmp: Path

    def until_ok(self, *, address: str = ALICE_DIRECT, attempts: int = 20) -> dict[str, Any]:
        """Call until one succeeds (bounded: ``attempts`` calls of at most 2 s + a pause)."""
        answer: dict[str, Any] = {}
        for _ in range(attempts):
            answer = self.caller.call(address=address, timeout=2.0)
            if answer["ok"]:
                return answer
            assert answer["reason"] in LINK_FAILURES, answer
            time.sleep(0.5)
        raise AssertionError(f"no call succeeded after the link came back: {answer}")


def _configs(pki: Pki, tmp: Path) -> tuple[Path, Path]:
    alice_policy = write_policy(tmp / "alice-policy.toml", [grant("bob", ["text.echo", "kv.get"])])
    bob_policy = write_policy(tmp / "bob-policy.toml", [grant("alice", ["text.echo"])])
    alice = write_agent_toml(
        tmp / "alice.toml",
        pki,
        "alice",
        listen=f"0.0.0.0:{ALICE_PORT}",
        policy=alice_policy,
        audit_db=tmp / "alice-audit.sqlite",
        state_dir=tmp / "alice-state",
        peers=[("bob", BOB_DIRECT)],
    )
    bob = write_agent_toml(
        tmp / "bob.toml",
        pki,
        "bob",
        listen=f"0.0.0.0:{BOB_PORT}",
        policy=bob_policy,
        audit_db=tmp / "bob-audit.sqlite",
        state_dir=tmp / "bob-state",
        peers=[("alice", ALICE_DIRECT)],
    )
    return alice, bob


@pytest.fixture(scope="module")
def hosts(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """Three namespaces, alice and bob serving, bob's caller and the proxy ready."""
    if reason := netns_unavailable_reason():
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("multihost")
    alice_config, bob_config = _configs(pki, tmp)
    lab = NetLab("a2af")
    processes: list[JsonLineProcess] = []
    try:
        a, b, p = lab.namespace("a"), lab.namespace("b"), lab.namespace("p")
        direct = lab.veth(a, "10.231.1.1", b, "10.231.1.2")
        upstream = lab.veth(a, "10.231.2.1", p, "10.231.2.2")
        lab.veth(p, "10.231.3.1", b, "10.231.3.2")
        alice, bob = AgentProcess(alice_config, a.popen), AgentProcess(bob_config, b.popen)
        alice.spawn()
        bob.spawn()
        caller = Caller(
            b, [sys.executable, "-m", "tests.helpers.peer_caller", "--config", str(bob_config)]
        )
        proxy = Proxy(
            p,
            [
                sys.executable, "-m", "tests.helpers.netproxy", "--seed", "7",
                "--listen", ALICE_VIA_PROXY, "--target", f"10.231.2.1:{ALICE_PORT}",
            ],
        )  # fmt: skip
        processes += [caller, proxy]
        alice.wait_serving()
        bob.wait_serving()
        assert caller.read(SERVE_START_TIMEOUT) == {"ready": True}
        assert proxy.read(SERVE_START_TIMEOUT) == {"listening": ALICE_VIA_PROXY}
        yield Hosts(lab, a, b, direct, upstream, caller, proxy, alice, bob, tmp)
    finally:
        for process in processes:
            process.close()
        lab.close()  # kills every process it started, by pid, then deletes the namespaces


@pytest.mark.netns
def test_calls_cross_namespaces_over_mtls(hosts: Hosts) -> None:
    answer = hosts.caller.call(payload={"text": "across"}, timeout=15.0)
    assert answer["ok"] and answer["output"] == {"text": "across"}, answer

    # The other direction with the real CLI: alice (in "a") calls bob (in "b").
    result = hosts.a.run(
        [
            sys.executable, "-m", "gateway.cli.main", "call",
            "--config", str(hosts.alice.config), "--peer", spiffe("bob"),
            "text.echo", "--input", '{"text": "back"}', "--timeout", "15",
        ],
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"text": "back"}

    # The address is not what is checked: asking for carol at alice's address fails.
    wrong = hosts.caller.call(peer="carol", timeout=5.0)
    assert not wrong["ok"] and wrong["reason"] == "PEER_IDENTITY_MISMATCH", wrong

    # alice saw bob's identity from his certificate (allowed records land in the next batch).
    db = hosts.tmp / "alice-audit.sqlite"
    for _ in range(100):  # bounded: 10 s
        if any(r.reason == "OK" for r in query_records(open_audit_reader(db))):
            break
        time.sleep(0.1)
    assert {r.peer_id for r in query_records(open_audit_reader(db)) if r.reason == "OK"} == {
        spiffe("bob")
    }


@pytest.mark.netns
def test_latency_and_loss_within_the_deadline_succeed_shorter_deadline_fails(
    hosts: Hosts,
) -> None:
    try:
        hosts.proxy.set(latency=0.1, loss=0.3, retransmit_delay=0.2)
        for n in range(3):
            answer = hosts.caller.call(
                payload={"text": f"slow {n}"}, address=ALICE_VIA_PROXY, timeout=20.0
            )
            assert answer["ok"] and answer["output"] == {"text": f"slow {n}"}, answer

        hosts.proxy.set(latency=1.0, loss=0.0)  # a round trip now takes at least 2 s
        short = hosts.caller.call(address=ALICE_VIA_PROXY, timeout=0.5)
        assert not short["ok"] and short["reason"] == "DEADLINE_EXCEEDED", short

        long = hosts.caller.call(payload={"text": "patient"}, address=ALICE_VIA_PROXY, timeout=20.0)
        assert long["ok"] and long["output"] == {"text": "patient"}, long
    finally:
        hosts.proxy.set(restore=True)


@pytest.mark.netns
def test_link_cut_mid_sequence_fails_cleanly_and_recovers(hosts: Hosts) -> None:
    for n in range(3):
        assert hosts.caller.call(payload={"text": f"before {n}"})["ok"]
    try:
        hosts.direct.set_up(False)  # alice's end of the cable
        for _ in range(2):
            answer = hosts.caller.call(timeout=1.5)
            assert not answer["ok"] and answer["reason"] in LINK_FAILURES, answer
    finally:
        hosts.direct.set_up(True)
    hosts.until_ok()


@pytest.mark.netns
def test_link_cut_while_a_call_is_in_flight(hosts: Hosts) -> None:
    hosts.until_ok(address=ALICE_VIA_PROXY)  # the channel through the proxy is up
    try:
        hosts.proxy.set(latency=0.5)  # the request sits on the wire for a while
        hosts.caller.start_call(address=ALICE_VIA_PROXY, timeout=3.0)
        time.sleep(0.2)
        hosts.proxy_upstream.set_up(False, side="right")  # the proxy's link towards alice
        answer = hosts.caller.answer(3.0)
        assert not answer["ok"] and answer["reason"] in LINK_FAILURES, answer
    finally:
        hosts.proxy_upstream.set_up(True, side="right")
        hosts.proxy.set(restore=True)
    hosts.until_ok(address=ALICE_VIA_PROXY)


async def test_proxy_reset_and_blackhole_on_loopback(pki: Pki, alice: Any) -> None:
    """Without namespaces (no root needed): a reset link is PEER_UNAVAILABLE, a silent one
    DEADLINE_EXCEEDED; both recover once the proxy passes traffic again."""
    port = int(alice.address.rsplit(":", 1)[1])
    async with TcpProxy("127.0.0.1", port) as proxy:
        async with PeerClient(alice.config.id, proxy.address, pki.material("bob")) as bob:
            assert (await bob.invoke("text.echo", {"text": "a"}, timeout=10.0)).output() == {
                "text": "a"
            }

            proxy.set_blackhole(True)
            with pytest.raises(DeadlineExceeded):
                await bob.invoke("text.echo", {"text": "b"}, timeout=0.5)
            proxy.set_blackhole(False)

            proxy.cut()
            with pytest.raises(PeerUnavailable):
                await bob.invoke("text.echo", {"text": "c"}, timeout=5.0)
            proxy.restore()

            last: GatewayError | None = None
            for _ in range(20):  # bounded: the channel reconnects after its backoff
                try:
                    result = await bob.invoke("text.echo", {"text": "d"}, timeout=2.0)
                except (PeerUnavailable, DeadlineExceeded) as err:
                    last = err
                    await asyncio.sleep(0.5)
                    continue
                assert result.output() == {"text": "d"}
                break
            else:
                raise AssertionError(f"no call succeeded after restore: {last!r}")
