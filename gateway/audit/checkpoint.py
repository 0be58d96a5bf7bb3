"""Signed checkpoints of the audit chain head, kept outside the database.

The hash chain shows any edit *inside* the log, but not a tail cut off together
with a rewritten ``chain_head`` row: nothing in the database remembers the old
head. So every N records or T seconds (and at a graceful stop) the audit
writer, right after a commit, signs ``(agent, seq, head, time)`` with the
agent's own TLS key and appends it as one JSON line to a separate file (opened
``O_APPEND``, fsynced), and logs it as an ``audit_checkpoint`` event for
shipping elsewhere. ``audit verify --checkpoints`` then reports a log that ends
before a checkpoint or disagrees with one (:mod:`gateway.audit.checkpoint_verify`).

One line::

    {"agent": "spiffe://…", "seq": 1000, "head": "<record_hash of seq 1000>",
     "time_unix_ms": 1764500000000, "sig_alg": "ecdsa-sha256",
     "cert_sha256": "<SHA-256 of the signer's certificate, DER>", "sig": "<base64>",
     "cert": "<base64 of the signer's certificate, DER>"}

The signature covers the canonical JSON (keys sorted, no whitespace, ASCII) of
the first five fields. ``cert`` makes each line verifiable on its own after
any number of rotations (``pki issue --force`` throws the old certificate
away): the verifier checks that it is the one ``cert_sha256`` names, chains
to the trusted CA and names the agent. It needs no signature of its own: a
certificate whose key did not make ``sig`` fails the signature check. Lines
written before it existed have no ``cert`` and verify with certificates the
operator gives.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from gateway.errors import AuditUnavailable, ConfigError

_log = logging.getLogger(__name__)

SIGNED_FIELDS = ("agent", "seq", "head", "time_unix_ms", "sig_alg")
"""The fields a checkpoint's signature covers."""

EVENT = "audit_checkpoint"
"""The log event name of a written checkpoint."""

_SigningKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One signed statement: the agent's log held ``seq`` records ending in ``head``."""

    agent: str
    """SPIFFE ID of the signing agent."""
    seq: int
    """Seq of the last record covered."""
    head: str
    """``record_hash`` of that record."""
    time_unix_ms: int
    """When it was signed."""
    sig_alg: str
    """``ecdsa-sha256``, ``ed25519`` or ``rsa-pkcs1v15-sha256``."""
    cert_sha256: str
    """Hex SHA-256 of the signer's certificate (DER)."""
    sig: str
    """Base64 signature over :meth:`signed_bytes`."""
    cert: str = ""
    """Base64 DER of the signer's certificate ("" in lines written before it was added)."""

    def signed_bytes(self) -> bytes:
        """The canonical JSON the signature covers."""
        return signed_bytes(self.agent, self.seq, self.head, self.time_unix_ms, self.sig_alg)

    def to_line(self) -> str:
        """The JSONL line (with its newline)."""
        return (
            json.dumps(
                {
                    "agent": self.agent,
                    "seq": self.seq,
                    "head": self.head,
                    "time_unix_ms": self.time_unix_ms,
                    "sig_alg": self.sig_alg,
                    "cert_sha256": self.cert_sha256,
                    "sig": self.sig,
                    **({"cert": self.cert} if self.cert else {}),
                },
                separators=(",", ":"),
            )
            + "\n"
        )


def signed_bytes(agent: str, seq: int, head: str, time_unix_ms: int, sig_alg: str) -> bytes:
    """Canonical JSON of the signed fields: sorted keys, no whitespace, ASCII only."""
    fields = {
        "agent": agent,
        "seq": seq,
        "head": head,
        "time_unix_ms": time_unix_ms,
        "sig_alg": sig_alg,
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("ascii")


def certificate_sha256(cert_pem: bytes) -> str:
    """Hex SHA-256 of the DER of the first certificate in ``cert_pem``.

    Raises:
        ConfigError: ``cert_pem`` holds no readable certificate.
    """
    return hashlib.sha256(_first_der(cert_pem)).hexdigest()


def _first_der(cert_pem: bytes) -> bytes:
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as err:
        raise ConfigError("checkpoint certificate: cannot be parsed") from err
    return certificate.public_bytes(serialization.Encoding.DER)


class CheckpointSigner:
    """Signs checkpoints with an agent's TLS key (EC, Ed25519 or RSA)."""

    def __init__(self, agent: str, key_pem: bytes, cert_pem: bytes) -> None:
        """Load the key; the certificate and its fingerprint go into every line.

        Raises:
            ConfigError: the key cannot be loaded or is of another type.
        """
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as err:
            raise ConfigError("checkpoint signing key: not an unencrypted private key") from err
        if not isinstance(
            key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey
        ):
            raise ConfigError(
                f"checkpoint signing key: {type(key).__name__} is not EC, Ed25519 or RSA"
            )
        self._key: _SigningKey = key
        self._agent = agent
        der = _first_der(cert_pem)
        self._cert_sha256 = hashlib.sha256(der).hexdigest()
        self._cert = base64.b64encode(der).decode("ascii")
        self.sig_alg = _algorithm_of(key)

    def sign(self, seq: int, head: str, time_unix_ms: int) -> Checkpoint:
        """A signed checkpoint for the log ending at ``seq`` with hash ``head``."""
        message = signed_bytes(self._agent, seq, head, time_unix_ms, self.sig_alg)
        key = self._key
        if isinstance(key, ec.EllipticCurvePrivateKey):
            signature = key.sign(message, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, ed25519.Ed25519PrivateKey):
            signature = key.sign(message)
        else:
            signature = key.sign(message, padding.PKCS1v15(), hashes.SHA256())
        return Checkpoint(
            agent=self._agent,
            seq=seq,
            head=head,
            time_unix_ms=time_unix_ms,
            sig_alg=self.sig_alg,
            cert_sha256=self._cert_sha256,
            sig=base64.b64encode(signature).decode("ascii"),
            cert=self._cert,
        )


def signature_valid(checkpoint: Checkpoint, cert_pem: bytes) -> bool:
    """True if ``checkpoint.sig`` verifies with the public key of ``cert_pem``."""
    try:
        public_key = x509.load_pem_x509_certificate(cert_pem).public_key()
        signature = base64.b64decode(checkpoint.sig, validate=True)
    except ValueError:
        return False
    message = checkpoint.signed_bytes()
    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            if checkpoint.sig_alg != "ecdsa-sha256":
                return False
            public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public_key, ed25519.Ed25519PublicKey):
            if checkpoint.sig_alg != "ed25519":
                return False
            public_key.verify(signature, message)
        elif isinstance(public_key, rsa.RSAPublicKey):
            if checkpoint.sig_alg != "rsa-pkcs1v15-sha256":
                return False
            public_key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
        else:
            return False
    except InvalidSignature:
        return False
    return True


def _algorithm_of(key: _SigningKey) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return "ecdsa-sha256"
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "ed25519"
    return "rsa-pkcs1v15-sha256"


class Checkpointer:
    """Decides when a checkpoint is due and writes it; used by the audit writer thread.

    A checkpoint is due once ``every_records`` records were committed since the
    last one, or ``every_seconds`` passed with uncovered records, and always at
    a graceful stop. It is only ever asked about heads that are committed.
    """

    def __init__(
        self, signer: CheckpointSigner, path: Path, *, every_records: int, every_seconds: float
    ) -> None:
        """Prepare; the file is opened (created if missing) by :meth:`open`.

        Raises:
            ConfigError: ``every_records`` < 1 or ``every_seconds`` <= 0.
        """
        if every_records < 1:
            raise ConfigError(f"checkpoint every_records must be >= 1, not {every_records}")
        if not every_seconds > 0:
            raise ConfigError(f"checkpoint every_seconds must be > 0, not {every_seconds}")
        self._signer = signer
        self._path = path
        self._every_records = every_records
        self._every_seconds = every_seconds
        self._fd: int | None = None
        self._last_seq = 0
        self._last_time = time.monotonic()

    @property
    def path(self) -> Path:
        """The checkpoint file."""
        return self._path

    def use_signer(self, signer: CheckpointSigner) -> None:
        """Sign the next checkpoints with ``signer`` (a rotated key and certificate).

        One attribute assignment: the writer thread signs with the old signer or
        the new one, never a mix.
        """
        self._signer = signer

    def open(self) -> None:
        """Open the file for appending.

        Raises:
            AuditUnavailable: it cannot be opened for appending.
        """
        try:
            created = not self._path.exists()
            self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            if created:  # the new name must survive a crash as well as the lines
                directory = os.open(self._path.parent, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        except OSError as err:
            self.close()
            raise AuditUnavailable(
                f"audit checkpoints {self._path}: cannot open: {err.strerror}"
            ) from err

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def seconds_until_due(self, count: int) -> float | None:
        """How long the writer may sleep before a timed checkpoint; None: nothing uncovered."""
        if count <= self._last_seq:
            return None
        return max(0.0, self._last_time + self._every_seconds - time.monotonic())

    def maybe_write(self, count: int, head: str, *, final: bool = False) -> None:
        """Write a checkpoint of the committed head ``(count, head)`` if one is due.

        Raises:
            AuditUnavailable: the line could not be written and synced.
        """
        if count <= self._last_seq:
            return
        elapsed = time.monotonic() - self._last_time
        if not (
            final or count - self._last_seq >= self._every_records or elapsed >= self._every_seconds
        ):
            return
        self._write(self._signer.sign(count, head, int(time.time() * 1000)))

    def _write(self, checkpoint: Checkpoint) -> None:
        if self._fd is None:
            raise AuditUnavailable(f"audit checkpoints {self._path}: not open")
        data = checkpoint.to_line().encode("ascii")
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes)")
            os.fsync(self._fd)
        except OSError as err:
            raise AuditUnavailable(
                f"audit checkpoints {self._path}: cannot write: {err.strerror or err}"
            ) from err
        self._last_seq, self._last_time = checkpoint.seq, time.monotonic()
        _log.info(
            "%s agent=%s seq=%d head=%s time_unix_ms=%d",
            EVENT,
            checkpoint.agent,
            checkpoint.seq,
            checkpoint.head,
            checkpoint.time_unix_ms,
            extra={
                EVENT: {
                    "agent": checkpoint.agent,
                    "seq": checkpoint.seq,
                    "head": checkpoint.head,
                    "time_unix_ms": checkpoint.time_unix_ms,
                }
            },
        )
