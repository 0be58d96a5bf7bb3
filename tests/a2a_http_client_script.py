"""A new user's a2a-sdk client over HTTPS, run as its own process against ``a2a-gateway serve``.

Usage: python a2a_http_client_script.py URL SERVER_SPIFFE_ID CA CERT KEY BINDING [TASK_ID]

``BINDING``: ``default`` (the SDK's default ClientConfig: JSON-RPC, streaming
on; only the mTLS httpx client is ours) or ``rest`` (HTTP+JSON preferred).
Prints one JSON object: the card check, the caller's skills, a SendMessage
answer (data), the refusal of a text part, a CAPABILITY_NOT_GRANTED refusal,
and, given TASK_ID (another peer's task), what GetTask says about it.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import (
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
)
from google.protobuf import json_format, struct_pb2

from gateway.transport.a2a.card_signing import verify_card


def message(capability: str, part: Part) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            parts=[part],
            metadata={"a2agw.capability": capability},
        )
    )


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


async def main(
    url: str, server_id: str, ca: str, cert: str, key: str, binding: str, other_task: str
) -> dict[str, Any]:
    tls = ssl.create_default_context(cafile=ca)
    tls.load_cert_chain(cert, key)
    http = httpx.AsyncClient(verify=tls, timeout=10.0)
    ca_pem = Path(ca).read_bytes()  # noqa: ASYNC240 - once, before any call
    config = ClientConfig(httpx_client=http)
    if binding == "rest":
        config = ClientConfig(httpx_client=http, supported_protocol_bindings=["HTTP+JSON"])
    client = await create_client(
        url, config, signature_verifier=lambda card: verify_card(card, ca_pem, server_id)
    )
    card = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
    data = json_format.ParseDict({"text": "hello"}, struct_pb2.Value())
    [event] = [e async for e in client.send_message(message("text.echo", Part(data=data)))]
    out: dict[str, Any] = {
        "skills": sorted(skill.id for skill in card.skills),
        "state": a2a_state(event.task.status.state),
        "output": json_format.MessageToDict(event.task.artifacts[0].parts[0].data),
        "task_id": event.task.id,
    }

    async def first(request: SendMessageRequest) -> None:
        [_ async for _ in client.send_message(request)]

    out["text_part"] = await refusal(first(message("text.echo", Part(text="hello"))))
    out["not_granted"] = await refusal(first(message("kv.get", Part(data=data))))
    if other_task:
        out["other_task"] = await refusal(client.get_task(GetTaskRequest(id=other_task)))
    await client.close()
    await http.aclose()
    return out


def a2a_state(state: int) -> str:
    from a2a.types import a2a_pb2

    return a2a_pb2.TaskState.Name(state)


if __name__ == "__main__":
    args = sys.argv[1:]
    other = args[6] if len(args) > 6 else ""
    print(json.dumps(asyncio.run(main(*args[:6], other_task=other))))
