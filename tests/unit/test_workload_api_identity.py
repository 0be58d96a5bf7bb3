"""``[tls] source = "workload-api"`` without a SPIRE agent: config, SVID choice, trust domains.

The SVIDs and bundles are py-spiffe's own objects, made from the dev PKI's
certificates (the integration tests in tests/spire/ take them from a real SPIRE).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from spiffe import TrustDomain, X509Bundle, X509BundleSet, X509Svid
from spiffe.workloadapi.x509_context import X509Context

from gateway.cli.main import main
from gateway.client.a2a.upstream_links import client_tls_context
from gateway.config import AgentConfig, TlsFiles, WorkloadApiTls
from gateway.devtools.pki import CertificateAuthority
from gateway.errors import AgentConfigError, ConfigError, PeerUnavailable, Unauthenticated
from gateway.transport.live_tls import LiveTls
from gateway.transport.workload_api import material_from_context, workload_api_socket
from policies.identity import svid_dns_name

ALICE, BOB = "spiffe://example.org/agent/alice", "spiffe://example.org/agent/bob"
DAVE = "spiffe://other.test/agent/dave"


def config(tls: dict[str, Any]) -> AgentConfig:
    return AgentConfig.model_validate(
        {"id": ALICE, "tls": tls, "policy": "p.toml", "audit_db": "a.sqlite", "state_dir": "s"}
    )


def test_tls_source_defaults_to_files_and_takes_the_workload_api() -> None:
    files = config({"ca": "ca.pem", "cert": "a.pem", "key": "a.key"}).tls
    assert isinstance(files, TlsFiles) and files.source == "files"
    api = config({"source": "workload-api", "socket": "unix:///run/spire/agent.sock"}).tls
    assert isinstance(api, WorkloadApiTls) and api.socket == "unix:///run/spire/agent.sock"
    assert config({"source": "workload-api"}).tls.socket is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("tls", "problem"),
    [
        ({"source": "workload-api", "socket": "tcp://127.0.0.1:8081"}, "unix:///absolute/path"),
        ({"source": "workload-api", "socket": "unix://relative.sock"}, "unix:///absolute/path"),
        ({"source": "workload-api", "ca": "ca.pem"}, "Extra inputs are not permitted"),
        ({"source": "vault"}, "does not match any of the expected tags"),
        ({"source": "files", "ca": "ca.pem"}, "Field required"),
    ],
)
def test_bad_tls_sections_are_refused(tls: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        config(tls)


def test_the_socket_comes_from_the_config_else_the_spiffe_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPIFFE_ENDPOINT_SOCKET", "unix:///from/env.sock")
    assert workload_api_socket("unix:///from/config.sock") == "unix:///from/config.sock"
    assert workload_api_socket(None) == "unix:///from/env.sock"
    monkeypatch.setenv("SPIFFE_ENDPOINT_SOCKET", "tcp://127.0.0.1:1")
    with pytest.raises(AgentConfigError, match="unix:///absolute/path"):
        workload_api_socket(None)
    monkeypatch.delenv("SPIFFE_ENDPOINT_SOCKET")
    with pytest.raises(AgentConfigError, match="or the SPIFFE_ENDPOINT_SOCKET environment"):
        workload_api_socket(None)


def _svid(ca: CertificateAuthority, spiffe_id: str) -> X509Svid:
    cert, key = ca.issue_svid(spiffe_id)
    return X509Svid.parse(cert, key)


def _bundle(ca: CertificateAuthority) -> X509Bundle:
    return X509Bundle.parse(TrustDomain(ca.trust_domain), ca.certificate_pem())


@pytest.fixture(scope="module")
def cas() -> tuple[CertificateAuthority, CertificateAuthority]:
    return CertificateAuthority.create("example.org"), CertificateAuthority.create("other.test")


def test_the_svid_for_the_agent_id_is_taken_with_every_bundle_own_domain_first(
    cas: tuple[CertificateAuthority, CertificateAuthority],
) -> None:
    own, other = cas
    context = X509Context(
        [_svid(own, BOB), _svid(own, ALICE)], X509BundleSet.of([_bundle(other), _bundle(own)])
    )
    material = material_from_context(context, ALICE)
    assert material.spiffe_id() == ALICE
    assert [domain for domain, _ in material.bundles] == ["example.org", "other.test"]
    assert material.roots_for("other.test") == other.certificate_pem()
    assert material.ca_pem == own.certificate_pem() + other.certificate_pem()
    assert material.roots_for("third.test") is None
    with pytest.raises(PeerUnavailable, match=r"no trust bundle for trust domain third\.test"):
        material.channel_credentials("spiffe://third.test/agent/x")
    with pytest.raises(ConfigError, match=rf"holds no SVID for {DAVE} \(it holds: {ALICE}, {BOB}"):
        material_from_context(context, DAVE)


def _live(material_context: X509Context, agent_id: str = ALICE) -> LiveTls:
    settings = WorkloadApiTls(source="workload-api", socket="unix:///unused.sock")
    return LiveTls(agent_id, settings, material_from_context(material_context, agent_id))


def test_a_federated_ca_cannot_vouch_for_another_trust_domain(
    cas: tuple[CertificateAuthority, CertificateAuthority],
) -> None:
    own, other = cas
    live = _live(X509Context([_svid(own, ALICE)], X509BundleSet.of([_bundle(own), _bundle(other)])))
    genuine_bob, _ = own.issue_svid(BOB)
    genuine_dave, _ = other.issue_svid(DAVE)
    live.check_peer_issuer(genuine_bob, BOB)
    live.check_peer_issuer(genuine_dave, DAVE)
    forged_bob, _ = other.mint(uris=[BOB], dns_names=[svid_dns_name(BOB)])
    with pytest.raises(Unauthenticated, match=r"not issued by trust domain example\.org's bundle"):
        live.check_peer_issuer(forged_bob, BOB)
    third, _ = CertificateAuthority.create("third.test").issue_svid("spiffe://third.test/agent/x")
    with pytest.raises(Unauthenticated, match="no trust bundle for the caller's trust domain"):
        live.check_peer_issuer(third, "spiffe://third.test/agent/x")


def test_an_update_is_checked_like_a_file_and_a_bad_one_keeps_the_old_set(
    cas: tuple[CertificateAuthority, CertificateAuthority],
) -> None:
    own, other = cas
    bundles = X509BundleSet.of([_bundle(own)])
    live = _live(X509Context([_svid(own, ALICE)], bundles))
    kept = live.facts.serial
    for bad in (
        X509Context([_svid(other, DAVE)], X509BundleSet.of([_bundle(other)])),  # not alice
        X509Context([_svid(other, ALICE.replace("example.org", "other.test"))], bundles),
    ):
        assert live.offer(lambda bad=bad: material_from_context(bad, ALICE)) is not None
    assert (live.stats().reloads_rejected, live.facts.serial) == (2, kept)
    assert (
        live.offer(lambda: material_from_context(X509Context([_svid(own, ALICE)], bundles), ALICE))
        is None
    )
    assert live.stats().reloads_ok == 1 and live.facts.serial != kept


def test_an_svid_with_only_its_uri_san_is_taken(
    cas: tuple[CertificateAuthority, CertificateAuthority],
) -> None:
    own, _ = cas
    bundles = X509BundleSet.of([_bundle(own)])
    live = _live(X509Context([_svid(own, ALICE)], bundles))
    assert live.facts.derived_name
    no_dns_cert, no_dns_key = own.mint(uris=[ALICE])  # a SPIRE entry without -dns
    svid = X509Svid.parse(no_dns_cert, no_dns_key)
    assert live.offer(lambda: material_from_context(X509Context([svid], bundles), ALICE)) is None
    assert (live.stats().reloads_ok, live.facts.derived_name) == (1, False)


def test_spiffe_dns_name_prints_the_name_for_the_registration_entry(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["spiffe", "dns-name", ALICE]) == 0
    assert capsys.readouterr().out == svid_dns_name(ALICE) + "\n"
    assert main(["spiffe", "dns-name", "not-an-id"]) == 2
    assert "'not-an-id' is not a SPIFFE ID" in capsys.readouterr().err


def test_an_https_upstream_gets_the_svid_through_a_private_folder_that_is_removed(
    cas: tuple[CertificateAuthority, CertificateAuthority],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own, other = cas
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    material = material_from_context(
        X509Context([_svid(own, ALICE)], X509BundleSet.of([_bundle(own), _bundle(other)])), ALICE
    )
    settings = WorkloadApiTls(source="workload-api", socket="unix:///unused.sock")
    context = client_tls_context(material, DAVE, settings)
    assert list(tmp_path.iterdir()) == []  # the key was on disk only while ssl read it
    (root,) = context.get_ca_certs()  # dave is verified by other.test's bundle alone
    assert dict(item[0] for item in root["subject"])["commonName"] == "other.test"
    with pytest.raises(PeerUnavailable, match="no trust bundle"):
        client_tls_context(material, "spiffe://third.test/agent/x", settings)
