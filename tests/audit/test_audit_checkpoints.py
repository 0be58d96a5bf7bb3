"""Signed checkpoints: a cut tail or a rewritten chain is caught even with a rewritten head."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import sqlite3
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from gateway.audit import AuditLog, AuditRecord, verify_chain
from gateway.audit.chain import GENESIS_HASH, fields_hash
from gateway.audit.checkpoint import (
    Checkpoint,
    Checkpointer,
    CheckpointSigner,
    certificate_sha256,
    signature_valid,
)
from gateway.audit.checkpoint_verify import verify_checkpoints
from gateway.audit.store.sqlite_schema import RECORD_COLUMNS
from gateway.config import AgentConfig, AuditCheckpoints, load_agent_config
from gateway.errors import AuditUnavailable, ConfigError
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader, open_chain_writer
from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import Pki, spiffe
from tests.helpers.audit_logs import (
    CALLS,
    checkpoint_problems,
    checkpointing_config,
    run_refused_calls,
)
from tests.helpers.cli import CliResult, run_cli_async

Found = list[tuple[str, int]]


def _lines(config: AgentConfig) -> list[dict[str, Any]]:
    return [json.loads(line) for line in config.checkpoint_file.read_text().splitlines()]


def _messages(config: AgentConfig) -> list[str]:
    cert_pem = config.tls.cert.read_bytes()
    report = verify_checkpoints(
        open_audit_reader(config.audit_db), config.checkpoint_file, cert_pem
    )
    return [problem.message for problem in report.problems]


def _cut_tail(db: Path, k: int) -> int:
    """Delete the last ``k`` records and rewrite chain_head to match; returns the new last seq."""
    with closing(sqlite3.connect(db)) as conn, conn:
        last = conn.execute("SELECT MAX(seq) FROM audit_records").fetchone()[0]
        conn.execute("DELETE FROM audit_records WHERE seq > ?", (last - k,))
        row = conn.execute(
            "SELECT seq, record_hash FROM audit_records ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        head = (0, GENESIS_HASH) if row is None else row
        conn.execute("UPDATE chain_head SET count = ?, last_hash = ? WHERE id = 1", head)
    return int(last) - k


def _rewrite_from(db: Path, seq: int) -> None:
    """Edit record ``seq`` and rehash the chain from there on, head included."""
    columns = ", ".join(RECORD_COLUMNS)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE audit_records SET detail = 'rewritten' WHERE seq = ?", (seq,))
        prev_row = conn.execute(
            "SELECT record_hash FROM audit_records WHERE seq = ?", (seq - 1,)
        ).fetchone()
        prev = GENESIS_HASH if prev_row is None else prev_row[0]
        rows = conn.execute(
            f"SELECT {columns} FROM audit_records WHERE seq >= ? ORDER BY seq", (seq,)
        ).fetchall()
        for row in rows:
            digest = fields_hash(prev, dict(zip(RECORD_COLUMNS, row, strict=True)))
            conn.execute(
                "UPDATE audit_records SET prev_hash = ?, record_hash = ? WHERE seq = ?",
                (prev, digest, row[0]),
            )
            prev = digest
        conn.execute("UPDATE chain_head SET last_hash = ? WHERE id = 1", (prev,))


async def _verify_cli(*args: str) -> CliResult:
    return await run_cli_async("audit", "verify", *args)


async def test_a_real_agent_signs_checkpoints_that_verify(alice_log: AgentConfig) -> None:
    lines = _lines(alice_log)
    # Every 4 records, and the graceful stop checkpointed the last one.
    assert [line["seq"] for line in lines] == [4, 8, 12, CALLS]
    fingerprint = certificate_sha256(alice_log.tls.cert.read_bytes())
    assert {line["cert_sha256"] for line in lines} == {fingerprint}
    assert {line["agent"] for line in lines} == {alice_log.id}
    assert {line["sig_alg"] for line in lines} == {"ecdsa-sha256"}
    assert alice_log.checkpoint_file == alice_log.audit_db.with_name(
        "alice-audit.sqlite.checkpoints.jsonl"
    )
    assert verify_chain(open_audit_reader(alice_log.audit_db)).ok
    assert checkpoint_problems(alice_log) == []

    db = str(alice_log.audit_db)
    done = await _verify_cli(
        "--db",
        db,
        "--checkpoints",
        str(alice_log.checkpoint_file),
        "--cert",
        str(alice_log.tls.cert),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"{db}: chain intact ({CALLS} records; {len(lines)} of {len(lines)} checkpoints valid)"
    )


@pytest.mark.parametrize("k", [1, 2, 3, 5, CALLS])
async def test_a_cut_tail_with_a_rewritten_head_is_reported(
    pki: Pki, tmp_path: Path, alice_log: AgentConfig, k: int
) -> None:
    last = _cut_tail(alice_log.audit_db, k)
    assert verify_chain(open_audit_reader(alice_log.audit_db)).ok  # the database alone cannot tell
    assert checkpoint_problems(alice_log) == [("ends_before_checkpoint", last + 1)]
    assert _messages(alice_log) == [
        f"log ends before checkpoint seq {CALLS} (last record is seq {last})"
    ]

    toml = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=alice_log.policy,
        audit_db=alice_log.audit_db,
        state_dir=alice_log.state_dir,
    )
    done = await _verify_cli("--db", str(alice_log.audit_db), "--config", str(toml))
    assert done.returncode == 1
    assert f"ends_before_checkpoint: log ends before checkpoint seq {CALLS}" in done.stdout
    assert "chain BROKEN (1 problem(s)" in done.stderr


@pytest.mark.parametrize("k", [1, 4, 9])
async def test_a_cut_tail_refilled_by_new_records_disagrees(
    pki: Pki, alice_log: AgentConfig, k: int
) -> None:
    last = _cut_tail(alice_log.audit_db, k)
    covered = [line["seq"] for line in _lines(alice_log) if line["seq"] > last]
    assert CALLS in covered
    await run_refused_calls(pki, alice_log, k + 2, tag="again")  # the agent resumes on the cut log
    assert verify_chain(open_audit_reader(alice_log.audit_db)).ok
    found = checkpoint_problems(alice_log)
    assert found == [("checkpoint_mismatch", seq) for seq in covered]
    assert f"checkpoint {CALLS} disagrees with record {CALLS}" in _messages(alice_log)


@pytest.mark.parametrize("which", [0, 1, -1])
async def test_a_record_rewritten_at_a_checkpointed_seq_disagrees(
    alice_log: AgentConfig, which: int
) -> None:
    seqs = [line["seq"] for line in _lines(alice_log)]
    target = seqs[which]
    _rewrite_from(alice_log.audit_db, target)
    assert verify_chain(open_audit_reader(alice_log.audit_db)).ok  # rehashed: the chain alone holds
    assert checkpoint_problems(alice_log) == [
        ("checkpoint_mismatch", s) for s in seqs if s >= target
    ]


async def test_a_record_rewritten_between_checkpoints_is_caught_by_the_next(
    alice_log: AgentConfig,
) -> None:
    seqs = [line["seq"] for line in _lines(alice_log)]
    target = seqs[0] + 1
    _rewrite_from(alice_log.audit_db, target)
    assert checkpoint_problems(alice_log) == [
        ("checkpoint_mismatch", s) for s in seqs if s >= target
    ]


def _forgeries() -> list[tuple[str, Callable[[dict[str, Any]], str], str]]:
    def edit(**changes: Any) -> Callable[[dict[str, Any]], str]:
        return lambda line: json.dumps({**line, **changes})

    bad, unreadable = "checkpoint_bad_signature", "checkpoint_unreadable"
    return [
        ("later seq", lambda line: json.dumps({**line, "seq": line["seq"] + 5}), bad),
        ("other head", edit(head="ab" * 32), bad),
        ("other time", lambda line: json.dumps({**line, "time_unix_ms": 1}), bad),
        ("other alg", edit(sig_alg="ed25519"), bad),
        ("random sig", edit(sig=base64.b64encode(b"\x30" * 70).decode()), bad),
        ("sig not base64", edit(sig="!!!"), bad),
        ("empty sig", edit(sig=""), bad),
        ("other agent", edit(agent=spiffe("mallory")), bad),
        ("other cert", edit(cert_sha256="00" * 32), bad),
        ("not json", lambda line: "{not json", unreadable),
        (
            "missing field",
            lambda line: json.dumps({k: v for k, v in line.items() if k != "sig"}),
            unreadable,
        ),
        ("extra field", edit(note="x"), unreadable),
        ("seq as text", lambda line: json.dumps({**line, "seq": str(line["seq"])}), unreadable),
        ("seq as bool", edit(seq=True), unreadable),
        ("array", lambda line: "[]", unreadable),
    ]


@pytest.mark.parametrize(("name", "forge", "kind"), _forgeries(), ids=[f[0] for f in _forgeries()])
async def test_a_forged_checkpoint_line_is_reported(
    alice_log: AgentConfig, name: str, forge: Callable[[dict[str, Any]], str], kind: str
) -> None:
    lines = _lines(alice_log)
    with alice_log.checkpoint_file.open("a") as handle:
        handle.write(forge(lines[-1]) + "\n")
    found = checkpoint_problems(alice_log)
    assert [k for k, _ in found] == [kind], name
    message = _messages(alice_log)[0]
    number = len(lines) + 1
    assert message.startswith(
        f"bad signature on checkpoint line {number}"
        if kind == "checkpoint_bad_signature"
        else f"checkpoint line {number} is unreadable"
    )


async def test_a_checkpoint_file_from_another_key_is_refused(
    pki: Pki, tmp_path: Path, alice_log: AgentConfig
) -> None:
    alice_lines = _lines(alice_log)
    # bob's own, genuine checkpoints: not alice's.
    bob = checkpointing_config(pki, tmp_path, "bob")
    await run_refused_calls(pki, bob, 6)
    bob_lines = _lines(bob)
    alice_log.checkpoint_file.write_text(bob.checkpoint_file.read_text())
    assert checkpoint_problems(alice_log) == [
        ("checkpoint_bad_signature", line["seq"]) for line in bob_lines
    ]
    assert all(m.endswith("signed by another certificate") for m in _messages(alice_log))

    # alice's true heads, signed by bob's key, claiming alice's identity and certificate.
    signer = CheckpointSigner(
        alice_log.id, (pki.dir / "bob.key").read_bytes(), (pki.dir / "alice.pem").read_bytes()
    )
    forged = [signer.sign(c["seq"], c["head"], c["time_unix_ms"]) for c in alice_lines]
    alice_log.checkpoint_file.write_text("".join(c.to_line() for c in forged))
    assert checkpoint_problems(alice_log) == [
        ("checkpoint_bad_signature", c["seq"]) for c in alice_lines
    ]
    assert all(m.endswith("does not verify") for m in _messages(alice_log))


def _self_signed(key: Any) -> bytes:
    name = x509.Name([])
    now = datetime.now(UTC)
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(spiffe("k"))]), False
        )
        .sign(key, algorithm)
    )
    return cert.public_bytes(serialization.Encoding.PEM)


KEYS: dict[str, Callable[[], Any]] = {
    "ecdsa-sha256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "ecdsa-sha256-p384": lambda: ec.generate_private_key(ec.SECP384R1()),
    "ed25519": ed25519.Ed25519PrivateKey.generate,
    "rsa-pkcs1v15-sha256": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
}


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_every_supported_key_type_signs_and_verifies(kind: str) -> None:
    key = KEYS[kind]()
    other = KEYS[kind]()
    cert_pem, other_pem = _self_signed(key), _self_signed(other)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    checkpoint = CheckpointSigner(spiffe("k"), key_pem, cert_pem).sign(7, "ab" * 32, 1_700_000)
    assert checkpoint.sig_alg == kind.removesuffix("-p384")
    assert signature_valid(checkpoint, cert_pem)
    assert not signature_valid(checkpoint, other_pem)
    for change in ({"seq": 8}, {"head": "cd" * 32}, {"time_unix_ms": 1}, {"agent": spiffe("x")}):
        edited = Checkpoint(**{**_as_dict(checkpoint), **change})
        assert not signature_valid(edited, cert_pem), change


def _as_dict(checkpoint: Checkpoint) -> dict[str, Any]:
    return dict(json.loads(checkpoint.to_line()))


def test_a_key_of_another_type_is_refused() -> None:
    from cryptography.hazmat.primitives.asymmetric import dsa

    key = dsa.generate_private_key(key_size=2048)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert_pem = _self_signed(ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(ConfigError, match="not EC, Ed25519 or RSA"):
        CheckpointSigner(spiffe("k"), key_pem, cert_pem)


def _record(n: int) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=1_700_000_000_000 + n,
        request_id=f"r{n}",
        peer_id=spiffe("bob"),
        capability="text.echo",
        version_constraint="",
        served_version="1.0.0",
        decision="allow",
        reason="OK",
        payload_size=3,
        payload_sha256="0" * 64,
        latency_ms=1.0,
    )


def _last_seq(path: Path) -> int:
    lines = path.read_text().splitlines() if path.exists() else []
    return int(json.loads(lines[-1])["seq"]) if lines else 0


async def test_an_idle_writer_checkpoints_after_every_seconds_and_logs_the_event(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    signer = CheckpointSigner(
        spiffe("alice"), (pki.dir / "alice.key").read_bytes(), (pki.dir / "alice.pem").read_bytes()
    )
    path = tmp_path / "cp.jsonl"
    log = AuditLog(
        open_chain_writer(tmp_path / "audit.db"),
        checkpoints=Checkpointer(signer, path, every_records=10**6, every_seconds=0.05),
    )
    caplog.set_level(logging.INFO, logger="gateway.audit.checkpoint")
    await log.start()
    try:
        for n in range(3):
            await log.record_durable(_record(n))
        for _ in range(200):  # bounded: 10 s; the checkpoint is due after 0.05 s
            if _last_seq(path) == 3:
                break
            await asyncio.sleep(0.05)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        # Written while the log stays open. A slow runner may take 0.05 s
        # between two of the records: then an earlier head is checkpointed too.
        seqs = [line["seq"] for line in lines]
        assert seqs[-1] == 3 and seqs == sorted(set(seqs))
    finally:
        await log.close()
    assert [json.loads(x) for x in path.read_text().splitlines()] == lines
    events = [r for r in caplog.records if r.getMessage().startswith("audit_checkpoint ")]
    assert len(events) == len(lines)  # nothing new at the close either
    assert events[-1].audit_checkpoint == {  # type: ignore[attr-defined]
        "agent": spiffe("alice"),
        "seq": 3,
        "head": lines[-1]["head"],
        "time_unix_ms": lines[-1]["time_unix_ms"],
    }
    assert verify_checkpoints(
        open_audit_reader(tmp_path / "audit.db"), path, (pki.dir / "alice.pem").read_bytes()
    ).ok


async def test_checkpoints_can_be_disabled(pki: Pki, tmp_path: Path) -> None:
    config = checkpointing_config(pki, tmp_path, enabled=False)
    await run_refused_calls(pki, config, 5)
    assert not config.checkpoint_file.exists()


async def test_an_unwritable_checkpoint_file_fails_the_log_closed(pki: Pki, tmp_path: Path) -> None:
    config = checkpointing_config(pki, tmp_path, file=tmp_path / "missing-dir" / "cp.jsonl")
    agent = Agent(config)
    with pytest.raises(AuditUnavailable, match=r"audit checkpoints .*cannot open"):
        await agent.start(watch_policy=False)
    await agent.stop()


def test_checkpoint_settings_load_from_the_config_file(pki: Pki, tmp_path: Path) -> None:
    toml = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=tmp_path / "p.toml",
        audit_db=tmp_path / "a.sqlite",
        state_dir=tmp_path / "s",
    )
    default = load_agent_config(toml)
    assert default.audit_checkpoints == AuditCheckpoints()
    assert (default.audit_checkpoints.enabled, default.audit_checkpoints.every_records) == (
        True,
        1000,
    )
    assert default.checkpoint_file == tmp_path / "a.sqlite.checkpoints.jsonl"
    toml.write_text(
        toml.read_text() + '\n[audit_checkpoints]\nevery_records = 10\nfile = "cp/x.jsonl"\n'
    )
    custom = load_agent_config(toml)
    assert custom.checkpoint_file == tmp_path / "cp" / "x.jsonl"
    assert custom.audit_checkpoints.every_records == 10
    toml.write_text(toml.read_text().replace("every_records = 10", "every_records = 0"))
    with pytest.raises(ConfigError, match="every_records"):
        load_agent_config(toml)
