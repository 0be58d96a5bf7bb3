"""Keys left in doubt: listed, resolved or released by an operator, audited, never a double write."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from gateway.audit import AuditRecord, query_records, verify_chain
from gateway.audit.checkpoint_verify import verify_checkpoints
from gateway.client.peer_client import PeerClient
from gateway.config import load_agent_config
from gateway.errors import ConfigError, IdempotencyInDoubt, IdempotencyNotInDoubt
from gateway.inbound.idempotency.operator import KeyEntry
from gateway.inbound.idempotency.sqlite import SqliteIdempotencyStore, SqliteKeyAdmin
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader
from gateway.storage.factory import audit_target
from tests.helpers.agent_process import AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, write_policy
from tests.helpers.cli import CliResult, run_cli, run_cli_async
from tests.helpers.crash_window import appended_lines

BOB = spiffe("bob")
PUT = b'{"key":"k","value":"v"}'
PUT_SHA = hashlib.sha256(PUT).hexdigest()


def list_keys(store: Path, *, in_doubt_only: bool = False) -> list[KeyEntry]:
    """The keys in ``store``, as the operator lists them."""
    return SqliteKeyAdmin(store, audit_target(store), "").keys(in_doubt_only=in_doubt_only)


def _cli(*args: str) -> CliResult:
    return run_cli("idempotency", *args)


async def _cli_async(*args: str) -> CliResult:
    return await run_cli_async("idempotency", *args)


def _resolve(config: Path, capability: str, key: str, *how: str) -> CliResult:
    return _cli(
        "resolve", "--config", str(config), "--peer", BOB, "--capability", capability,
        "--key", key, *how,
    )  # fmt: skip


async def _resolve_async(config: Path, capability: str, key: str, *how: str) -> CliResult:
    return await asyncio.to_thread(_resolve, config, capability, key, *how)


def _alice_toml(pki: Pki, tmp_path: Path, modules: tuple[str, ...]) -> Path:
    policy = write_policy(
        tmp_path / "alice-policy.toml", [grant("bob", ["notes.append", "kv.put", "kv.get"])]
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


def _operator_records(db: Path) -> list[AuditRecord]:
    return [
        r for r in query_records(open_audit_reader(db)) if r.reason.startswith("IDEMPOTENCY_RE")
    ]


@pytest.mark.slow
async def test_keys_cut_off_by_a_crash_are_resolved_and_released_exactly_once(
    pki: Pki, tmp_path: Path
) -> None:
    toml = _alice_toml(pki, tmp_path, ("capabilities.builtin", "tests.helpers.crash_window"))
    config = load_agent_config(toml)
    state = config.state_dir
    agent = AgentProcess(toml)
    client: PeerClient | None = None
    try:
        client = PeerClient(config.id, agent.start(), pki.material("bob"))
        calls = [
            asyncio.create_task(
                client.invoke("notes.append", {"note": n}, idempotency_key=f"k-{n}", timeout=30)
            )
            for n in ("n1", "n2")
        ]
        for _ in range(200):  # until both side effects are durable (bounded: 10 s)
            if len(appended_lines(state)) == 2:
                break
            await asyncio.sleep(0.05)
        assert sorted(appended_lines(state)) == ["n1", "n2"]
        agent.kill()  # after both writes, before their answers
        for call in calls:
            with pytest.raises(Exception):  # noqa: B017 - any cut-off error will do
                await call
        await client.close()

        agent = AgentProcess(toml)  # the restart marks both claims in doubt
        client = PeerClient(config.id, agent.start(), pki.material("bob"))
        listed = await _cli_async("list", "--config", str(toml), "--in-doubt", "--json")
        assert listed.returncode == 0, listed.stderr
        entries = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(e["key"], e["state"], e["peer"], e["capability"]) for e in entries] == [
            ("k-n1", "in_doubt", BOB, "notes.append"),
            ("k-n2", "in_doubt", BOB, "notes.append"),
        ]
        assert {e["served_version"] for e in entries} == {"1.0.0"}
        for note in ("n1", "n2"):
            with pytest.raises(IdempotencyInDoubt):
                await client.invoke("notes.append", {"note": note}, idempotency_key=f"k-{note}")

        # n1: the operator saw the note in appends.log once: mark done with that outcome.
        done = await _resolve_async(
            toml, "notes.append", "k-n1", "--done", "--output-json", '{"appended": 1}',
            "--reason", "appends.log holds n1 once",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"resolved: key 'k-n1' of {BOB} for notes.append")
        again = await client.invoke("notes.append", {"note": "n1"}, idempotency_key="k-n1")
        assert again.remembered and again.output() == {"appended": 1}
        assert again.served_version == "1.0.0"

        # n2: pretend the operator found the write had not landed: release, retry runs once.
        released = await _resolve_async(
            toml, "notes.append", "k-n2", "--release", "--reason", "rolled back"
        )
        assert released.returncode == 0, released.stderr
        assert "freed; the next call with this key runs the write again" in released.stdout
        ran = await client.invoke("notes.append", {"note": "n2"}, idempotency_key="k-n2")
        assert not ran.remembered
        again = await client.invoke("notes.append", {"note": "n2"}, idempotency_key="k-n2")
        assert again.remembered and again.output() == ran.output()

        lines = appended_lines(state)
        assert lines.count("n1") == 1, "the resolved write ran again"
        assert lines.count("n2") == 2, "the released write must run exactly once more"
        again_done = await _resolve_async(
            toml, "notes.append", "k-n1", "--done", "--output-json", "{}", "--reason", "twice"
        )
        assert again_done.returncode == 1
        assert "refused: IDEMPOTENCY_NOT_IN_DOUBT" in again_done.stderr
        assert "already done" in again_done.stderr
        assert (
            await _cli_async("list", "--config", str(toml), "--in-doubt")
        ).stdout.strip() == "no keys in doubt"
        await client.close()
        client = None
        assert agent.terminate() == 0, agent.errors()
    finally:
        agent.ensure_stopped()
        if client is not None:
            await client.close()

    records = _operator_records(config.audit_db)
    output = b'{"appended":1}'
    assert [(r.reason, r.peer_id, r.capability, r.decision) for r in records] == [
        ("IDEMPOTENCY_RESOLVED", BOB, "notes.append", "allow"),
        ("IDEMPOTENCY_RELEASED", BOB, "notes.append", "allow"),
    ]
    assert (records[0].payload_size, records[0].payload_sha256) == (
        len(output),
        hashlib.sha256(output).hexdigest(),
    )
    assert records[0].detail == "key 'k-n1'; operator: appends.log holds n1 once"
    assert (records[1].payload_size, records[1].detail) == (0, "key 'k-n2'; operator: rolled back")
    assert "appended" not in records[0].detail
    # The CLI appended to the log of a running agent: one chain, and the checkpoints hold.
    assert verify_chain(open_audit_reader(config.audit_db)).ok
    report = verify_checkpoints(
        open_audit_reader(config.audit_db), config.checkpoint_file, config.tls.cert.read_bytes()
    )
    assert report.ok and report.valid == 1  # the killed run wrote none; the stop wrote one


@pytest.fixture
async def running(pki: Pki, tmp_path: Path) -> tuple[Agent, Path]:
    """alice with the built-ins from her config file; ``kv.put`` is the write under test."""
    toml = _alice_toml(pki, tmp_path, ("capabilities.builtin",))
    agent = Agent(load_agent_config(toml))
    await agent.start(watch_policy=False)
    return agent, toml


async def _in_doubt(agent: Agent, key: str) -> None:
    """A kv.put key in doubt made through the store API, as a cut-off attempt leaves it."""
    ident = (BOB, "kv.put", key)
    assert await agent.idempotency.claim(ident, PUT_SHA, "1.0.0") is None
    agent.idempotency.leave_in_doubt(ident)
    for _ in range(200):  # the mark is written in the background (bounded: 10 s)
        if any(e.key == key for e in list_keys(agent.config.idempotency_store, in_doubt_only=True)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the key was never marked in doubt")


async def _revision(client: PeerClient) -> int:
    """How many times kv.put really ran for key k (its revision; 0: never)."""
    stored = (await client.invoke("kv.get", {"key": "k"})).output()
    return int(stored["revision"]) if stored["found"] else 0


@pytest.mark.parametrize("how", ["done", "release"])
async def test_resolving_while_the_agent_runs_keeps_exactly_once(
    pki: Pki, running: tuple[Agent, Path], how: str
) -> None:
    agent, toml = running
    client = PeerClient(agent.config.id, agent.address, pki.material("bob"))
    try:
        await _in_doubt(agent, "k1")
        with pytest.raises(IdempotencyInDoubt):
            await client.invoke("kv.put", PUT, idempotency_key="k1")
        args = (
            ["--done", "--output-json", '{"key": "k", "revision": 41}']
            if how == "done"
            else ["--release"]
        )
        result = await asyncio.to_thread(
            _resolve, toml, "kv.put", "k1", *args, "--reason", "checked the kv table"
        )
        assert result.returncode == 0, result.stderr
        first = await client.invoke("kv.put", PUT, idempotency_key="k1")
        second = await client.invoke("kv.put", PUT, idempotency_key="k1")
        if how == "done":
            assert first.remembered and first.output() == {"key": "k", "revision": 41}
            assert await _revision(client) == 0  # the write never ran
        else:
            assert not first.remembered and first.output() == {"key": "k", "revision": 1}
            assert await _revision(client) == 1  # it ran exactly once more
        assert second.remembered and second.output() == first.output()
        assert first.served_version == "1.0.0"
        await agent.audit.flush()
        assert verify_chain(open_audit_reader(agent.config.audit_db)).ok
    finally:
        await client.close()
        await agent.stop()
    reasons = [r.reason for r in _operator_records(agent.config.audit_db)]
    assert reasons == ["IDEMPOTENCY_RESOLVED" if how == "done" else "IDEMPOTENCY_RELEASED"]


async def test_keys_not_in_doubt_are_never_changed(pki: Pki, running: tuple[Agent, Path]) -> None:
    agent, toml = running
    config = agent.config
    store, audit_db = config.idempotency_store, config.audit_db
    client = PeerClient(config.id, agent.address, pki.material("bob"))
    try:
        await client.invoke("kv.put", PUT, idempotency_key="finished")
        running_claim = (BOB, "kv.put", "running")
        assert await agent.idempotency.claim(running_claim, PUT_SHA, "1.0.0") is None
        before = [(e.key, e.state) for e in list_keys(store)]
        await agent.audit.flush()
        records_before = len(query_records(open_audit_reader(audit_db)))
        cases = [
            ("finished", "already done"),
            ("running", "claimed by an attempt that may still be running"),
            ("unknown", "no such key"),
        ]
        for key, why in cases:
            for act in (
                lambda k: SqliteKeyAdmin(store, audit_target(audit_db), "").resolve_done(
                    (BOB, "kv.put", k), {"key": "k"}, "r"
                ),
                lambda k: SqliteKeyAdmin(store, audit_target(audit_db), "").release(
                    (BOB, "kv.put", k), "r"
                ),
            ):
                with pytest.raises(IdempotencyNotInDoubt, match=why):
                    act(key)
            cli = await _resolve_async(toml, "kv.put", key, "--release", "--reason", "r")
            assert (cli.returncode, cli.stdout) == (1, "")
            assert (
                cli.stderr.startswith("refused: IDEMPOTENCY_NOT_IN_DOUBT: ") and why in cli.stderr
            )
        assert [(e.key, e.state) for e in list_keys(store)] == before
        await agent.audit.flush()
        assert (
            len(query_records(open_audit_reader(audit_db))) == records_before
        )  # refusals change nothing
        again = await client.invoke("kv.put", PUT, idempotency_key="finished")
        assert again.remembered
        assert await _revision(client) == 1
    finally:
        await client.close()
        await agent.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--done", "--reason", "r"], "--done needs --output-json"),
        (["--done", "--output-json", "[1]", "--reason", "r"], "must be a JSON object"),
        (["--done", "--output-json", '"x"', "--reason", "r"], "must be a JSON object"),
        (["--done", "--output-json", "{nope", "--reason", "r"], "--output-json is not JSON"),
        (
            ["--done", "--output-json", '{"key": "k", "revision": 1}', "--reason", "  "],
            "a --reason is required",
        ),
        (["--release", "--output-json", "{}", "--reason", "r"], "goes with --done"),
        (
            ["--done", "--output-json", '{"revision": 1}', "--reason", "r"],
            "does not match the output contract of kv.put@1.0.0: key: missing",
        ),
        (
            ["--done", "--output-json", '{"key": "k", "revision": 0}', "--reason", "r"],
            "revision: greater_than_equal",
        ),
        (
            ["--done", "--output-json", '{"key": "k", "revision": 1, "x": 2}', "--reason", "r"],
            "x: extra_forbidden",
        ),
    ],
)
async def test_bad_operator_input_changes_nothing(
    running: tuple[Agent, Path], args: list[str], message: str
) -> None:
    agent, toml = running
    try:
        await _in_doubt(agent, "k1")
        result = await asyncio.to_thread(_resolve, toml, "kv.put", "k1", *args)
        assert result.returncode == 2
        assert result.stderr.startswith("error: ") and message in result.stderr
        assert [e.state for e in list_keys(agent.config.idempotency_store)] == ["in_doubt"]
        assert _operator_records(agent.config.audit_db) == []
    finally:
        await agent.stop()


def test_resolve_needs_exactly_one_action(pki: Pki, tmp_path: Path) -> None:
    toml = _alice_toml(pki, tmp_path, ("capabilities.builtin",))
    for how in ([], ["--done", "--release"]):
        result = _resolve(toml, "kv.put", "k", *how, "--reason", "r")
        assert result.returncode == 2 and "usage:" in result.stderr


def test_list_shows_every_state_and_json_is_exact(pki: Pki, tmp_path: Path) -> None:
    toml = _alice_toml(pki, tmp_path, ("capabilities.builtin",))
    config = load_agent_config(toml)
    config.state_dir.mkdir(parents=True)
    store = SqliteIdempotencyStore(config.idempotency_store)
    store.close()
    with closing(sqlite3.connect(config.idempotency_store)) as db, db:
        for key, state in (("a", "done"), ("b\nfake row", "in_doubt"), ("c", "claimed")):
            db.execute(
                "INSERT INTO idempotency (peer, capability, key, request_sha256, state, "
                "updated_unix_ms, payload) VALUES (?, 'kv.put', ?, ?, ?, ?, ?)",
                (BOB, key, PUT_SHA, state, 1_700_000_000_000, b"{}" if state == "done" else None),
            )
    table = _cli("list", "--config", str(toml))
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert len(rows) == 4  # header + 3: a newline in a key cannot fake a row
    assert [row.split()[0] for row in rows[1:]] == ["done", "in_doubt", "claimed"]
    assert "'b\\nfake row'" in rows[2]
    doubt = _cli("list", "--config", str(toml), "--in-doubt", "--json")
    assert [json.loads(line)["key"] for line in doubt.stdout.splitlines()] == ["b\nfake row"]


async def test_retention_purges_completed_keys_only(pki: Pki, tmp_path: Path) -> None:
    toml = _alice_toml(pki, tmp_path, ("capabilities.builtin",))
    toml.write_text('idempotency_retention = "2h"\n' + toml.read_text())
    config = load_agent_config(toml)
    config.state_dir.mkdir(parents=True)
    SqliteIdempotencyStore(config.idempotency_store).close()
    now = int(time.time() * 1000)
    old, fresh = now - 3 * 3600 * 1000, now - 3600 * 1000
    with closing(sqlite3.connect(config.idempotency_store)) as db, db:
        for key, state, when in (
            ("old-done", "done", old),
            ("fresh-done", "done", fresh),
            ("old-doubt", "in_doubt", old),
            ("old-claim", "claimed", old),
        ):
            db.execute(
                "INSERT INTO idempotency (peer, capability, key, request_sha256, state, "
                "updated_unix_ms) VALUES (?, 'kv.put', ?, ?, ?, ?)",
                (BOB, key, PUT_SHA, state, when),
            )
    agent = Agent(config)
    await agent.start(watch_policy=False)  # purges at start
    try:
        kept = {(e.key, e.state) for e in list_keys(config.idempotency_store)}
    finally:
        await agent.stop()
    # The claim of a process that is gone became in doubt at start; nothing in doubt is purged.
    assert kept == {("fresh-done", "done"), ("old-doubt", "in_doubt"), ("old-claim", "in_doubt")}


@pytest.mark.parametrize("value", ['"0d"', '"7"', '"1w"', '"-1h"', "0", '"abc"'])
def test_retention_must_be_a_positive_span(pki: Pki, tmp_path: Path, value: str) -> None:
    toml = _alice_toml(pki, tmp_path, ("capabilities.builtin",))
    assert load_agent_config(toml).idempotency_retention.days == 7
    toml.write_text(f"idempotency_retention = {value}\n" + toml.read_text())
    with pytest.raises(ConfigError, match="idempotency_retention"):
        load_agent_config(toml)


@pytest.mark.parametrize("forged", ["k count=999999 x", "count=999999", "count=7 window_ms=1"])
async def test_a_key_that_looks_like_a_count_is_one_call_in_the_summary(
    running: tuple[Agent, Path], forged: str
) -> None:
    """The summary's counts come from limit refusals only, never from text in a detail."""
    agent, toml = running
    try:
        await _in_doubt(agent, forged)
        done = await asyncio.to_thread(
            _resolve, toml, "kv.put", forged, "--done",
            "--output-json", '{"key": "k", "revision": 1}', "--reason", "count=5",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    finally:
        await agent.stop()
    [record] = _operator_records(agent.config.audit_db)
    assert "count=999999" in record.detail or "count=7" in record.detail
    summary = await run_cli_async(
        "audit", "--db", str(agent.config.audit_db), "--summary", "--json"
    )
    assert summary.returncode == 0, summary.stderr
    rows = [json.loads(line) for line in summary.stdout.splitlines()]
    assert [(r["reason"], r["calls"], r["records"]) for r in rows] == [
        ("IDEMPOTENCY_RESOLVED", 1, 1)
    ]
