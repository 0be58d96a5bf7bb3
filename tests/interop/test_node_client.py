"""A client that is not ours: Node's @grpc/grpc-js calls a real agent over mTLS.

It follows docs/other-languages.md to the letter: the derived DNS
name as target name override, a ``checkServerIdentity`` that checks the server's
URI SAN, rich errors read from ``grpc-status-details-bin``. Both services are
called: a2agw.v1 (Describe, Invoke allowed and refused) and lf.a2a.v1
(SendMessage, GetExtendedAgentCard). The descriptors come from the generated
Python modules (a FileDescriptorSet made in the test), so no proto file is copied.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from a2a.types import a2a_pb2

from gateway.runtime.agent import Agent
from gateway.wire.v1 import gateway_pb2
from tests.helpers.agents import Pki, WriteCounter, audit_rows, spiffe
from tests.helpers.node_projects import GRPC_JS, descriptor_set, node_ready

NODE_DIR = GRPC_JS


async def test_node_grpc_client_calls_both_services_as_the_readme_says(
    pki: Pki, alice: Agent, counter: WriteCounter, tmp_path: Path
) -> None:
    node_ready(NODE_DIR, "@grpc/grpc-js")
    config = {
        "address": alice.address,
        "ca": str(pki.dir / "ca.pem"),
        "cert": str(pki.dir / "bob.pem"),
        "key": str(pki.dir / "bob.key"),
        "server_id": alice.config.id,
        "wrong_server_id": spiffe("carol"),
        "refused_capability": "notes.delete",
        "gateway_descriptor_set": str(
            descriptor_set(gateway_pb2.DESCRIPTOR, tmp_path / "gateway.pb")
        ),
        "a2a_descriptor_set": str(descriptor_set(a2a_pb2.DESCRIPTOR, tmp_path / "a2a.pb")),
    }
    (tmp_path / "node.json").write_text(json.dumps(config))

    process = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_DIR / "client.js"),
        str(tmp_path / "node.json"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, stderr.decode()
    answered = json.loads(stdout)

    assert answered["describe"] == ["kv.get", "kv.put", "notes.write", "text.echo", "text.search"]
    assert answered["invoke"] == {"served_version": "1.0.0", "payload": '{"text":"from node"}'}
    assert answered["refused"] == {
        "ok": False,
        "code": "PERMISSION_DENIED",
        "reasons": [{"domain": "a2agw.v1", "reason": "CAPABILITY_NOT_GRANTED"}],
        "details": "capability not granted to this peer",
    }
    assert answered["wrong_identity"] == "UNAVAILABLE"
    assert answered["send_message"] == {
        "state": "TASK_STATE_COMPLETED",
        "output": {"text": "a2a from node"},
    }
    assert answered["card_skills"] == answered["describe"]
    await alice.audit.flush()
    rows = [
        (r.peer_id, r.capability, r.decision, r.reason) for r in audit_rows(alice.config.audit_db)
    ]
    assert rows == [
        (spiffe("bob"), "text.echo", "allow", "OK"),
        (spiffe("bob"), "notes.delete", "refuse", "CAPABILITY_NOT_GRANTED"),
        (spiffe("bob"), "text.echo", "allow", "OK"),
    ]
    assert counter.calls == 0
