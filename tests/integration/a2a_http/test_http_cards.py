"""Agent cards over HTTPS and gRPC: every interface listed, the extended card on all three,
every card signed by the holder of the agent's SPIFFE ID; the public card's two forms
(1.0, and 0.3 for a request naming no version) and its caching headers."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from a2a.compat.v0_3 import types as types_v03
from a2a.types import a2a_pb2
from cryptography import x509
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor

from capabilities.registry import CapabilityRegistry
from gateway.errors import Unauthenticated
from gateway.runtime.agent import Agent
from gateway.server.a2a.card_signing import verify_card
from gateway.server.a2a.card_v0_3 import v0_3_canonical
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from gateway.server.a2a_http.card_route import MAX_AGE
from tests.a2a_http_support import V1_HEADERS, https_client, jsonrpc
from tests.a2a_support import V1, A2APeer
from tests.support import Pki, spiffe, started

CARD_PATH = "/.well-known/agent-card.json"


def card_of(document: dict[str, object]) -> a2a_pb2.AgentCard:
    return json_format.ParseDict(document, a2a_pb2.AgentCard(), ignore_unknown_fields=True)


def not_in_the_1_0_schema(value: Any, descriptor: Descriptor, path: str = "$") -> list[str]:
    """Keys the A2A 1.0 JSON schema refuses: it is made from the proto, each object taking
    its message's fields only (``additionalProperties: false``), Struct values anything."""
    if descriptor.full_name.startswith("google.protobuf."):
        return []
    fields = {field.json_name: field for field in descriptor.fields}
    extra = []
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            extra.append(f"{path}.{key}")
            continue
        kind = field.message_type
        if kind is None:
            continue
        if kind.GetOptions().map_entry:
            inner = kind.fields_by_name["value"].message_type
            for name, entry in item.items() if inner is not None else ():
                extra += not_in_the_1_0_schema(entry, inner, f"{path}.{key}.{name}")
        elif field.is_repeated:
            for index, entry in enumerate(item):
                extra += not_in_the_1_0_schema(entry, kind, f"{path}.{key}[{index}]")
        else:
            extra += not_in_the_1_0_schema(item, kind, f"{path}.{key}")
    return extra


def verifies_as_0_3(document: dict[str, Any], signature: dict[str, str]) -> bool:
    """``signature`` verifies as an a2a-sdk 0.3 client checks it: over its 0.3 model of the card."""
    header = json.loads(base64.urlsafe_b64decode(signature["protected"] + "=="))
    leaf = x509.load_der_x509_certificate(base64.b64decode(header["x5c"][0]))
    payload = base64.urlsafe_b64encode(
        v0_3_canonical(types_v03.AgentCard.model_validate(document))
    ).rstrip(b"=")
    token = f"{signature['protected']}.{payload.decode()}.{signature['signature']}"
    try:
        jwt.decode(token, leaf.public_key(), algorithms=[header["alg"]])  # type: ignore[arg-type]
    except jwt.PyJWTError:
        return False
    return True


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


async def test_a_client_naming_1_0_gets_the_card_the_1_0_schema_takes(
    pki: Pki, alice: Agent
) -> None:
    async with https_client(pki, None) as client:
        by_header = await client.get(alice.https_url + CARD_PATH, headers=V1_HEADERS)
        by_query = await client.get(alice.https_url + CARD_PATH + "?A2A-Version=1.0")
    document = by_header.json()
    assert by_query.json() == document
    assert not_in_the_1_0_schema(document, a2a_pb2.AgentCard.DESCRIPTOR) == []
    assert document["skills"] == []  # REQUIRED: present though empty
    assert len(document["signatures"]) == 1
    card = card_of(document)
    assert [i.protocol_version for i in card.supported_interfaces] == ["1.0"] * 3 + ["0.3"] * 2
    verify_card(card, (pki.dir / "ca.pem").read_bytes(), spiffe("alice"))


async def test_a_client_naming_no_version_gets_the_0_3_fields_under_their_own_signature(
    pki: Pki, alice: Agent
) -> None:
    async with https_client(pki, None) as client:
        document = (await client.get(alice.https_url + CARD_PATH)).json()
        named_0_3 = await client.get(alice.https_url + CARD_PATH, headers={"A2A-Version": "0.3"})
    assert named_0_3.json() == document
    assert not_in_the_1_0_schema(document, a2a_pb2.AgentCard.DESCRIPTOR) != []  # url, ...
    ca = (pki.dir / "ca.pem").read_bytes()
    verify_card(card_of(document), ca, spiffe("alice"))  # a 1.0 client: the first verifies
    first, second = document["signatures"]
    assert verifies_as_0_3(document, second) and not verifies_as_0_3(document, first)
    # Whoever points a 0.3 client elsewhere breaks the signature that covers what it dials.
    for field, value in [
        ("url", "https://evil.example/a2a/jsonrpc"),
        ("preferredTransport", "HTTP+JSON"),
        ("additionalInterfaces", [{"transport": "HTTP+JSON", "url": "https://evil.example"}]),
    ]:
        assert not verifies_as_0_3({**document, field: value}, second), field
        verify_card(card_of({**document, field: value}), ca, spiffe("alice"))  # 1.0 does not see it


async def test_the_card_is_cached_for_minutes_and_revalidated_by_its_etag(
    pki: Pki, alice: Agent
) -> None:
    url = alice.https_url + CARD_PATH
    async with https_client(pki, None) as client:
        v0_3, v1_0 = await client.get(url), await client.get(url, headers=V1_HEADERS)
        for answer in (v0_3, v1_0):
            assert answer.headers["cache-control"] == f"public, max-age={MAX_AGE}"
            assert answer.headers["vary"] == "A2A-Version"
            assert answer.headers["last-modified"].endswith(" GMT")
        assert v0_3.headers["etag"] != v1_0.headers["etag"]
        etag = v1_0.headers["etag"]
        again = await client.get(url, headers={**V1_HEADERS, "If-None-Match": etag})
        strong = await client.get(url, headers={**V1_HEADERS, "If-None-Match": etag[2:]})
        other = await client.get(url, headers={**V1_HEADERS, "If-None-Match": v0_3.headers["etag"]})
    assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", etag)
    assert strong.status_code == 304  # If-None-Match compares weakly
    assert other.status_code == 200 and other.json() == v1_0.json()


async def test_a_rebuilt_card_signed_anew_keeps_its_etag(pki: Pki, alice: Agent) -> None:
    # Every signing gives other ECDSA bytes (as every replica's card has): the same card.
    # (A rotation, a new x5c, changes it: test_http_rotation.py.)
    async def fetch() -> httpx.Response:
        async with https_client(pki, None) as client:
            return await client.get(alice.https_url + CARD_PATH, headers=V1_HEADERS)

    before = await fetch()
    alice.public_card.invalidate()
    after = await fetch()
    assert before.json()["signatures"] != after.json()["signatures"]
    assert before.headers["etag"] == after.headers["etag"]
