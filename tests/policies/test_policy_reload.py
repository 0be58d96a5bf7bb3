"""Policy files and their live reload, as an operator's tools really write them.

Each test fails on the code before its fix:

* a policy rewritten in place is reloaded only once it has stopped changing: a
  poll between two writes saw a valid grant without its ``max_risk`` line and
  let a write capability run that the whole file refuses;
* a policy path that is a FIFO, a device or a huge file is refused at once
  (``POLICY_INVALID``, the old policy kept, the agent serving): a FIFO blocked
  the reload, and with it the agent's event loop, forever;
* a relative policy path that is a symlink (a mounted ConfigMap folder, as
  docs/deploy.md advises) keeps following the link: resolved at load, the
  agent watched the old target, and an update that revoked a grant never took
  effect.
"""

from __future__ import annotations

import asyncio
import os
import threading
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import policies.store
from gateway.client.peer_client import PeerClient
from gateway.config import load_agent_config
from gateway.errors import GatewayError, RiskNotGranted, UnknownPeer
from gateway.local.toml_files import MAX_FILE_BYTES
from gateway.runtime.agent import Agent
from policies.policy_file import Policy
from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    future,
    spiffe,
    standard_registry,
    started,
)

HEAD = f"""version = 1

[[grants]]
peer = "{spiffe("bob")}"
capabilities = ["text.echo", "notes.write"]
max_payload_bytes = 4096
expires_at = "{future()}"
"""
RESTRICTION = 'max_risk = "read"\n'
"""The grant's last line: without it, bob may call notes.write (risk ``write``)."""


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, counter: WriteCounter) -> AsyncIterator[Agent]:
    """alice, not watching her policy file: each test drives reloads itself."""
    policy = tmp_path / "alice-policy.toml"
    policy.write_text(HEAD + RESTRICTION)
    config = agent_config(pki, tmp_path, "alice", policy)
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    yield agent
    await agent.stop()


async def _refusal(pki: Pki, agent: Agent, capability: str, payload: dict[str, str]) -> str:
    client = PeerClient(agent.config.id, agent.address, pki.material("bob"))
    try:
        await client.invoke(capability, payload, timeout=5.0)
    except GatewayError as err:
        return err.reason
    finally:
        await client.close()
    return "OK"


def _audit_file(agent: Agent) -> Path:
    db = agent.config.audit_db
    assert isinstance(db, Path)  # SQLite here
    return db


class _Polls:
    """Stands in for the watcher's ``asyncio.sleep``: each ``poll()`` lets one poll run."""

    def __init__(self) -> None:
        self._go: asyncio.Queue[None] = asyncio.Queue()
        self._waiting: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(self, _seconds: float) -> None:
        self._waiting.put_nowait(None)
        await self._go.get()

    async def started(self) -> None:
        await self._waiting.get()

    async def poll(self) -> None:
        """One interval passes; returns once that poll is done and the next one waits."""
        self._go.put_nowait(None)
        await asyncio.wait_for(self._waiting.get(), 5.0)


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> _Polls:
    """The policy watcher's sleeps, driven by the test (its reads still on a thread)."""
    driven = _Polls()
    monkeypatch.setattr(
        policies.store,
        "asyncio",
        types.SimpleNamespace(sleep=driven.sleep, to_thread=asyncio.to_thread),
    )
    return driven


async def test_a_policy_written_in_two_steps_is_not_loaded_half_written(
    pki: Pki, alice: Agent, counter: WriteCounter, polls: _Polls
) -> None:
    watcher = asyncio.ensure_future(alice.policies.watch())
    try:
        await polls.started()
        with alice.config.policy.open("w") as file:
            file.write(HEAD)  # in place: the grant, complete and valid ...
            file.flush()
            await polls.poll()  # ... a poll comes before the writer's next write
            assert await _refusal(pki, alice, "notes.write", {"note": "n"}) == "RISK_NOT_GRANTED"
            file.write(RESTRICTION.replace("read", "write"))
        await polls.poll()  # changed again since the last poll: not settled yet
        assert alice.policies.current.grants[spiffe("bob")].max_risk == "read"
        await polls.poll()  # unchanged for one interval: loaded
        assert alice.policies.current.grants[spiffe("bob")].max_risk == "write"
    finally:
        watcher.cancel()
    assert alice.policies.reloads_ok == 1
    assert counter.calls == 0
    [record] = [r for r in audit_rows(_audit_file(alice)) if r.capability == "notes.write"]
    assert (record.peer_id, record.reason) == (spiffe("bob"), RiskNotGranted.reason)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _device(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/null")  # reads as an empty file: a policy with no grants


def _huge(path: Path) -> None:
    with path.open("a") as file:
        file.truncate(MAX_FILE_BYTES + 1)  # sparse: costs no disk


@pytest.mark.parametrize(
    ("replace", "why"),
    [
        (_fifo, "policy file is not a regular file"),
        (_device, "policy file is not a regular file"),
        (_huge, f"policy file is larger than {MAX_FILE_BYTES} bytes"),
    ],
)
async def test_a_policy_that_is_no_plain_file_is_refused_and_the_agent_serves_on(
    pki: Pki, alice: Agent, replace: Callable[[Path], None], why: str
) -> None:
    path = alice.config.policy
    replace(path)
    try:
        error = await asyncio.wait_for(asyncio.to_thread(alice.policies.reload), 5.0)
    finally:
        if path.is_fifo():
            _release_reader(path)
    assert error is not None
    assert error.reason == "POLICY_INVALID"
    assert error.message == f"{path}: {why}"
    assert alice.policies.reloads_rejected == 1
    assert await _refusal(pki, alice, "text.echo", {"text": "a"}) == "OK"  # old policy
    assert await _refusal(pki, alice, "notes.write", {"note": "n"}) == "RISK_NOT_GRANTED"


def _release_reader(fifo: Path) -> None:
    """A reader blocked on ``fifo`` (the old code's reload) gets its end of file."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: nobody has it open for reading
        pass


async def test_a_policy_in_a_mounted_configmap_folder_follows_its_updates(
    pki: Pki, tmp_path: Path, counter: WriteCounter
) -> None:
    # kubelet's layout: file -> ..data/file, ..data -> ..<revision>; an update
    # writes a new revision, swaps ..data in one rename and removes the old one.
    folder = tmp_path / "policy"
    (folder / "..1").mkdir(parents=True)
    (folder / "..1" / "alice-policy.toml").write_text(HEAD)
    (folder / "..data").symlink_to("..1")
    (folder / "alice-policy.toml").symlink_to("..data/alice-policy.toml")
    config_file = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=Path("policy/alice-policy.toml"),  # relative, as docs/deploy.md writes it
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "alice-state",
    )
    config = load_agent_config(config_file)
    assert config.policy == folder / "alice-policy.toml"
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    try:
        assert await _refusal(pki, agent, "notes.write", {"note": "n"}) == "OK"
        (folder / "..2").mkdir()
        (folder / "..2" / "alice-policy.toml").write_text("version = 1\n")  # bob revoked
        (folder / "..data.new").symlink_to("..2")
        os.replace(folder / "..data.new", folder / "..data")
        (folder / "..1" / "alice-policy.toml").unlink()
        (folder / "..1").rmdir()
        assert agent.policies.reload() is None
        assert await _refusal(pki, agent, "notes.write", {"note": "n"}) == UnknownPeer.reason
    finally:
        await agent.stop()
    assert counter.calls == 1
    reasons = [r.reason for r in audit_rows(_audit_file(agent)) if r.capability == "notes.write"]
    assert reasons == ["ADMITTED", "OK", UnknownPeer.reason]


async def test_the_watcher_reads_a_changed_policy_off_the_event_loop(
    alice: Agent, polls: _Polls, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A policy of tens of thousands of grants takes seconds to read and check: on the
    # loop, every call of every peer waited for it. The real load, only observed here.
    loaded_on: list[int] = []
    real_load = policies.store.load_policy

    def observed_load(path: Path) -> Policy:
        loaded_on.append(threading.get_ident())
        return real_load(path)

    monkeypatch.setattr(policies.store, "load_policy", observed_load)
    watcher = asyncio.ensure_future(alice.policies.watch())
    try:
        await polls.started()
        alice.config.policy.write_text(HEAD + RESTRICTION.replace("read", "write"))
        await polls.poll()  # the change seen
        await polls.poll()  # settled: loaded
    finally:
        watcher.cancel()
    assert alice.policies.current.grants[spiffe("bob")].max_risk == "write"
    assert alice.policies.reloads_ok == 1
    assert len(loaded_on) == 1 and loaded_on[0] != threading.get_ident()
