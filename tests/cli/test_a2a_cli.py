"""A2A as a new user meets it: ``a2a-gateway card`` and an a2a-sdk client process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.agent_process import REPO, AgentProcess
from tests.cli.test_cli import agent_files, run
from tests.support import Pki, audit_rows, grant, spiffe


def test_the_public_card_has_interfaces_and_mtls_but_no_skills(pki: Pki, tmp_path: Path) -> None:
    config = agent_files(pki, tmp_path, "alice", grants=[grant("bob", ["text.echo"])])
    result = run("card", "--config", str(config), "--url", "alice.example:7001")
    assert result.returncode == 0, result.stderr
    card = json.loads(result.stdout)
    assert card["skills"] == []  # present (REQUIRED in the 1.0 schema), and empty
    assert "text.echo" not in result.stdout and spiffe("bob") not in result.stdout
    assert card["name"] == spiffe("alice")
    assert card["supportedInterfaces"] == [
        {"url": "alice.example:7001", "protocolBinding": "GRPC", "protocolVersion": "1.0"}
    ]
    assert "mtlsSecurityScheme" in card["securitySchemes"]["mtls"]
    assert card["capabilities"]["extendedAgentCard"] is True
    assert card["capabilities"]["streaming"] is True
    extension = card["capabilities"]["extensions"][0]
    assert extension["uri"] == "urn:a2agw:capability-contracts:v1" and "params" not in extension


def test_an_a2a_sdk_client_process_against_a_served_agent(pki: Pki, tmp_path: Path) -> None:
    config = agent_files(pki, tmp_path, "alice", grants=[grant("bob", ["text.search@^1"])])
    alice = AgentProcess(config)
    try:
        address = alice.start()
        client = subprocess.run(
            [
                sys.executable,
                str(REPO / "tests" / "a2a_client_script.py"),
                address,
                spiffe("alice"),
                str(pki.dir / "ca.pem"),
                str(pki.dir / "bob.pem"),
                str(pki.dir / "bob.key"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert client.returncode == 0, client.stderr
        answer = json.loads(client.stdout)
        assert alice.terminate() == 0
    finally:
        alice.ensure_stopped()
    assert answer["skills"] == ["text.search"]
    assert answer["state"] == answer["get_task_state"] == "TASK_STATE_COMPLETED"
    assert answer["output"] == {"items": [{"id": "doc-3", "title": "Audit logs", "score": 1.0}]}
    assert answer["artifact_metadata"]["a2agw.served_version"] == "1.0.0"
    assert "PERMISSION_DENIED" in answer["refusal"]
    reasons = [r.reason for r in audit_rows(tmp_path / "alice-audit.sqlite")]
    assert reasons == ["OK", "CAPABILITY_NOT_GRANTED"]


def test_the_printed_card_lists_the_https_bindings_and_is_signed(pki: Pki, tmp_path: Path) -> None:
    from a2a.types import a2a_pb2
    from google.protobuf import json_format

    from gateway.server.a2a.card_signing import verify_card

    config = agent_files(pki, tmp_path, "alice", grants=[grant("bob", ["text.echo"])])
    config.write_text(config.read_text() + '\n[a2a]\nhttp_listen = "alice.example:7443"\n')
    result = run("card", "--config", str(config), "--url", "alice.example:7001")
    assert result.returncode == 0, result.stderr
    card = json_format.ParseDict(json.loads(result.stdout), a2a_pb2.AgentCard())
    assert [(i.protocol_binding, i.url, i.protocol_version) for i in card.supported_interfaces] == [
        ("GRPC", "alice.example:7001", "1.0"),
        ("JSONRPC", "https://alice.example:7443/a2a/jsonrpc", "1.0"),
        ("HTTP+JSON", "https://alice.example:7443/a2a/rest", "1.0"),
        ("JSONRPC", "https://alice.example:7443/a2a/jsonrpc", "0.3"),  # as served (v0_3_compat)
        ("HTTP+JSON", "https://alice.example:7443/a2a/rest", "0.3"),
    ]
    verify_card(card, (pki.dir / "ca.pem").read_bytes(), spiffe("alice"))
