"""Push notifications as the official JavaScript SDK (@a2a-js/sdk) sets them, on all three bindings.

alice serves gRPC and HTTPS in this process with ``[push]`` on; bob's grant
names ``127.0.0.1`` as a webhook host. tests/interop/node-a2a/push_client.mjs
sends, per binding, a blocking text.echo carrying a webhook, then creates,
gets, lists and deletes a second config on that task. The webhook (a real
HTTPS server with its own CA) records what alice sends, and
tests/interop/node-a2a/verify_notification.mjs checks every notification's
JWS with ``node:crypto`` alone, as a receiver in another language would.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.runtime.agent import Agent
from tests.a2a_http_support import serving_https
from tests.integration.a2a.test_a2a_long_tasks import summary
from tests.interop.node_projects import A2A_JS, node_ready
from tests.push_receiver import Delivered, WebhookReceiver, with_push
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

BINDINGS = ("JSONRPC", "HTTP+JSON", "GRPC")
ALICE = spiffe("alice")


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(tmp_path / "webhook") as webhook:
        yield webhook


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, receiver: WebhookReceiver) -> AsyncIterator[Agent]:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [{**grant("bob", ["text.echo"]), "push_hosts": ["127.0.0.1"]}],
    )
    plain = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(
        with_push(plain, receiver.ca), standard_registry(WriteCounter(), tmp_path / "state")
    )
    yield agent
    await agent.stop()


async def node(script: str, config: Path) -> Any:
    process = await asyncio.create_subprocess_exec(
        "node",
        str(A2A_JS / script),
        str(config),
        cwd=A2A_JS,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()[-3000:]
    return json.loads(out)


def binding_of(delivered: Delivered) -> str:
    return delivered.path.split("binding=", 1)[1].replace("%2B", "+")


async def test_the_js_sdk_sets_webhooks_and_a_js_receiver_verifies_every_notification(
    pki: Pki, tmp_path: Path, alice: Agent, receiver: WebhookReceiver
) -> None:
    node_ready(A2A_JS, "@a2a-js/sdk")
    config = tmp_path / "push-client.json"
    config.write_text(
        json.dumps(
            {
                "https_url": alice.https_url.replace("127.0.0.1", "localhost"),
                "server_id": ALICE,
                "ca": str(pki.dir / "ca.pem"),
                "cert": str(pki.dir / "bob.pem"),
                "key": str(pki.dir / "bob.key"),
                "webhook": receiver.url(),
            }
        )
    )
    answer = await node("push_client.mjs", config)
    for binding in BINDINGS:
        got = answer[binding]
        assert "error" not in got, got
        assert got["transport"] == binding
        assert got["state"] in (3, "TASK_STATE_COMPLETED")
        assert got["made"]["id"] == "later" and got["made"]["taskId"] == got["task"]
        assert got["got"] == {"id": "later", "token": "token-later", "scheme": "Bearer"}
        assert got["listed"] == ["on-send", "later"]
        assert "TaskNotFound" in got["gone"], got
        assert got["refused"] != "accepted", got
    delivered = await receiver.wait(3 * len(BINDINGS))
    for binding in BINDINGS:
        mine = [d for d in delivered if binding_of(d) == binding]
        assert [summary(d.event()) for d in mine] == [
            "status:WORKING",
            "artifact:output",
            "status:COMPLETED",
        ]
        assert {d.headers["authorization"] for d in mine} == {"Bearer secret-on-send"}
        assert {
            d.event().status_update.task_id or d.event().artifact_update.task_id for d in mine
        } == {answer[binding]["task"]}
    checks = tmp_path / "notifications.json"
    checks.write_text(
        json.dumps(
            {
                "ca": str(pki.dir / "ca.pem"),
                "agent": ALICE,
                "notifications": [
                    {
                        "url": receiver.url(path=d.path),
                        "body_b64": base64.b64encode(d.body).decode(),
                        "signature": d.headers["x-a2a-notification-signature"],
                    }
                    for d in delivered
                ]
                + [  # the same signature over another body: refused
                    {
                        "url": receiver.url(path=delivered[0].path),
                        "body_b64": base64.b64encode(delivered[1].body).decode(),
                        "signature": delivered[0].headers["x-a2a-notification-signature"],
                    }
                ],
            }
        )
    )
    verdicts = await node("verify_notification.mjs", checks)
    assert [v["ok"] for v in verdicts] == [True] * len(delivered) + [False]
    await alice.audit.flush()
    rows = [r for r in audit_rows(alice.config.audit_db) if r.detail.startswith("A2A push")]
    assert len(rows) == len(delivered) and {r.reason for r in rows} == {"OK"}
    assert [v["jti"] for v in verdicts[:-1]] == [
        d.verified((pki.dir / "ca.pem").read_bytes(), ALICE, receiver.url(path=d.path))["jti"]
        for d in delivered
    ]
