"""Users carried through calls, grants that need them, and CEL conditions over the call.

alice's grant of carol needs a user (``users = "required"``) in the group
``finance``, and its condition ``short-text`` keeps ``text`` under 12
characters. The user token comes in ``A2AGW-User-Token``, from the session's
OIDC issuer, and must have been issued to carol (its ``azp`` is
``carol-client``, or its ``act.sub`` is carol). Every refusal is one audit
record and nothing runs; an allowed call's record names the user and the
actor chain, never the token.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from gateway.runtime.agent import Agent
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.a2a_grpc import V1, A2APeer, data_request, gateway_reason
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    audit_rows,
    raw_channel,
    spiffe,
    standard_registry,
)
from tests.helpers.token_issuer import ALICE, SessionIssuer, SvidKeys, start_alice, token_settings

CAROL = spiffe("carol")


def user_token(issuer: SessionIssuer, **claims: Any) -> str:
    return issuer.token(
        claims.pop("sub", "user-42"),
        ALICE,
        **({"azp": "carol-client", "groups": ["finance"]} | claims),
    )


async def carol_sends(
    pki: Pki, agent: Agent, text: str, user: str | None, capability: str = "text.echo"
) -> str:
    """Our reason for carol's SendMessage over gRPC ("OK" when it completed)."""
    metadata = V1 if user is None else (*V1, ("a2agw-user-token", user))
    async with A2APeer(pki, agent, "carol") as carol:
        try:
            await carol.stub.SendMessage(
                data_request(capability, {"text": text}), metadata=metadata, timeout=20
            )
        except grpc.aio.AioRpcError as err:
            return gateway_reason(err)
    return "OK"


async def last_record(agent: Agent) -> tuple[str, str, str, str, str, str]:
    await agent.audit.flush()
    r = audit_rows(agent.config.audit_db)[-1]
    return (r.peer_id, r.decision, r.reason, r.on_behalf_of, r.actor_chain, r.detail)


async def test_a_grant_that_needs_a_user_refuses_a_call_without_one(pki: Pki, alice: Agent) -> None:
    assert await carol_sends(pki, alice, "hi", None) == "USER_NOT_AUTHORIZED"
    assert (await last_record(alice))[:4] == (CAROL, "refuse", "USER_NOT_AUTHORIZED", "")


async def test_the_user_and_the_actor_chain_are_audited_never_the_token(
    pki: Pki, alice: Agent, issuer: SessionIssuer
) -> None:
    token = user_token(issuer)
    assert await carol_sends(pki, alice, "hi", token) == "OK"
    record = await last_record(alice)
    assert record[:5] == (CAROL, "allow", "OK", "user-42", json.dumps([CAROL]).replace(" ", ""))
    assert token.split(".")[2].encode() not in alice.config.audit_db.read_bytes()


async def test_an_act_chain_names_every_agent_before_the_caller(
    pki: Pki, alice: Agent, issuer: SessionIssuer
) -> None:
    act = {"sub": CAROL, "act": {"sub": "bob-client", "act": {"sub": "the-portal"}}}
    token = issuer.token("user-7", ALICE, act=act, groups=["finance"])
    assert await carol_sends(pki, alice, "hi", token) == "OK"
    record = await last_record(alice)
    assert record[3] == "user-7"
    assert json.loads(record[4]) == [CAROL, spiffe("bob"), "the-portal"]


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"groups": ["engineering"]}, "USER_NOT_AUTHORIZED"),
        ({"azp": "bob-client"}, "TOKEN_NOT_BOUND"),  # issued to bob, presented by carol
        ({"act": {"sub": spiffe("bob")}}, "TOKEN_NOT_BOUND"),
    ],
)
async def test_a_user_without_the_claims_or_not_carols_is_refused(
    pki: Pki, alice: Agent, issuer: SessionIssuer, claims: dict[str, Any], reason: str
) -> None:
    assert await carol_sends(pki, alice, "hi", user_token(issuer, **claims)) == reason
    assert (await last_record(alice))[:3] == (CAROL, "refuse", reason)


@pytest.mark.parametrize(
    "claims",
    [
        {"sub": "carol-client"},  # carol's own client token (client_claim = "sub")
        {"sub": CAROL, "act": {"sub": CAROL}},  # carol acting for carol
    ],
    ids=["own-client-token", "own-spiffe-id"],
)
async def test_a_user_token_naming_the_caller_itself_names_no_user(
    pki: Pki, alice: Agent, issuer: SessionIssuer, claims: dict[str, Any]
) -> None:
    # carol's grant needs a user: her own token in the user header must not pass for one.
    token = user_token(issuer, **claims)
    assert await carol_sends(pki, alice, "hi", token) == "TOKEN_INVALID"
    record = await last_record(alice)
    detail = "corp: user token sub is the caller"
    assert record == (CAROL, "refuse", "TOKEN_INVALID", "", "", detail)
    assert [r.decision for r in audit_rows(alice.config.audit_db)] == ["refuse"]


async def test_a_condition_not_met_is_refused_naming_it(
    pki: Pki, alice: Agent, issuer: SessionIssuer
) -> None:
    reason = await carol_sends(pki, alice, "far too long a text", user_token(issuer))
    assert reason == "CONDITION_NOT_MET"
    record = await last_record(alice)
    assert record[:4] == (CAROL, "refuse", "CONDITION_NOT_MET", "user-42")
    assert record[5] == "short-text: false"


async def test_a_single_use_token_is_refused_the_second_time(
    pki: Pki, tmp_path: Path, issuer: SessionIssuer, svid: SvidKeys, counter: WriteCounter
) -> None:
    settings = token_settings(issuer, svid)
    assert settings.tokens is not None
    issuers = [
        i.model_copy(update={"single_use_jti": True}) if i.name == "corp" else i
        for i in settings.tokens.issuers
    ]
    settings = settings.model_copy(
        update={"tokens": settings.tokens.model_copy(update={"issuers": tuple(issuers)})}
    )
    agent = await start_alice(
        pki, tmp_path, settings, standard_registry(counter, tmp_path / "state")
    )
    try:
        once = user_token(issuer, jti=str(uuid.uuid4()))
        without_jti = user_token(issuer)
        reasons = [await carol_sends(pki, agent, "hi", t) for t in (once, once, without_jti)]
        assert reasons == ["OK", "TOKEN_REPLAYED", "TOKEN_INVALID"]
        assert (await last_record(agent))[:3] == (CAROL, "refuse", "TOKEN_INVALID")
    finally:
        await agent.stop()


async def test_an_agent_without_identity_tokens_refuses_them_on_grpc(
    pki: Pki, tmp_path: Path, issuer: SessionIssuer
) -> None:
    from tests.helpers.agents import agent_config, grant, started, write_policy

    policy = write_policy(tmp_path / "p.toml", [grant("bob", ["text.echo"])])
    agent = await started(agent_config(pki, tmp_path, "alice", policy))
    try:
        request = gateway_pb2.InvokeRequest(
            request_id="r-1", capability="text.echo", payload=b'{"text": "x"}'
        )
        reasons = []
        for header in ("authorization", "a2agw-user-token"):
            async with raw_channel(pki, agent, "bob") as channel:
                stub = gateway_pb2_grpc.PeerGatewayStub(channel)
                value = f"Bearer {issuer.token('bob-client', ALICE)}"
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Invoke(request, metadata=((header, value),), timeout=10)
            reasons.append(gateway_reason(refused.value))
        assert reasons == ["UNAUTHENTICATED", "UNAUTHENTICATED"]
    finally:
        await agent.stop()
