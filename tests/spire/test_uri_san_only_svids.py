"""SPIRE registrations without ``-dns``: SVIDs that carry only the SPIFFE ID.

The usual SPIRE registration. Agents serve with such SVIDs and call each other
(the client pins the URI SAN, through ``gateway.client.spiffe_relay``), across
rotations; with the default ``expiry_warning`` (a quarter of the lifetime) an
SVID SPIRE rotates on time is never warned about, however short it lives (the
old fixed ``"5m"`` warned of every SVID of ten minutes or less); ``config
check`` asks the Workload API and says what it hands out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config import AgentConfig
from gateway.config.fields import LifetimeShare
from policies.identity import svid_dns_name
from tests.spire.spire_lab import SpireAgent, SpireLab, SpireServer, spire_bin
from tests.spire.test_spire_probe_fixes import _svid
from tests.spire.test_workload_api import eventually, start_agent, workload_config
from tests.support import audit_rows, grant, spiffe

ALICE, BOB = spiffe("alice"), spiffe("bob")
SVID_SECONDS = 60
"""SPIRE rotates at half the lifetime (checking every 5 s): 25-30 s left, well before the
15 s (a quarter) at which the default expiry warning starts."""


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[SpireServer, SpireAgent, SpireAgent]]:
    spire = SpireLab(spire_bin())
    try:
        server = spire.server("example.org")
        alice_node, bob_node = spire.agent(server, "alice-node"), spire.agent(server, "bob-node")
        for node, spiffe_id in ((alice_node, ALICE), (bob_node, BOB)):
            server.run(
                *("entry", "create", "-parentID", node.node_id, "-spiffeID", spiffe_id),
                *("-selector", f"unix:uid:{os.getuid()}", "-x509SVIDTTL", str(SVID_SECONDS)),
            )  # no -dns
        yield server, alice_node, bob_node
    finally:
        spire.close()


def default_warning(config: AgentConfig) -> AgentConfig:
    """``config`` with ``expiry_warning`` left to its default."""
    tls = {k: v for k, v in config.tls.model_dump().items() if k != "expiry_warning"}
    return config.model_copy(update={"tls": type(config.tls).model_validate(tls)})


async def test_agents_with_uri_only_svids_call_each_other_across_rotation_unwarned(
    lab: tuple[SpireServer, SpireAgent, SpireAgent],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, alice_node, bob_node = lab
    caplog.set_level(logging.WARNING, logger="gateway.transport")
    alice_config = workload_config(
        tmp_path, ALICE, alice_node.address, [grant("bob", ["text.echo"])]
    )
    alice = await start_agent(default_warning(alice_config))
    bob_config = workload_config(tmp_path, BOB, bob_node.address, [], peers=[alice])
    bob = await start_agent(default_warning(bob_config))
    try:
        assert alice.config.tls.expiry_warning == LifetimeShare(25.0)
        assert not alice.live_tls.facts.derived_name and not bob.live_tls.facts.derived_name
        first = alice.live_tls.facts.serial
        answer = await bob.client(ALICE).invoke("text.echo", {"text": "before"})
        assert answer.output() == {"text": "before"}
        assert bob.client(ALICE).through_relay
        await eventually(lambda: alice.live_tls.facts.serial != first, "alice's SVID rotated", 90)
        answer = await bob.client(ALICE).invoke("text.echo", {"text": "after"})
        assert answer.output() == {"text": "after"}
        for agent in (alice, bob):
            stats = agent.tls_stats()
            assert (stats.expiring_soon, stats.expiry_warnings) == (False, 0)
        assert "has not rotated" not in caplog.text
        await alice.audit.flush()
        rows = audit_rows(alice.config.audit_db)
        assert [(r.peer_id, r.capability, r.decision) for r in rows] == [
            (BOB, "text.echo", "allow"),
            (BOB, "text.echo", "allow"),
        ]
    finally:
        await bob.stop()
        await alice.stop()


async def test_config_check_asks_the_workload_api_and_notes_the_missing_name(
    lab: tuple[SpireServer, SpireAgent, SpireAgent], tmp_path: Path
) -> None:
    _, alice_node, _ = lab
    await _svid(alice_node, ALICE)  # attested and handed out (bounded)
    config = tmp_path / "alice.toml"
    config.write_text(
        f'id = "{ALICE}"\nlisten = "127.0.0.1:0"\npolicy = "{tmp_path}/policy.toml"\n'
        f'audit_db = "{tmp_path}/audit.sqlite"\nstate_dir = "{tmp_path}/state"\n'
        f'[tls]\nsource = "workload-api"\nsocket = "{alice_node.address}"\n'
    )
    (tmp_path / "policy.toml").write_text("version = 1\n")
    done = await asyncio.to_thread(_config_check, config)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("ok: certificate: ")]
    source = f"from the SPIFFE Workload API ({alice_node.address}): "
    assert lines[0].startswith(f"ok: certificate: {source}{ALICE}, expires "), lines
    # A quarter of the lifetime: 15 s of the 60 s TTL, a little more as SPIRE backdates
    # not_before (10 s in 1.13).
    assert re.search(r" left, warned within 1[5-8]s\)$", lines[0]), lines
    assert lines[1] == (
        f"ok: certificate: carries only its SPIFFE ID (no DNS name {svid_dns_name(ALICE)}): "
        "gateway clients pin the URI SAN; a gRPC client that can verify only a host name "
        "needs that name (docs/other-languages.md)"
    )
    # Another SPIFFE ID than the Workload API hands this process: what serve would refuse.
    config.write_text(config.read_text().replace(ALICE, spiffe("nobody")))
    done = await asyncio.to_thread(_config_check, config)
    assert done.returncode == 1
    assert (
        f"error: certificate: {source}the Workload API holds no SVID for {spiffe('nobody')} "
        f"(it holds: {ALICE})"
    ) in done.stdout, done.stdout


def _config_check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "config", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
