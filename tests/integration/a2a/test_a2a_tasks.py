"""A2A tasks seen only by their owner (also after a restart), and what we do not offer."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors

from gateway.runtime.agent import Agent
from tests.a2a_support import V1, A2APeer, data_request, error_infos, gateway_reason, output_of
from tests.integration.a2a.conftest import last_record
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    standard_registry,
    started,
    write_policy,
)


async def test_another_peers_task_is_indistinguishable_from_none(
    alice: Agent, bob: A2APeer, carol: A2APeer
) -> None:
    task = await bob.send(data_request("text.echo", {"text": "mine"}))
    assert (await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))).id == task.id

    answers = []
    for task_id in (task.id, "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(a2a_errors.TaskNotFoundError) as info:
            await carol.client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
        rpc = info.value.__cause__
        assert isinstance(rpc, grpc.aio.AioRpcError)
        answers.append((rpc.code(), rpc.details(), error_infos(rpc)))
        record = await last_record(alice)
        assert (record.decision, record.reason, record.detail) == (
            "refuse",
            "TASK_NOT_FOUND",
            "A2A GetTask",
        )
    assert answers[0] == answers[1]
    assert answers[0][0] is grpc.StatusCode.NOT_FOUND

    with pytest.raises(a2a_errors.TaskNotFoundError):
        await carol.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    listed = await carol.client.list_tasks(a2a_pb2.ListTasksRequest())
    assert list(listed.tasks) == [] and listed.total_size == 0


async def test_list_tasks_pages_through_the_callers_own(
    alice: Agent, bob: A2APeer, carol: A2APeer
) -> None:
    ids = []
    for n in range(3):
        request = data_request("text.echo", {"text": f"t{n}"})
        request.message.context_id = "ctx-a"
        ids.append((await bob.send(request)).id)
    await carol.send(data_request("text.echo", {"text": "carol's"}))

    first = await bob.client.list_tasks(a2a_pb2.ListTasksRequest(page_size=2))
    assert [t.id for t in first.tasks] == ids[::-1][:2] and first.total_size == 3
    assert not first.tasks[0].artifacts  # include_artifacts defaults to false
    second = await bob.client.list_tasks(
        a2a_pb2.ListTasksRequest(
            page_size=2, page_token=first.next_page_token, include_artifacts=True
        )
    )
    assert [t.id for t in second.tasks] == ids[:1] and second.next_page_token == ""
    assert output_of(second.tasks[0]) == {"text": "t0"}
    by_context = await bob.client.list_tasks(a2a_pb2.ListTasksRequest(context_id="ctx-a"))
    assert by_context.total_size == 3
    failed = await bob.client.list_tasks(a2a_pb2.ListTasksRequest(status=a2a_pb2.TASK_STATE_FAILED))
    assert failed.total_size == 0
    working = await bob.client.list_tasks(
        a2a_pb2.ListTasksRequest(status=a2a_pb2.TASK_STATE_WORKING)
    )
    assert list(working.tasks) == []


async def test_a_finished_task_is_not_cancelable(alice: Agent, bob: A2APeer) -> None:
    task = await bob.send(data_request("text.echo", {"text": "done"}))
    with pytest.raises(a2a_errors.TaskNotCancelableError):
        await bob.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    record = await last_record(alice)
    assert (record.reason, record.task_id) == ("TASK_NOT_CANCELABLE", task.id)


async def test_tasks_survive_a_restart_and_stay_scoped(
    pki: Pki, tmp_path: Path, stores: dict[str, str]
) -> None:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [grant("bob", ["text.echo"]), grant("carol", ["text.echo"])],
    )
    config = agent_config(pki, tmp_path, "alice", policy, stores=stores)
    state = tmp_path / "alice-state"
    agent = await started(config, standard_registry(WriteCounter(), state))
    try:
        async with A2APeer(pki, agent, "bob") as bob:
            sent = data_request("text.echo", {"text": "kept"})
            task = await bob.send(sent)
    finally:
        await agent.stop()
    agent = await started(config, standard_registry(WriteCounter(), state))
    try:
        async with A2APeer(pki, agent, "bob") as bob, A2APeer(pki, agent, "carol") as carol:
            again = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
            assert again.status.state == a2a_pb2.TASK_STATE_COMPLETED
            assert output_of(again) == {"text": "kept"}
            with pytest.raises(a2a_errors.TaskNotFoundError):
                await carol.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
            # The message id stays used across the restart (replay window).
            with pytest.raises(a2a_errors.A2AError) as info:
                await bob.send(sent)
            assert gateway_reason(info.value) == "REPLAYED_REQUEST"
    finally:
        await agent.stop()


# --- what we do not offer: answered after authentication, audited ------------


async def _stream_error(call: grpc.aio.UnaryStreamCall) -> grpc.aio.AioRpcError:  # type: ignore[type-arg]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    return info.value


async def test_subscribing_to_no_task_or_a_finished_one_is_refused_and_audited(
    alice: Agent, bob: A2APeer
) -> None:
    done = await bob.send(data_request("text.echo", {"text": "x"}))
    for task_id, code, reason in (
        ("t-1", grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND"),
        (done.id, grpc.StatusCode.UNIMPLEMENTED, "UNSUPPORTED_OPERATION"),  # spec 1.0.0, 5.4
    ):
        request = a2a_pb2.SubscribeToTaskRequest(id=task_id)
        err = await _stream_error(bob.stub.SubscribeToTask(request, metadata=V1, timeout=10))
        assert err.code() is code
        assert error_infos(err) == [("a2a-protocol.org", reason), ("a2agw.v1", reason)]
        record = await last_record(alice)
        assert (record.decision, record.reason, record.detail, record.peer_id) == (
            "refuse",
            reason,
            "A2A SubscribeToTask",
            "spiffe://example.org/agent/bob",
        )
    assert alice.limit_stats().in_flight_total == 0  # the refused subscriptions left no slot


async def test_push_notification_configs_are_not_supported(alice: Agent, bob: A2APeer) -> None:
    with pytest.raises(a2a_errors.PushNotificationNotSupportedError):
        await bob.client.create_task_push_notification_config(
            a2a_pb2.TaskPushNotificationConfig(task_id="t", url="https://example.org/hook")
        )
    for method, request in (
        ("GetTaskPushNotificationConfig", a2a_pb2.GetTaskPushNotificationConfigRequest()),
        ("ListTaskPushNotificationConfigs", a2a_pb2.ListTaskPushNotificationConfigsRequest()),
        ("DeleteTaskPushNotificationConfig", a2a_pb2.DeleteTaskPushNotificationConfigRequest()),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(bob.stub, method)(request, metadata=V1, timeout=10)
        assert gateway_reason(info.value) == "PUSH_NOTIFICATION_NOT_SUPPORTED"
        assert ("a2a-protocol.org", "PUSH_NOTIFICATION_NOT_SUPPORTED") in error_infos(info.value)
        record = await last_record(alice)
        assert (record.reason, record.detail) == (
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
            f"A2A {method}",
        )


@pytest.mark.parametrize("version", [(("a2a-version", "0.3"),), ()])
async def test_a2a_versions_other_than_1x_are_refused(
    alice: Agent, bob: A2APeer, counter: WriteCounter, version: tuple[tuple[str, str], ...]
) -> None:
    for method, request in (
        ("SendMessage", data_request("notes.write", {"note": "x"})),
        ("GetTask", a2a_pb2.GetTaskRequest(id="t-1")),
        ("GetExtendedAgentCard", a2a_pb2.GetExtendedAgentCardRequest()),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(bob.stub, method)(request, metadata=version, timeout=10)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
        assert error_infos(info.value) == [
            ("a2a-protocol.org", "VERSION_NOT_SUPPORTED"),
            ("a2agw.v1", "VERSION_NOT_SUPPORTED"),
        ]
        record = await last_record(alice)
        assert (record.reason, record.detail) == ("VERSION_NOT_SUPPORTED", f"A2A {method}")
    assert counter.calls == 0
    ok = await bob.stub.SendMessage(
        data_request("text.echo", {"text": "x"}), metadata=(("a2a-version", "1.0.3"),), timeout=10
    )
    assert ok.task.status.state == a2a_pb2.TASK_STATE_COMPLETED


async def test_a_tenant_is_refused_clearly(
    alice: Agent, bob: A2APeer, counter: WriteCounter
) -> None:
    request = data_request("notes.write", {"note": "x"})
    request.tenant = "acme"
    for call in (
        bob.client.send_message(request),
        bob.client.list_tasks(a2a_pb2.ListTasksRequest(tenant="acme")),
    ):
        with pytest.raises(a2a_errors.InvalidRequestError) as info:
            if hasattr(call, "__anext__"):
                await call.__anext__()
            else:
                await call
        assert "tenants are not supported" in info.value.message
        assert gateway_reason(info.value) == "INVALID_REQUEST"
        record = await last_record(alice)
        assert (record.decision, record.reason) == ("refuse", "INVALID_REQUEST")
    assert counter.calls == 0


@pytest.mark.parametrize("method", ["SendMessage", "GetTask", "ListTasks", "CancelTask"])
async def test_corrupt_protobuf_is_an_audited_invalid_request(
    alice: Agent, bob: A2APeer, method: str
) -> None:
    call = bob.channel.unary_unary(
        f"/lf.a2a.v1.A2AService/{method}",
        request_serializer=lambda raw: raw,
        response_deserializer=lambda raw: raw,
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"\xff\xff\xff\xff", metadata=V1, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert gateway_reason(info.value) == "INVALID_REQUEST"
    record = await last_record(alice)
    assert (record.decision, record.reason, record.peer_id) == (
        "refuse",
        "INVALID_REQUEST",
        "spiffe://example.org/agent/bob",
    )


async def test_unknown_peer_is_refused_before_anything_a2a_specific(pki: Pki, alice: Agent) -> None:
    async with A2APeer(pki, alice, "mallory") as mallory:
        for call in (
            mallory.stub.GetTask(a2a_pb2.GetTaskRequest(id="t"), metadata=V1, timeout=10),
            mallory.stub.ListTasks(a2a_pb2.ListTasksRequest(), metadata=(), timeout=10),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert gateway_reason(info.value) == "UNKNOWN_PEER"
            record = await last_record(alice)
            assert (record.decision, record.reason) == ("refuse", "UNKNOWN_PEER")
