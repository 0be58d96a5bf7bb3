"""An agent's own certificate must chain to the configured CA through the file's own order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.devtools.pki import CertificateAuthority
from gateway.errors import ConfigError
from gateway.transport.live_tls import check_material
from gateway.transport.tls import TlsMaterial
from tests.helpers.agents import TRUST_DOMAIN, spiffe

NOW = datetime.now(UTC)
ALICE = spiffe("alice")


def _ca(
    name: str, issuer: CertificateAuthority | None, *, path_length: int | None
) -> CertificateAuthority:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.certificate.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - timedelta(minutes=5))
        .not_valid_after(NOW + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(issuer.key if issuer else key, hashes.SHA256())
    )
    return CertificateAuthority(key=key, certificate=certificate, trust_domain=TRUST_DOMAIN)


def _pem(ca: CertificateAuthority) -> bytes:
    return ca.certificate.public_bytes(serialization.Encoding.PEM)


@pytest.fixture
def root() -> CertificateAuthority:
    return _ca("root", None, path_length=1)


def test_a_leaf_with_its_intermediate_chains_to_the_root(root: CertificateAuthority) -> None:
    intermediate = _ca("intermediate", root, path_length=0)
    leaf, key = intermediate.mint(uris=[ALICE])
    facts = check_material(
        TlsMaterial(_pem(root), leaf + _pem(intermediate), key), ALICE, datetime.now(UTC)
    )
    assert facts.serial == x509.load_pem_x509_certificate(leaf).serial_number


def test_a_leaf_issued_by_the_root_itself_is_accepted(root: CertificateAuthority) -> None:
    leaf, key = root.mint(uris=[ALICE])
    check_material(TlsMaterial(_pem(root), leaf, key), ALICE, datetime.now(UTC))
    check_material(TlsMaterial(_pem(root), leaf + _pem(root), key), ALICE, datetime.now(UTC))


def _cases(root: CertificateAuthority) -> dict[str, tuple[bytes, bytes]]:
    foreign = _ca("foreign", None, path_length=1)
    intermediate = _ca("intermediate", root, path_length=0)
    foreign_leaf, foreign_key = foreign.mint(uris=[ALICE])
    leaf, key = intermediate.mint(uris=[ALICE])
    return {
        "foreign leaf, then the root": (foreign_leaf + _pem(root), foreign_key),
        "foreign leaf, then the root's intermediate": (
            foreign_leaf + _pem(intermediate) + _pem(root),
            foreign_key,
        ),
        "leaf without its intermediate": (leaf, key),
        "leaf, a foreign CA, then the intermediate": (
            leaf + _pem(foreign) + _pem(intermediate),
            key,
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "foreign leaf, then the root",
        "foreign leaf, then the root's intermediate",
        "leaf without its intermediate",
        "leaf, a foreign CA, then the intermediate",
    ],
)
def test_a_leaf_that_does_not_chain_to_the_root_is_refused(
    root: CertificateAuthority, case: str
) -> None:
    cert, key = _cases(root)[case]
    with pytest.raises(ConfigError, match="not issued by the configured CA"):
        check_material(TlsMaterial(_pem(root), cert, key), ALICE, datetime.now(UTC))


def test_an_expired_intermediate_breaks_the_chain(root: CertificateAuthority) -> None:
    intermediate = _ca("intermediate", root, path_length=0)
    leaf, key = intermediate.mint(uris=[ALICE])
    later = intermediate.certificate.not_valid_after_utc + timedelta(seconds=1)
    material = TlsMaterial(_pem(root), leaf + _pem(intermediate), key)
    with pytest.raises(ConfigError, match="not issued by the configured CA"):
        # The leaf (30 days) outlives its intermediate (1 day).
        check_material(material, ALICE, later)
