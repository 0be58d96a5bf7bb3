"""The A2A half of the fuzz harness: generated ``lf.a2a.v1`` requests and their checks.

Shared by ``tests/security/test_fuzz_a2a.py`` (small, in CI) and
``scripts/fuzz_long.py --binding a2a`` (by hand), on the same ``FuzzTarget``
as Invoke. Nothing here is a test. Each case is one call of one of the eleven
methods (nine in ten a well-formed request, mostly SendMessage; one in ten
random bytes), and must:

* end with an expected status carrying ``ErrorInfo(domain="a2agw.v1")``
  whose reason maps to that very status (never INTERNAL or UNKNOWN);
* add no audit record for an answered read (GetTask, ListTasks, the card),
  else exactly one outcome record whose reason is what the caller got (for a
  SendMessage answered with a failed task, the task's ``a2agw.reason``),
  preceded by one ``ADMITTED`` record only for an admitted write;
* audit a ``raw`` part with its exact size and digest, and a ``data`` or
  ``text`` part refused before it was decoded with its measured size and no
  digest (and only for refusals decided before decoding);
* leave none of the strings planted in the payload in any record;
* run ``notes.write`` once for a fresh completed task of it, never otherwise.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

import grpc
from a2a.types import a2a_pb2
from google.protobuf import json_format, message_factory, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import strategies as st

from gateway.errors import ERROR_DOMAIN, error_for_reason
from gateway.inbound.invoke_handler import ADMITTED
from gateway.server.a2a.registration import a2a_method_names
from gateway.server.a2a.task_store.store import page_token
from gateway.transport.status import status_code_for
from tests.helpers.fuzz_invoke import (
    CAPABILITIES,
    EXPECTED_CODES,
    FUZZ_CALLERS,
    KNOWN_REASONS,
    VALID_CONSTRAINTS,
    WRITE_CAPABILITY,
    CaseResult,
    FuzzTarget,
    leak_problems,
    near_valid_objects,
    payloads,
    tokens,
)

SERVICE = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"]
A2A_CODES = EXPECTED_CODES | {grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED}
"""Invoke's statuses plus the spec's not-cancelable (FAILED_PRECONDITION) and
unsupported/push/version (UNIMPLEMENTED) answers."""
READS = frozenset({"GetTask", "ListTasks", "GetExtendedAgentCard"})
"""Methods whose answered calls are not audited (as Describe)."""
AFTER_DECODING = frozenset({"OK", "INVALID_INPUT", "REPLAYED_REQUEST", "DEADLINE_EXCEEDED"})
"""Reasons only a call whose data part was decoded can get (they are checked after it)."""
BEFORE_DECODING = frozenset(
    {
        "UNAUTHENTICATED",
        "UNKNOWN_PEER",
        "GRANT_EXPIRED",
        "RATE_LIMITED",
        "CONCURRENCY_LIMITED",
        "SERVER_BUSY",
        "CAPABILITY_NOT_GRANTED",
        "VERSION_NOT_AVAILABLE",
        "RISK_NOT_GRANTED",
    }
)
"""Refusals the pipeline decides before it decodes a data part."""
UNSAFE = "\t\n\r\x0b\x00\x1b\x7f\x85\x9b\u2028\u2029\u061c\u200f\u202e\u2066"
_FRESH = itertools.count(1)


@dataclass(frozen=True, slots=True)
class A2ACase:
    """One generated A2A call.

    Attributes:
        caller: Key of the target's channels.
        method: The ``A2AService`` method.
        request: The request message (None: ``raw`` bytes are sent instead).
        raw: Bytes sent as the request message when ``request`` is None.
        version: ``a2a-version`` metadata (None: not sent).
        tokens: Payload strings no audit record may hold.
        fresh: Give a SendMessage a never-used ``message_id`` suffix at send time.
    """

    caller: str
    method: str
    request: Any = None
    raw: bytes = b""
    version: str | None = "1.0"
    tokens: tuple[str, ...] = ()
    fresh: bool = True

    def body(self) -> bytes:
        """The bytes to send (a fresh message id resolved now)."""
        if self.request is None:
            return self.raw
        request = type(self.request)()
        request.CopyFrom(self.request)
        if self.fresh and isinstance(request, a2a_pb2.SendMessageRequest):
            request.message.message_id += f"-{next(_FRESH)}"
        return bytes(request.SerializeToString())


@dataclass(frozen=True, slots=True)
class A2AAnswer:
    """How one call ended: status, our ErrorInfo reason, the response bytes."""

    code: grpc.StatusCode
    reason: str = ""
    message: str = ""
    response: bytes = b""
    events: tuple[bytes, ...] = ()


def call_a2a(target: FuzzTarget, case: A2ACase, body: bytes) -> A2AAnswer:
    """Send ``body`` to ``case.method`` as ``case.caller``; never raises for a status."""
    channel = target.channel(case.caller)
    path = f"/{SERVICE.full_name}/{case.method}"
    metadata = () if case.version is None else (("a2a-version", case.version),)
    try:
        if SERVICE.methods_by_name[case.method].server_streaming:
            stream = channel.unary_stream(path, None, None)
            parts = tuple(stream(body, metadata=metadata, timeout=10))
            return A2AAnswer(grpc.StatusCode.OK, response=b"".join(parts), events=parts)
        unary = channel.unary_unary(path, None, None)
        return A2AAnswer(grpc.StatusCode.OK, response=unary(body, metadata=metadata, timeout=10))
    except grpc.RpcError as err:
        return _answer(err)


def _answer(err: grpc.RpcError) -> A2AAnswer:
    call: Any = err
    reason = ""
    try:
        status = rpc_status.from_call(call)
    except ValueError:
        status = None
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info) and info.domain == ERROR_DOMAIN:
            reason = info.reason
            break
    return A2AAnswer(call.code(), reason, call.details() or "")


def check_a2a(target: FuzzTarget, case: A2ACase) -> CaseResult:
    """Run one generated A2A call against the target and check every invariant."""
    seq, runs = target.audit_seq(), target.counter.calls
    body = case.body()
    answer = call_a2a(target, case, body)
    target.flush_audit()
    runs = target.counter.calls - runs
    task = _task_of(case, answer)
    reason = answer.reason or ("OK" if answer.code is grpc.StatusCode.OK else "(no ErrorInfo)")
    result = CaseResult(answer.code, reason, _status_problems(answer))
    records = target.records_after(seq)
    result.records = len(records)
    for record in records:
        result.problems += leak_problems(record, case.tokens)
    if answer.code is grpc.StatusCode.OK and case.method in READS:
        if records or runs:
            result.problems.append(f"an answered {case.method} added {len(records)} records")
        return result
    expected = answer.reason if task is None else _task_reason(task)
    outcomes = [r for r in records if r.reason != ADMITTED]
    if len(outcomes) != 1 or records[-1] is not outcomes[0]:
        result.problems.append(f"audit records {[r.reason for r in records]} for one call")
        return result
    outcome = outcomes[0]
    if outcome.reason != expected:
        result.problems.append(f"audit reason {outcome.reason} but the caller got {expected}")
    admitted = records[:-1]
    if admitted and (len(admitted) > 1 or admitted[0].capability not in target.write_capabilities):
        result.problems.append(f"write-ahead records {[r.capability for r in admitted]}")
    if runs and not admitted:
        result.problems.append("a write ran without a write-ahead record")
    result.problems += _payload_problems(
        case, outcome.payload_size, outcome.payload_sha256, outcome.reason
    )
    fresh_write = (
        task is not None
        and task.status.state == a2a_pb2.TASK_STATE_COMPLETED
        and task.metadata["a2agw.capability"] == WRITE_CAPABILITY
        and not task.artifacts[0].metadata["a2agw.replayed"]
    )
    if runs != (1 if fresh_write else 0):
        result.problems.append(f"{WRITE_CAPABILITY} ran {runs} time(s) for {expected}")
    return result


def _status_problems(answer: A2AAnswer) -> list[str]:
    if answer.code not in A2A_CODES:
        return [f"unexpected status {answer.code.name}: {answer.message[:200]!r}"]
    if answer.code is grpc.StatusCode.OK:
        return []
    if answer.reason not in KNOWN_REASONS:
        return [f"{answer.code.name} without a known a2agw.v1 reason ({answer.reason!r})"]
    if status_code_for(error_for_reason(answer.reason)("")) is not answer.code:
        return [f"reason {answer.reason} sent with status {answer.code.name}"]
    return []


def _task_of(case: A2ACase, answer: A2AAnswer) -> a2a_pb2.Task | None:
    if answer.code is not grpc.StatusCode.OK:
        return None
    if case.method == "SendStreamingMessage":
        return _streamed_task(answer)
    if case.method != "SendMessage":
        return None
    return a2a_pb2.SendMessageResponse.FromString(answer.response).task


def _streamed_task(answer: A2AAnswer) -> a2a_pb2.Task | None:
    """The task a stream ends with: its first event's task, with the last status it
    announced and the artifacts it sent (what a client following it ends up with)."""
    events = [a2a_pb2.StreamResponse.FromString(event) for event in answer.events]
    if not events or events[0].WhichOneof("payload") != "task":
        return None
    task = a2a_pb2.Task()
    task.CopyFrom(events[0].task)
    for event in events[1:]:
        kind = event.WhichOneof("payload")
        if kind == "status_update":
            task.status.CopyFrom(event.status_update.status)
            for key, value in event.status_update.status.message.metadata.items():
                task.metadata[key] = value
        elif kind == "artifact_update":
            task.artifacts.add().CopyFrom(event.artifact_update.artifact)
        elif kind == "task":
            task.CopyFrom(event.task)
    return task


def _task_reason(task: a2a_pb2.Task) -> str:
    if task.status.state == a2a_pb2.TASK_STATE_COMPLETED:
        return "OK"
    return str(task.metadata["a2agw.reason"])


def _payload_problems(case: A2ACase, size: int, digest: str, reason: str) -> list[str]:
    request = case.request
    if not isinstance(request, a2a_pb2.SendMessageRequest) or len(request.message.parts) != 1:
        return []
    part = request.message.parts[0]
    nothing = (0, hashlib.sha256(b"").hexdigest())  # refused before a call was built
    kind = part.WhichOneof("content")
    if kind == "raw" and part.media_type == "application/json":  # the JSON payload itself
        if (size, digest) not in (nothing, (len(part.raw), hashlib.sha256(part.raw).hexdigest())):
            return ["audit size/digest are neither those of the raw part nor of nothing"]
        return []
    if kind not in ("data", "text", "raw") or (size, digest) == nothing:
        return []
    # What the cap counts of a part before anything of it is read: its content, then its
    # file name and media type (a raw part of another media type is a file part).
    content = {"data": part.data.ByteSize, "text": lambda: len(part.text.encode())}.get(
        kind, lambda: len(part.raw)
    )()
    measured = content + len(part.filename.encode()) + len(part.media_type.encode())
    # A text part for a contract that is not text-only fails its decoding INVALID_INPUT.
    never_undecoded = AFTER_DECODING - ({"INVALID_INPUT"} if kind == "text" else set())
    if digest == "":  # refused before (or at) decoding
        if size != measured:
            return [f"undecoded {kind} part audited as {size} bytes, not {measured}"]
        if reason in never_undecoded:
            return [f"{reason} for a {kind} part that was never decoded"]
    elif reason in BEFORE_DECODING:
        return [f"a {kind} part was decoded before the {reason} refusal"]
    return []


# --- generators ------------------------------------------------------------------


@st.composite
def capability_texts(draw: st.DrawFn, made_for: str | None) -> str:
    """``a2agw.capability``: usually right, sometimes with a constraint or an unsafe character."""
    name = made_for or draw(st.sampled_from(CAPABILITIES))
    text = name + draw(st.sampled_from(["", "", "@" + draw(st.sampled_from(VALID_CONSTRAINTS))]))
    odd = draw(st.integers(0, 9))
    if odd == 9:
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(UNSAFE + " \u00a0")) + text[at:]
    elif odd == 8:
        text = draw(st.sampled_from(["", "@", "@^1", "nope.nope", "x" * 200]))
    return text


def _data_part(obj: Any, nan: bool) -> a2a_pb2.Part | None:
    part = a2a_pb2.Part()
    try:
        json_format.ParseDict(obj, part.data)
    except Exception:  # lone surrogates, numbers beyond a double: send it raw instead
        return None
    if nan and part.data.WhichOneof("kind") == "struct_value":
        part.data.struct_value.fields["zz"].number_value = float("nan")
    return part


@st.composite
def parts(draw: st.DrawFn) -> tuple[str | None, list[a2a_pb2.Part], tuple[str, ...]]:
    """(capability made for, the message's parts, planted tokens): mostly one part."""
    kind = draw(st.sampled_from(["data", "raw", "big"]))
    if draw(st.integers(0, 9)) == 9:
        kind = draw(st.sampled_from(["text", "none", "two"]))
    if kind in ("data", "two"):
        made_for, obj, marks = draw(near_valid_objects())
        part = _data_part(obj, nan=draw(st.integers(0, 9)) == 9)
        if part is not None:
            return made_for, [part] * (2 if kind == "two" else 1), tuple(marks)
        kind = "raw"
    if kind == "big":
        token = draw(tokens)
        size = draw(st.integers(60_000, 70_000) | st.integers(0, 200_000))
        part = _data_part({"text": token + "z" * size}, nan=False)
        assert part is not None
        return "text.echo", [part], (token,)
    if kind == "text":
        token = draw(tokens)
        return draw(st.sampled_from(CAPABILITIES)), [a2a_pb2.Part(text=token)], (token,)
    if kind == "none":
        return None, [], ()
    made_for, raw, marks = draw(payloads())
    media = draw(st.sampled_from(["application/json"] * 5 + ["text/plain", ""]))
    return made_for, [a2a_pb2.Part(raw=raw, media_type=media)], marks


_METADATA_VALUES = [
    struct_pb2.Value(string_value="x"),
    struct_pb2.Value(number_value=5),
    struct_pb2.Value(bool_value=True),
    struct_pb2.Value(null_value=struct_pb2.NULL_VALUE),
]
CONTEXT_IDS = ["", "", "", "ctx-1", "ctx-2", "c" * 129, "ctx\n", "ctx\u202e", "ctx 1"]


@st.composite
def send_messages(draw: st.DrawFn) -> tuple[a2a_pb2.SendMessageRequest, tuple[str, ...], bool]:
    """A SendMessage: capability, parts, context, metadata; odd fields now and then."""
    made_for, message_parts, marks = draw(parts())
    message = a2a_pb2.Message(role=a2a_pb2.ROLE_USER, parts=message_parts)
    message.message_id = "m"
    if draw(st.integers(0, 9)) == 9:
        message.message_id = draw(st.sampled_from(["", "bad id!", "x" * 200, "dup"]))
    if draw(st.integers(0, 19)) != 19:
        message.metadata["a2agw.capability"] = draw(capability_texts(made_for))
    if draw(st.integers(0, 3)) == 3:
        message.metadata["a2agw.idempotency_key"] = draw(st.sampled_from(["k1", "k2", "k\n"]))
    if draw(st.integers(0, 9)) == 9:
        key = draw(st.sampled_from(["a2agw.skill", "a2agw.replayed", "a2agw.x", "client.x"]))
        message.metadata.fields[key].CopyFrom(draw(st.sampled_from(_METADATA_VALUES)))
    if draw(st.integers(0, 4)) == 4:
        message.context_id = draw(st.sampled_from(CONTEXT_IDS))
    request = a2a_pb2.SendMessageRequest(message=message)
    odd = draw(st.integers(0, 29))
    if odd == 29:
        request.tenant = "t"
    elif odd == 28:
        request.message.task_id = "task-1"
    return request, marks, message.message_id in ("m", "dup") and draw(st.integers(0, 9)) != 9


PAGE_TOKENS = ["", "", "²", "-1", "1", "abc", "x" * 300, page_token("no-such-task")]


@st.composite
def other_requests(draw: st.DrawFn, method: str) -> Any:
    """A request of ``method`` (not SendMessage) with ids, tokens and timestamps, odd or not."""
    descriptor = SERVICE.methods_by_name[method].input_type
    request = message_factory.GetMessageClass(descriptor)()
    ids = ["t-1", "", "zz", "\x00bad", "9" * 30, "x" * 300]
    for name in ("id", "task_id"):
        if name in descriptor.fields_by_name:
            setattr(request, name, draw(st.sampled_from(ids)))
    if isinstance(request, a2a_pb2.ListTasksRequest):
        request.context_id = draw(st.sampled_from(CONTEXT_IDS))
        request.page_token = draw(st.sampled_from(PAGE_TOKENS))
        if draw(st.booleans()):
            request.page_size = draw(st.integers(-(2**31), 2**31 - 1))
        if draw(st.booleans()):
            request.status = draw(st.integers(0, 9))
        if draw(st.booleans()):
            request.status_timestamp_after.seconds = draw(st.integers(-(2**63), 2**63 - 1))
            request.status_timestamp_after.nanos = draw(st.integers(-(2**31), 2**31 - 1))
        request.include_artifacts = draw(st.booleans())
    if "tenant" in descriptor.fields_by_name and draw(st.integers(0, 9)) == 9:
        request.tenant = "t"
    return request


@st.composite
def a2a_cases(draw: st.DrawFn) -> A2ACase:
    """One A2A call: half SendMessage, the rest any method; one in ten raw bytes."""
    caller = draw(st.sampled_from(FUZZ_CALLERS))
    versions: list[str | None] = ["1.0"] * 8 + ["1.1", "0.3", "2.0", None]
    version = draw(st.sampled_from(versions))
    names = a2a_method_names()
    method = draw(st.sampled_from(["SendMessage"] * len(names) + list(names)))
    if draw(st.integers(0, 9)) == 9:
        token = draw(tokens)
        raw = draw(st.binary(max_size=64)) + token.encode() + draw(st.binary(max_size=64))
        return A2ACase(caller, method, raw=raw, version=version, tokens=(token,))
    if method in ("SendMessage", "SendStreamingMessage"):
        request, marks, fresh = draw(send_messages())
        return A2ACase(caller, method, request, version=version, tokens=marks, fresh=fresh)
    return A2ACase(caller, method, draw(other_requests(method)), version=version)


def describe_case(case: A2ACase) -> str:
    """A short description of a case for a report (never its whole payload)."""
    text = str(case.request)[:300] if case.request is not None else repr(case.raw[:80])
    return json.dumps({"caller": case.caller, "method": case.method, "version": case.version}) + (
        f" {text}"
    )
