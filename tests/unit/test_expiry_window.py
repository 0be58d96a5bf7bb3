"""``[tls] expiry_warning``: a span, or a share of the certificate's lifetime.

The Workload API default is a quarter of the SVID's lifetime: SPIRE rotates at
half, so an SVID of any lifetime that rotates is never warned about, and one
whose rotation stopped is, a quarter of its life before it ends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from gateway.config import TlsFiles, WorkloadApiTls
from gateway.config.fields import LifetimeShare
from gateway.devtools.pki import CertificateAuthority
from gateway.transport.live_tls import LiveTls
from gateway.transport.tls import TlsMaterial

ALICE = "spiffe://example.org/agent/alice"


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create("example.org")


def svid(ca: CertificateAuthority, lifetime: timedelta, left: timedelta) -> TlsMaterial:
    """An SVID of ``lifetime`` with ``left`` of it to run."""
    now = datetime.now(UTC)
    cert, key = ca.mint(uris=[ALICE], not_before=now + left - lifetime, not_after=now + left)
    return TlsMaterial(ca_pem=ca.certificate_pem(), cert_pem=cert, key_pem=key)


def workload_api(expiry_warning: str | None = None) -> WorkloadApiTls:
    table = {"source": "workload-api", "socket": "unix:///run/spire/agent.sock"}
    if expiry_warning is not None:
        table["expiry_warning"] = expiry_warning
    return WorkloadApiTls.model_validate(table)


def test_the_workload_api_default_is_a_quarter_of_the_lifetime() -> None:
    assert workload_api().expiry_warning == LifetimeShare(25.0)
    assert workload_api("5m").expiry_warning == timedelta(minutes=5)
    assert workload_api("12.5%").expiry_warning == LifetimeShare(12.5)
    files = TlsFiles.model_validate({"ca": "ca.pem", "cert": "a.pem", "key": "a.key"})
    assert files.expiry_warning == timedelta(days=7)


@pytest.mark.parametrize("text", ["0%", "100%", "150%", "-5%", "%", "25 %s", "1.23456%"])
def test_a_share_outside_0_to_100_is_refused(text: str) -> None:
    with pytest.raises(ValidationError, match="expected a share of the lifetime"):
        workload_api(text)


@pytest.mark.parametrize(
    ("lifetime", "left", "setting", "warned"),
    [
        # A ten-minute SVID SPIRE rotates at 5 minutes left: a fixed "5m" warned of each.
        (timedelta(minutes=10), timedelta(minutes=4, seconds=50), "5m", True),
        (timedelta(minutes=10), timedelta(minutes=4, seconds=50), None, False),
        # Rotation stopped: a quarter of its life left.
        (timedelta(minutes=10), timedelta(minutes=2), None, True),
        (timedelta(hours=1), timedelta(minutes=20), None, False),
        (timedelta(hours=1), timedelta(minutes=10), None, True),
        (timedelta(days=30), timedelta(days=10), "50%", True),
    ],
)
def test_expiring_soon_follows_the_lifetime(
    ca: CertificateAuthority,
    lifetime: timedelta,
    left: timedelta,
    setting: str | None,
    warned: bool,
) -> None:
    live = LiveTls(ALICE, workload_api(setting), svid(ca, lifetime, left))
    assert live.stats().expiring_soon is warned
    assert live.warn_if_expiring(once=True) is warned
    assert live.stats().expiry_warnings == int(warned)
