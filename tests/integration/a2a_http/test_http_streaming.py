"""The SSE path of the HTTP bindings, with a servicer that streams.

Today's servicer answers the streaming methods UNSUPPORTED_OPERATION (see
test_http_bindings). Here a servicer whose ``SendStreamingMessage`` is an
async generator of ``StreamResponse`` (as a streaming servicer's is) sits
behind the same edge and HTTPS server: its events reach the client as SSE on
both bindings (raw, and to the a2a-sdk client once the card says
``streaming: true``), and a refusal before the first event is the binding's
error with our reason code, audited once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from a2a.types import a2a_pb2

from gateway.agent import Agent
from gateway.errors import CapabilityNotGranted, GatewayError
from gateway.transport.a2a.servicer import A2AServicer
from gateway.transport.a2a.wire_errors import to_a2a_status
from gateway.transport.a2a_http import JSONRPC_PATH, REST_PATH, A2AHttpServer, HttpEdge
from tests.a2a_http_support import V1_HEADERS, https_client, jsonrpc, message_params, our_reason
from tests.support import Pki, audit_rows

STATES = (a2a_pb2.TASK_STATE_WORKING, a2a_pb2.TASK_STATE_COMPLETED)


class StreamingServicer(A2AServicer):
    """Streams two status updates for ``text.echo``; refuses (audited) any other capability."""

    async def SendStreamingMessage(  # type: ignore[override]
        self, request: a2a_pb2.SendMessageRequest, context: Any
    ) -> AsyncIterator[a2a_pb2.StreamResponse]:
        try:
            peer_id = await self._admit(request, context, "SendStreamingMessage")
            if request.message.metadata["a2agw.capability"] != "text.echo":
                raise await self._handler.refuse(
                    peer_id, CapabilityNotGranted("not streamed here"), "A2A SendStreamingMessage"
                )
        except GatewayError as err:
            await context.abort_with_status(to_a2a_status(err))
        for number, state in enumerate(STATES):
            if number:  # a later event comes later: the stream must outlive its first event
                await asyncio.sleep(0.3)
            update = a2a_pb2.TaskStatusUpdateEvent(task_id="t-1", context_id="c-1")
            update.status.state = state
            yield a2a_pb2.StreamResponse(status_update=update)


@pytest.fixture
async def streaming_url(alice: Agent) -> AsyncIterator[str]:
    servicer = StreamingServicer(
        alice.config.id, alice.handler, alice.a2a_tasks, alice.registry, alice.card_issuer
    )
    server = A2AHttpServer(
        HttpEdge(alice.handler, servicer, alice.public_card.get).app(), alice.tls
    )
    await server.start("localhost:0")
    yield f"https://localhost:{server.port}"
    await server.stop()


def sse_data(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


async def test_events_arrive_as_sse_on_both_bindings(pki: Pki, streaming_url: str) -> None:
    params = message_params("text.echo", {"text": "hi"})
    headers = {**V1_HEADERS, "Accept": "text/event-stream"}
    async with https_client(pki, "bob") as client:
        rpc = await client.post(
            streaming_url + JSONRPC_PATH,
            json=jsonrpc("SendStreamingMessage", params, 5),
            headers=headers,
        )
        rest = await client.post(
            streaming_url + REST_PATH + "/message:stream", json=params, headers=headers
        )
    assert rpc.headers["content-type"].startswith("text/event-stream")
    events = sse_data(rpc.text)
    assert [e["id"] for e in events] == [5, 5]
    assert [e["result"]["statusUpdate"]["status"]["state"] for e in events] == [
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    assert [e["statusUpdate"]["status"]["state"] for e in sse_data(rest.text)] == [
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]


async def test_a_refusal_before_the_first_event_is_the_bindings_error(
    pki: Pki, alice: Agent, streaming_url: str
) -> None:
    await alice.audit.flush()
    before = len(audit_rows(alice.config.audit_db))
    params = message_params("kv.get", {"key": "a"})
    async with https_client(pki, "bob") as client:
        rpc = await client.post(
            streaming_url + JSONRPC_PATH,
            json=jsonrpc("SendStreamingMessage", params),
            headers=V1_HEADERS,
        )
        rest = await client.post(
            streaming_url + REST_PATH + "/message:stream", json=params, headers=V1_HEADERS
        )
    error = rpc.json()["error"]
    assert (error["code"], our_reason(error["data"])) == (-32000, "CAPABILITY_NOT_GRANTED")
    assert rest.status_code == 403
    assert our_reason(rest.json()["error"]["details"]) == "CAPABILITY_NOT_GRANTED"
    await alice.audit.flush()
    added = audit_rows(alice.config.audit_db)[before:]
    assert [r.reason for r in added] == ["CAPABILITY_NOT_GRANTED"] * 2


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_the_sdk_client_streams_when_the_card_says_so(
    pki: Pki, alice: Agent, streaming_url: str, binding: str
) -> None:
    from a2a.client import ClientConfig, ClientFactory
    from a2a.types import SendMessageRequest
    from google.protobuf import json_format

    card = a2a_pb2.AgentCard()
    card.CopyFrom(alice.public_card.get())
    card.capabilities.streaming = True  # what a streaming servicer's card will say
    for interface in card.supported_interfaces:
        interface.url = interface.url.replace(alice.https_url, streaming_url)
    async with https_client(pki, "bob") as http:
        config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])
        client = ClientFactory(config).create(card)
        request = json_format.ParseDict(
            message_params("text.echo", {"text": "hi"}), SendMessageRequest()
        )
        events = [event async for event in client.send_message(request)]
    assert [e.status_update.status.state for e in events] == list(STATES)
