"""Server identity binding: no loopback SANs, no wildcards, no dialling by address alone."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.errors import ConfigError
from gateway.runtime.agent import Agent
from gateway.transport.tls import TlsMaterial
from policies.identity import svid_dns_name
from tests.agent_process import write_agent_toml
from tests.support import Pki, agent_config, grant, spiffe, started, write_policy

WILDCARDS = ["*.svid.a2agw.invalid", "*.a2agw.invalid", "*", "id-*.svid.a2agw.invalid"]


def _signed_behind_the_issuers_back(pki: Pki, dns_names: list[str]) -> tuple[bytes, bytes]:
    """A leaf the CA key signs directly (``mint`` refuses wildcards), as a rogue CA would."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(spiffe("alice"))]
    sans += [x509.DNSName(name) for name in dns_names]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(pki.ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(pki.ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.mark.parametrize("wildcard", WILDCARDS)
async def test_an_agent_refuses_to_start_with_a_wildcard_certificate(
    pki: Pki, tmp_path: Path, wildcard: str
) -> None:
    cert_pem, key_pem = _signed_behind_the_issuers_back(
        pki, [svid_dns_name(spiffe("alice")), wildcard]
    )
    (tmp_path / "alice.pem").write_bytes(cert_pem)
    (tmp_path / "alice.key").write_bytes(key_pem)
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "alice", policy)
    config = config.model_copy(
        update={
            "tls": config.tls.model_copy(
                update={"cert": tmp_path / "alice.pem", "key": tmp_path / "alice.key"}
            )
        }
    )
    material = TlsMaterial(pki.ca.certificate_pem(), cert_pem, key_pem)
    with pytest.raises(ConfigError, match="wildcard DNS name") as info:
        material.spiffe_id()
    assert repr(wildcard) in info.value.message
    with pytest.raises(ConfigError, match="wildcard DNS name"):
        await Agent(config).start()

    toml = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=tmp_path / "a.sqlite",
        state_dir=tmp_path / "state",
    )
    toml.write_text(
        toml.read_text()
        .replace(str(pki.dir / "alice.pem"), str(tmp_path / "alice.pem"))
        .replace(str(pki.dir / "alice.key"), str(tmp_path / "alice.key"))
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(toml)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: own certificate carries wildcard DNS name(s)")
    assert not (tmp_path / "a.sqlite").exists()  # refused before anything was opened


async def _health(address: str, material: TlsMaterial, override: str | None) -> int:
    options = [("grpc.ssl_target_name_override", override)] if override else []
    async with grpc.aio.secure_channel(
        address, material.channel_credentials(), options=options
    ) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="a2agw.v1.PeerGateway"), timeout=5
        )
        return int(reply.status)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_dialling_an_agent_by_address_alone_fails_the_handshake(
    pki: Pki, tmp_path: Path, host: str
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    agent = await started(agent_config(pki, tmp_path, "alice", policy))
    address = f"{host}:{agent.port}"
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _health(address, pki.material("bob"), None)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as info:  # the name of another agent: refused
            await _health(address, pki.material("bob"), svid_dns_name(spiffe("carol")))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        serving = await _health(address, pki.material("bob"), svid_dns_name(agent.config.id))
        assert serving == health_pb2.HealthCheckResponse.SERVING
    finally:
        await agent.stop()
