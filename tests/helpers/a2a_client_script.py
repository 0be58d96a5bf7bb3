"""A new user's a2a-sdk client, run as its own process against ``a2a-gateway serve``.

Usage: python a2a_client_script.py ADDRESS SERVER_SPIFFE_ID CA CERT KEY
Prints one JSON object: the caller's card skills, a SendMessage answer, GetTask
and a refusal. Mirrors the client in docs/a2a.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path

import grpc
from a2a.client import ClientConfig, ClientFactory, minimal_agent_card
from a2a.types import (
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
)
from google.protobuf import json_format, struct_pb2

from policies.identity import svid_dns_name


def mtls_channel(address: str, server_id: str, ca: str, cert: str, key: str) -> grpc.aio.Channel:
    """An mTLS channel that only talks to the agent holding ``server_id``."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes(),
        certificate_chain=Path(cert).read_bytes(),
    )
    name = svid_dns_name(server_id)  # the server's certificate carries this DNS name
    return grpc.aio.secure_channel(
        address,
        credentials,
        options=[("grpc.ssl_target_name_override", name), ("grpc.default_authority", name)],
    )


async def main(address: str, server_id: str, ca: str, cert: str, key: str) -> dict[str, object]:
    channel = mtls_channel(address, server_id, ca, cert, key)
    config = ClientConfig(
        streaming=False,
        supported_protocol_bindings=["GRPC"],
        grpc_channel_factory=lambda url: channel,
    )
    client = ClientFactory(config).create(minimal_agent_card(address, ["GRPC"]))
    card = await client.get_extended_agent_card(GetExtendedAgentCardRequest())

    data = json_format.ParseDict({"query": "audit", "limit": 1}, struct_pb2.Value())
    message = Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(data=data)],
        metadata={"a2agw.capability": "text.search@^1"},
    )
    [event] = [e async for e in client.send_message(SendMessageRequest(message=message))]
    task = event.task
    again = await client.get_task(GetTaskRequest(id=task.id))

    refused = Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(data=json_format.ParseDict({"key": "k"}, struct_pb2.Value()))],
        metadata={"a2agw.capability": "kv.get"},
    )
    try:
        [_ async for _ in client.send_message(SendMessageRequest(message=refused))]
        refusal = "none"
    except Exception as err:  # the SDK's A2AClientError, carrying the gRPC status
        refusal = str(err)
    await channel.close()
    return {
        "skills": [skill.id for skill in card.skills],
        "state": a2a_state_name(task.status.state),
        "output": json_format.MessageToDict(task.artifacts[0].parts[0].data),
        "artifact_metadata": json_format.MessageToDict(task.artifacts[0].metadata),
        "get_task_state": a2a_state_name(again.status.state),
        "refusal": refusal,
    }


def a2a_state_name(state: int) -> str:
    from a2a.types import a2a_pb2

    return str(a2a_pb2.TaskState.Name(state))


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:6]))))
