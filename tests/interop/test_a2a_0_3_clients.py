"""Clients that are not ours and speak A2A 0.3, each its own process, against ``serve``.

- a2a-go v0.3.3 (tests/interop/go/main.go, go.mod/go.sum pinned): it reads the
  public card, builds its client with ``NewFromCard`` (JSON-RPC, the card's
  ``url``/``preferredTransport``) and sends ``message/send``, ``message/stream``
  and ``tasks/get``. Built once with the machine's Go into a cache outside the
  clone, keyed by the hash of its sources.
- the A2A Java SDK 0.3.0.Final (tests/interop/java: pom.xml for the classpath,
  A2AClient.java run by Java's source launcher), JSON-RPC, streaming by default.

Only their HTTP client / TLS context is ours, for the client certificate.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.helpers.agents import Pki, spiffe
from tests.helpers.served_agent import (
    JAVA_DIR,
    Served,
    go_client,
    java_classpath,
    pkcs12_of,
    serve_alice,
)

BOB = spiffe("bob")
CAP = 1024
"""bob's max_payload_bytes on alice."""


def _serve(pki: Pki, tmp_path: Path, compat: bool | None) -> Iterator[Served]:
    yield from serve_alice(
        pki, tmp_path, bob_may=["text.echo@^1", "text.search@^1"], bob_cap=CAP, compat=compat
    )


@pytest.fixture
def served(pki: Pki, tmp_path: Path) -> Iterator[Served]:
    """alice as ``serve`` runs it, ``[a2a] v0_3_compat`` left at its default."""
    yield from _serve(pki, tmp_path, None)


@pytest.fixture
def served_1_0_only(pki: Pki, tmp_path: Path) -> Iterator[Served]:
    yield from _serve(pki, tmp_path, False)


def run_go_client(pki: Pki, served: Served, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The client's answers, by step (card, send_data, ..., no_cert)."""
    binary = go_client()
    config = tmp_path / "go-client.json"
    config.write_text(
        json.dumps(
            {
                "base_url": served.process.https_url,
                "ca": str(pki.dir / "ca.pem"),
                "cert": str(pki.dir / "bob.pem"),
                "key": str(pki.dir / "bob.key"),
                "other_task_id": served.carol_task,
                "refused_capability": "notes.delete",
                "large_bytes": 3 * CAP + 64 * 1024,  # past bob's body limit, 2 x cap + envelope
            }
        )
    )
    result = subprocess.run([str(binary), str(config)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [json.loads(line) for line in result.stdout.splitlines()]
    return {step.pop("step"): step for step in steps}


CAROLS = ("spiffe://example.org/agent/carol", "text.echo", "allow", "OK")
"""The record of carol's task (made before the client runs)."""


def test_the_a2a_go_0_3_client_with_its_defaults(pki: Pki, served: Served, tmp_path: Path) -> None:
    answer = run_go_client(pki, served, tmp_path)
    base = served.process.https_url
    assert answer["card"] == {
        "url": base + JSONRPC_PATH,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3",
        "streaming": True,
        "additionalInterfaces": [{"transport": "HTTP+JSON", "url": base + REST_PATH}],
    }
    assert answer["send_data"]["state"] == "completed"
    assert answer["send_data"]["output"] == {"text": "hello"}
    assert answer["send_text"]["output"] == {"text": "hello text"}  # a text part: {"text": ...}
    # The client keeps code and data.error: our reason is at the start of its error.
    assert answer["refused"]["error"].startswith("CAPABILITY_NOT_GRANTED: ")
    assert answer["stream"]["events"] == [  # the task first, the last event terminal
        "task:submitted",
        "status-update:working",
        "artifact-update",
        "status-update:completed",
    ]
    assert answer["get_own"] == {"id": answer["send_data"]["id"], "state": "completed"}
    assert answer["get_other"]["error"].startswith("TASK_NOT_FOUND: ")
    assert answer["get_other"]["error"].endswith(": task not found")  # -32001: its own error
    assert answer["too_large"]["error"].startswith("PAYLOAD_TOO_LARGE: the request body is ")
    assert answer["no_cert"]["error"].startswith("UNAUTHENTICATED: ")
    # One record per call (a read that succeeds has none), none for the card.
    expected = Counter(
        {
            CAROLS: 1,
            (BOB, "text.echo", "allow", "OK"): 3,
            (BOB, "notes.delete", "refuse", "CAPABILITY_NOT_GRANTED"): 1,
            (BOB, "", "refuse", "TASK_NOT_FOUND"): 1,
            (BOB, "", "refuse", "PAYLOAD_TOO_LARGE"): 1,
            ("", "", "refuse", "UNAUTHENTICATED"): 1,
        }
    )
    assert served.records_once_committed(expected) == expected


def test_with_v0_3_compat_off_the_go_client_cannot_read_the_card(
    pki: Pki, served_1_0_only: Served, tmp_path: Path
) -> None:
    # What every 0.3 client met before compat: a 1.0 card has no "type" in its
    # security scheme, no url/preferredTransport. Nothing reached the servicer.
    answer = run_go_client(pki, served_1_0_only, tmp_path)
    assert answer == {"card": {"error": "card parsing failed: unknown security scheme type "}}
    expected = Counter({CAROLS: 1})
    assert served_1_0_only.records_once_committed(expected) == expected


def test_the_java_sdk_0_3_client_with_its_defaults(
    pki: Pki, served: Served, tmp_path: Path
) -> None:
    classpath = java_classpath(JAVA_DIR, "interop-java")
    config = tmp_path / "java-client.json"
    config.write_text(
        json.dumps(
            {
                "base_url": served.process.https_url,
                "ca": str(pki.dir / "ca.pem"),
                "p12": str(pkcs12_of(pki, "bob", tmp_path / "bob.p12", b"interop")),
                "p12_password": "interop",
                "other_task_id": served.carol_task,
                "refused_capability": "notes.delete",
            }
        )
    )
    result = subprocess.run(
        ["java", "-cp", classpath, str(JAVA_DIR / "A2AClient.java"), str(config)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    answer = {step.pop("step"): step for step in map(json.loads, lines)}
    base = served.process.https_url
    assert answer["card"] == {
        "url": base + JSONRPC_PATH,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3",
        "streaming": True,
    }
    stream = [
        "task:submitted",
        "status-update:working",
        "artifact-update",
        "status-update:completed",
    ]
    for step, output in [("send_data", {"text": "hello"}), ("send_text", {"text": "hello text"})]:
        assert answer[step]["events"] == stream, answer[step]  # it streams: the card says so
        assert (answer[step]["state"], answer[step]["output"]) == ("completed", output)
    assert answer["refused"]["error"].startswith("CAPABILITY_NOT_GRANTED: ")
    assert answer["get_own"] == {"id": answer["send_data"]["id"], "state": "completed"}
    assert answer["get_other"]["error"].startswith("TASK_NOT_FOUND: ")
    assert answer["no_cert"]["error"].startswith("UNAUTHENTICATED: ")
    expected = Counter(
        {
            CAROLS: 1,
            (BOB, "text.echo", "allow", "OK"): 2,
            (BOB, "notes.delete", "refuse", "CAPABILITY_NOT_GRANTED"): 1,
            (BOB, "", "refuse", "TASK_NOT_FOUND"): 1,
            ("", "", "refuse", "UNAUTHENTICATED"): 1,
        }
    )
    assert served.records_once_committed(expected) == expected
