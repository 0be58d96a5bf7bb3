"""The agent's certificate, key and trust root, re-read without a restart.

The files are re-read on SIGHUP and when they change (polled like the policy
file). A new set is checked before it is used: the certificate parses, carries
exactly the agent's SPIFFE ID and no wildcard DNS name, is valid now, chains
to the configured CA (the leaf itself, through the file's intermediates), and
the key is the certificate's. A set that fails
is rejected (logged, counted) and the old one stays in force.

New TLS handshakes of the server present the new certificate at once (gRPC's
dynamic server credentials ask :meth:`LiveTls.server_credentials`' fetcher on
every handshake); connections already open, and the calls on them, go on with
the old one. Listeners (the agent's outbound channels) are told of every
accepted change, so new channels are built with the new client certificate.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from gateway.config import TlsFiles
from gateway.errors import AgentConfigError, ConfigError
from gateway.transport.tls import TlsMaterial

_log = logging.getLogger(__name__)
_PUBLIC = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
_EXPIRY_CHECK_EVERY_SECONDS = 86400.0

Stamp = tuple[int, int, int, int] | None


@dataclass(frozen=True, slots=True)
class CertificateFacts:
    """What the agent may say about its own certificate (no key, no PEM)."""

    serial: int
    not_after: datetime


@dataclass(frozen=True, slots=True)
class TlsStats:
    """A read-only snapshot of certificate reloads and expiry.

    Attributes:
        reloads_ok: New certificate sets taken into use since start.
        reloads_rejected: New sets rejected (the old one stayed in force).
        serial: Serial number of the certificate in force.
        not_after_unix: When it expires, seconds since the Unix epoch.
        expiring_soon: It expires within ``[tls] expiry_warning``.
        expiry_warnings: Expiry warnings logged since start.
    """

    reloads_ok: int
    reloads_rejected: int
    serial: int
    not_after_unix: float
    expiring_soon: bool
    expiry_warnings: int


def check_material(material: TlsMaterial, agent_id: str, now: datetime) -> CertificateFacts:
    """Everything an agent requires of its own TLS material before using it.

    Raises:
        ConfigError: a file does not parse, the SPIFFE ID is not ``agent_id`` or
            a DNS name is a wildcard, the certificate is expired or not yet
            valid, it was not issued by the CA file, or the key is not its key.
    """
    spiffe_id = material.spiffe_id()  # also refuses wildcard DNS names
    if spiffe_id != agent_id:
        raise ConfigError(f"agent id {agent_id} does not match its certificate ({spiffe_id})")
    try:
        chain = x509.load_pem_x509_certificates(material.cert_pem)
        roots = x509.load_pem_x509_certificates(material.ca_pem)
        key = serialization.load_pem_private_key(material.key_pem, password=None)
    except (ValueError, TypeError) as err:
        # The message names the file kind only: never key or certificate content.
        raise ConfigError("certificate, key or CA file cannot be parsed") from err
    leaf = chain[0]
    if key.public_key().public_bytes(*_PUBLIC) != leaf.public_key().public_bytes(*_PUBLIC):
        raise ConfigError("the private key does not belong to the certificate")
    if now >= leaf.not_valid_after_utc:
        raise ConfigError(f"the certificate expired at {leaf.not_valid_after_utc.isoformat()}")
    if now < leaf.not_valid_before_utc:
        raise ConfigError(
            f"the certificate is not valid before {leaf.not_valid_before_utc.isoformat()}"
        )
    if not _chains_to(chain, roots, now):
        raise ConfigError(
            "the certificate was not issued by the configured CA "
            "(its own chain in the certificate file does not lead to it)"
        )
    return CertificateFacts(serial=leaf.serial_number, not_after=leaf.not_valid_after_utc)


def _chains_to(chain: list[x509.Certificate], roots: list[x509.Certificate], now: datetime) -> bool:
    """Whether the leaf (``chain[0]``) leads to a root through the file's own order.

    Each certificate must be issued by a root or by the next one in the file,
    which must then be a CA valid now: the path a peer builds from what the
    agent presents. Some other certificate in the file that a root issued (the
    CA itself, appended after a foreign leaf) proves nothing about the leaf.
    """
    for position, certificate in enumerate(chain):
        if any(_issued_by(certificate, root) for root in roots):
            return True
        if position + 1 == len(chain):
            return False
        issuer = chain[position + 1]
        if not (_is_ca(issuer, now) and _issued_by(certificate, issuer)):
            return False
    return False


def _is_ca(certificate: x509.Certificate, now: datetime) -> bool:
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return False
    valid = certificate.not_valid_before_utc <= now < certificate.not_valid_after_utc
    return constraints.value.ca and valid


def _issued_by(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


class LiveTls:
    """The TLS material in force for one agent, swapped atomically on reload.

    Args:
        agent_id: The SPIFFE ID every certificate must carry.
        files: The configured CA, certificate and key paths, and the expiry window.

    Raises:
        AgentConfigError: the files at start fail :func:`check_material`.
    """

    def __init__(self, agent_id: str, files: TlsFiles) -> None:
        self._agent_id = agent_id
        self._files = files
        self._stamps = self._file_stamps()
        try:
            material = self._read()
            facts = check_material(material, agent_id, datetime.now(UTC))
        except ConfigError as err:
            raise AgentConfigError(err.message) from err
        self._material, self._facts = material, facts
        self._generation = 0
        self._served_generation = 0
        self._listeners: list[Callable[[TlsMaterial], None]] = []
        self._ok = self._rejected = self._warnings = 0

    @property
    def current(self) -> TlsMaterial:
        """The material in force."""
        return self._material

    def on_change(self, listener: Callable[[TlsMaterial], None]) -> None:
        """Call ``listener`` with the new material after every accepted reload."""
        self._listeners.append(listener)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server credentials (client certificate required) that follow reloads."""
        return grpc.dynamic_ssl_server_credentials(
            self._certificate_configuration(self._material),
            self._fetch_configuration,
            require_client_authentication=True,
        )

    def reload(self) -> ConfigError | None:
        """Re-read the files; returns the error if they were rejected, else None."""
        self._stamps = self._file_stamps()
        try:
            material = self._read()
            facts = check_material(material, self._agent_id, datetime.now(UTC))
        except ConfigError as err:
            self._rejected += 1
            _log.error(
                "certificate reload rejected, keeping serial %x: %s",
                self._facts.serial,
                err.message,
            )
            return err
        if material == self._material:
            return None
        self._material, self._facts = material, facts  # one assignment each: old or new
        self._generation += 1
        self._ok += 1
        _log.info("certificate reloaded: serial %x, expires %s", facts.serial, facts.not_after)
        for listener in self._listeners:
            listener(material)
        self.warn_if_expiring()
        return None

    def reload_if_changed(self) -> ConfigError | None:
        """Reload when any of the three files' identity, size or times changed."""
        if self._file_stamps() == self._stamps:
            return None
        return self.reload()

    async def watch(self, interval: float = 1.0) -> None:
        """Poll the files and reload on change; warn of expiry daily; until cancelled."""
        last_expiry_check = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            try:
                self.reload_if_changed()
                if time.monotonic() - last_expiry_check >= _EXPIRY_CHECK_EVERY_SECONDS:
                    last_expiry_check = time.monotonic()
                    self.warn_if_expiring()
            except Exception:  # never let one bad file stop all future reloads
                _log.exception("certificate reload failed; keeping the previous certificate")

    def warn_if_expiring(self) -> bool:
        """Log a warning (and count it) if the certificate expires within the window."""
        if not self._expiring_soon():
            return False
        self._warnings += 1
        left = self._facts.not_after - datetime.now(UTC)
        _log.warning(
            "own certificate (serial %x) expires at %s, in %d h: re-issue it",
            self._facts.serial,
            self._facts.not_after.isoformat(),
            left // timedelta(hours=1),
        )
        return True

    def stats(self) -> TlsStats:
        """Reload counts and the expiry of the certificate in force."""
        return TlsStats(
            reloads_ok=self._ok,
            reloads_rejected=self._rejected,
            serial=self._facts.serial,
            not_after_unix=self._facts.not_after.timestamp(),
            expiring_soon=self._expiring_soon(),
            expiry_warnings=self._warnings,
        )

    def _expiring_soon(self) -> bool:
        return self._facts.not_after - datetime.now(UTC) <= self._files.expiry_warning

    def _read(self) -> TlsMaterial:
        return TlsMaterial.from_files(self._files.ca, self._files.cert, self._files.key)

    def _fetch_configuration(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC for every new handshake, on its own thread: None keeps
        # the configuration it has, so only a reload builds a new one.
        generation = self._generation
        if generation == self._served_generation:
            return None
        self._served_generation = generation
        return self._certificate_configuration(self._material)

    @staticmethod
    def _certificate_configuration(
        material: TlsMaterial,
    ) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(material.key_pem, material.cert_pem)], root_certificates=material.ca_pem
        )

    def _file_stamps(self) -> tuple[Stamp, Stamp, Stamp]:
        return (
            _stamp(self._files.ca),
            _stamp(self._files.cert),
            _stamp(self._files.key),
        )


def _stamp(path: os.PathLike[str]) -> Stamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
