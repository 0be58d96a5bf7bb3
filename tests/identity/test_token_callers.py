"""Callers identified by bearer tokens: alone on HTTPS, bound to the certificate everywhere.

alice takes JWT-SVIDs of example.org and tokens of the session's OIDC issuer
(clients ``bob-client`` → bob, ``carol-client`` → carol), with
``token_only_callers``. An a2a-sdk client without a certificate sends a bearer
token over JSON-RPC and over HTTP+JSON and is served as the token's identity;
a gRPC caller (always with a certificate) may send a token only if it is bound
to that certificate; a token naming someone else is refused TOKEN_NOT_BOUND,
audited under the certificate's identity, and nothing runs.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
import uuid
from pathlib import Path

import grpc
import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import Message, Part, Role, SendMessageRequest, a2a_pb2
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from google.protobuf import struct_pb2

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.a2a_grpc import V1, A2APeer, data_request, gateway_reason
from tests.helpers.a2a_http import (
    V1_HEADERS,
    https_client,
    jsonrpc,
    message_params,
    our_reason,
    serving_https,
)
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    raw_channel,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.push_receiver import with_push
from tests.helpers.token_issuer import (
    ALICE,
    SessionIssuer,
    SvidKeys,
    alice_grants,
    token_settings,
    with_tokens,
)

BOB = spiffe("bob")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def ca_only(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))


async def rows(agent: Agent) -> list[tuple[str, str, str, str]]:
    await agent.audit.flush()
    return [
        (r.peer_id, r.decision, r.reason, r.capability) for r in audit_rows(agent.config.audit_db)
    ]


def echo_request(text: str) -> SendMessageRequest:
    data = struct_pb2.Value()
    data.struct_value.update({"text": text})
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(data=data)])
    message.metadata.update({"a2agw.capability": "text.echo"})
    return SendMessageRequest(message=message)


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
@pytest.mark.parametrize("kind", ["oidc-client", "jwt-svid"])
async def test_an_a2a_sdk_client_with_only_a_bearer_token_is_its_identity(
    pki: Pki, alice: Agent, issuer: SessionIssuer, svid: SvidKeys, binding: str, kind: str
) -> None:
    token = issuer.token("bob-client", ALICE) if kind == "oidc-client" else svid.token("bob", ALICE)
    async with httpx.AsyncClient(verify=ca_only(pki), headers=bearer(token), timeout=20) as http:
        client = await create_client(
            alice.https_url,
            ClientConfig(httpx_client=http, streaming=False, supported_protocol_bindings=[binding]),
        )
        events = [event async for event in client.send_message(echo_request("hi"))]
    [event] = events
    assert event.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert (BOB, "allow", "OK", "text.echo") in await rows(alice)


async def test_without_a_token_or_certificate_https_says_how_to_authenticate(
    pki: Pki, alice: Agent
) -> None:
    async with https_client(pki, None) as client:
        response = await client.post(
            alice.https_url + REST_PATH + "/message:send",
            json=message_params("text.echo", {"text": "x"}),
            headers=V1_HEADERS,
        )
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="a2agw"'
    assert our_reason(response.json()["error"]["details"]) == "UNAUTHENTICATED"


async def test_a_bound_jwt_svid_is_taken_on_grpc_and_another_identity_is_refused(
    pki: Pki, alice: Agent, svid: SvidKeys, counter: object
) -> None:
    own = (*V1, ("authorization", f"Bearer {svid.token('bob', ALICE)}"))
    other = (*V1, ("authorization", f"Bearer {svid.token('carol', ALICE)}"))
    async with A2APeer(pki, alice, "bob") as bob:
        task = await bob.stub.SendMessage(data_request("text.echo", {"text": "ok"}), metadata=own)
        assert task.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await bob.stub.SendMessage(
                data_request("kv.put", {"key": "k", "value": "v"}), metadata=other
            )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert gateway_reason(refused.value) == "TOKEN_NOT_BOUND"
    assert (await rows(alice))[-1] == (BOB, "refuse", "TOKEN_NOT_BOUND", "kv.put")


async def test_a2agw_invoke_takes_a_bound_token_and_refuses_another(
    pki: Pki, alice: Agent, issuer: SessionIssuer
) -> None:
    request = gateway_pb2.InvokeRequest(
        request_id=str(uuid.uuid4()), capability="text.echo", payload=b'{"text": "x"}'
    )
    async with raw_channel(pki, alice, "bob") as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        own = (("authorization", f"Bearer {issuer.token('bob-client', ALICE)}"),)
        answer = await stub.Invoke(request, metadata=own, timeout=10)
        assert answer.served_version
        request.request_id = str(uuid.uuid4())
        carol = (("authorization", f"Bearer {issuer.token('carol-client', ALICE)}"),)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Invoke(request, metadata=carol, timeout=10)
    assert gateway_reason(refused.value) == "TOKEN_NOT_BOUND"
    assert (await rows(alice))[-2:] == [
        (BOB, "allow", "OK", "text.echo"),
        (BOB, "refuse", "TOKEN_NOT_BOUND", "text.echo"),
    ]


def thumbprint(pki: Pki, name: str) -> str:
    cert = x509.load_pem_x509_certificate((pki.dir / f"{name}.pem").read_bytes())
    digest = hashlib.sha256(cert.public_bytes(Encoding.DER)).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


async def test_a_certificate_bound_token_needs_that_certificate(
    pki: Pki, alice: Agent, issuer: SessionIssuer
) -> None:
    # RFC 8705: cnf.x5t#S256 binds the token to bob's certificate, whatever its sub.
    bound = issuer.token("bob-client", ALICE, cnf={"x5t#S256": thumbprint(pki, "bob")})
    elsewhere = issuer.token("bob-client", ALICE, cnf={"x5t#S256": thumbprint(pki, "carol")})
    url = alice.https_url + JSONRPC_PATH
    body = jsonrpc("SendMessage", message_params("text.echo", {"text": "y"}))
    reasons = []
    for caller, token in (("bob", bound), (None, bound), ("bob", elsewhere)):
        async with https_client(pki, caller) as client:
            answer = (
                await client.post(url, json=body, headers={**V1_HEADERS, **bearer(token)})
            ).json()
        reasons.append("OK" if "result" in answer else our_reason(answer["error"]["data"]))
    assert reasons == ["OK", "TOKEN_NOT_BOUND", "TOKEN_NOT_BOUND"]


async def test_the_public_card_lists_the_bearer_and_oidc_schemes(
    pki: Pki, alice: Agent, issuer: SessionIssuer
) -> None:
    async with https_client(pki, None) as client:
        card = (await client.get(alice.https_url + "/.well-known/agent-card.json")).json()
    schemes = card["securitySchemes"]
    assert set(schemes) == {"mtls", "bearer", "oidc-corp"}
    assert schemes["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert schemes["oidc-corp"]["openIdConnectSecurityScheme"]["openIdConnectUrl"] == (
        issuer.url + "/.well-known/openid-configuration"
    )
    assert card["securityRequirements"] == [
        {"schemes": {"mtls": {}}},
        {"schemes": {"bearer": {}}},
    ]


async def test_push_config_methods_identify_the_caller_by_its_token(
    pki: Pki, tmp_path: Path, issuer: SessionIssuer, svid: SvidKeys, counter: WriteCounter
) -> None:
    grants = alice_grants()
    grants[0] = {**grants[0], "push_hosts": ["127.0.0.1"]}
    policy = write_policy(tmp_path / "alice-policy.toml", grants)
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    config = with_tokens(with_push(config), token_settings(issuer, svid))
    alice = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    token = issuer.token("bob-client", ALICE)
    headers = {**bearer(token), **V1_HEADERS}
    try:
        async with httpx.AsyncClient(verify=ca_only(pki), headers=headers, timeout=20) as http:
            url = alice.https_url + JSONRPC_PATH
            sent = await http.post(
                url, json=jsonrpc("SendMessage", message_params("text.echo", {"text": "hi"}))
            )
            task_id = sent.json()["result"]["task"]["id"]
            hook = {"taskId": task_id, "id": "hook-1", "url": "https://127.0.0.1:9/hook"}
            made = await http.post(url, json=jsonrpc("CreateTaskPushNotificationConfig", hook))
            listed = await http.post(
                url, json=jsonrpc("ListTaskPushNotificationConfigs", {"taskId": task_id})
            )
        assert made.json()["result"]["id"] == "hook-1"  # the token's caller: its own task
        assert [c["id"] for c in listed.json()["result"]["configs"]] == ["hook-1"]
        before = len(await rows(alice))
        forged = (*V1, ("authorization", "Bearer not.a.token"))
        async with A2APeer(pki, alice, "bob") as bob:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await bob.stub.ListTaskPushNotificationConfigs(
                    a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task_id),
                    metadata=forged,
                )
        assert gateway_reason(refused.value) == "TOKEN_INVALID"  # as on every other method
        assert (await rows(alice))[before:] == [(BOB, "refuse", "TOKEN_INVALID", "")]
    finally:
        await alice.stop()
