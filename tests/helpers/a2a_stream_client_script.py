"""An a2a-sdk streaming client, run as its own process against ``a2a-gateway serve``.

Usage: python a2a_stream_client_script.py ADDRESS SERVER_SPIFFE_ID CA CERT KEY
Streams ``text.echo`` (SendStreamingMessage), then starts ``job.hang`` with
``return_immediately`` (the SDK's polling mode). Prints one JSON object: the
stream's events in order, and the background task's id and first state.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

from a2a.client import ClientConfig, ClientFactory, minimal_agent_card
from a2a.types import AgentCapabilities, Message, Part, Role, SendMessageRequest, StreamResponse
from a2a_client_script import a2a_state_name, mtls_channel
from google.protobuf import json_format, struct_pb2


def summary(event: StreamResponse) -> str:
    kind = event.WhichOneof("payload")
    if kind == "task":
        return f"task:{a2a_state_name(event.task.status.state)}"
    if kind == "status_update":
        return f"status:{a2a_state_name(event.status_update.status.state)}"
    return f"artifact:{json.dumps(json_format.MessageToDict(event.artifact_update.artifact.parts[0].data))}"


def message(capability: str, payload: dict[str, object]) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            parts=[Part(data=json_format.ParseDict(payload, struct_pb2.Value()))],
            metadata={"a2agw.capability": capability},
        )
    )


async def main(address: str, server_id: str, ca: str, cert: str, key: str) -> dict[str, object]:
    channel = mtls_channel(address, server_id, ca, cert, key)
    card = minimal_agent_card(address, ["GRPC"])
    card.capabilities.CopyFrom(AgentCapabilities(streaming=True))  # as the agent's card says

    def client(**mode: bool):  # type: ignore[no-untyped-def]
        config = ClientConfig(
            supported_protocol_bindings=["GRPC"], grpc_channel_factory=lambda url: channel, **mode
        )
        return ClientFactory(config).create(card)

    streamed = [
        summary(e)
        async for e in client(streaming=True).send_message(message("text.echo", {"text": "hi"}))
    ]
    [submitted] = [
        e
        async for e in client(streaming=False, polling=True).send_message(
            message("job.hang", {"tag": "crash"})
        )
    ]
    await channel.close()
    return {
        "stream": streamed,
        "hang_task": submitted.task.id,
        "hang_state": a2a_state_name(submitted.task.status.state),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:6]))))
