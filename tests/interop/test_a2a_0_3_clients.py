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

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    load_pem_private_key,
    pkcs12,
)
from cryptography.x509 import load_pem_x509_certificate

from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.a2a_http_support import carol_task, https_certificate
from tests.agent_process import REPO, AgentProcess, write_agent_toml
from tests.support import Pki, audit_rows, grant, spiffe, write_policy

GO_DIR = REPO / "tests" / "interop" / "go"
JAVA_DIR = REPO / "tests" / "interop" / "java"
GO_CACHE = Path(os.environ.get("A2AGW_INTEROP_GO_CACHE", "/var/cache/a2agw/interop-go"))
BOB = spiffe("bob")
CAP = 1024
"""bob's max_payload_bytes on alice."""


def go_client() -> Path:
    """The built client, from the cache when its sources did not change (built if absent)."""
    if shutil.which("go") is None:
        pytest.skip("the Go toolchain is not installed (.ci/run builds the client)")
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((GO_DIR / name).read_bytes())
    binary = GO_CACHE / digest.hexdigest()[:16] / "a2a03client"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["go", "build", "-mod=readonly", "-o", str(binary), "."],
            cwd=GO_DIR,
            check=True,
            timeout=600,
        )
    return binary


class Served:
    def __init__(self, process: AgentProcess, audit_db: Path, carol_task: str) -> None:
        self.process = process
        self.audit_db = audit_db
        self.carol_task = carol_task

    def records(self) -> list[tuple[str, str, str, str]]:
        """(peer, capability, decision, reason) of every audit record committed so far."""
        return [(r.peer_id, r.capability, r.decision, r.reason) for r in audit_rows(self.audit_db)]

    def records_once_committed(self, expected: Counter[Any]) -> Counter[Any]:
        """The records, read again (for up to 10 s) until ``expected`` is committed:
        the agent commits allowed calls in batches."""
        deadline = time.monotonic() + 10.0
        while True:
            got = Counter(self.records())
            if got == expected or time.monotonic() > deadline:
                return got
            time.sleep(0.1)


def _serve(pki: Pki, tmp_path: Path, compat: bool | None) -> Iterator[Served]:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            grant("bob", ["text.echo@^1", "text.search@^1"], max_payload_bytes=CAP),
            grant("carol", ["text.echo"]),
        ],
    )
    audit_db = tmp_path / "alice-audit.sqlite"
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=audit_db,
        state_dir=tmp_path / "alice-state",
    )
    cert, key = https_certificate(pki, "alice", tmp_path / "https")
    text = config.read_text()
    text = text.replace(str(pki.dir / "alice.pem"), str(cert))
    text = text.replace(str(pki.dir / "alice.key"), str(key))
    text += '\n[a2a]\nhttp_listen = "localhost:0"\n'
    if compat is not None:
        text += f"v0_3_compat = {str(compat).lower()}\n"
    config.write_text(text)
    process = AgentProcess(config)
    try:
        process.start()
        yield Served(process, audit_db, carol_task(pki, process.https_url))
    finally:
        process.ensure_stopped()


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


def java_classpath() -> str:
    """The Java client's classpath, resolved by Maven from tests/interop/java/pom.xml (cached)."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("java/mvn not installed (.ci/run resolves the Java client)")
    digest = hashlib.sha256((JAVA_DIR / "pom.xml").read_bytes()).hexdigest()[:16]
    saved = GO_CACHE.parent / "interop-java" / digest / "classpath.txt"
    stale = saved.is_file() and not all(map(os.path.isfile, saved.read_text().split(":")))
    if not saved.is_file() or stale:  # stale: the local Maven repository was emptied
        saved.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mvn", "-q", "-B", "dependency:build-classpath", f"-Dmdep.outputFile={saved}"],
            cwd=JAVA_DIR,
            check=True,
            timeout=600,
        )
    return saved.read_text().strip()


def _pkcs12(pki: Pki, name: str, path: Path, password: bytes) -> Path:
    key = load_pem_private_key((pki.dir / f"{name}.key").read_bytes(), None)
    cert = load_pem_x509_certificate((pki.dir / f"{name}.pem").read_bytes())
    blob = pkcs12.serialize_key_and_certificates(
        name.encode(),
        key,
        cert,
        None,
        BestAvailableEncryption(password),  # type: ignore[arg-type]
    )
    path.write_bytes(blob)
    return path


def test_the_java_sdk_0_3_client_with_its_defaults(
    pki: Pki, served: Served, tmp_path: Path
) -> None:
    classpath = java_classpath()
    config = tmp_path / "java-client.json"
    config.write_text(
        json.dumps(
            {
                "base_url": served.process.https_url,
                "ca": str(pki.dir / "ca.pem"),
                "p12": str(_pkcs12(pki, "bob", tmp_path / "bob.p12", b"interop")),
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
