"""The A2A Java SDK's 1.0 client (1.0.0.Alpha3), its own process, against ``serve``.

tests/interop/java1: pom.xml for the classpath (resolved by Maven into a cache outside the
clone, keyed by the pom's hash, as .ci/run does), A2AClient.java run by Java's source launcher.
It reads the public card, builds one client per binding from it (the SDK picks the card's
interface for the transport it is given) and, over JSON-RPC and HTTP+JSON: SendMessage with a
data part and a text part, SendStreamingMessage (task, status updates, artifact, terminal last),
a ``return_immediately`` task polled with GetTask until completed, one cancelled, a refusal
(CAPABILITY_NOT_GRANTED), carol's task (TASK_NOT_FOUND); and one SendMessage over gRPC, one
without a certificate. Every call is one audit record.

Only the TLS context is ours, and three work-arounds for Alpha3 gaps (the gateway follows
A2A 1.0 in each; A2AClient.java marks where):

1. its card parser (protobuf ``JsonFormat``, strict) refuses fields it does not know, so the
   public card, which also carries the A2A 0.3 fields under ``[a2a] v0_3_compat`` (on by
   default), fails to parse ("description in message a2a.v1.SecurityScheme"); the spec says
   implementations SHOULD ignore unrecognized fields (5.7). The client parses it with the SDK's
   own mapping, ignoring unknown fields. With compat off the SDK's own resolver reads it as is
   (second test).
2. it sends no ``A2A-Version`` (1.0 clients MUST, 3.6.1; a missing one means 0.3, so every call
   would be VERSION_NOT_SUPPORTED); the client passes ``A2A-Version: 1.0`` as a call header
   (``ClientCallContext``, the SDK's way to add one).
3. its SendMessageConfiguration is the pre-1.0 draft's ``blocking`` (a polling client sends
   ``blocking: false``, or nothing over HTTP+JSON, false being the default), which 1.0 renamed
   ``return_immediately`` and inverted; the gateway ignores the unknown field (as the spec says)
   and blocks. A polling client's HTTP client sets ``configuration.returnImmediately``.

What Alpha3 cannot do, asserted as it is so that a fixed release shows up here:

- gRPC: its stubs are the pre-1.0 draft proto (package ``a2a.v1``, not ``lf.a2a.v1``, and other
  field numbers, e.g. SendMessageRequest.message is 1, tenant 1 in 1.0), so no 1.0 server can
  serve it: the call is refused UNIMPLEMENTED (``UNKNOWN_METHOD``, audited: the gateway
  answers every method it does not serve itself, tests/security/test_unknown_grpc_methods.py).
- HTTP+JSON errors: its HTTP client turns 401/403 into "Authorization failed" without the body,
  and its RestErrorMapper expects ``{"error": "<Java class>", "message": ...}``, not the spec's
  ``google.rpc.Status`` form (11.6): ``error`` is an object, and it throws
  UnsupportedOperationException ("JsonObject"). The reason is in the body and the audit record.
- A JSON-RPC stream refused before its first event: the gateway answers a JSON-RPC error as
  ``application/json`` (as the a2a-sdk does; the JS SDK reads it), the Java SSE reader reads only
  ``data:`` lines, so the stream just ends with no event and no error.
- A JSON-RPC error with ``"id": null`` (a refusal before the body is read, here without a
  certificate: JSON-RPC 2.0 says null when the id is not known) is refused by its parser
  ("Invalid 'id' type: JsonNull").
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
from policies.identity import svid_dns_name
from tests.helpers.agent_process import REPO
from tests.helpers.agents import Pki, spiffe
from tests.helpers.served_agent import Served, java_classpath, pkcs12_of, serve_alice

JAVA_DIR = REPO / "tests" / "interop" / "java1"
BOB = spiffe("bob")
HTTP_BINDINGS = ("JSONRPC", "HTTP+JSON")


@pytest.fixture
def served(pki: Pki, tmp_path: Path) -> Iterator[Served]:
    """alice as ``serve`` runs it, ``[a2a] v0_3_compat`` left at its default (on)."""
    yield from _serve(pki, tmp_path, None)


@pytest.fixture
def served_1_0_only(pki: Pki, tmp_path: Path) -> Iterator[Served]:
    yield from _serve(pki, tmp_path, False)


def _serve(pki: Pki, tmp_path: Path, compat: bool | None) -> Iterator[Served]:
    yield from serve_alice(
        pki,
        tmp_path,
        bob_may=["text.echo@^1", "job.pause", "job.watch"],
        bob_cap=1024,
        compat=compat,
        modules=("tests.helpers.task_capabilities",),  # the built-ins, job.pause, job.watch
    )


def run_java_client(
    pki: Pki, served: Served, tmp_path: Path, bindings: list[str], *, no_cert: bool
) -> dict[tuple[str, str], dict[str, Any]]:
    """The client's answers, by (binding, step); binding "" for the card steps."""
    classpath = java_classpath(JAVA_DIR, "interop-java1")
    config = tmp_path / "java1-client.json"
    config.write_text(
        json.dumps(
            {
                "base_url": served.process.https_url,
                "ca": str(pki.dir / "ca.pem"),
                "p12": str(pkcs12_of(pki, "bob", tmp_path / "bob.p12", b"interop")),
                "p12_password": "interop",
                "cert": str(pki.dir / "bob.pem"),
                "key": str(pki.dir / "bob.key"),
                "server_dns_name": svid_dns_name(spiffe("alice")),
                "other_task_id": served.carol_task,
                "refused_capability": "notes.delete",
                "bindings": bindings,
                "no_cert": no_cert,
            }
        )
    )
    result = subprocess.run(
        ["java", "-cp", classpath, str(JAVA_DIR / "A2AClient.java"), str(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    answers = {}
    for line in lines:
        step = json.loads(line)
        answers[(step.pop("binding"), step.pop("step"))] = step
    return answers


CAROLS = (spiffe("carol"), "text.echo", "allow", "OK")
"""The record of carol's task (made before the client runs)."""
STREAM = [
    "task:TASK_STATE_SUBMITTED",
    "status:TASK_STATE_WORKING",
    "artifact",
    "status:TASK_STATE_COMPLETED",
]


def test_the_java_sdk_1_0_client_on_json_rpc_http_json_and_grpc(
    pki: Pki, served: Served, tmp_path: Path
) -> None:
    answer = run_java_client(pki, served, tmp_path, [*HTTP_BINDINGS, "GRPC"], no_cert=True)
    assert not [key for key in answer if key[1] == "crashed"], answer
    # Work-around 1: the SDK's strict parser and the card's A2A 0.3 fields.
    sdk_card = answer[("", "sdk_card")]
    assert sdk_card["type"] == "A2AClientJSONError", sdk_card
    assert "description in message a2a.v1.SecurityScheme" in sdk_card["cause"]
    base, grpc_address = served.process.https_url, served.process.address
    card = answer[("", "card")]
    assert card == {
        "name": spiffe("alice"),
        "streaming": True,
        "extended": True,
        "interfaces": [
            ["GRPC", "1.0", grpc_address],
            ["JSONRPC", "1.0", base + JSONRPC_PATH],
            ["HTTP+JSON", "1.0", base + REST_PATH],
            ["JSONRPC", "0.3", base + JSONRPC_PATH],
            ["HTTP+JSON", "0.3", base + REST_PATH],
        ],
    }
    for binding in HTTP_BINDINGS:
        got = {step: value for (b, step), value in answer.items() if b == binding}
        for step, output in [
            ("send_data", {"text": "hello"}),
            ("send_text", {"text": "hello text"}),  # a text part becomes {"text": ...}
        ]:
            assert got[step]["events"] == ["task:TASK_STATE_COMPLETED"], (binding, got[step])
            assert (got[step]["state"], got[step]["output"]) == ("TASK_STATE_COMPLETED", output)
        assert got["stream"]["events"] == STREAM, (binding, got["stream"])
        assert got["stream"]["output"] == {"text": "streamed"}
        polled = got["polled"]
        assert polled["answered"] in {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"}, polled
        assert (polled["seen"][-1], polled["output"]) == ("TASK_STATE_COMPLETED", {"done": "p"})
        cancelled = got["cancelled"]
        assert cancelled["answered"] in {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"}, cancelled
        assert cancelled["state"] == "TASK_STATE_CANCELED", cancelled
    rpc = {step: value for (b, step), value in answer.items() if b == "JSONRPC"}
    # JSON-RPC: our reason starts the message, the spec's code and class where it has one.
    assert rpc["refused"]["error"].startswith("CAPABILITY_NOT_GRANTED: "), rpc["refused"]
    assert rpc["refused"]["code"] == -32000
    assert rpc["get_other"]["error"].startswith("TASK_NOT_FOUND: task not found"), rpc
    assert (rpc["get_other"]["a2a_error"], rpc["get_other"]["code"]) == (
        "TaskNotFoundError",
        -32001,
    )
    assert rpc["refused_stream"] == {"events": []}  # Alpha3 reads no non-SSE error body
    assert "Invalid 'id' type: JsonNull" in answer[("JSONRPC", "no_cert")]["error"]
    rest = {step: value for (b, step), value in answer.items() if b == "HTTP+JSON"}
    assert "Authorization failed" in rest["refused"]["error"]  # 403: Alpha3 drops the body
    assert "Authorization failed" in rest["refused_stream"]["error"]
    assert (rest["get_other"]["type"], rest["get_other"]["error"]) == (
        "UnsupportedOperationException",
        "JsonObject",  # Alpha3's RestErrorMapper on the spec's google.rpc.Status body
    )
    grpc_call = answer[("GRPC", "send_data")]  # Alpha3's draft a2a.v1 stubs
    assert grpc_call["error"] == (
        "Failed to send message: no method /a2a.v1.A2AService/SendMessage on this agent"
    ), grpc_call
    assert grpc_call["a2a_error"] == "UnsupportedOperationError"
    # One record per call (a read that succeeds has none), none for the card; the draft
    # gRPC method is refused UNKNOWN_METHOD.
    per_binding = Counter(
        {
            (BOB, "text.echo", "allow", "OK"): 3,
            (BOB, "job.pause", "allow", "OK"): 1,
            (BOB, "job.watch", "allow", "CANCELLED"): 1,
            (BOB, "notes.delete", "refuse", "CAPABILITY_NOT_GRANTED"): 2,
            (BOB, "", "refuse", "TASK_NOT_FOUND"): 1,
        }
    )
    expected = per_binding + per_binding
    expected[CAROLS] = 1
    expected[("", "", "refuse", "UNAUTHENTICATED")] = 1
    expected[(BOB, "", "refuse", "UNKNOWN_METHOD")] = 1
    assert served.records_once_committed(expected) == expected


def test_with_v0_3_compat_off_the_sdk_reads_the_card_itself(
    pki: Pki, served_1_0_only: Served, tmp_path: Path
) -> None:
    answer = run_java_client(pki, served_1_0_only, tmp_path, ["JSONRPC"], no_cert=False)
    assert answer[("", "sdk_card")] == {"ok": True}  # A2A.getAgentCard, no work-around
    base = served_1_0_only.process.https_url
    assert answer[("", "card")]["interfaces"] == [
        ["GRPC", "1.0", served_1_0_only.process.address],
        ["JSONRPC", "1.0", base + JSONRPC_PATH],
        ["HTTP+JSON", "1.0", base + REST_PATH],
    ]
    assert answer[("JSONRPC", "send_data")]["output"] == {"text": "hello"}
    assert answer[("JSONRPC", "stream")]["events"] == STREAM
