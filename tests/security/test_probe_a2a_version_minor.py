"""Probe: an A2A version this agent does not speak (``1.1``, ``2.0``) is VERSION_NOT_SUPPORTED.

A2A 1.0, section 3.6: the version is ``Major.Minor`` (patch numbers "MUST not be
considered"); 3.6.2: "Agents MUST process requests using the semantics of the
requested A2A-Version (matching Major.Minor). If the version is not supported by
the interface, agents MUST return a VersionNotSupportedError." The a2a-sdk's own
``validate_version`` does exactly that (major and minor must match, patch ignored).
This agent's card lists protocol version ``1.0`` only.

Defect found: ``speaks_1x`` took any version whose major is ``1`` as spoken:
``A2A-Version: 1.1`` (a minor this agent does not implement), ``1.99``, and even
``1.x`` were served with 1.0 semantics, on gRPC (metadata ``a2a-version``) and
on both HTTP bindings, instead of ``VERSION_NOT_SUPPORTED``. ``2.0`` was
refused, as it should be. (docs/a2a.md and docs/a2a-http.md state the
``1.x`` rule; the spec's rule is ``1.0``.)

Expected: ``1.0`` and ``1.0.N`` (patch ignored) are served; ``1.1``, ``1.99``,
``1.x`` and ``2.0`` are refused ``UNIMPLEMENTED``/``VERSION_NOT_SUPPORTED``
(JSON-RPC ``-32009``; REST 400 with the same reason), audited once under the
caller, and the capability never runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.a2a_http_support import https_client, jsonrpc, message_params, our_reason, serving_https
from tests.a2a_support import A2APeer, data_request, error_infos
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)

BOB = spiffe("bob")
UNSPOKEN = ["1.1", "1.99", "1.x", "2.0"]
SPOKEN = ["1.0", "1.0.7"]


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, counter: WriteCounter) -> AsyncIterator[Agent]:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["notes.write"])])
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    yield agent
    await agent.stop()


async def _last(agent: Agent) -> tuple[str, str, str]:
    await agent.audit.flush()
    record = audit_rows(agent.config.audit_db)[-1]
    return record.peer_id, record.reason, record.detail


@pytest.mark.parametrize("version", UNSPOKEN)
async def test_grpc_refuses_a_version_it_does_not_speak(
    pki: Pki, alice: Agent, counter: WriteCounter, version: str
) -> None:
    async with A2APeer(pki, alice, "bob") as bob:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bob.stub.SendMessage(
                data_request("notes.write", {"note": "n"}),
                metadata=(("a2a-version", version),),
                timeout=10,
            )
    assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert error_infos(info.value) == [
        ("a2a-protocol.org", "VERSION_NOT_SUPPORTED"),
        ("a2agw.v1", "VERSION_NOT_SUPPORTED"),
    ]
    assert await _last(alice) == (BOB, "VERSION_NOT_SUPPORTED", "A2A SendMessage")
    assert counter.calls == 0


@pytest.mark.parametrize("version", SPOKEN)
async def test_grpc_serves_1_0_with_or_without_a_patch(
    pki: Pki, alice: Agent, counter: WriteCounter, version: str
) -> None:
    async with A2APeer(pki, alice, "bob") as bob:
        answer = await bob.stub.SendMessage(
            data_request("notes.write", {"note": "n"}),
            metadata=(("a2a-version", version),),
            timeout=10,
        )
    assert answer.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert counter.calls == 1


@pytest.mark.parametrize("version", UNSPOKEN)
async def test_jsonrpc_refuses_a_version_it_does_not_speak(
    pki: Pki, alice: Agent, counter: WriteCounter, version: str
) -> None:
    params = message_params("notes.write", {"note": "n"})
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=jsonrpc("SendMessage", params),
            headers={"A2A-Version": version},
        )
    body = answer.json()
    assert "error" in body, body
    assert (body["error"]["code"], our_reason(body["error"]["data"])) == (
        -32009,
        "VERSION_NOT_SUPPORTED",
    )
    assert await _last(alice) == (BOB, "VERSION_NOT_SUPPORTED", "A2A SendMessage")
    assert counter.calls == 0


@pytest.mark.parametrize("version", UNSPOKEN)
async def test_rest_refuses_a_version_it_does_not_speak(
    pki: Pki, alice: Agent, counter: WriteCounter, version: str
) -> None:
    params = message_params("notes.write", {"note": "n"})
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            alice.https_url + REST_PATH + "/message:send",
            json=params,
            headers={"A2A-Version": version},
        )
    assert answer.status_code == 400, answer.text
    assert our_reason(answer.json()["error"]["details"]) == "VERSION_NOT_SUPPORTED"
    assert await _last(alice) == (BOB, "VERSION_NOT_SUPPORTED", "A2A SendMessage")
    assert counter.calls == 0
