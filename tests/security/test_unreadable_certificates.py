"""CA-signed client certificates the identity parser cannot fully read.

Each is signed by the session CA and presented to a real agent over mTLS.
BoringSSL (inside gRPC) reads some extensions itself and refuses the handshake
when they are malformed (the SAN, certificate policies, key usage); others it
never reads (SCT list, AIA, a URI that is not IA5) and lets through, and those
reach the gateway's parser. Either way: never UNKNOWN, never the parser's text,
exactly one audit record when the call reached the gateway, no traceback.
"""

from __future__ import annotations

import logging

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import Unauthenticated
from gateway.inbound.pipeline import peer_id_from_cert
from gateway.runtime.agent import Agent
from gateway.transport.tls import TlsMaterial, channel_options
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from policies.identity import is_spiffe_id, spiffe_id_from_pem
from tests.helpers.agents import Pki, WriteCounter, audit_rows
from tests.helpers.forged_certs import (
    EXTENSION_OIDS,
    MALFORMED_EXAMPLES,
    PARSER_WORDS,
    REACH_THE_GATEWAY,
    SAN,
    WELL_FORMED,
    RawExtension,
    material_raw,
    mint_raw,
)

"""The handshake accepts these; before the fix the first three answered UNKNOWN."""

HANDSHAKE_REFUSES = ("truncated SAN", "garbage certificate policies")
"""BoringSSL parses these extensions while verifying the client and fails the handshake."""

CLIENT_CANNOT_LOAD = ("garbage key usage",)
"""gRPC refuses to build a handshaker from a certificate with a garbled key usage at all."""


async def _invoke(material: TlsMaterial, agent: Agent, capability: str) -> grpc.aio.AioRpcError:
    async with grpc.aio.secure_channel(
        agent.address, material.channel_credentials(), options=channel_options(agent.config.id)
    ) as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        request = gateway_pb2.InvokeRequest(
            request_id="forged-1", capability=capability, payload=b'{"note":"x"}'
        )
        try:
            await stub.Invoke(request, timeout=10)
        except grpc.aio.AioRpcError as err:
            return err
    raise AssertionError("a forged certificate was served")


async def _describe(material: TlsMaterial, agent: Agent) -> grpc.aio.AioRpcError:
    async with grpc.aio.secure_channel(
        agent.address, material.channel_credentials(), options=channel_options(agent.config.id)
    ) as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        try:
            await stub.Describe(gateway_pb2.DescribeRequest(), timeout=10)
        except grpc.aio.AioRpcError as err:
            return err
    raise AssertionError("a forged certificate was described to")


def _assert_refused_cleanly(err: grpc.aio.AioRpcError) -> None:
    assert err.code() is grpc.StatusCode.UNAUTHENTICATED
    details = err.details() or ""
    assert not any(word in details for word in PARSER_WORDS), details
    assert details.startswith("peer certificate")


def _assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
        assert "Traceback" not in record.getMessage()


@pytest.mark.parametrize("name", REACH_THE_GATEWAY)
async def test_unreadable_certificate_is_unauthenticated_and_audited_once(
    pki: Pki, alice: Agent, counter: WriteCounter, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    caplog.set_level(logging.DEBUG)
    material = material_raw(pki.ca, MALFORMED_EXAMPLES[name])
    before = len(audit_rows(alice.config.audit_db))

    err = await _invoke(material, alice, "notes.write")

    _assert_refused_cleanly(err)
    rows = audit_rows(alice.config.audit_db)[before:]
    assert [(r.decision, r.reason, r.peer_id, r.capability) for r in rows] == [
        ("refuse", "UNAUTHENTICATED", "", "notes.write")
    ]
    assert counter.calls == 0
    _assert_no_traceback(caplog)


@pytest.mark.parametrize("name", REACH_THE_GATEWAY)
async def test_unreadable_certificate_describe_is_unauthenticated_and_audited(
    pki: Pki, alice: Agent, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    caplog.set_level(logging.DEBUG)
    material = material_raw(pki.ca, MALFORMED_EXAMPLES[name])
    before = len(audit_rows(alice.config.audit_db))

    err = await _describe(material, alice)

    _assert_refused_cleanly(err)
    rows = audit_rows(alice.config.audit_db)[before:]
    assert [(r.decision, r.reason, r.peer_id, r.detail) for r in rows] == [
        ("refuse", "UNAUTHENTICATED", "", "Describe")
    ]
    _assert_no_traceback(caplog)


@pytest.mark.parametrize("name", HANDSHAKE_REFUSES + CLIENT_CANNOT_LOAD)
async def test_certificates_boringssl_reads_itself_never_reach_the_gateway(
    pki: Pki, alice: Agent, counter: WriteCounter, name: str
) -> None:
    material = material_raw(pki.ca, MALFORMED_EXAMPLES[name])
    before = len(audit_rows(alice.config.audit_db))

    err = await _invoke(material, alice, "notes.write")

    assert err.code() is grpc.StatusCode.UNAVAILABLE
    assert len(audit_rows(alice.config.audit_db)) == before
    assert counter.calls == 0


CRYPTOGRAPHY_IGNORES = frozenset(
    {"policy_mappings", "subject_directory_attributes", "private_unknown"}
)
"""Extensions neither BoringSSL nor cryptography parse: garbled, they change nothing."""


@pytest.mark.parametrize("extension", sorted(EXTENSION_OIDS))
async def test_every_extension_garbled_is_refused_at_handshake_or_as_unauthenticated(
    pki: Pki, alice: Agent, caplog: pytest.LogCaptureFixture, extension: str
) -> None:
    # A SEQUENCE that announces five bytes and holds none: malformed for every type.
    caplog.set_level(logging.DEBUG)
    oid = EXTENSION_OIDS[extension]
    forged = [RawExtension(oid, b"\x30\x05")]
    if oid != SAN:
        forged.append(RawExtension(SAN, WELL_FORMED[SAN]))
    material = material_raw(pki.ca, forged)
    before = len(audit_rows(alice.config.audit_db))

    async with grpc.aio.secure_channel(
        alice.address, material.channel_credentials(), options=channel_options(alice.config.id)
    ) as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        request = gateway_pb2.InvokeRequest(
            request_id=f"garbled-{extension}", capability="text.echo", payload=b'{"text":"x"}'
        )
        try:
            await stub.Invoke(request, timeout=10)
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as err:
            code = err.code()
            if code is grpc.StatusCode.UNAUTHENTICATED:
                _assert_refused_cleanly(err)
    await alice.audit.flush()

    rows = audit_rows(alice.config.audit_db)[before:]
    if extension in CRYPTOGRAPHY_IGNORES:  # nobody reads it, so bob is bob
        assert code is grpc.StatusCode.OK
        assert [(r.reason, r.peer_id) for r in rows] == [("OK", "spiffe://example.org/agent/bob")]
    elif code is grpc.StatusCode.UNAVAILABLE:  # the TLS stack refused it first
        assert rows == []
    else:
        assert code is grpc.StatusCode.UNAUTHENTICATED
        assert [(r.reason, r.peer_id) for r in rows] == [("UNAUTHENTICATED", "")]
    _assert_no_traceback(caplog)


async def test_any_parser_exception_is_unauthenticated_logged_in_one_line(
    pki: Pki,
    alice: Agent,
    counter: WriteCounter,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The parser (cryptography, not ours) failing in a way nobody planned for.
    from policies import identity

    def explode(pem: bytes) -> object:
        raise RuntimeError("CERT-CONTENT-MARKER")

    monkeypatch.setattr(identity.x509, "load_pem_x509_certificate", explode)
    caplog.set_level(logging.DEBUG)
    material = pki.odd_material(uris=["spiffe://example.org/agent/bob"])  # fresh: not cached
    before = len(audit_rows(alice.config.audit_db))

    err = await _invoke(material, alice, "notes.write")

    _assert_refused_cleanly(err)
    assert "CERT-CONTENT-MARKER" not in (err.details() or "")
    rows = audit_rows(alice.config.audit_db)[before:]
    assert [(r.reason, r.detail) for r in rows] == [
        ("UNAUTHENTICATED", "unreadable certificate (RuntimeError)")
    ]
    lines = [r.getMessage() for r in caplog.records if "certificate" in r.getMessage()]
    assert lines == ["peer certificate unreadable (RuntimeError); refused as UNAUTHENTICATED"]
    assert all("CERT-CONTENT-MARKER" not in r.getMessage() for r in caplog.records)
    _assert_no_traceback(caplog)
    assert counter.calls == 0


# --- the parser alone, fuzzed: every extension, garbled every way ------------------


@st.composite
def garbled_extensions(draw: st.DrawFn) -> list[RawExtension]:
    """One extension (any of ``EXTENSION_OIDS``) holding malformed or random DER.

    The SAN stays well formed unless it is the one garbled, so a certificate
    the parser accepts must name bob.
    """
    oid = EXTENSION_OIDS[draw(st.sampled_from(sorted(EXTENSION_OIDS)))]
    base = WELL_FORMED.get(oid) or draw(st.binary(min_size=1, max_size=24))
    how = draw(st.sampled_from(["random", "truncate", "flip", "append", "retag", "relength"]))
    if how == "random":
        value = draw(st.binary(max_size=64))
    elif how == "truncate":
        value = base[: draw(st.integers(0, max(0, len(base) - 1)))]
    elif how == "flip":
        index = draw(st.integers(0, len(base) - 1))
        value = base[:index] + bytes([draw(st.integers(0, 255))]) + base[index + 1 :]
    elif how == "append":
        value = base + draw(st.binary(min_size=1, max_size=8))
    elif how == "retag":
        value = bytes([draw(st.integers(0, 255))]) + base[1:]
    else:
        value = base[:1] + bytes([draw(st.integers(0x80, 0xFF))]) + base[2:]
    forged = [RawExtension(oid, value, critical=draw(st.booleans()))]
    if oid != SAN:
        forged.append(RawExtension(SAN, WELL_FORMED[SAN]))
    return forged


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbled_extensions())
def test_identity_parser_yields_one_spiffe_id_or_unauthenticated(
    pki: Pki, forged: list[RawExtension]
) -> None:
    cert_pem, _ = mint_raw(pki.ca, forged)
    for parse in (spiffe_id_from_pem, peer_id_from_cert):
        try:
            peer_id = parse(cert_pem)
        except Unauthenticated as err:
            assert not any(word in err.message for word in PARSER_WORDS), err.message
            continue
        assert is_spiffe_id(peer_id)
        if forged[0].oid != SAN:
            assert peer_id == "spiffe://example.org/agent/bob"
