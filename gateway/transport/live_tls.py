"""The agent's certificate, key and trust root, re-read without a restart.

The files are re-read on SIGHUP and when they change (polled like the policy
file); with ``[tls] source = "workload-api"`` every update the Workload API
pushes is offered the same way (``gateway.transport.workload_api``). A new set
is checked before it is used: the certificate parses, carries exactly the
agent's SPIFFE ID and no wildcard DNS name, is valid now, was issued by the
configured CA (the agent's own trust bundle; the leaf itself, through the file's
intermediates, each a CA valid now), and the key is the
certificate's. The DNS name derived from the SPIFFE ID is optional: clients
pin the URI SAN. A set that fails is rejected (logged, counted) and
the old one stays in force.

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

from gateway.config import TlsFiles, TlsSettings, WorkloadApiTls
from gateway.config.fields import expiry_window
from gateway.errors import AgentConfigError, ConfigError, Unauthenticated
from gateway.transport.svid_checks import (
    CertificateFacts,
    chains_to,
    check_material,
    dropped_roots,
)
from gateway.transport.tls import TlsMaterial
from policies.identity import trust_domain_of

_log = logging.getLogger(__name__)
_EXPIRY_CHECK_EVERY_SECONDS = 86400.0

Stamp = tuple[int, int, int, int] | None


@dataclass(frozen=True, slots=True)
class TlsStats:
    """A read-only snapshot of certificate reloads and expiry.

    Attributes:
        reloads_ok: New certificate sets taken into use since start.
        reloads_rejected: New sets rejected (the old one stayed in force).
        serial: Serial number of the certificate in force.
        not_after_unix: When it expires, seconds since the Unix epoch.
        expiring_soon: It expires within ``[tls] expiry_warning`` (a span, or a
            share of its lifetime).
        expiry_warnings: Expiry warnings logged since start.
    """

    reloads_ok: int
    reloads_rejected: int
    serial: int
    not_after_unix: float
    expiring_soon: bool
    expiry_warnings: int


class LiveTls:
    """The TLS material in force for one agent, swapped atomically on reload.

    Args:
        agent_id: The SPIFFE ID every certificate must carry.
        settings: ``[tls]``: the CA, certificate and key paths, or the
            Workload API; and the expiry window.
        material: The first set when it does not come from files (the
            Workload API's first update); read from the files when None.

    Raises:
        AgentConfigError: the first set fails :func:`check_material`.
    """

    def __init__(
        self, agent_id: str, settings: TlsSettings, material: TlsMaterial | None = None
    ) -> None:
        self._agent_id = agent_id
        self._settings = settings
        self._stamps = self._file_stamps()
        try:
            material = material if material is not None else self._read()
            facts = check_material(material, agent_id, datetime.now(UTC))
        except ConfigError as err:
            raise AgentConfigError(err.message) from err
        self._material, self._facts = material, facts
        self._dropped_roots = b""
        """PEM of roots trusted before and dropped from the trust bundle since."""
        self._generation = 0
        self._served_generation = 0
        self._listeners: list[Callable[[TlsMaterial], None]] = []
        self._ok = self._rejected = self._warnings = 0
        self._warned_serial: int | None = None

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
        """Re-read the files; returns the error if they were rejected, else None.

        With the Workload API there are no files: nothing happens (its updates
        arrive through :meth:`offer`).
        """
        if self._from_workload_api:
            return None
        self._stamps = self._file_stamps()
        return self.offer(self._read)

    def offer(self, produce: Callable[[], TlsMaterial]) -> ConfigError | None:
        """Take the set ``produce`` makes if it passes :func:`check_material`.

        Returns the error if it was rejected (the old set stays), else None.
        """
        try:
            material = produce()
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
        dropped = dropped_roots(self._material.ca_pem, material.ca_pem, self._dropped_roots)
        self._material, self._facts = material, facts  # one assignment each: old or new
        self._dropped_roots = dropped
        self._generation += 1
        self._ok += 1
        _log.info("certificate reloaded: serial %x, expires %s", facts.serial, facts.not_after)
        for listener in self._listeners:
            listener(material)
        self.warn_if_expiring()
        return None

    def valid_now(self) -> bool:
        """True while the certificate in force is within its validity period (a health check)."""
        return datetime.now(UTC) < self._facts.not_after

    @property
    def facts(self) -> CertificateFacts:
        """Serial and expiry of the certificate in force."""
        return self._facts

    def check_peer_issuer(self, peer_cert_pem: bytes, peer_id: str) -> None:
        """Refuse a peer certificate not issued within its own trust domain's bundle.

        The TLS stack verifies a client against every bundle at once; with
        more than one trust domain (federation), a federated domain's CA could
        otherwise vouch for an identity of another domain. With one set of
        roots (a CA file, or one bundle) the handshake verified the chain; what
        it cannot know is a root dropped from the bundle since (a revoked
        SPIRE authority, a CA removed from the file): a connection opened
        before must not keep it trusted, so a certificate issued directly by a
        dropped root, and by no root in force, is refused.

        Raises:
            Unauthenticated: no bundle for the peer's trust domain, the
                certificate does not chain to it, or it was issued by a root
                dropped from the bundle after the connection was made.
        """
        material, dropped = self._material, self._dropped_roots
        if len(material.bundles) < 2:
            if (
                dropped
                and chains_to(peer_cert_pem, dropped)
                and not chains_to(peer_cert_pem, material.ca_pem)
            ):
                raise Unauthenticated(
                    "the caller's certificate was issued by a CA the trust bundle no longer holds",
                    detail="issuer dropped from the trust bundle after this connection was made",
                )
            return
        domain = trust_domain_of(peer_id)
        roots_pem = material.roots_for(domain)
        if roots_pem is None:
            raise Unauthenticated(f"no trust bundle for the caller's trust domain {domain}")
        if not chains_to(peer_cert_pem, roots_pem):
            raise Unauthenticated(
                f"the caller's certificate was not issued by trust domain {domain}'s bundle"
            )

    def reload_if_changed(self) -> ConfigError | None:
        """Reload when any of the three files' identity, size or times changed."""
        if self._from_workload_api or self._file_stamps() == self._stamps:
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

    def warn_if_expiring(self, *, once: bool = False) -> bool:
        """Log a warning (and count it) if the certificate expires within the window.

        ``once``: only if this certificate has not been warned about yet (a
        frequent check of short-lived SVIDs).
        """
        if not self._expiring_soon():
            return False
        if once and self._warned_serial == self._facts.serial:
            return False
        self._warned_serial = self._facts.serial
        self._warnings += 1
        left = self._facts.not_after - datetime.now(UTC)
        if self._from_workload_api:
            _log.warning(
                "own SVID (serial %x) expires at %s, in %d s: the Workload API has not rotated it",
                self._facts.serial,
                self._facts.not_after.isoformat(),
                max(0, left // timedelta(seconds=1)),
            )
            return True
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
        facts = self._facts
        window = expiry_window(self._settings.expiry_warning, facts.not_before, facts.not_after)
        return facts.not_after - datetime.now(UTC) <= window

    @property
    def _from_workload_api(self) -> bool:
        return isinstance(self._settings, WorkloadApiTls)

    def _read(self) -> TlsMaterial:
        files = self._settings
        if not isinstance(files, TlsFiles):
            raise ConfigError("[tls] source is the Workload API: there are no files to read")
        return TlsMaterial.from_files(files.ca, files.cert, files.key)

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

    def _file_stamps(self) -> tuple[Stamp, ...]:
        files = self._settings
        if not isinstance(files, TlsFiles):
            return ()
        return (_stamp(files.ca), _stamp(files.cert), _stamp(files.key))


def _stamp(path: os.PathLike[str]) -> Stamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
