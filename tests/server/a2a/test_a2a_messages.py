"""A2A ⇄ InvokeCall conversion, integers from doubles, and the A2A error wire form."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils.errors import A2A_ERROR_MAPPING, A2A_REASON_TO_ERROR
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2, status_pb2

from capabilities.builtin.echo import EchoInput
from capabilities.builtin.search import SearchInput
from capabilities.contract import Accepts, ContractModel
from gateway import errors
from gateway.inbound.call import InvokeCall
from gateway.server.a2a.messages import invoke_call
from gateway.server.a2a.registration import a2a_method_names
from gateway.server.a2a.request_checks import speaks_1_0
from gateway.server.a2a.servicer import A2AServicer
from gateway.server.a2a.task_store.store import A2ATask, TaskOutcome
from gateway.server.a2a.task_view import task_message
from gateway.server.a2a.wire_errors import SPEC_DOMAIN, SPEC_ERRORS, to_a2a_status
from gateway.transport.a2a.json_numbers import restore_integers
from gateway.transport.a2a.part_payloads import MessageParts
from gateway.transport.status import status_code_for
from tests.helpers.a2a_grpc import a2a_task, data_request, raw_request


class Inner(ContractModel):
    count: int
    ratio: float


class Outer(ContractModel):
    limit: int | None = None
    score: float = 0.0
    inner: Inner | None = None
    many: list[Inner] = []
    tags: dict[str, int] = {}
    name: str = ""


def test_whole_numbers_become_integers_only_where_the_schema_says_integer() -> None:
    value = {
        "limit": 2.0,
        "score": 3.0,
        "inner": {"count": 4.0, "ratio": 5.0},
        "many": [{"count": 6.0, "ratio": 7.0}],
        "tags": {"a": 8.0},
        "name": "9",
        "unknown": 10.0,
    }
    restored = restore_integers(value, [Outer])
    assert restored == value
    kinds = {
        "limit": type(restored["limit"]),
        "score": type(restored["score"]),
        "count": type(restored["inner"]["count"]),
        "ratio": type(restored["inner"]["ratio"]),
        "many.count": type(restored["many"][0]["count"]),
        "tags.a": type(restored["tags"]["a"]),
        "unknown": type(restored["unknown"]),
    }
    assert kinds == {
        "limit": int,
        "score": float,
        "count": int,
        "ratio": float,
        "many.count": int,
        "tags.a": int,
        "unknown": float,
    }
    assert restore_integers({"limit": 2.5}, [Outer]) == {"limit": 2.5}
    del restored["unknown"]
    assert Outer.model_validate(restored).inner == Inner(count=4, ratio=5.0)


def test_any_version_saying_integer_is_enough() -> None:
    class V2(ContractModel):
        limit: float

    assert type(restore_integers({"limit": 3.0}, [V2, SearchInput])["limit"]) is int
    assert type(restore_integers({"limit": 3.0}, [V2])["limit"]) is float
    assert restore_integers({"limit": 3.0}, []) == {"limit": 3.0}


def _call(request: a2a_pb2.SendMessageRequest) -> InvokeCall:
    return invoke_call(request, peer_cert_pem=None, deadline=0.0, task_id="t-1")


def test_a_data_part_is_measured_then_becomes_compact_json_with_integers() -> None:
    request = data_request("text.search@^1", {"query": "q", "limit": 2}, idempotency_key="k")
    call = _call(request)
    assert (call.capability, call.version_constraint, call.idempotency_key) == (
        "text.search",
        "^1",
        "k",
    )
    assert call.payload == b"" and call.payload_sha256 == "" and call.problem == ""
    assert call.task_id == "t-1"
    pending = call.pending_payload
    assert pending is not None
    assert pending.size == call.payload_size == request.message.parts[0].data.ByteSize()
    assert pending.decode(SearchInput) == b'{"limit":2,"query":"q"}'


def test_a_text_part_is_pending_until_a_text_only_contract_decodes_it() -> None:
    call = _call(_with_part(a2a_pb2.Part(text="héllo")))
    pending = call.pending_payload
    assert call.problem == "" and pending is not None and pending.size == len("héllo".encode())
    assert call.message is pending
    pending.check_parts(Accepts(), EchoInput)  # type: ignore[attr-defined]
    assert pending.decode(EchoInput) == '{"text":"héllo"}'.encode()
    with pytest.raises(errors.InvalidInput) as info:
        pending.check_parts(Accepts(), SearchInput)  # type: ignore[attr-defined]
    assert info.value.message == (
        'a text part is the input {"text": ...} only of a capability whose input is exactly '
        "one string field 'text'; this one's fields are: limit, query; send a data part"
    )


def test_the_default_capability_is_used_only_without_metadata() -> None:
    request = _with_part(a2a_pb2.Part(text="t"))
    del request.message.metadata.fields["a2agw.capability"]
    call = invoke_call(
        request, peer_cert_pem=None, deadline=0.0, task_id="t", default_capability="kv.get@^1"
    )
    assert (call.capability, call.version_constraint, call.problem) == ("kv.get", "^1", "")
    named = invoke_call(
        _with_part(a2a_pb2.Part(text="t")),
        peer_cert_pem=None,
        deadline=0.0,
        task_id="t",
        default_capability="kv.get@^1",
    )
    assert (named.capability, named.version_constraint) == ("text.echo", "")
    assert "is missing" in _call(request).problem


def test_raw_bytes_are_the_payload_unchanged() -> None:
    raw = b'{ "text":"\\u00e9" }'
    call = _call(raw_request("text.echo", raw))
    assert call.payload == raw and call.problem == ""


def _with_part(part: a2a_pb2.Part) -> a2a_pb2.SendMessageRequest:
    request = data_request("text.echo", {"text": "x"})
    del request.message.parts[:]
    request.message.parts.append(part)
    return request


PROBLEMS = [
    (data_request("", {"text": "x"}), "a2agw.capability"),
    (a2a_pb2.SendMessageRequest(), "message is missing"),
    (_with_part(a2a_pb2.Part(text="x")), ""),
]
PROBLEMS[2][0].message.ClearField("parts")
PROBLEMS[2] = (PROBLEMS[2][0], "the message has no parts")


PART_REFUSALS = [
    # What only the chosen version's contract decides, once every check up to the cap passed.
    (data_request("text.echo", {"text": "x"}, extra_parts=1), errors.InvalidRequest, "at most 1"),
    (raw_request("text.echo", b"{}", media_type="text/plain"), errors.ContentTypeNotSupported,
     "file parts of media type 'text/plain'"),
    (_with_part(a2a_pb2.Part(url="https://x")), errors.ContentTypeNotSupported, "URL parts"),
]  # fmt: skip


@pytest.mark.parametrize(("request_", "error", "problem"), PART_REFUSALS)
def test_parts_the_contract_does_not_take_are_refused_by_it(
    request_: a2a_pb2.SendMessageRequest, error: type[errors.GatewayError], problem: str
) -> None:
    call = _call(request_)
    assert call.problem == "" and call.message is not None
    with pytest.raises(error) as refused:
        call.message.check_parts(Accepts(), EchoInput)
    assert problem in refused.value.message


def test_a_data_part_that_is_the_input_must_be_an_object() -> None:
    call = _call(data_request("text.echo", [1, 2]))
    assert call.pending_payload is not None
    with pytest.raises(errors.InvalidRequest) as refused:
        call.pending_payload.decode(EchoInput)
    assert "JSON object" in refused.value.message


@pytest.mark.parametrize(("request_", "problem"), PROBLEMS)
def test_what_cannot_be_a_call_is_a_problem(
    request_: a2a_pb2.SendMessageRequest, problem: str
) -> None:
    assert problem in _call(request_).problem


def test_envelope_problems() -> None:
    request = data_request("text.echo", {"text": "secret-content"})
    request.tenant = "t"
    assert "tenants are not supported" in _call(request).problem
    request = data_request("text.echo", {"text": "x"})
    request.message.task_id = "old"  # continued only through the servicer's task lookup
    assert "cannot be continued" in _call(request).problem
    request = data_request("text.echo", {"text": "x"})
    request.message.metadata["a2agw.capability"] = 5
    assert "must be a string" in _call(request).problem


def test_problems_never_quote_payload_content() -> None:
    request = data_request("text.echo", ["secret-content"])
    assert "secret-content" not in _call(request).problem


def test_every_a2a_rpc_has_a_servicer_method() -> None:
    for name in a2a_method_names():
        assert name in vars(A2AServicer), name
    assert len(a2a_method_names()) == 11


@pytest.mark.parametrize("version", ["1", "1.0", "1.0.3"])
def test_1_0_is_spoken_whatever_the_patch(version: str) -> None:
    assert speaks_1_0(version)


@pytest.mark.parametrize(
    "version", ["0.3", "", "2.0", "10", "1x", " 1.0", "1.1", "1.99", "1.x", "1.", "1.00"]
)
def test_other_versions_are_not(version: str) -> None:
    assert not speaks_1_0(version)


SPEC_TABLE = {
    "TASK_NOT_FOUND": ("TASK_NOT_FOUND", "NOT_FOUND"),
    "TASK_NOT_CANCELABLE": ("TASK_NOT_CANCELABLE", "FAILED_PRECONDITION"),
    "PUSH_NOTIFICATION_NOT_SUPPORTED": ("PUSH_NOTIFICATION_NOT_SUPPORTED", "UNIMPLEMENTED"),
    "UNSUPPORTED_OPERATION": ("UNSUPPORTED_OPERATION", "UNIMPLEMENTED"),
    "CONTENT_TYPE_NOT_SUPPORTED": ("CONTENT_TYPE_NOT_SUPPORTED", "INVALID_ARGUMENT"),
    "VERSION_NOT_SUPPORTED": ("VERSION_NOT_SUPPORTED", "UNIMPLEMENTED"),
    "INVALID_REQUEST": ("INVALID_REQUEST", "INVALID_ARGUMENT"),
    "INVALID_INPUT": ("INVALID_PARAMS", "INVALID_ARGUMENT"),
}
"""Our reason → the spec's reason and gRPC status (A2A 1.0.0, section 5.4, which the TCK checks)."""


@pytest.mark.parametrize("reason", list(SPEC_TABLE))
def test_spec_errors_carry_the_spec_reason_first_and_the_spec_code(reason: str) -> None:
    cls = errors.error_for_reason(reason)
    spec_reason, code = SPEC_TABLE[reason]
    status = to_a2a_status(cls("why"))
    ((_, raw),) = [m for m in status.trailing_metadata if m[0] == "grpc-status-details-bin"]
    detail = status_pb2.Status.FromString(raw)
    infos = []
    for any_ in detail.details:
        info = error_details_pb2.ErrorInfo()
        any_.Unpack(info)
        infos.append((info.domain, info.reason))
    assert infos == [(SPEC_DOMAIN, spec_reason), ("a2agw.v1", cls.reason)]
    assert status.code is getattr(grpc.StatusCode, code) is status_code_for(cls("x"))
    assert SPEC_ERRORS[reason].grpc is status.code
    assert spec_reason in A2A_REASON_TO_ERROR  # an a2a-sdk client raises its class for it


def test_only_the_1_0_1_revision_of_the_spec_table_differs_from_the_sdks() -> None:
    # The a2a-sdk answers by the 1.0.1 table (FAILED_PRECONDITION where 1.0.0 says
    # UNIMPLEMENTED); its clients map the ErrorInfo reason, not the code.
    differ = {
        reason
        for reason, (spec_reason, code) in SPEC_TABLE.items()
        if A2A_ERROR_MAPPING[A2A_REASON_TO_ERROR[spec_reason]].grpc_status != code
    }
    assert differ == {
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
        "UNSUPPORTED_OPERATION",
        "VERSION_NOT_SUPPORTED",
    }


def test_our_own_errors_carry_only_our_reason() -> None:
    status = to_a2a_status(errors.UnknownPeer("no"))
    ((_, raw),) = [m for m in status.trailing_metadata if m[0] == "grpc-status-details-bin"]
    assert len(status_pb2.Status.FromString(raw).details) == 1


def test_outputs_travel_as_data_parts() -> None:

    task = A2ATask(
        "t",
        "o",
        "c",
        TaskOutcome.COMPLETED,
        "x.y",
        "1.0.0",
        b'{"n":1,"s":"a"}',
        "e" * 64,
        False,
        "OK",
        "",
        1,
        2,
    )
    answer = task_message(task)
    assert json_format.MessageToDict(answer.artifacts[0].parts[0].data) == {"n": 1.0, "s": "a"}
    assert answer.artifacts[0].parts[0].media_type == "application/json"


@pytest.mark.parametrize(
    "output",
    [
        b'{"n":123456789012345678901234567890,"m":-9223372036854775809}',
        b'{"x":NaN,"y":[1,2.5,-0.0,null,true,"\\u00e9"]}',
        b'{"nested":{"b":[{"c":9007199254740993}]},"s":"' + b"x" * 70000 + b'"}',
        b'[1,"not an object"]',
    ],
)
def test_a_task_output_becomes_the_value_json_would_make(output: bytes) -> None:
    task = a2a_task(
        "t1",
        "spiffe://example.org/agent/a",
        "text.echo",
        context_id="c1",
        state=TaskOutcome.COMPLETED,
        output=output,
        evidence_sha256="0" * 64,
        reason="OK",
        created_ms=1,
        updated_ms=2,
    )
    expected = struct_pb2.Value()
    json_format.ParseDict(json.loads(output), expected)
    part = task_message(task).artifacts[0].parts[0]
    assert part.data == expected


def test_a_text_part_fits_fronted_skills_without_a_schema_and_schemas_of_one_text() -> None:
    from capabilities.schema_models import contract_model
    from gateway.outbound.upstream_capabilities import TextInput

    part = MessageParts([a2a_pb2.Part(text="t")])
    one_text = {"type": "object", "properties": {"text": {"type": "string"}}}
    two = {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}}
    not_string = {"type": "object", "properties": {"text": {"type": "integer"}}}
    for model in (TextInput, contract_model("OneText", one_text)):
        part.check_parts(Accepts(), model)
        assert part.decode(model) == b'{"text":"t"}'
    for schema in (two, not_string):
        with pytest.raises(errors.InvalidInput):
            part.check_parts(Accepts(), contract_model("NotText", schema))


@pytest.mark.parametrize(
    ("state", "output", "reason", "message"),
    [
        (TaskOutcome.COMPLETED, b'{"s":"' + b"x" * 300_000 + b'","n":[1,2.5]}', "OK", ""),
        (TaskOutcome.FAILED, b"", "CAPABILITY_FAILED", "text.echo@1.0.0 failed"),
        (TaskOutcome.WORKING, b"", "", "half way"),
        (TaskOutcome.CANCELED, b"", "CANCELLED", "cancelled by its owner"),
    ],
)
def test_answers_built_in_place_are_the_messages_built_by_constructors(
    state: TaskOutcome, output: bytes, reason: str, message: str
) -> None:
    # The in-place builders (fast at 256 KB) must send exactly what the
    # constructor form sent: same fields, same bytes on the wire.
    from gateway.server.a2a.task_events import output_events
    from gateway.server.a2a.task_view import output_artifact, send_answer, task_event

    task = A2ATask(
        "t9", "o", "c9", state, "text.echo", "1.0.0", output, "ab" * 32, True, reason, message, 5, 7
    )
    built = task_message(task)
    assert send_answer(task) == a2a_pb2.SendMessageResponse(task=built)
    assert task_event(task) == a2a_pb2.StreamResponse(task=built)
    assert send_answer(task).SerializeToString(deterministic=True) == (
        a2a_pb2.SendMessageResponse(task=built).SerializeToString(deterministic=True)
    )
    if state is TaskOutcome.COMPLETED:
        assert built.artifacts[0].parts[0].data.struct_value.fields["s"].string_value == (
            "x" * 300_000
        )
        old_event = a2a_pb2.StreamResponse(
            artifact_update=a2a_pb2.TaskArtifactUpdateEvent(
                task_id="t9", context_id="c9", artifact=output_artifact(task), last_chunk=True
            )
        )
        assert output_events(task) == [old_event]


@pytest.mark.parametrize(
    "value",
    [
        {"text": "x" * 300_000},
        {"n": 2**70, "m": -(2**63) - 1, "f": [1.5, -0.0, 1e-7, float("nan")], "e": None},
        {"nested": {"b": [{"c": 9007199254740993, "t": True}]}, "s": "\u00e9\u2028"},
    ],
)
def test_an_output_that_keeps_its_value_makes_the_part_its_bytes_make(value: Any) -> None:
    from capabilities.canonical import CanonicalJson

    kept = CanonicalJson.of(value)

    def part(output: bytes) -> struct_pb2.Value:
        task = A2ATask(
            "t", "o", "c", TaskOutcome.COMPLETED, "x.y", "1.0.0", output, "e" * 64, False, "OK",
            "", 1, 2,
        )  # fmt: skip
        return task_message(task).artifacts[0].parts[0].data

    from_value, from_bytes = part(kept), part(bytes(kept))
    # Compared on the wire: a NaN is not equal to itself.
    assert from_value.SerializeToString(deterministic=True) == from_bytes.SerializeToString(
        deterministic=True
    )
    assert from_value.ByteSize() > 0


def test_a_call_given_a_new_deadline_keeps_its_digest_without_hashing_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A background or streamed task outlives its RPC's deadline: the call is
    # copied with the contract's, and a 256 KB payload must not be hashed twice.
    import hashlib

    from gateway.inbound import call as call_module

    payload = b'{"text":"' + b"x" * 262_000 + b'"}'
    call = InvokeCall(None, "r-1", "text.echo", "", payload, 5.0, task_id="t-1")
    hashed: list[int] = []
    sha256 = hashlib.sha256

    def counting(data: bytes) -> Any:
        hashed.append(len(data))
        return sha256(data)

    monkeypatch.setattr(call_module.hashlib, "sha256", counting)
    later = call.with_deadline(99.0)
    assert hashed == []
    assert later.deadline == 99.0 and call.deadline == 5.0
    assert later.payload_sha256 == call.payload_sha256 == sha256(payload).hexdigest()
    assert (later.payload, later.task_id, later.capability) == (payload, "t-1", "text.echo")
