"""An agent killed with SIGKILL under load: after a restart nothing a caller was told is lost.

The agent runs as ``python -m gateway.cli.main serve``. Callers in this process
drive a bounded mix of allowed calls, refusals (CAPABILITY_NOT_GRANTED,
UNKNOWN_PEER) and idempotent ``kv.put`` writes; the agent is killed mid-load and
restarted from the same config. What must hold afterwards:

- the audit hash chain verifies;
- every refusal a caller received is in the log, same request id, same reason
  (refusals are committed before they are answered);
- every acknowledged ``kv.put`` replays its first answer and its key's revision
  did not move (the write happened exactly once);
- the restarted agent serves.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.audit import query_records, verify_chain
from gateway.client.peer_client import InvokeResult, PeerClient
from gateway.errors import GatewayError, IdempotencyInDoubt
from gateway.storage import open_audit_reader
from tests.helpers.agent_process import AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, write_policy
from tests.helpers.crash_window import appended_lines

WORKERS = 16
KILL_AFTER = 160  # completed calls before the kill; the load is still running then
LOAD_BOUND_SECONDS = 30.0  # a safety net only: the kill normally comes within ~2 s
CALL_TIMEOUT = 5.0
KINDS = ("echo", "put", "not_granted", "unknown_peer")
EXPECTED = {
    "echo": "OK",
    "put": "OK",
    "not_granted": "CAPABILITY_NOT_GRANTED",
    "unknown_peer": "UNKNOWN_PEER",
}
# What a call cut off by the kill may end with (on the caller's side).
CUT_OFF = {"PEER_UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED"}


@dataclass(frozen=True)
class Outcome:
    """What one caller was told."""

    kind: str
    request_id: str
    reason: str  # "OK" or the refusal's reason code
    after_kill: bool
    key: str = ""
    value: str = ""
    answer: InvokeResult | None = None


@dataclass
class Load:
    clients: dict[str, PeerClient]
    outcomes: list[Outcome]
    killed: bool = False
    stop: asyncio.Event | None = None


async def _one_call(load: Load, worker: int, i: int) -> Outcome:
    kind = KINDS[(worker + i) % len(KINDS)]
    request_id = f"w{worker:02d}-{i:04d}"
    key = value = ""
    if kind == "echo":
        call = load.clients["bob"].invoke(
            "text.echo", {"text": request_id}, request_id=request_id, timeout=CALL_TIMEOUT
        )
    elif kind == "put":
        key, value = f"k-{request_id}", f"v-{request_id}"
        call = load.clients["bob"].invoke(
            "kv.put",
            {"key": key, "value": value},
            request_id=request_id,
            idempotency_key=f"idem-{request_id}",
            timeout=CALL_TIMEOUT,
        )
    elif kind == "not_granted":
        call = load.clients["carol"].invoke(
            "kv.get", {"key": "k"}, request_id=request_id, timeout=CALL_TIMEOUT
        )
    else:
        call = load.clients["mallory"].invoke(
            "text.echo", {"text": "x"}, request_id=request_id, timeout=CALL_TIMEOUT
        )
    try:
        answer = await call
    except GatewayError as err:
        return Outcome(kind, request_id, err.reason, load.killed, key, value)
    return Outcome(kind, request_id, "OK", load.killed, key, value, answer)


async def _worker(load: Load, worker: int) -> None:
    assert load.stop is not None
    for i in range(10_000):  # bounded; the stop event ends it long before
        if load.stop.is_set():
            return
        load.outcomes.append(await _one_call(load, worker, i))


async def _run_load_and_kill(load: Load, agent: AgentProcess) -> None:
    load.stop = asyncio.Event()
    workers = [asyncio.create_task(_worker(load, n)) for n in range(WORKERS)]
    try:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + LOAD_BOUND_SECONDS
        while len(load.outcomes) < KILL_AFTER and loop.time() < give_up:
            if any(task.done() for task in workers):
                break  # a worker crashed: stop and let gather report it
            await asyncio.sleep(0.02)
        assert len(load.outcomes) >= KILL_AFTER, f"load stalled: {_tally(load.outcomes)}"
        agent.kill()
        load.killed = True
    finally:
        load.stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), CALL_TIMEOUT * 4)


def _tally(outcomes: list[Outcome]) -> dict[str, int]:
    tally: dict[str, int] = {}
    for o in outcomes:
        tally[f"{o.kind}:{o.reason}"] = tally.get(f"{o.kind}:{o.reason}", 0) + 1
    return tally


def _write_alice(pki: Pki, tmp_path: Path, modules: tuple[str, ...]) -> Path:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            grant("bob", ["text.echo", "kv.put", "kv.get", "notes.append"]),
            grant("carol", ["text.echo"]),
        ],
    )
    return write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "alice-state",
        modules=modules,
    )


def _clients(pki: Pki, address: str) -> dict[str, PeerClient]:
    return {
        name: PeerClient(spiffe("alice"), address, pki.material(name))
        for name in ("bob", "carol", "mallory")
    }


async def _close(clients: dict[str, PeerClient]) -> None:
    for client in clients.values():
        await client.close()


def _integrity(db: Path) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _stored_keys(db: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {row[0] for row in conn.execute("SELECT key FROM idempotency")}
    finally:
        conn.close()


async def test_sigkill_under_load_loses_nothing_callers_were_told(pki: Pki, tmp_path: Path) -> None:
    config = _write_alice(pki, tmp_path, ("capabilities.builtin",))
    db = tmp_path / "alice-audit.sqlite"
    agent = AgentProcess(config)
    load = Load(clients={}, outcomes=[])
    try:
        load.clients = _clients(pki, agent.start())
        await _run_load_and_kill(load, agent)
        await _close(load.clients)

        # Before the kill every call got exactly its expected answer; cut-off calls
        # failed as transport failures, never as INTERNAL or another refusal.
        for o in load.outcomes:
            allowed = {EXPECTED[o.kind]} | (CUT_OFF if o.after_kill else set())
            assert o.reason in allowed, (o, _tally(load.outcomes))
        refusals = [
            o for o in load.outcomes if o.reason in ("CAPABILITY_NOT_GRANTED", "UNKNOWN_PEER")
        ]
        acked_puts = [o for o in load.outcomes if o.kind == "put" and o.reason == "OK"]
        assert refusals and acked_puts, _tally(load.outcomes)

        agent = AgentProcess(config)
        load.clients = _clients(pki, agent.start())

        report = verify_chain(open_audit_reader(db))
        assert report.ok, report.problems
        logged = {r.request_id: r for r in query_records(open_audit_reader(db))}
        for o in refusals:
            record = logged.get(o.request_id)
            assert record is not None, f"refusal {o.request_id} ({o.reason}) is not in the log"
            assert (record.decision, record.reason) == ("refuse", o.reason), record

        state = tmp_path / "alice-state"
        assert _integrity(state / "idempotency.sqlite") == "ok"
        assert _integrity(state / "kv.sqlite") == "ok"
        assert {f"idem-{o.request_id}" for o in acked_puts} <= _stored_keys(
            state / "idempotency.sqlite"
        )

        bob = load.clients["bob"]
        for o in acked_puts:
            assert o.answer is not None
            again = await bob.invoke(
                "kv.put",
                {"key": o.key, "value": o.value},
                idempotency_key=f"idem-{o.request_id}",
                timeout=CALL_TIMEOUT,
            )
            assert again.remembered, o.request_id
            assert (again.payload, again.evidence_sha256, again.served_version) == (
                o.answer.payload,
                o.answer.evidence_sha256,
                o.answer.served_version,
            )
            assert json.loads(o.answer.payload)["revision"] == 1
            stored = await bob.invoke("kv.get", {"key": o.key}, timeout=CALL_TIMEOUT)
            assert stored.output() == {"key": o.key, "found": True, "value": o.value, "revision": 1}

        echoed = await bob.invoke("text.echo", {"text": "after restart"}, timeout=CALL_TIMEOUT)
        assert echoed.output() == {"text": "after restart"}
        await _close(load.clients)
        assert agent.terminate() == 0, agent.errors()
        final = verify_chain(open_audit_reader(db))
        assert final.ok and final.records > report.records, final
    finally:
        agent.ensure_stopped()
        await _close(load.clients)


async def test_write_cut_off_by_a_crash_is_not_run_again_on_retry(pki: Pki, tmp_path: Path) -> None:
    config = _write_alice(pki, tmp_path, ("capabilities.builtin", "tests.helpers.crash_window"))
    state = tmp_path / "alice-state"
    agent = AgentProcess(config)
    clients: dict[str, PeerClient] = {}
    try:
        clients = _clients(pki, agent.start())
        first = asyncio.create_task(
            clients["bob"].invoke(
                "notes.append", {"note": "n1"}, idempotency_key="idem-n1", timeout=30.0
            )
        )
        for _ in range(200):  # until the side effect is durable (bounded: 10 s)
            if appended_lines(state) or first.done():
                break
            await asyncio.sleep(0.05)
        assert appended_lines(state) == ["n1"]
        agent.kill()  # after the write, before its answer and its idempotency record
        with pytest.raises(GatewayError):
            await first
        await _close(clients)

        agent = AgentProcess(config)
        clients = _clients(pki, agent.start())
        with pytest.raises(IdempotencyInDoubt):  # unknown outcome: refused, never run twice
            await clients["bob"].invoke(
                "notes.append", {"note": "n1"}, idempotency_key="idem-n1", timeout=10.0
            )
        assert appended_lines(state) == ["n1"], "the write ran twice for one idempotency key"
    finally:
        agent.ensure_stopped()
        await _close(clients)
