"""Agent cards over HTTPS and gRPC: every interface listed, the extended card on all three,
every card signed by the holder of the agent's SPIFFE ID."""

from __future__ import annotations

from pathlib import Path

import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format

from capabilities.registry import CapabilityRegistry
from gateway.errors import Unauthenticated
from gateway.runtime.agent import Agent
from gateway.server.a2a.card_signing import verify_card
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.a2a_http_support import V1_HEADERS, https_client, jsonrpc
from tests.a2a_support import V1, A2APeer
from tests.support import Pki, spiffe, started


def card_of(document: dict[str, object]) -> a2a_pb2.AgentCard:
    return json_format.ParseDict(document, a2a_pb2.AgentCard(), ignore_unknown_fields=True)


async def test_the_public_card_needs_no_certificate_and_lists_every_interface(
    pki: Pki, alice: Agent
) -> None:
    async with https_client(pki, None) as client:
        response = await client.get(alice.https_url + "/.well-known/agent-card.json")
    assert response.status_code == 200
    document = response.json()
    card = card_of(document)
    assert [(i.protocol_binding, i.url, i.protocol_version) for i in card.supported_interfaces] == [
        ("GRPC", alice.address, "1.0"),
        ("JSONRPC", alice.https_url + JSONRPC_PATH, "1.0"),
        ("HTTP+JSON", alice.https_url + REST_PATH, "1.0"),
        ("JSONRPC", alice.https_url + JSONRPC_PATH, "0.3"),  # [a2a] v0_3_compat (default)
        ("HTTP+JSON", alice.https_url + REST_PATH, "0.3"),
    ]
    # The v0.3 fields, from the first 0.3 interface: what a 0.3 client reads.
    assert (document["url"], document["preferredTransport"], document["protocolVersion"]) == (
        alice.https_url + JSONRPC_PATH,
        "JSONRPC",
        "0.3",
    )
    assert document["additionalInterfaces"] == [
        {"transport": "HTTP+JSON", "url": alice.https_url + REST_PATH}
    ]
    assert document["securitySchemes"]["mtls"]["type"] == "mutualTLS"
    assert not card.skills and card.capabilities.extended_agent_card
    assert card.capabilities.streaming  # truthful: SendStreamingMessage and SubscribeToTask stream
    verify_card(card, (pki.dir / "ca.pem").read_bytes(), spiffe("alice"))


async def test_the_extended_card_is_the_callers_on_all_three_bindings(
    pki: Pki, alice: Agent
) -> None:
    async with https_client(pki, "bob") as client:
        rpc = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=jsonrpc("GetExtendedAgentCard", {}),
            headers=V1_HEADERS,
        )
        rest = await client.get(
            alice.https_url + REST_PATH + "/extendedAgentCard", headers=V1_HEADERS
        )
    async with A2APeer(pki, alice, "bob") as peer:
        grpc_card = await peer.stub.GetExtendedAgentCard(
            a2a_pb2.GetExtendedAgentCardRequest(), metadata=V1
        )
    cards = [card_of(rpc.json()["result"]), card_of(rest.json()), grpc_card]
    ca = (pki.dir / "ca.pem").read_bytes()
    for card in cards:
        assert sorted(skill.id for skill in card.skills) == [
            "kv.get",
            "kv.put",
            "notes.write",
            "text.echo",
            "text.search",
        ]
        assert len(card.supported_interfaces) == 5  # 1.0 on three bindings, 0.3 on two
        verify_card(card, ca, spiffe("alice"))


async def test_a_card_does_not_verify_for_another_id_or_after_a_change(
    pki: Pki, alice: Agent
) -> None:
    card = alice.public_card.get()
    ca = (pki.dir / "ca.pem").read_bytes()
    with pytest.raises(Unauthenticated, match="another SPIFFE ID"):
        verify_card(card, ca, spiffe("bob"))
    tampered = a2a_pb2.AgentCard()
    tampered.CopyFrom(card)
    tampered.supported_interfaces[1].url = "https://evil.example:443/a2a/jsonrpc"
    with pytest.raises(Unauthenticated, match="does not verify"):
        verify_card(tampered, ca, spiffe("alice"))
    garbled = a2a_pb2.AgentCard()
    garbled.CopyFrom(card)
    garbled.signatures[0].protected = "not-base64-json"
    with pytest.raises(Unauthenticated, match="cannot be read"):
        verify_card(garbled, ca, spiffe("alice"))
    foreign_ca = (pki.foreign_dir / "ca.pem").read_bytes()
    with pytest.raises(Unauthenticated, match="chain does not verify"):
        verify_card(card, foreign_ca, spiffe("alice"))


async def test_the_cards_list_the_configured_public_url(
    pki: Pki, alice: Agent, tmp_path: Path
) -> None:
    bound = [i.url for i in alice.public_card.get().supported_interfaces]
    assert bound[0] == alice.address  # gRPC: listen's host and the bound port, by default
    public = alice.config.a2a.model_copy(
        update={"http_url": "https://alice.example:443", "grpc_address": "alice.example:8443"}
    )
    behind_a_proxy = alice.config.model_copy(
        update={
            "a2a": public,
            "audit_db": tmp_path / "public-audit.sqlite",
            "state_dir": tmp_path / "public-state",
        }
    )
    agent = await started(behind_a_proxy, CapabilityRegistry())
    try:
        card = agent.public_card.get()
    finally:
        await agent.stop()
    assert [i.url for i in card.supported_interfaces] == [
        "alice.example:8443",
        *2
        * [
            "https://alice.example:443" + JSONRPC_PATH,
            "https://alice.example:443" + REST_PATH,
        ],
    ]
