"""Certificates rewritten under a running agent: new handshakes, in-flight calls, rejections."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.client.peer_client import PeerClient
from gateway.devtools.pki import init_ca, issue
from gateway.errors import ConfigError, GatewayError
from gateway.runtime.agent import Agent
from tests.agent_process import REPO
from tests.rotation.rotation_support import (
    RecordingTlsServer,
    file_serial,
    own_pki,
    served_serial,
    wildcard_pair,
)
from tests.support import (
    Pki,
    Probe,
    WriteCounter,
    agent_config,
    grant,
    mesh_registry,
    spiffe,
    write_policy,
)


async def serve_alice(
    pki: Pki, base: Path, probe: Probe | None = None, peers: list[tuple[str, str]] | None = None
) -> Agent:
    policy = write_policy(base / "alice-policy.toml", [grant("bob", ["slow.wait", "text.echo"])])
    config = agent_config(pki, base, "alice", policy, peers)
    agent = Agent(config, mesh_registry(WriteCounter(), base / "alice-state", probe))
    await agent.start(watch_policy=False)
    return agent


def seen(pki: Pki, agent: Agent) -> int:
    return served_serial(pki, agent.address, agent.config.id)


async def test_new_handshakes_get_the_new_certificate_and_held_calls_finish(
    tmp_path: Path,
) -> None:
    pki = own_pki(tmp_path)
    probe = Probe()
    alice = await serve_alice(pki, tmp_path, probe)
    cert = pki.dir / "alice.pem"
    try:
        old = file_serial(cert)
        assert await asyncio.to_thread(seen, pki, alice) == old
        async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as bob:
            held = asyncio.create_task(bob.invoke("slow.wait", {}))
            await asyncio.wait_for(probe.started.wait(), 10)
            issue(pki.dir, "alice", overwrite=True)
            alice.reload()  # what SIGHUP does
            new = file_serial(cert)
            assert new != old
            assert await asyncio.to_thread(seen, pki, alice) == new
            probe.release.set()
            assert (await held).output() == {"done": True}  # the call in flight finished
        async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as fresh:
            assert (await fresh.invoke("text.echo", {"text": "x"})).output() == {"text": "x"}
        stats = alice.tls_stats()
        assert (stats.reloads_ok, stats.reloads_rejected, stats.serial) == (1, 0, new)
    finally:
        probe.release.set()
        await alice.stop()


def _wrong_spiffe_id(pki: Pki, tmp_path: Path) -> tuple[bytes, bytes]:
    return (pki.dir / "bob.pem").read_bytes(), (pki.dir / "bob.key").read_bytes()


def _key_of_another_certificate(pki: Pki, tmp_path: Path) -> tuple[bytes, bytes]:
    cert, _ = pki.ca.mint(uris=[spiffe("alice")])
    return cert, (pki.dir / "alice.key").read_bytes()


def _unparsable(pki: Pki, tmp_path: Path) -> tuple[bytes, bytes]:
    return b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n", (
        pki.dir / "alice.key"
    ).read_bytes()


def _expired(pki: Pki, tmp_path: Path) -> tuple[bytes, bytes]:
    now = datetime.now(UTC)
    return pki.ca.mint(
        uris=[spiffe("alice")],
        not_before=now - timedelta(days=2),
        not_after=now - timedelta(days=1),
    )


def _wildcard(pki: Pki, tmp_path: Path) -> tuple[bytes, bytes]:
    return wildcard_pair(pki.ca, "alice")


def _another_ca(pki: Pki, tmp_path: Path) -> tuple[bytes, bytes]:
    other = tmp_path / "other-ca"
    init_ca(other, "example.org")
    issue(other, "alice")
    return (other / "alice.pem").read_bytes(), (other / "alice.key").read_bytes()


def _foreign_leaf_then_the_real_ca(pki: Pki, tmp_path: Path) -> tuple[bytes, bytes]:
    cert, key = _another_ca(pki, tmp_path)
    return cert + (pki.dir / "ca.pem").read_bytes(), key


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (_foreign_leaf_then_the_real_ca, "not issued by the configured CA"),
        (_wrong_spiffe_id, "does not match its certificate"),
        (_key_of_another_certificate, "private key does not belong"),
        (_unparsable, "cannot be parsed|SPIFFE|certificate"),
        (_expired, "expired"),
        (_wildcard, "wildcard"),
        (_another_ca, "not issued by the configured CA"),
    ],
)
async def test_a_bad_new_certificate_is_rejected_and_the_old_one_stays(
    tmp_path: Path, make: object, why: str
) -> None:
    pki = own_pki(tmp_path)
    alice = await serve_alice(pki, tmp_path)
    try:
        old = file_serial(pki.dir / "alice.pem")
        cert, key = make(pki, tmp_path)  # type: ignore[operator]
        (pki.dir / "alice.key").write_bytes(key)
        (pki.dir / "alice.pem").write_bytes(cert)
        error = alice.live_tls.reload()
        assert isinstance(error, ConfigError)
        assert error.message and __import__("re").search(why, error.message)
        assert b"PRIVATE KEY" not in error.message.encode()
        assert await asyncio.to_thread(seen, pki, alice) == old
        stats = alice.tls_stats()
        assert (stats.reloads_ok, stats.reloads_rejected, stats.serial) == (0, 1, old)
        async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as bob:
            assert (await bob.invoke("text.echo", {"text": "x"})).output() == {"text": "x"}
    finally:
        await alice.stop()


async def test_a_foreign_leaf_before_the_real_ca_is_refused_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The CA appended to the file is issued by itself; the leaf in front of it is not."""
    pki = own_pki(tmp_path)
    alice = await serve_alice(pki, tmp_path)
    try:
        old = file_serial(pki.dir / "alice.pem")
        cert, key = _foreign_leaf_then_the_real_ca(pki, tmp_path)
        (pki.dir / "alice.key").write_bytes(key)
        (pki.dir / "alice.pem").write_bytes(cert)
        with caplog.at_level("ERROR", logger="gateway.transport.live_tls"):
            assert alice.live_tls.reload_if_changed() is not None
        [line] = [r.getMessage() for r in caplog.records if r.name == "gateway.transport.live_tls"]
        assert line.startswith(f"certificate reload rejected, keeping serial {old:x}: ")
        assert "not issued by the configured CA" in line
        assert await asyncio.to_thread(seen, pki, alice) == old
        assert alice.tls_stats().reloads_rejected == 1
    finally:
        await alice.stop()


async def test_a_key_without_its_certificate_waits_for_the_pair(tmp_path: Path) -> None:
    pki = own_pki(tmp_path)
    alice = await serve_alice(pki, tmp_path)
    staged = tmp_path / "staged"
    staged.mkdir()
    shutil.copy(pki.dir / "ca.pem", staged / "ca.pem")
    shutil.copy(pki.dir / "ca.key", staged / "ca.key")
    try:
        old = file_serial(pki.dir / "alice.pem")
        issue(staged, "alice")
        shutil.copy(staged / "alice.key", pki.dir / "alice.key")  # key first, as pki issue does
        assert isinstance(alice.live_tls.reload_if_changed(), ConfigError)
        assert await asyncio.to_thread(seen, pki, alice) == old
        shutil.copy(staged / "alice.pem", pki.dir / "alice.pem")
        assert alice.live_tls.reload_if_changed() is None
        assert alice.live_tls.reload_if_changed() is None  # unchanged: nothing to do
        new = file_serial(pki.dir / "alice.pem")
        assert await asyncio.to_thread(seen, pki, alice) == new
        stats = alice.tls_stats()
        assert (stats.reloads_ok, stats.reloads_rejected) == (1, 1)
    finally:
        await alice.stop()


async def test_outbound_channels_present_the_new_client_certificate(tmp_path: Path) -> None:
    pki = own_pki(tmp_path)
    receiver = RecordingTlsServer(pki, "bob")
    alice = await serve_alice(pki, tmp_path, peers=[(spiffe("bob"), receiver.address)])
    try:
        old = file_serial(pki.dir / "alice.pem")
        with pytest.raises(GatewayError):
            await alice.client(spiffe("bob")).invoke("text.echo", {"text": "x"}, timeout=3)
        assert set(receiver.serials) == {old}
        issue(pki.dir, "alice", overwrite=True)
        alice.reload()
        # A second listener: only the new client's connections reach it (the first may
        # still be finishing handshakes the old client began).
        after = RecordingTlsServer(pki, "bob")
        try:
            with pytest.raises(GatewayError):
                await alice.client(spiffe("bob"), after.address).invoke(
                    "text.echo", {"text": "x"}, timeout=3
                )
            assert set(after.serials) == {file_serial(pki.dir / "alice.pem")} != {old}
        finally:
            after.close()
    finally:
        await alice.stop()
        receiver.close()


async def test_a_rotated_agent_still_calls_a_real_peer(tmp_path: Path) -> None:
    pki = own_pki(tmp_path)
    bob_policy = write_policy(tmp_path / "bob-policy.toml", [grant("alice", ["text.echo"])])
    bob = Agent(agent_config(pki, tmp_path, "bob", bob_policy))
    await bob.start(watch_policy=False)
    alice = await serve_alice(pki, tmp_path, peers=[(bob.config.id, bob.address)])
    try:
        first = await alice.client(bob.config.id).invoke("text.echo", {"text": "a"})
        issue(pki.dir, "alice", overwrite=True)
        alice.reload()
        second = await alice.client(bob.config.id).invoke("text.echo", {"text": "b"})
        assert (first.output(), second.output()) == ({"text": "a"}, {"text": "b"})
    finally:
        await alice.stop()
        await bob.stop()


async def test_expiry_within_the_window_is_warned_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = own_pki(tmp_path)
    issue(pki.dir, "alice", overwrite=True, valid_for=timedelta(days=3))
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "alice", policy)
    config = config.model_copy(
        update={"tls": config.tls.model_copy(update={"expiry_warning": timedelta(days=7)})}
    )
    alice = Agent(config)
    with caplog.at_level("WARNING", logger="gateway.transport.live_tls"):
        await alice.start(watch_policy=False)
    try:
        stats = alice.tls_stats()
        assert (stats.expiring_soon, stats.expiry_warnings) == (True, 1)
        assert [r.message for r in caplog.records if "expires at" in r.message]
        assert all("PRIVATE" not in r.getMessage() for r in caplog.records)
        issue(pki.dir, "alice", overwrite=True, valid_for=timedelta(days=30))
        alice.reload()
        assert alice.tls_stats().expiring_soon is False
        assert alice.tls_stats().expiry_warnings == 1
    finally:
        await alice.stop()


async def test_checkpoints_are_signed_with_the_rotated_key(tmp_path: Path) -> None:
    pki = own_pki(tmp_path)
    old_cert = tmp_path / "alice-old.pem"
    shutil.copy(pki.dir / "alice.pem", old_cert)
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "alice", policy)
    config = config.model_copy(
        update={
            "audit_checkpoints": config.audit_checkpoints.model_copy(update={"every_records": 1})
        }
    )
    alice = Agent(config)
    await alice.start(watch_policy=False)
    try:
        async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as bob:
            await bob.invoke("text.echo", {"text": "before"})
            await alice.audit.flush()
            issue(pki.dir, "alice", overwrite=True)
            alice.reload()
            await bob.invoke("text.echo", {"text": "after"})
    finally:
        await alice.stop()
    new_cert = pki.dir / "alice.pem"

    def verify(*certs: Path) -> subprocess.CompletedProcess[str]:
        cert_args = [arg for cert in certs for arg in ("--cert", str(cert))]
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli.main", "audit", "verify", "--db",
             str(config.audit_db), "--checkpoints", str(config.checkpoint_file), *cert_args],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip

    new_only, old_only, both = verify(new_cert), verify(old_cert), verify(old_cert, new_cert)
    assert new_only.returncode == 1 and "signed by another certificate" in new_only.stdout
    assert old_only.returncode == 1 and "signed by another certificate" in old_only.stdout
    hint = "hint: checkpoints signed by a certificate not given (one from before a rotation?)"
    assert hint in new_only.stderr and hint in old_only.stderr  # what to pass, said
    assert both.returncode == 0, both.stdout + both.stderr
    assert "hint:" not in both.stderr
    assert "chain intact" in both.stdout
