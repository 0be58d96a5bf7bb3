"""Seeded fuzzing of every A2A method over real mTLS: precise, audited once, never a crash.

Each case sends random bytes or a randomly built request to one of the eleven
``lf.a2a.v1.A2AService`` methods, as one of four callers, with a random
``a2a-version``. Every answer must be OK or carry our ``ErrorInfo`` whose reason
maps to the status it came with (never INTERNAL or UNKNOWN), add exactly one
audit record (two for an admitted write: ``ADMITTED`` then its outcome; none
for an answered GetTask/ListTasks/card, which like Describe are audited when
refused), and
run the write capability only for a fresh, successful ``notes.write``.
"""

from __future__ import annotations

import random

import grpc
import pytest
from a2a.types import a2a_pb2
from google.protobuf import message_factory
from hypothesis import HealthCheck, event, given, settings

from gateway.errors import error_for_reason
from gateway.runtime.agent import Agent
from gateway.server.a2a.registration import a2a_method_names
from gateway.transport.status import from_rpc_error, status_code_for
from tests.helpers.a2a_fuzz import A2ACase, a2a_cases, check_a2a, describe_case
from tests.helpers.a2a_grpc import data_request, raw_request
from tests.helpers.agents import Pki, WriteCounter, audit_rows, raw_channel
from tests.helpers.fuzz_invoke import FuzzTarget

pytestmark = pytest.mark.fuzz

CASES = 160
SEED = 20261130
CALLERS = ("bob", "carol", "dave", "mallory")
VERSIONS = ("1.0", "1.0", "1.1", "0.3", "2.0", None)
CAPABILITIES = ("text.echo", "notes.write", "kv.get", "nope.nope", "notes.write@9", "", "@")
SERVICE = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"]


def _send_message(rng: random.Random) -> bytes:
    capability = rng.choice(CAPABILITIES)
    message_id = rng.choice([None, "", "bad id!", "x" * 200, f"m-{rng.random()}"])
    kind = rng.randrange(5)
    if kind == 0:
        request = raw_request(
            capability, rng.randbytes(rng.randrange(0, 80)), message_id=message_id
        )
    elif kind == 1:
        request = raw_request(
            capability, b'{"note":"n"}', media_type=rng.choice(["", "text/plain"])
        )
    else:
        payload = rng.choice([{"note": "n"}, {"text": "t"}, {"key": "k"}, {"note": 1}, [1], {}])
        request = data_request(
            capability, payload, message_id=message_id, extra_parts=rng.choice([0, 0, 1])
        )
    if rng.random() < 0.1:
        request.tenant = "t"
    if rng.random() < 0.1:
        request.message.task_id = "task"
    if rng.random() < 0.1:
        request.message.metadata["a2agw.idempotency_key"] = rng.choice([1, "k", True])
    return request.SerializeToString()


def _body(rng: random.Random, method: str) -> bytes:
    if rng.random() < 0.3:
        return rng.randbytes(rng.randrange(0, 64))
    if method in ("SendMessage", "SendStreamingMessage"):
        return _send_message(rng)
    descriptor = SERVICE.methods_by_name[method].input_type
    request = message_factory.GetMessageClass(descriptor)()
    for name in ("id", "task_id", "context_id", "page_token"):
        if name in descriptor.fields_by_name and rng.random() < 0.6:
            setattr(request, name, rng.choice(["t-1", "", "zz", "\x00bad", "9" * 30]))
    if "tenant" in descriptor.fields_by_name and rng.random() < 0.2:
        request.tenant = "t"
    return request.SerializeToString()


async def _call(
    channel: grpc.aio.Channel, method: str, body: bytes, version: str | None
) -> grpc.StatusCode | grpc.aio.AioRpcError:
    path = f"/lf.a2a.v1.A2AService/{method}"
    metadata = () if version is None else (("a2a-version", version),)
    streaming = SERVICE.methods_by_name[method].server_streaming
    make = channel.unary_stream if streaming else channel.unary_unary
    call = make(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        if streaming:
            async for _ in call(body, metadata=metadata, timeout=10):
                pass
        else:
            await call(body, metadata=metadata, timeout=10)
    except grpc.aio.AioRpcError as err:
        return err
    return grpc.StatusCode.OK


@pytest.mark.parametrize("seed", [SEED])
async def test_fuzzed_a2a_calls_are_precise_audited_once_and_never_crash(
    pki: Pki, alice: Agent, counter: WriteCounter, seed: int
) -> None:
    rng = random.Random(seed)
    channels = {name: raw_channel(pki, alice, name) for name in CALLERS}
    outcomes: dict[str, int] = {}
    try:
        for _ in range(CASES):
            method = rng.choice(a2a_method_names())
            caller = rng.choice(CALLERS)
            version = rng.choice(VERSIONS)
            before, runs = len(audit_rows(alice.config.audit_db)), counter.calls
            answer = await _call(channels[caller], method, _body(rng, method), version)
            await alice.audit.flush()
            records = audit_rows(alice.config.audit_db)[before:]
            if isinstance(answer, grpc.aio.AioRpcError):
                error = from_rpc_error(answer)
                assert answer.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
                assert error_for_reason(error.reason) is type(error), (method, answer.details())
                assert status_code_for(error) is answer.code()
                reason = error.reason
            else:
                reason = "OK"
            outcomes[f"{method} {reason}"] = outcomes.get(f"{method} {reason}", 0) + 1
            wrote = counter.calls - runs
            sends = ("SendMessage", "SendStreamingMessage")
            if reason == "OK" and method not in sends:  # reads are audited when refused
                assert records == [] and wrote == 0
                continue
            assert [r.reason for r in records][-1:] == [reason], (method, caller, reason)
            if records[0].reason == "ADMITTED":
                assert len(records) == 2 and wrote <= 1
            else:
                assert len(records) == 1 and wrote == 0, (method, reason, records)
    finally:
        for channel in channels.values():
            await channel.close()
    # The generator reaches allowed calls and the interesting refusals.
    seen = {key.split()[1] for key in outcomes}
    assert {"OK", "INVALID_REQUEST", "VERSION_NOT_SUPPORTED", "UNKNOWN_PEER"} <= seen, outcomes
    assert "TASK_NOT_FOUND" in seen, outcomes


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=a2a_cases())
def test_generated_a2a_calls_hold_every_invariant_of_the_long_fuzz(
    fuzz_target: FuzzTarget, case: A2ACase
) -> None:
    # The generators and checks of ``scripts/fuzz_long.py --binding a2a``, briefly.
    result = check_a2a(fuzz_target, case)
    event(f"{case.method} {result.code.name} {result.reason}")
    assert not result.problems, (describe_case(case), result.reason, result.problems)


@pytest.mark.parametrize("capability", ["text.echo", "notes.write"])
def test_a_streamed_call_is_judged_by_its_last_event(
    fuzz_target: FuzzTarget, capability: str
) -> None:
    # The long fuzz compares the audit outcome with what the caller saw; for a
    # stream that is the terminal status, not its first event (the task, submitted).
    payload = {"text": "z" * 4000} if capability == "text.echo" else {"note": "n"}
    case = A2ACase(
        "bob", "SendStreamingMessage", data_request(capability, payload), version="1.0", fresh=True
    )
    result = check_a2a(fuzz_target, case)
    assert (result.code, result.problems) == (grpc.StatusCode.OK, []), describe_case(case)
    assert result.reason == "OK" and result.records >= 1
