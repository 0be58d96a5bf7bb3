"""A plan for a user, two hops deep: every hop gets its own exchanged token, every audit names
the user and the agents acting for it.

alice runs a plan for user-9 (a user token issued to alice). Its step goes to
bob's ``relay.text``, which calls carol's ``text.echo`` through ``ctx.call_peer``.
bob's and carol's grants need a user. Each call onward carries a token made
by the session issuer's RFC 8693 endpoint for that peer alone (audience bob,
then carol), whose ``act`` names the agent that asked (alice, then bob over
alice); the raw inbound token never leaves an agent. bob's audit says
user-9 via [alice]; carol's says user-9 via [bob, alice].
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.registry import CapabilityRegistry, capability
from gateway.config import IdentitySettings
from gateway.errors import TokenNotBound, UserNotAuthorized
from gateway.plans.document.model import Plan
from gateway.plans.task import PlanTaskState
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    outbound_rule,
    spiffe,
    standard_registry,
    write_policy,
)
from tests.helpers.token_issuer import SessionIssuer, SvidKeys, token_settings, with_tokens

ALICE, BOB, CAROL = spiffe("alice"), spiffe("bob"), spiffe("carol")


class Text(ContractModel):
    text: str


def relay_registry(
    counter: WriteCounter, state: Path, users_seen: list[tuple[str, tuple[str, ...]]]
) -> CapabilityRegistry:
    registry = standard_registry(counter, state)

    @capability("relay.text", "1.0.0", risk="read", timeout=10.0)
    async def relay(inp: Text, ctx: CallContext) -> Text:
        """Echo ``text`` through carol."""
        assert ctx.call_peer is not None
        users_seen.append(("", ()) if ctx.user is None else (ctx.user.subject, ctx.user.actors))
        answer = await ctx.call_peer(CAROL, "text.echo", {"text": inp.text})
        return Text(text=str(answer["text"]))

    registry.register(relay)
    return registry


def identity(issuer: SessionIssuer, svid: SvidKeys, **change: Any) -> IdentitySettings:
    settings = token_settings(
        issuer,
        svid,
        token_only_callers=False,
        exchange_url=issuer.token_url,
        exchange_ca=str(issuer.ca_file),
        **change,
    )
    assert settings.tokens is not None
    corp = next(i for i in settings.tokens.issuers if i.name == "corp")
    clients = (("alice-client", ALICE), ("bob-client", BOB), ("carol-client", CAROL))
    issuers = (corp.model_copy(update={"clients": clients}),)
    return settings.model_copy(
        update={"tokens": settings.tokens.model_copy(update={"issuers": issuers})}
    )


@dataclass
class Chain:
    alice: Agent
    bob: Agent
    carol: Agent
    users_seen_by_bob: list[tuple[str, tuple[str, ...]]]


async def start(
    pki: Pki,
    base: Path,
    name: str,
    registry: CapabilityRegistry,
    grants: list[dict[str, Any]],
    settings: IdentitySettings,
    outbound: list[dict[str, Any]] | None = None,
    peers: list[Agent] | None = None,
) -> Agent:
    policy = write_policy(base / f"{name}-policy.toml", grants, outbound)
    config = agent_config(pki, base, name, policy, [(p.config.id, p.address) for p in peers or []])
    agent = Agent(with_tokens(config, settings), registry)
    await agent.start(watch_policy=False)
    return agent


@pytest.fixture
async def chain(
    pki: Pki, tmp_path: Path, issuer: SessionIssuer, svid: SvidKeys, counter: WriteCounter
) -> AsyncIterator[Chain]:
    settings = identity(issuer, svid)
    needs_user = {"users": "required"}
    users_seen: list[tuple[str, tuple[str, ...]]] = []
    carol = await start(
        pki,
        tmp_path,
        "carol",
        standard_registry(counter, tmp_path / "carol-state"),
        [grant("bob", ["text.echo"]) | needs_user],
        settings,
    )
    bob = await start(
        pki,
        tmp_path,
        "bob",
        relay_registry(counter, tmp_path / "bob-state", users_seen),
        [grant("alice", ["relay.text"]) | needs_user],
        settings,
        outbound=[outbound_rule("carol", ["text.echo"])],
        peers=[carol],
    )
    alice = await start(
        pki,
        tmp_path,
        "alice",
        standard_registry(counter, tmp_path / "alice-state"),
        [],
        settings,
        outbound=[outbound_rule("bob", ["relay.text"])],
        peers=[bob],
    )
    yield Chain(alice, bob, carol, users_seen)
    for agent in (alice, bob, carol):
        await agent.stop(grace=0)


def relay_plan() -> Plan:
    return Plan.model_validate(
        {
            "goal": "relay a greeting",
            "steps": [{"id": "relay", "capability": "relay.text", "input": {"text": "hello"}}],
        }
    )


async def user_rows(agent: Agent) -> list[tuple[str, str, str, str, list[str]]]:
    await agent.audit.flush()
    return [
        (r.peer_id, r.capability, r.reason, r.on_behalf_of, json.loads(r.actor_chain or "[]"))
        for r in audit_rows(agent.config.audit_db)
    ]


async def test_each_hop_gets_an_exchanged_token_and_audits_the_user_and_actors(
    chain: Chain, issuer: SessionIssuer
) -> None:
    user_token = issuer.token("user-9", ALICE, azp="alice-client", groups=["finance"])
    acting_for = await chain.alice.acting_for(user_token)
    before = len(issuer.exchanges)
    result = await chain.alice.plans.run(relay_plan(), acting_for=acting_for)

    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert result.steps["relay"].where == BOB
    assert issuer.exchanges[before:] == [
        {"actor": ALICE, "audience": BOB},
        {"actor": BOB, "audience": CAROL},
    ]
    assert await user_rows(chain.bob) == [(ALICE, "relay.text", "OK", "user-9", [ALICE])]
    assert chain.users_seen_by_bob == [("user-9", (ALICE,))]  # ctx.user, never the token
    assert await user_rows(chain.carol) == [(BOB, "text.echo", "OK", "user-9", [BOB, ALICE])]
    for agent in (chain.alice, chain.bob, chain.carol):
        assert user_token.split(".")[2].encode() not in agent.config.audit_db.read_bytes()


JWT = re.compile(rb"eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
"""A signed JWT (header and claims are JSON objects, so both start ``eyJ``)."""


def _files_holding_a_jwt(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and JWT.search(path.read_bytes())]


async def test_no_token_reaches_a_state_file_or_a_log(
    chain: Chain, issuer: SessionIssuer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The user's token and the two exchanged ones: none in any agent's files or logs.
    caplog.set_level(logging.DEBUG)
    user_token = issuer.token("user-9", ALICE, azp="alice-client", groups=["finance"])
    result = await chain.alice.plans.run(
        relay_plan(), acting_for=await chain.alice.acting_for(user_token)
    )
    for agent in (chain.alice, chain.bob, chain.carol):
        await agent.audit.flush()
    assert result.state == PlanTaskState.COMPLETED
    kept = _files_holding_a_jwt(tmp_path)
    assert kept == []
    assert JWT.search(caplog.text.encode()) is None


async def test_a_plan_for_no_user_is_refused_where_a_grant_needs_one(chain: Chain) -> None:
    result = await chain.alice.plans.run(relay_plan())
    assert result.state == PlanTaskState.FAILED
    assert await user_rows(chain.bob) == [(ALICE, "relay.text", "USER_NOT_AUTHORIZED", "", [])]
    assert await user_rows(chain.carol) == []


async def test_a_user_token_issued_to_another_agent_is_not_acted_for(
    chain: Chain, issuer: SessionIssuer
) -> None:
    token = issuer.token("user-9", ALICE, azp="bob-client")
    with pytest.raises(TokenNotBound):
        await chain.alice.acting_for(token)


async def test_a_task_keeps_its_user_and_resumes_only_for_that_user(
    chain: Chain, issuer: SessionIssuer
) -> None:
    token = issuer.token("user-9", ALICE, azp="alice-client", groups=["finance"])
    acting_for = await chain.alice.acting_for(token)
    other = await chain.alice.acting_for(
        issuer.token("user-8", ALICE, azp="alice-client", groups=["finance"])
    )
    user = (acting_for.user.subject, acting_for.user.issuer)
    await chain.alice.plan_tasks.create("t-user", relay_plan(), now_ms(), user)  # as if interrupted

    for wrong in (None, other):
        with pytest.raises(UserNotAuthorized, match="acts for a user"):
            await chain.alice.plans.resume("t-user", acting_for=wrong)
    assert await user_rows(chain.bob) == []  # nothing was sent for a wrong user

    result = await chain.alice.plans.resume("t-user", acting_for=acting_for)
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert await user_rows(chain.bob) == [(ALICE, "relay.text", "OK", "user-9", [ALICE])]
    stored = await chain.alice.plan_tasks.load("t-user")
    assert (stored.on_behalf_of, stored.user_issuer) == user


async def test_a_task_for_no_user_does_not_resume_for_one(
    chain: Chain, issuer: SessionIssuer
) -> None:
    await chain.alice.plan_tasks.create("t-none", relay_plan(), now_ms())
    token = issuer.token("user-9", ALICE, azp="alice-client", groups=["finance"])
    with pytest.raises(UserNotAuthorized, match="acts for no user"):
        await chain.alice.plans.resume("t-none", acting_for=await chain.alice.acting_for(token))
    assert await user_rows(chain.bob) == []


def now_ms() -> int:
    return int(time.time() * 1000)
