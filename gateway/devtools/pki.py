"""The development PKI: one CA per trust domain, and X.509-SVIDs signed by it.

Certificates follow the SPIFFE X.509-SVID spec (one URI SAN per leaf, a CA
without a path below it) and add the DNS name from ``svid_dns_name`` so gRPC's
hostname check proves which SPIFFE ID the server holds. ``uri_san_only`` leaves
that name out, as a SPIRE registration without ``-dns`` does: clients then pin
the URI SAN (``gateway.client.pinned_tls``). Meant for local and test
deployments; production trust domains bring their own CA.

That binding holds only while no certificate of the CA can answer for another
agent's name, so:

- SVIDs carry no ``localhost`` / loopback IP SAN unless asked for
  (``loopback_sans``), nor other extra names (``dns_names``, ``ip_addresses``):
  with them, any client dialling 127.0.0.1 without the name override would
  accept *every* agent of the CA as the one it wanted;
- this CA never signs a wildcard DNS name (``*.svid.a2agw.invalid`` would
  answer for every agent) nor an extra name under ``svid.a2agw.invalid``, and
  its certificate carries critical name constraints: DNS names only under
  ``svid.a2agw.invalid``, ``localhost`` and the suffixes given at ``init``
  (see :mod:`gateway.devtools.pki_names`, also for why IP addresses are not
  constrained there).
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.devtools.pki_names import (
    LOOPBACK_DNS,
    check_extra_names,
    dns_name,
    name_constraints,
)
from gateway.errors import ConfigError
from gateway.transport.tls import load_pem_file
from policies.identity import is_spiffe_id, svid_dns_name, trust_domain_of

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
CLOCK_SKEW = timedelta(minutes=5)
"""How far back ``not_before`` is set, so peers with slightly slow clocks accept new certs."""

_TRUST_DOMAIN = re.compile(r"[a-z0-9._-]{1,255}")
_AGENT_NAME = re.compile(r"[A-Za-z0-9._-]+")
_CA_URI = re.compile(r"spiffe://([a-z0-9._-]{1,255})")
_LEAF_SUBJECT = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "A2A Peer Gateway dev")])
_LEAF_EKU = x509.ExtendedKeyUsage(
    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
)
LOOPBACK_IPS = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class IssuedIdentity:
    """Where ``issue`` wrote an agent's SVID."""

    spiffe_id: str
    """The SPIFFE ID in the certificate's URI SAN."""
    cert_path: Path
    """The PEM certificate (leaf only; the CA is ``ca.pem`` beside it)."""
    key_path: Path
    """The unencrypted PKCS8 PEM private key, mode 0o600."""
    dropped_names: tuple[str, ...] = ()
    """Extra names (``DNS:...``, ``IP:...``) of the certificate this one replaced that it
    does not carry: an HTTPS client dialling one of them fails its hostname check."""


@dataclass(frozen=True)
class CertificateAuthority:
    """An in-memory CA (key + cert)."""

    key: ec.EllipticCurvePrivateKey = field(repr=False)
    """The CA's signing key."""
    certificate: x509.Certificate
    """The self-signed CA certificate."""
    trust_domain: str
    """The trust domain whose SPIFFE IDs this CA may sign."""

    def certificate_pem(self) -> bytes:
        """The CA certificate as PEM (the trust bundle peers load)."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def create(
        cls,
        trust_domain: str,
        *,
        valid_for: timedelta = timedelta(days=365),
        now: datetime | None = None,
        permit_dns: Sequence[str] = (),
    ) -> CertificateAuthority:
        """A new CA with a fresh P-256 key for ``trust_domain``.

        ``permit_dns``: DNS suffixes its SVIDs may carry as extra names,
        besides ``svid.a2agw.invalid`` and ``localhost`` (fixed for the CA's life).

        Raises:
            ConfigError: ``trust_domain`` is not a valid trust domain name, or
                an entry of ``permit_dns`` is not a DNS name.
        """
        _check_trust_domain(trust_domain)
        constraints = name_constraints(permit_dns)
        now = now or datetime.now(UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "A2A Peer Gateway dev CA"),
                x509.NameAttribute(NameOID.COMMON_NAME, trust_domain),
            ]
        )
        uri = x509.UniformResourceIdentifier(f"spiffe://{trust_domain}")
        certificate = (
            _builder(name, name, key, now - CLOCK_SKEW, now + valid_for)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(digital_signature=False, cert_sign=True), critical=True)
            .add_extension(x509.SubjectAlternativeName([uri]), critical=False)
            .add_extension(constraints, critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(key=key, certificate=certificate, trust_domain=trust_domain)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """The CA saved in ``directory`` (``ca.pem`` and ``ca.key``).

        Raises:
            ConfigError: a file is missing or unreadable, or the two do not form a CA.
        """
        cert_path, key_path = directory / CA_CERT_FILE, directory / CA_KEY_FILE
        cert_pem = load_pem_file(cert_path, "CA certificate")
        key_pem = load_pem_file(key_path, "CA key")
        try:
            certificate = x509.load_pem_x509_certificate(cert_pem)
        except ValueError as err:
            raise ConfigError(f"CA certificate file {cert_path}: not a certificate") from err
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"CA key file {key_path}: not an unencrypted private key") from err
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"CA key file {key_path}: not an EC private key")
        if key.public_key() != certificate.public_key():
            raise ConfigError(f"CA key file {key_path}: does not match {cert_path}")
        trust_domain = _ca_trust_domain(certificate, cert_path)
        return cls(key=key, certificate=certificate, trust_domain=trust_domain)

    def save(self, directory: Path) -> None:
        """Write ``ca.key`` (mode 0o600) and ``ca.pem`` into an existing ``directory``."""
        key_pem = _private_key_pem(self.key)
        _write_atomic(directory / CA_KEY_FILE, key_pem, mode=0o600)
        _write_atomic(directory / CA_CERT_FILE, self.certificate_pem(), mode=0o644)

    def mint(
        self,
        *,
        uris: Sequence[str],
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        not_before: datetime | None = None,
        not_after: datetime | None = None,
        valid_for: timedelta = timedelta(days=30),
    ) -> tuple[bytes, bytes]:
        """Low-level: returns (cert_pem, key_pem). Used by tests to make odd certificates.

        Takes the SANs exactly as given (no URI, two URIs, no SAN at all) and any
        validity window (expired, not yet valid); ``issue_svid`` is the checked path.
        Even here a wildcard DNS name is refused: no certificate of this CA may
        answer for every agent.

        Raises:
            ConfigError: an entry of ``ip_addresses`` is not an IP address, or
                an entry of ``dns_names`` holds a wildcard.
        """
        now = datetime.now(UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        start = not_before if not_before is not None else now - CLOCK_SKEW
        end = not_after if not_after is not None else now + valid_for
        builder = (
            _builder(_LEAF_SUBJECT, self.certificate.subject, key, start, end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(digital_signature=True, cert_sign=False), critical=True)
            .add_extension(_LEAF_EKU, critical=False)
            .add_extension(self._authority_key_identifier(), critical=False)
        )
        names = _general_names(uris, dns_names, ip_addresses)
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        return certificate.public_bytes(serialization.Encoding.PEM), _private_key_pem(key)

    def _authority_key_identifier(self) -> x509.AuthorityKeyIdentifier:
        try:
            ski = self.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        except x509.ExtensionNotFound:
            return x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key())
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski.value)

    def issue_svid(
        self,
        spiffe_id: str,
        *,
        valid_for: timedelta = timedelta(days=30),
        now: datetime | None = None,
        loopback_sans: bool = False,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        uri_san_only: bool = False,
    ) -> tuple[bytes, bytes]:
        """An X.509-SVID for ``spiffe_id``, usable as both TLS server and client.

        Args:
            spiffe_id: The SVID's one URI SAN.
            valid_for: Lifetime from ``now``.
            now: Issue time (default: the current time).
            loopback_sans: Also add ``DNS:localhost``, ``IP:127.0.0.1`` and
                ``IP:::1``, for tools that dial loopback without the name
                override. Such a certificate lets those tools mistake one agent
                for another; the gateway's own clients never need it.
            dns_names: Extra DNS names (e.g. for an ``https://`` URL), inside
                the CA's permitted DNS subtrees.
            ip_addresses: Extra IP addresses (any; not from an older CA that
                constrains IPs).
            uri_san_only: Leave out the DNS name derived from ``spiffe_id``
                (the SVID a SPIRE registration without ``-dns`` gives).

        Returns:
            ``(cert_pem, key_pem)``.

        Raises:
            ConfigError: ``spiffe_id`` is malformed or outside this CA's trust domain,
                ``valid_for`` is not positive, or an extra name is refused
                (:func:`gateway.devtools.pki_names.check_extra_names`).
        """
        if not is_spiffe_id(spiffe_id):
            raise ConfigError(f"not a well-formed SPIFFE ID: {spiffe_id!r}")
        if trust_domain_of(spiffe_id) != self.trust_domain:
            raise ConfigError(f"{spiffe_id} is outside trust domain {self.trust_domain}")
        if valid_for <= timedelta(0):
            raise ConfigError(f"certificate lifetime must be positive, got {valid_for}")
        extra_dns = [*([LOOPBACK_DNS] if loopback_sans else []), *dns_names]
        extra_ips = [*(LOOPBACK_IPS if loopback_sans else ()), *ip_addresses]
        check_extra_names(self.certificate, extra_dns, extra_ips)
        now = now or datetime.now(UTC)
        derived = [] if uri_san_only else [svid_dns_name(spiffe_id)]
        return self.mint(
            uris=[spiffe_id],
            dns_names=_unique([*derived, *(dns_name(n) for n in extra_dns)]),
            ip_addresses=_unique([str(ipaddress.ip_address(ip)) for ip in extra_ips]),
            not_before=now - CLOCK_SKEW,
            not_after=now + valid_for,
        )


def init_ca(
    directory: Path,
    trust_domain: str,
    *,
    overwrite: bool = False,
    permit_dns: Sequence[str] = (),
) -> Path:
    """Create a CA for ``trust_domain`` in ``directory`` and return the ``ca.pem`` path.

    ``permit_dns``: see :meth:`CertificateAuthority.create`.

    Raises:
        ConfigError: the trust domain or a ``permit_dns`` entry is invalid, or
            a CA exists and not ``overwrite``.
    """
    _check_trust_domain(trust_domain)
    name_constraints(permit_dns)  # refuse a bad name before touching the directory
    cert_path = directory / CA_CERT_FILE
    if cert_path.exists() and not overwrite:
        raise ConfigError(f"CA already exists at {cert_path} (pass --force to replace it)")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create directory {directory}: {err.strerror}") from err
    CertificateAuthority.create(trust_domain, permit_dns=permit_dns).save(directory)
    return cert_path


def issue(
    directory: Path,
    name: str,
    *,
    valid_for: timedelta = timedelta(days=30),
    loopback_sans: bool = False,
    overwrite: bool = False,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    uri_san_only: bool = False,
) -> IssuedIdentity:
    """Issue ``spiffe://<trust domain>/agent/<name>`` from the CA in ``directory``.

    Writes ``<name>.pem`` and ``<name>.key`` (mode 0o600) next to the CA.
    ``overwrite`` re-issues over an earlier SVID of that name (rotation): each
    file is replaced atomically (temp file, then rename), key first, so an
    agent watching them sees old or new files, never half of one; in between
    it sees a new key with the old certificate, rejects the mismatch, and takes
    the pair once the certificate follows. ``loopback_sans``, ``dns_names``,
    ``ip_addresses``, ``uri_san_only``: see :meth:`CertificateAuthority.issue_svid`.

    Raises:
        ConfigError: ``name`` is invalid or reserved, the CA cannot be loaded,
            an extra name is refused, or an SVID of that name exists and not
            ``overwrite``.
    """
    if not _AGENT_NAME.fullmatch(name):
        raise ConfigError(f"agent name {name!r} must match [A-Za-z0-9._-]+")
    # Case-insensitive: on macOS "CA.pem" is the same file as "ca.pem".
    if name.lower() == "ca":
        raise ConfigError(f"agent name {name!r} is reserved for the CA")
    ca = CertificateAuthority.load(directory)
    spiffe_id = f"spiffe://{ca.trust_domain}/agent/{name}"
    cert_pem, key_pem = ca.issue_svid(
        spiffe_id,
        valid_for=valid_for,
        loopback_sans=loopback_sans,
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        uri_san_only=uri_san_only,
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    existing = [path for path in (cert_path, key_path) if path.exists()]
    if existing and not overwrite:
        raise ConfigError(
            f"{existing[0]} already exists (pass --force to re-issue over it, e.g. to rotate)"
        )
    dropped = _extra_names(cert_path, spiffe_id) - _extra_names(cert_pem, spiffe_id)
    _write_atomic(key_path, key_pem, mode=0o600)
    _write_atomic(cert_path, cert_pem, mode=0o644)
    return IssuedIdentity(spiffe_id, cert_path, key_path, tuple(sorted(dropped)))


def _extra_names(source: Path | bytes, spiffe_id: str) -> set[str]:
    """The DNS and IP names of a certificate beside its SVID name (none if unreadable)."""
    try:
        pem = source.read_bytes() if isinstance(source, Path) else source
        extension = x509.load_pem_x509_certificate(pem).extensions
        san = extension.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return set()
    names = {f"DNS:{name}" for name in san.get_values_for_type(x509.DNSName)}
    names |= {f"IP:{address}" for address in san.get_values_for_type(x509.IPAddress)}
    return names - {f"DNS:{svid_dns_name(spiffe_id)}"}


def _check_trust_domain(trust_domain: str) -> None:
    if not _TRUST_DOMAIN.fullmatch(trust_domain):
        raise ConfigError(
            f"trust domain {trust_domain!r} must be lowercase letters, digits, '.', '-', '_'"
        )


def _ca_trust_domain(certificate: x509.Certificate, cert_path: Path) -> str:
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = x509.SubjectAlternativeName([])
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    match = _CA_URI.fullmatch(uris[0]) if len(uris) == 1 else None
    if match is None:
        raise ConfigError(f"CA certificate file {cert_path}: needs one URI SAN spiffe://DOMAIN")
    return match.group(1)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    not_before: datetime,
    not_after: datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )


def _key_usage(*, digital_signature: bool, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=digital_signature,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_names(
    uris: Sequence[str], dns_names: Sequence[str], ip_addresses: Sequence[str]
) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri) for uri in uris]
    for name in dns_names:
        if "*" in name:
            raise ConfigError(f"wildcard DNS names are never issued: {name!r}")
        names.append(x509.DNSName(name))
    for address in ip_addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError as err:
            raise ConfigError(f"not an IP address: {address!r}") from err
    return names


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_atomic(path: Path, data: bytes, *, mode: int) -> None:
    """Write via a same-directory temp file created with ``mode``, then rename over ``path``."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        # O_EXCL: never reuse (or follow a symlink at) a name someone else created.
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror}") from err
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it; make it exact
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError as err:
        temp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {err.strerror}") from err
