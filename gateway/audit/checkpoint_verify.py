"""Check an audit log against its signed checkpoints (see :mod:`gateway.audit.checkpoint`).

What each problem means::

    ends_before_checkpoint    the log ends before the highest valid checkpoint's
                              seq: its tail was cut (even if chain_head was
                              rewritten to match)
    checkpoint_mismatch       the record at a checkpoint's seq does not carry the
                              head that was signed: it, or the chain up to it,
                              was rewritten (or it is missing)
    checkpoint_bad_signature  a line that does not verify with the given
                              certificates or the one it carries: forged,
                              edited, signed by another key or for another
                              agent, or carrying a certificate of another
                              agent or CA (see checkpoint_cert)
    checkpoint_unreadable     a line that is not a checkpoint at all

What it proves: every record up to the highest valid checkpoint is the one the
agent had committed when it signed (the chain links them to the signed head),
and the log was not cut below it. What it does not: records after the last
checkpoint are protected by the chain only (a cut there, with a rewritten head,
goes unnoticed); deleting lines from the end of the checkpoint file itself is
not detectable from that file (ship the ``audit_checkpoint`` log events
elsewhere); and whoever holds the agent's private key can sign anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509

from gateway.audit.checkpoint import Checkpoint, certificate_sha256, signature_valid
from gateway.audit.checkpoint_cert import carried_certificate, load_trust_bundle
from gateway.audit.verify import ChainProblem
from gateway.errors import ConfigError, Unauthenticated
from gateway.local.regular_files import read_regular_file
from policies.identity import spiffe_id_from_pem

if TYPE_CHECKING:
    from gateway.audit.store.store import AuditReader

_FIELDS: dict[str, type] = {
    "agent": str,
    "seq": int,
    "head": str,
    "time_unix_ms": int,
    "sig_alg": str,
    "cert_sha256": str,
    "sig": str,
}
_OPTIONAL_FIELDS: dict[str, type] = {"cert": str}
UNKNOWN_SIGNER = "signed by another certificate"
"""Why a line fails when its signer is none of the certificates given (nor carried)."""


@dataclass(frozen=True)
class CheckpointReport:
    """The result of :func:`verify_checkpoints`."""

    checkpoints: int
    """Lines in the file."""
    valid: int
    """Lines whose signature verified."""
    problems: tuple[ChainProblem, ...]
    """Problems found; empty when the log agrees with every checkpoint."""

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def verify_checkpoints(
    log: AuditReader,
    checkpoints: Path,
    cert_pem: bytes | Sequence[bytes],
    *,
    ca_pem: bytes | None = None,
) -> CheckpointReport:
    """Check the log ``log`` reads against every line of ``checkpoints``.

    Args:
        log: The audit store (a store of many chains: the chain of the
            agent named by ``cert_pem``).
        checkpoints: The JSONL checkpoint file.
        cert_pem: The certificate of the agent that signed them, or several:
            after a certificate rotation, lines name the certificate that
            signed them (by fingerprint) and each is checked with that one.
        ca_pem: The agent's trust bundle (``[tls] ca``). With it, a line
            signed by none of ``cert_pem`` is checked with the certificate
            it carries, if that one chains to the bundle and names the agent
            (:mod:`gateway.audit.checkpoint_cert`): so checkpoints verify
            after any number of rotations with the current certificate alone.

    Raises:
        ConfigError: A file is missing or unreadable, or a certificate is not
            one with one SPIFFE ID.
    """
    bundle = None if ca_pem is None else load_trust_bundle(ca_pem, "checkpoint CA")
    signers: dict[str, tuple[bytes, str]] = {}
    for pem in [cert_pem] if isinstance(cert_pem, bytes) else cert_pem:
        try:
            signers[certificate_sha256(pem)] = (pem, spiffe_id_from_pem(pem))
        except Unauthenticated as err:
            raise ConfigError(f"checkpoint certificate: {err.message}") from err
    agents = {agent for _, agent in signers.values()}
    if len(agents) != 1:
        raise ConfigError("checkpoint certificates: give the certificates of one agent")
    (agent,) = agents
    try:
        lines = read_regular_file(checkpoints).decode("utf-8", errors="replace").splitlines()
    except OSError as err:
        raise ConfigError(f"checkpoint file {checkpoints}: cannot read: {err.strerror}") from err
    problems: list[ChainProblem] = []
    valid: list[Checkpoint] = []
    for number, line in enumerate(lines, start=1):
        checkpoint = _parse(line)
        if checkpoint is None:
            problems.append(
                ChainProblem(0, "checkpoint_unreadable", f"checkpoint line {number} is unreadable")
            )
            continue
        why = _signature_problem(checkpoint, agent, signers, bundle)
        if why:
            problems.append(
                ChainProblem(
                    checkpoint.seq,
                    "checkpoint_bad_signature",
                    f"bad signature on checkpoint line {number}: {why}",
                )
            )
            continue
        valid.append(checkpoint)
    problems.extend(_compare_with_log(log, agent, valid))
    return CheckpointReport(len(lines), len(valid), tuple(problems))


def _parse(line: str) -> Checkpoint | None:
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        return None
    if not isinstance(data, dict) or not set(_FIELDS) <= set(data) <= {*_FIELDS, *_OPTIONAL_FIELDS}:
        return None
    for name, kind in {**_FIELDS, **_OPTIONAL_FIELDS}.items():
        value = data.get(name, "")
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
    return Checkpoint(**data)


def _signature_problem(
    checkpoint: Checkpoint,
    agent: str,
    signers: dict[str, tuple[bytes, str]],
    bundle: list[x509.Certificate] | None,
) -> str:
    signer = signers.get(checkpoint.cert_sha256)
    if signer is not None:
        cert_pem = signer[0]
    elif checkpoint.cert and bundle is not None:
        carried, why = carried_certificate(checkpoint, agent, bundle)
        if carried is None:
            return why
        cert_pem = carried
    else:
        return UNKNOWN_SIGNER
    if checkpoint.agent != agent:
        return "names another agent"
    if not signature_valid(checkpoint, cert_pem):
        return "does not verify"
    return ""


def _compare_with_log(log: AuditReader, agent: str, valid: list[Checkpoint]) -> list[ChainProblem]:
    if not valid:
        return []
    seqs = sorted({checkpoint.seq for checkpoint in valid})
    last, hashes = log.hashes_at(agent, seqs)
    problems: list[ChainProblem] = []
    for checkpoint in valid:
        if checkpoint.seq <= last and hashes.get(checkpoint.seq) != checkpoint.head:
            problems.append(
                ChainProblem(
                    checkpoint.seq,
                    "checkpoint_mismatch",
                    f"checkpoint {checkpoint.seq} disagrees with record {checkpoint.seq}",
                )
            )
    highest = max(valid, key=lambda c: c.seq)
    if highest.seq > last:
        problems.append(
            ChainProblem(
                last + 1,
                "ends_before_checkpoint",
                f"log ends before checkpoint seq {highest.seq} (last record is seq {last})",
            )
        )
    return sorted(problems, key=lambda p: (p.seq, p.kind))
