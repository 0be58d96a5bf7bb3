"""ListTasks: every bad request an audited INVALID_REQUEST; tokens that reveal nothing of others."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2
from google.protobuf import timestamp_pb2

from gateway.runtime.agent import Agent
from gateway.server.a2a.task_store.store import page_token, token_task_id
from gateway.transport.status import from_rpc_error
from tests.helpers.a2a_grpc import V1, A2APeer, data_request, raw_request
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)

BAD_TOKEN = "page_token is not a token this agent handed out to this caller"
BAD_TOKENS = [
    "²",  # str.isdigit() says yes, int() says no
    "١٢",  # Arabic-Indic digits
    "-1",
    "1",  # a row number, as tokens used to be
    "1" * 20,
    str(2**63),
    "abc",
    "x" * 300,
    "🙂",
    page_token("never-made"),
    base64.urlsafe_b64encode(b"\x00bad").decode(),
    base64.urlsafe_b64encode(b"task id!").decode(),
    base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    page_token("task-1") + "=",  # padding: not the spelling tokens have
    page_token("task-1") + "!",
]
BAD_TIMESTAMPS = [
    timestamp_pb2.Timestamp(seconds=2**62),
    timestamp_pb2.Timestamp(seconds=-(2**62)),
    timestamp_pb2.Timestamp(seconds=253_402_300_800),  # 10000-01-01
    timestamp_pb2.Timestamp(seconds=-62_135_596_801),  # before year 1
    timestamp_pb2.Timestamp(seconds=0, nanos=-1),
    timestamp_pb2.Timestamp(seconds=0, nanos=1_000_000_000),
]
GOOD_TIMESTAMPS = [
    timestamp_pb2.Timestamp(seconds=253_402_300_799, nanos=999_999_999),
    timestamp_pb2.Timestamp(seconds=-62_135_596_800),
    timestamp_pb2.Timestamp(seconds=0),
]


async def list_refusal(peer: A2APeer, request: a2a_pb2.ListTasksRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await peer.stub.ListTasks(request, metadata=V1, timeout=10)
    return info.value


async def assert_audited_invalid(
    alice: Agent, peer: A2APeer, request: a2a_pb2.ListTasksRequest
) -> str:
    """The request is INVALID_REQUEST with exactly one audit record; returns the message."""
    await alice.audit.flush()
    before = len(audit_rows(alice.config.audit_db))
    err = await list_refusal(peer, request)
    assert (err.code(), from_rpc_error(err).reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    await alice.audit.flush()
    rows = audit_rows(alice.config.audit_db)[before:]
    assert [(r.decision, r.reason, r.detail) for r in rows] == [
        ("refuse", "INVALID_REQUEST", "A2A ListTasks")
    ]
    return str(err.details())


@pytest.mark.parametrize("token", BAD_TOKENS, ids=repr)
async def test_a_malformed_page_token_is_an_audited_invalid_request(
    alice: Agent, bob: A2APeer, token: str
) -> None:
    await bob.send(data_request("text.echo", {"text": "t"}))
    details = await assert_audited_invalid(alice, bob, a2a_pb2.ListTasksRequest(page_token=token))
    assert details == BAD_TOKEN


@pytest.mark.parametrize("timestamp", BAD_TIMESTAMPS, ids=str)
async def test_a_timestamp_out_of_range_is_an_audited_invalid_request(
    alice: Agent, bob: A2APeer, timestamp: timestamp_pb2.Timestamp
) -> None:
    request = a2a_pb2.ListTasksRequest()
    request.status_timestamp_after.CopyFrom(timestamp)
    details = await assert_audited_invalid(alice, bob, request)
    assert details.startswith("status_timestamp_after must be a valid Timestamp")


@pytest.mark.parametrize("timestamp", GOOD_TIMESTAMPS, ids=str)
async def test_timestamps_at_the_ends_of_the_range_are_answered(
    bob: A2APeer, timestamp: timestamp_pb2.Timestamp
) -> None:
    task = await bob.send(data_request("text.echo", {"text": "t"}))
    request = a2a_pb2.ListTasksRequest()
    request.status_timestamp_after.CopyFrom(timestamp)
    listed = await bob.stub.ListTasks(request, metadata=V1)
    expected = [task.id] if timestamp.seconds <= 0 else []
    assert [t.id for t in listed.tasks] == expected


@pytest.mark.parametrize("context_id", ["c" * 129, "ctx\n", "ctx\u202e", "ctx 1"], ids=repr)
async def test_a_context_id_filter_that_is_not_an_id_is_an_audited_invalid_request(
    alice: Agent, bob: A2APeer, context_id: str
) -> None:
    request = a2a_pb2.ListTasksRequest(context_id=context_id)
    details = await assert_audited_invalid(alice, bob, request)
    assert details == "context_id must be empty or 1-128 characters of [A-Za-z0-9._:-]"


async def test_tokens_name_only_the_callers_own_tasks_and_are_refused_for_others(
    alice: Agent, bob: A2APeer, carol: A2APeer
) -> None:
    bobs = []
    for n in range(3):
        bobs.append((await bob.send(data_request("text.echo", {"text": f"b{n}"}))).id)
        for m in range(2):  # other peers' tasks in between
            await carol.send(data_request("text.echo", {"text": f"c{n}{m}"}))
    seen, token = [], ""
    for _ in range(3):
        page = await bob.stub.ListTasks(
            a2a_pb2.ListTasksRequest(page_size=1, page_token=token), metadata=V1
        )
        assert page.total_size == 3  # bob's own count only
        seen += [t.id for t in page.tasks]
        token = page.next_page_token
        if token:
            # What a token holds is the id of the caller's own last task on the
            # page: no row number, nothing that grows with carol's tasks.
            assert token_task_id(token) == seen[-1]
    assert seen == bobs[::-1] and token == ""

    bobs_token = (
        await bob.stub.ListTasks(a2a_pb2.ListTasksRequest(page_size=1), metadata=V1)
    ).next_page_token
    as_carol = await assert_audited_invalid(
        alice, carol, a2a_pb2.ListTasksRequest(page_token=bobs_token)
    )
    forged = await assert_audited_invalid(
        alice, carol, a2a_pb2.ListTasksRequest(page_token=page_token("no-such-task"))
    )
    assert as_carol == forged == BAD_TOKEN
    record = audit_rows(alice.config.audit_db)[-1]
    assert record.peer_id == spiffe("carol") and bobs_token not in record.detail


async def test_a_page_of_large_outputs_ends_where_one_message_is_full(
    pki: Pki, tmp_path: Path, counter: WriteCounter
) -> None:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [grant("bob", ["text.echo"], max_payload_bytes=1024 * 1024)],
    )
    agent = await started(
        agent_config(pki, tmp_path, "alice", policy),
        standard_registry(counter, tmp_path / "alice-state"),
    )
    try:
        async with A2APeer(pki, agent, "bob") as bob:
            ids = []
            for n in range(5):  # 5 x 900 kB of output: more than one gRPC message holds
                payload = json.dumps({"text": str(n) * 900_000}).encode()
                ids.append((await bob.send(raw_request("text.echo", payload))).id)
            request = a2a_pb2.ListTasksRequest(page_size=10, include_artifacts=True)
            first = await bob.stub.ListTasks(request, metadata=V1)
            assert [t.id for t in first.tasks] == ids[::-1][:4]
            assert first.page_size == 4 and first.total_size == 5 and first.next_page_token
            request.page_token = first.next_page_token
            second = await bob.stub.ListTasks(request, metadata=V1)
            assert [t.id for t in second.tasks] == ids[:1] and second.next_page_token == ""
    finally:
        await agent.stop()
