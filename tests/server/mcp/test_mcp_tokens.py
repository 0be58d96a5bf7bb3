"""MCP callers identified by a bearer token (``[identity.tokens]``), as on the A2A HTTPS door.

With ``token_only_callers``, an MCP client without a client certificate is the
SPIFFE ID of its JWT-SVID (``Authorization: Bearer``), and the official SDK's
client sends one as any MCP client sends its OAuth token. Without a token or
certificate, the 401 says how to authenticate (RFC 6750).
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.config import AgentConfig, IdentitySettings
from gateway.runtime.agent import Agent
from tests.helpers.agents import Pki, agent_config, audit_rows, grant, spiffe, started, write_policy
from tests.helpers.mcp import modern_call, raw_client, serving_mcp
from tests.helpers.token_issuer import SigningKey, es256_key, sign

ALICE = spiffe("alice")


async def _alice(pki: Pki, tmp_path: Path, *, single_use: bool = False) -> tuple[Agent, SigningKey]:
    """alice taking JWT-SVIDs of example.org on her MCP door, and the key that signs them."""
    key = es256_key("svid-1")
    bundle = tmp_path / "jwt-bundle.json"
    bundle.write_text(json.dumps({"keys": [{**key.jwk(), "use": "jwt-svid"}]}))
    identity = IdentitySettings.model_validate(
        {
            "tokens": {
                "token_only_callers": True,
                "issuers": [
                    {
                        "name": "spire",
                        "kind": "jwt-svid",
                        "trust_domain": "example.org",
                        "jwks_file": str(bundle),
                        "single_use_jti": single_use,
                    }
                ],
            }
        }
    )
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    plain = serving_mcp(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    config = AgentConfig.model_validate({**plain.model_dump(), "identity": identity.model_dump()})
    return await started(config), key


def _bobs_token(key: SigningKey, **claims: Any) -> str:
    now = int(time.time())
    return sign(key, {"sub": spiffe("bob"), "aud": [ALICE], "iat": now, "exp": now + 300, **claims})


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path) -> AsyncIterator[tuple[Agent, str]]:
    """alice taking JWT-SVIDs of example.org on her MCP door; the token bob presents."""
    agent, key = await _alice(pki, tmp_path)
    yield agent, _bobs_token(key)
    await agent.stop()


async def _records(agent: Agent) -> list[tuple[str, str, str]]:
    await agent.audit.flush()
    return [(r.peer_id, r.capability, r.reason) for r in audit_rows(agent.config.audit_db)]


async def test_a_bearer_token_alone_is_the_mcp_callers_identity(
    alice: tuple[Agent, str], pki: Pki
) -> None:
    agent, token = alice
    ca_only = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(verify=ca_only, headers=headers, timeout=20) as http:
        async with Client(streamable_http_client(agent.mcp_url, http_client=http)) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            result = await client.call_tool("text.echo", {"text": "by token"})
    body, call_headers = modern_call("text.echo", {"text": "hi"})
    async with raw_client(pki, None) as http:
        anonymous = await http.post(agent.mcp_url, json=body, headers=call_headers)
        forged = await http.post(
            agent.mcp_url, json=body, headers={**call_headers, "Authorization": "Bearer not.a.jwt"}
        )

    assert tools == ["text.echo"]
    assert result.structured_content == {"text": "by token"}
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == 'Bearer realm="a2agw"'
    assert forged.status_code == 401
    assert forged.headers["www-authenticate"] == 'Bearer realm="a2agw", error="invalid_token"'
    assert forged.json()["error"]["data"]["reason"] == "TOKEN_INVALID"
    assert (spiffe("bob"), "text.echo", "OK") in await _records(agent)


async def test_a_single_use_token_opens_one_mcp_request(pki: Pki, tmp_path: Path) -> None:
    # Verified once at the door: the tools/call behind it does not spend it a second time.
    agent, key = await _alice(pki, tmp_path, single_use=True)
    try:
        token = _bobs_token(key, jti=str(uuid.uuid4()))
        body, headers = modern_call("text.echo", {"text": "hi"})
        async with raw_client(pki, None) as http:
            answers = [
                await http.post(
                    agent.mcp_url,
                    json=body,
                    headers={**headers, "Authorization": f"Bearer {token}"},
                )
                for _ in range(2)
            ]
        records = await _records(agent)
    finally:
        await agent.stop()
    assert [a.status_code for a in answers] == [200, 401]
    assert answers[0].json()["result"]["structuredContent"] == {"text": "hi"}
    assert answers[1].json()["error"]["data"]["reason"] == "TOKEN_REPLAYED"
    assert records == [(spiffe("bob"), "text.echo", "OK"), ("", "", "TOKEN_REPLAYED")]


@pytest.mark.parametrize(
    ("caller", "times", "reason"),
    [("carol", 1, "TOKEN_NOT_BOUND"), ("bob", 2, "TOKEN_INVALID")],
    ids=["bound-to-another-certificate", "two-authorization-headers"],
)
async def test_a_token_beside_another_certificate_or_sent_twice_is_refused(
    alice: tuple[Agent, str], pki: Pki, caller: str, times: int, reason: str
) -> None:
    agent, token = alice
    body, headers = modern_call("text.echo", {"text": "hi"})
    sent = [*headers.items(), *[("Authorization", f"Bearer {token}")] * times]
    async with raw_client(pki, caller) as http:
        response = await http.post(agent.mcp_url, json=body, headers=sent)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="a2agw", error="invalid_token"'
    assert response.json()["error"]["data"]["reason"] == reason
    assert await _records(agent) == [(spiffe(caller), "", reason)]
