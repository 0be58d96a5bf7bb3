"""Checkpoints verify after any number of rotations: each line carries its certificate.

``pki issue alice --force`` throws the old certificate away; ``audit verify
--config`` used to report every checkpoint it had signed as broken. Now a line
signed by none of the given certificates is checked with the one it carries,
which must be the one it names, chain to the agent's CA and name the agent.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gateway.audit.checkpoint import CheckpointSigner
from gateway.audit.checkpoint_verify import verify_checkpoints
from gateway.cli.main import main
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig, load_agent_config
from gateway.devtools.pki import init_ca, issue
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader
from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, write_policy
from tests.helpers.rotation import own_pki

ROTATIONS = 3
ALICE = spiffe("alice")


@dataclass
class Rotated:
    """alice's log after calls with a rotation between each two (checkpoint after every record)."""

    pki: Pki
    path: Path
    config: AgentConfig

    def lines(self) -> list[dict[str, Any]]:
        text = self.config.checkpoint_file.read_text()
        return [json.loads(line) for line in text.splitlines()]

    def write(self, lines: list[dict[str, Any]]) -> None:
        self.config.checkpoint_file.write_text("".join(json.dumps(x) + "\n" for x in lines))

    def problems(self, *, ca: bool = True) -> list[tuple[str, int, str]]:
        report = verify_checkpoints(
            open_audit_reader(self.config.audit_db),
            self.config.checkpoint_file,
            self.config.tls.cert.read_bytes(),
            ca_pem=self.config.tls.ca.read_bytes() if ca else None,
        )
        return [(p.kind, p.seq, p.message) for p in report.problems]


@pytest.fixture
async def rotated(tmp_path: Path) -> Rotated:
    pki = own_pki(tmp_path)  # alice's files get rewritten: not the session's
    path = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])]),
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "alice-state",
    )
    path.write_text(path.read_text() + "[audit_checkpoints]\nevery_records = 1\n")
    config = load_agent_config(path)
    agent = Agent(config)
    await agent.start(watch_policy=False)
    try:
        async with PeerClient(ALICE, agent.address, pki.material("bob")) as bob:
            for round_ in range(ROTATIONS + 1):
                await bob.invoke("text.echo", {"text": f"round {round_}"})
                await agent.audit.flush()
                if round_ < ROTATIONS:
                    assert main(["pki", "issue", "alice", "--dir", str(pki.dir), "--force"]) == 0
                    agent.reload()  # what SIGHUP does
    finally:
        await agent.stop()
    return Rotated(pki, path, config)


def _verify_cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["audit", "verify", *args])
    return code, capsys.readouterr().out


async def test_checkpoints_verify_with_the_config_after_several_rotations(
    rotated: Rotated, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = rotated.lines()
    signers = list(dict.fromkeys(line["cert_sha256"] for line in lines))
    assert len(signers) == ROTATIONS + 1  # one certificate per round, each in its own lines
    assert all(line["cert"] for line in lines)
    db = str(rotated.config.audit_db)
    code, out = _verify_cli("--db", db, "--config", str(rotated.path), capsys=capsys)
    assert code == 0, out
    count = len(lines)
    assert (
        out
        == f"{db}: chain intact ({ROTATIONS + 1} records; {count} of {count} checkpoints valid)\n"
    )


async def test_without_the_ca_only_the_given_certificates_vouch(
    rotated: Rotated, capsys: pytest.CaptureFixture[str]
) -> None:
    db, cert = str(rotated.config.audit_db), str(rotated.config.tls.cert)
    checkpoints = str(rotated.config.checkpoint_file)
    code, out = _verify_cli("--db", db, "--checkpoints", checkpoints, "--cert", cert, capsys=capsys)
    assert code == 1
    current = rotated.lines()[-1]["cert_sha256"]
    old = [n for n, line in enumerate(rotated.lines(), 1) if line["cert_sha256"] != current]
    assert old and [
        problem for problem in out.splitlines() if "checkpoint_bad_signature" in problem
    ] == [
        f"{db}: seq {rotated.lines()[n - 1]['seq']}: checkpoint_bad_signature: "
        f"bad signature on checkpoint line {n}: signed by another certificate"
        for n in old
    ]
    code, out = _verify_cli(
        "--db", db, "--checkpoints", checkpoints, "--cert", cert, "--ca",
        str(rotated.config.tls.ca), capsys=capsys,
    )  # fmt: skip
    assert code == 0, out


async def test_lines_without_a_certificate_still_verify_with_the_current_one(
    rotated: Rotated,
) -> None:
    lines = rotated.lines()
    current = lines[-1]["cert_sha256"]
    old_format = [{k: v for k, v in line.items() if k != "cert"} for line in lines]
    rotated.write([line for line in old_format if line["cert_sha256"] == current])
    assert rotated.problems() == []
    rotated.write(old_format)  # the rotated-away certificates are nowhere now
    found = rotated.problems()
    assert {(kind, message.split(": ", 1)[1]) for kind, _, message in found} == {
        ("checkpoint_bad_signature", "signed by another certificate")
    }
    assert len(found) == sum(line["cert_sha256"] != current for line in lines)


def _signed(rotated: Rotated, cert_pem: bytes, key_pem: bytes, **at: int) -> dict[str, Any]:
    """alice's true last head, signed with ``key_pem`` for ``cert_pem``, claiming alice."""
    last = rotated.lines()[-1]
    signer = CheckpointSigner(ALICE, key_pem, cert_pem)
    time_unix_ms = at.get("time_unix_ms", last["time_unix_ms"])
    line: dict[str, Any] = json.loads(
        signer.sign(last["seq"], last["head"], time_unix_ms).to_line()
    )
    return line


def _foreign_alice(tmp_path: Path) -> tuple[bytes, bytes]:
    init_ca(tmp_path / "foreign", "example.org")
    identity = issue(tmp_path / "foreign", "alice")
    return identity.cert_path.read_bytes(), identity.key_path.read_bytes()


def _der_b64(pem: bytes) -> str:
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    return base64.b64encode(der).decode("ascii")


@pytest.mark.parametrize(
    "forgery",
    ["other identity", "other CA", "swapped cert", "expired when signed", "garbage cert", "edited"],
)
async def test_a_line_carrying_a_certificate_that_does_not_vouch_fails_with_the_reason(
    rotated: Rotated, tmp_path: Path, forgery: str
) -> None:
    pki, lines = rotated.pki, rotated.lines()
    mallory = (pki.dir / "mallory.pem", pki.dir / "mallory.key")
    if forgery == "other identity":  # a genuine SVID of the same CA, for another agent
        issue(pki.dir, "mallory")
        line = _signed(rotated, mallory[0].read_bytes(), mallory[1].read_bytes())
        why = f"its certificate names {spiffe('mallory')}, not {ALICE}"
    elif forgery == "other CA":
        line = _signed(rotated, *_foreign_alice(tmp_path))
        why = "its certificate is not issued by the trusted CA"
    elif forgery == "swapped cert":  # a rotated-away line, its certificate replaced
        issue(pki.dir, "mallory")
        line = {**lines[0], "cert": _der_b64(mallory[0].read_bytes())}
        why = "it carries another certificate than cert_sha256 names"
    elif forgery == "expired when signed":
        now = datetime.now(UTC)
        cert_pem, key_pem = pki.ca.mint(
            uris=[ALICE], not_before=now - timedelta(days=10), not_after=now - timedelta(days=1)
        )
        line = _signed(rotated, cert_pem, key_pem)
        why = "signed outside its certificate's validity"
    elif forgery == "garbage cert":
        line = {**lines[0], "cert": "!!!"}
        why = "its certificate is unreadable"
    else:  # a rotated-away line with another head: its own certificate does not verify it
        line = {**lines[0], "head": "ab" * 32}
        why = "does not verify"
    rotated.write([*lines, line])
    assert rotated.problems() == [
        (
            "checkpoint_bad_signature",
            line["seq"],
            f"bad signature on checkpoint line {len(lines) + 1}: {why}",
        )
    ]


async def test_a_bad_ca_file_is_a_config_error(
    rotated: Rotated, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ca.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    code = main(
        ["audit", "verify", "--db", str(rotated.config.audit_db), "--config", str(rotated.path),
         "--ca", str(tmp_path / "ca.pem")]
    )  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err == "error: checkpoint CA: no readable certificate\n"
