"""A new user's a2a-sdk client over HTTPS, run as its own process against ``a2a-gateway serve``.

Usage: python a2a_http_client_script.py URL SERVER_SPIFFE_ID CA CERT KEY BINDING [TASK_ID]

``BINDING``: ``default`` (the SDK's default ClientConfig: JSON-RPC, streaming
on, since the card says ``streaming: true``; only the mTLS httpx client is
ours) or ``rest`` (HTTP+JSON preferred, streaming on too). Prints one JSON
object: the card check, the caller's skills, a streamed data message followed
to its terminal event (the kinds of its events), a text message, a
long-running task sent with ``return_immediately`` and polled with GetTask
until it completed, one cancelled with CancelTask, the refusals of a text part
to a capability that takes no text (INVALID_INPUT) and of an ungranted
capability, what GetTask says about TASK_ID (another peer's task), and what a
client without a certificate is told.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from a2a.client import Client, ClientConfig, create_client
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    a2a_pb2,
)
from google.protobuf import json_format, struct_pb2

from gateway.server.a2a.card_signing import verify_card

TERMINAL = {
    a2a_pb2.TASK_STATE_COMPLETED,
    a2a_pb2.TASK_STATE_FAILED,
    a2a_pb2.TASK_STATE_CANCELED,
    a2a_pb2.TASK_STATE_REJECTED,
}


def message(capability: str, part: Part) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            parts=[part],
            metadata={"a2agw.capability": capability},
        )
    )


def data(payload: dict[str, Any]) -> Part:
    return Part(data=json_format.ParseDict(payload, struct_pb2.Value()))


async def refusal(call: Any) -> dict[str, Any]:
    try:
        await call
    except Exception as err:  # what the SDK raises is what we report
        return {
            "type": type(err).__name__,
            "message": str(err),
            "data": getattr(err, "data", None),
            "reason": reason_of(err),
        }
    return {"type": "none"}


def reason_of(err: Exception) -> str:
    """The gateway's reason code, wherever this SDK left it.

    JSON-RPC: ``err.data`` holds it where the spec defines the code, and the
    message always does (``JSON-RPC Error -32000: REASON: ...``). REST: the
    SDK maps only the spec's reasons to its classes; for the others its
    ``A2AClientError`` keeps the HTTP error as ``__cause__``, whose body holds it.
    """
    data = getattr(err, "data", None)
    if isinstance(data, dict) and "a2agw.reason" in data:
        return str(data["a2agw.reason"])
    response = getattr(err.__cause__, "response", None)
    if isinstance(response, httpx.Response):
        for detail in response.json()["error"]["details"]:
            if detail.get("domain") == "a2agw.v1":
                return str(detail["reason"])
    found = re.search(r"\b([A-Z][A-Z_]+): ", str(err))  # "JSON-RPC Error -32000: REASON: ..."
    return found.group(1) if found else ""


def kind(event: StreamResponse) -> str:
    """``task:SUBMITTED``, ``status:WORKING``, ``artifact``, ``message``."""
    which = event.WhichOneof("payload")
    if which == "task":
        return "task:" + state_name(event.task.status.state)
    if which == "status_update":
        return "status:" + state_name(event.status_update.status.state)
    return "artifact" if which == "artifact_update" else str(which)


async def final_task(
    client: Client, events: AsyncIterator[StreamResponse]
) -> tuple[Task, list[str]]:
    """Follow a stream to its terminal event; then the task as GetTask has it."""
    kinds: list[str] = []
    task_id = ""
    async for event in events:
        kinds.append(kind(event))
        if event.HasField("task"):
            task_id = event.task.id
    return await client.get_task(GetTaskRequest(id=task_id)), kinds


async def poll(client: Client, task_id: str, until: set[Any]) -> tuple[Task, list[str]]:
    """GetTask until the task is in one of ``until`` (bounded: 20 s)."""
    seen: list[str] = []
    for _ in range(200):
        task = await client.get_task(GetTaskRequest(id=task_id))
        if not seen or seen[-1] != state_name(task.status.state):
            seen.append(state_name(task.status.state))
        if task.status.state in until:
            return task, seen
        await asyncio.sleep(0.1)
    raise AssertionError(f"task {task_id} stayed {seen[-1]}")


async def background(client: Client, capability: str, tag: str) -> Task:
    """A task sent with ``return_immediately`` (the polling client): answered unfinished."""
    [event] = [e async for e in client.send_message(message(capability, data({"tag": tag})))]
    return event.task


def output_of(task: Task) -> Any:
    return json_format.MessageToDict(task.artifacts[-1].parts[0].data)


async def main(
    url: str, server_id: str, ca: str, cert: str, key: str, binding: str, other_task: str
) -> dict[str, Any]:
    tls = ssl.create_default_context(cafile=ca)
    tls.load_cert_chain(cert, key)
    http = httpx.AsyncClient(verify=tls, timeout=10.0)
    ca_pem = Path(ca).read_bytes()  # noqa: ASYNC240 - once, before any call
    bindings: dict[str, Any] = (
        {"supported_protocol_bindings": ["HTTP+JSON"]} if binding == "rest" else {}
    )

    def verifier(card: AgentCard) -> None:
        verify_card(card, ca_pem, server_id)

    client = await create_client(
        url, ClientConfig(httpx_client=http, **bindings), signature_verifier=verifier
    )
    polling = await create_client(
        url,
        ClientConfig(httpx_client=http, streaming=False, polling=True, **bindings),
        signature_verifier=verifier,
    )
    card = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
    task, kinds = await final_task(
        client, client.send_message(message("text.echo", data({"text": "hello"})))
    )
    texted, _ = await final_task(
        client, client.send_message(message("text.echo", Part(text="hi there")))
    )
    out: dict[str, Any] = {
        "skills": sorted(skill.id for skill in card.skills),
        "state": state_name(task.status.state),
        "output": output_of(task),
        "stream": kinds,
        "text": [state_name(texted.status.state), output_of(texted)],
    }

    started = await background(polling, "job.pause", "p")
    done, seen = await poll(polling, started.id, TERMINAL)
    out["polled"] = {
        "answered": state_name(started.status.state),
        "seen": seen,
        "output": output_of(done),
    }

    watched = await background(polling, "job.watch", f"{binding}-watch")
    await poll(polling, watched.id, {a2a_pb2.TASK_STATE_WORKING})
    canceled = await polling.cancel_task(CancelTaskRequest(id=watched.id))
    out["cancelled"] = {"id": watched.id, "state": state_name(canceled.status.state)}

    async def first(request: SendMessageRequest) -> None:
        [_ async for _ in client.send_message(request)]

    out["text_part"] = await refusal(first(message("text.search", Part(text="hello"))))
    out["not_granted"] = await refusal(first(message("kv.get", data({"key": "a"}))))
    if other_task:
        out["other_task"] = await refusal(client.get_task(GetTaskRequest(id=other_task)))
    await client.close()
    await polling.close()
    await http.aclose()
    out["no_certificate"] = await refusal(anonymous(url, ca, bindings))
    return out


async def anonymous(url: str, ca: str, bindings: dict[str, Any]) -> None:
    """The public card needs no certificate; a call without one is refused."""
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=ca)) as http:
        client = await create_client(url, ClientConfig(httpx_client=http, **bindings))
        [_ async for _ in client.send_message(message("text.echo", data({"text": "hi"})))]


def state_name(state: int) -> str:
    return str(a2a_pb2.TaskState.Name(state)).removeprefix("TASK_STATE_")


if __name__ == "__main__":
    args = sys.argv[1:]
    other = args[6] if len(args) > 6 else ""
    print(json.dumps(asyncio.run(main(*args[:6], other_task=other))))
