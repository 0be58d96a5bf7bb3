"""The fuzz harness: a real agent over mTLS, Invoke input generators, per-call checks.

Shared by ``tests/security/test_fuzz_invoke.py`` (small, in CI) and
``scripts/fuzz_long.py`` (10,000+ cases, by hand). Nothing here is a test.

The agent runs in its own thread with its own event loop, so hypothesis tests
stay synchronous and drive it through blocking gRPC channels built exactly as
``gateway.client.peer_client.PeerClient`` builds its own (same credentials, same options).
Calls are made one at a time: every audit record (the outcome record, and the
write-ahead ``ADMITTED`` record of an admitted write) and every run of the
write capability is then attributable to exactly one call.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import strategies as st

from capabilities.contract import Risk
from gateway.audit import AuditRecord, query_records
from gateway.audit.filter import AuditFilter
from gateway.errors import ERROR_DOMAIN, all_error_classes, error_for_reason
from gateway.inbound.invoke_handler import ADMITTED
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader
from gateway.transport.status import status_code_for
from gateway.transport.tls import TlsMaterial, channel_options
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    standard_registry,
    started,
    write_policy,
)

T = TypeVar("T")

INVOKE_METHOD = "/a2agw.v1.PeerGateway/Invoke"
CAP_BYTES = 64 * 1024
"""bob's payload cap: generated payloads reach just past it."""

EXPECTED_CODES = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.UNAUTHENTICATED,
        # IDEMPOTENCY_IN_DOUBT: a write with this key was cut off earlier (e.g. by
        # its deadline), so running it again could write twice.
        grpc.StatusCode.ABORTED,
    }
)
"""Every status a fuzzed call may end with; never INTERNAL, UNKNOWN or UNAVAILABLE."""

KNOWN_REASONS = frozenset(cls.reason for cls in all_error_classes())

FUZZ_CALLERS = ("bob", "bob", "bob", "bob", "carol", "dave", "mallory", "anon")
"""Who calls (bob, fully granted, most often). ``anon`` has no SPIFFE ID at all."""

WRITE_CAPABILITY = "notes.write"
"""The capability whose runs ``WriteCounter`` counts."""


# --- the target ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """How one Invoke ended, as the caller saw it.

    Attributes:
        code: The gRPC status code.
        reason: ``ErrorInfo.reason`` of an error status ("" if none was attached).
        domain: ``ErrorInfo.domain`` ("" if none was attached).
        message: The status message.
        reply: The response of a successful call.
    """

    code: grpc.StatusCode
    reason: str = ""
    domain: str = ""
    message: str = ""
    reply: gateway_pb2.InvokeResponse | None = None


def _answer_from_error(err: grpc.RpcError) -> Answer:
    call: Any = err
    reason = domain = ""
    try:
        status = rpc_status.from_call(call)
    except ValueError:  # details and status disagree: count it as "no ErrorInfo"
        status = None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, domain = info.reason, info.domain
    return Answer(call.code(), reason, domain, call.details() or "")


class FuzzTarget:
    """One real agent (built-ins plus the counting ``notes.write``) on 127.0.0.1:0.

    Grants: bob gets every built-in and ``notes.write`` up to ``CAP_BYTES``;
    carol only ``read`` risk; dave's grant has expired; mallory has none; the
    ``anon`` certificate carries no SPIFFE ID; frank may send ``notes.write`` at
    most 11 bytes, the smallest input it accepts.
    """

    def __init__(self, pki: Pki, base: Path) -> None:
        self.counter = WriteCounter()
        policy = write_policy(
            base / "fuzz-policy.toml",
            [
                grant(
                    "bob",
                    ["text.echo@^1", "text.search@^1", "kv.put@1", "kv.get", "notes.write@1"],
                    max_payload_bytes=CAP_BYTES,
                ),
                grant("carol", ["text.echo", "text.search", "notes.write"], max_risk="read"),
                grant("dave", ["text.echo", "notes.write"], expires_at="2020-01-01T00:00:00Z"),
                grant("frank", ["notes.write"], max_payload_bytes=11),
            ],
        )
        pki.ensure("frank")
        config = agent_config(pki, base, "fuzz-alice", policy)
        registry = standard_registry(self.counter, base / "fuzz-alice-state")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fuzz-agent", daemon=True
        )
        self._thread.start()
        self.agent: Agent = self.run(started(config, registry))
        self.write_capabilities = frozenset(
            cap.name for cap in registry if cap.contract.risk is not Risk.READ
        )
        materials = {name: pki.material(name) for name in ("bob", "carol", "dave", "mallory")}
        materials["frank"] = pki.material("frank")
        materials["anon"] = pki.odd_material(uris=[])
        self._channels = {name: self._channel(m) for name, m in materials.items()}
        self._stubs = {
            name: gateway_pb2_grpc.PeerGatewayStub(ch)  # type: ignore[no-untyped-call]
            for name, ch in self._channels.items()
        }

    def _channel(self, material: TlsMaterial) -> grpc.Channel:
        return grpc.secure_channel(
            self.agent.address,
            material.channel_credentials(),
            options=channel_options(self.agent.config.id),
        )

    def channel(self, caller: str) -> grpc.Channel:
        """``caller``'s blocking channel to the agent (any service on its port)."""
        return self._channels[caller]

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the agent's event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def invoke(
        self, caller: str, request: gateway_pb2.InvokeRequest, timeout: float = 10.0
    ) -> Answer:
        """One Invoke as ``caller``; never raises for a status, only returns it."""
        try:
            reply, _ = self._stubs[caller].Invoke.with_call(request, timeout=timeout)
        except grpc.RpcError as err:
            return _answer_from_error(err)
        return Answer(grpc.StatusCode.OK, reply=reply)

    def invoke_raw(self, caller: str, raw: bytes, timeout: float = 10.0) -> Answer:
        """Send ``raw`` bytes as the Invoke request message, unparsed by the client."""
        method = self._channels[caller].unary_unary(
            INVOKE_METHOD, request_serializer=None, response_deserializer=None
        )
        try:
            data, _ = method.with_call(raw, timeout=timeout)
        except grpc.RpcError as err:
            return _answer_from_error(err)
        return Answer(grpc.StatusCode.OK, reply=gateway_pb2.InvokeResponse.FromString(data))

    def flush_audit(self) -> None:
        """Wait until every record queued so far is committed."""
        self.run(self.agent.audit.flush())

    def audit_seq(self) -> int:
        """The seq of the last committed audit record (0 for an empty log)."""
        last = query_records(open_audit_reader(self.agent.config.audit_db), AuditFilter(limit=1))
        return last[0].seq if last else 0

    def records_after(self, seq: int) -> list[AuditRecord]:
        """Committed records with a seq above ``seq`` (call flush_audit first)."""
        return [
            r
            for r in query_records(
                open_audit_reader(self.agent.config.audit_db), AuditFilter(limit=64)
            )
            if r.seq > seq
        ]

    def echo_still_works(self) -> bool:
        """A plain, valid call still succeeds: the server keeps serving."""
        answer = self.invoke(
            "bob",
            gateway_pb2.InvokeRequest(
                request_id=f"still-serving-{uuid.uuid4().hex}",
                capability="text.echo",
                payload=b'{"text":"still serving"}',
            ),
        )
        return (
            answer.code is grpc.StatusCode.OK
            and answer.reply is not None
            and (json.loads(answer.reply.payload) == {"text": "still serving"})
        )

    def close(self) -> None:
        """Close the channels, stop the agent and its loop thread."""
        for channel in self._channels.values():
            channel.close()
        self.run(self.agent.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


# --- one case and its checks ---------------------------------------------------


_FRESH_IDS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class InvokeCase:
    """One generated Invoke: who calls, the envelope, the payload and its markers.

    Attributes:
        caller: Key of ``FuzzTarget`` channels.
        request_id: Sent verbatim, or with a unique suffix when ``fresh``.
        capability: Sent verbatim.
        constraint: Version constraint, sent verbatim.
        payload: Raw payload bytes.
        deadline: ``("abs", ms)`` sent as is, or ``("rel", ms)`` added to now at send time.
        task_id: Sent verbatim.
        step_id: Sent verbatim.
        idempotency_key: Sent verbatim.
        tokens: Distinctive strings inside the payload that no audit field may hold.
        fresh: Append a never-used suffix to ``request_id``.
    """

    caller: str
    request_id: str
    capability: str
    constraint: str
    payload: bytes
    deadline: tuple[str, int] = ("abs", 0)
    task_id: str = ""
    step_id: str = ""
    idempotency_key: str = ""
    tokens: tuple[str, ...] = ()
    fresh: bool = False

    def request(self) -> gateway_pb2.InvokeRequest:
        """The protobuf request, with a relative deadline resolved against now."""
        kind, value = self.deadline
        deadline = value if kind == "abs" else int(time.time() * 1000) + value
        request_id = self.request_id
        if self.fresh:
            # Replay protection refuses a request id a peer already used.
            request_id = f"{request_id}-{next(_FRESH_IDS)}"
        return gateway_pb2.InvokeRequest(
            request_id=request_id,
            capability=self.capability,
            version_constraint=self.constraint,
            payload=self.payload,
            deadline_unix_ms=max(-(2**63), min(deadline, 2**63 - 1)),
            task_id=self.task_id,
            step_id=self.step_id,
            idempotency_key=self.idempotency_key,
        )


@dataclass
class CaseResult:
    """What one case did, and every invariant it broke (empty when all held).

    Attributes:
        records: Audit records the call added (1, or 2 with a write-ahead record).
    """

    code: grpc.StatusCode
    reason: str
    problems: list[str] = field(default_factory=list)
    reached_gateway: bool = True
    records: int = 0


def answer_problems(answer: Answer) -> list[str]:
    """Problems with the status alone: unexpected code, missing or wrong ErrorInfo."""
    problems: list[str] = []
    if answer.code not in EXPECTED_CODES:
        problems.append(f"unexpected status {answer.code.name}: {answer.message[:200]!r}")
    if answer.code is grpc.StatusCode.OK:
        return problems
    if answer.domain != ERROR_DOMAIN:
        problems.append(f"{answer.code.name} without ErrorInfo(domain={ERROR_DOMAIN})")
    elif answer.reason not in KNOWN_REASONS:
        problems.append(f"unknown reason code {answer.reason!r}")
    elif status_code_for(error_for_reason(answer.reason)("")) is not answer.code:
        problems.append(f"reason {answer.reason} sent with status {answer.code.name}")
    return problems


def record_problems(
    record: AuditRecord, answer: Answer, payload: bytes, tokens: tuple[str, ...]
) -> list[str]:
    """Problems with the outcome record of a call: leaks, wrong reason, wrong digest."""
    problems = leak_problems(record, tokens)
    expected_reason = "OK" if answer.code is grpc.StatusCode.OK else answer.reason
    if record.reason != expected_reason:
        got = expected_reason or f"{answer.code.name} without a reason"
        problems.append(f"audit reason {record.reason} but the caller got {got}")
    if record.payload_size != len(payload):
        problems.append(f"audit payload_size {record.payload_size} != {len(payload)}")
    if record.payload_sha256 != hashlib.sha256(payload).hexdigest():
        problems.append("audit payload_sha256 is not the digest of the payload sent")
    return problems


def leak_problems(record: AuditRecord, tokens: tuple[str, ...]) -> list[str]:
    """One problem per planted payload string found anywhere in the record."""
    dumped = json.dumps(record.to_json_dict(), ensure_ascii=False)
    return [f"audit record holds payload text {t!r}" for t in tokens if t in dumped]


def write_ahead_problems(
    records: list[AuditRecord], target: FuzzTarget, ran: bool, answer: Answer
) -> list[str]:
    """Problems with the write-ahead rule: an admitted write/external call gets one
    ``ADMITTED`` record, committed before it runs and before its outcome record."""
    admitted = [r for r in records if r.reason == ADMITTED]
    if not admitted:
        reply = answer.reply
        wrote = reply is not None and reply.capability in target.write_capabilities
        return ["a write ran without a write-ahead record"] if ran or wrote else []
    first = records[0]
    problems = []
    if len(admitted) > 1 or first.reason != ADMITTED:
        problems.append(f"write-ahead records out of place: {[r.reason for r in records]}")
    if first.capability not in target.write_capabilities or first.decision != "allow":
        problems.append(f"write-ahead record for {first.capability!r} ({first.decision})")
    last = records[-1]
    # A key reused with another payload is refused after its ADMITTED record (nothing ran).
    if last.decision != "allow" and last.reason != "IDEMPOTENCY_CONFLICT":
        problems.append("an ADMITTED call was then refused")
    return problems


def counter_problem(answer: Answer, runs: int) -> str | None:
    """The write capability ran exactly once per fresh OK answer for it, else never.

    (A write whose output exceeds the cap runs and answers OUTPUT_TOO_LARGE by
    design; only frank's 11-byte grant can get there, and frank is not fuzzed.)
    """
    reply = answer.reply
    fresh_write = (
        answer.code is grpc.StatusCode.OK
        and reply is not None
        and reply.capability == WRITE_CAPABILITY
        and not reply.replayed
    )
    if runs != (1 if fresh_write else 0):
        return f"{WRITE_CAPABILITY} ran {runs} time(s) for a {answer.code.name} answer"
    return None


def check_reached(
    target: FuzzTarget, send: Callable[[], Answer], payload: bytes, tokens: tuple[str, ...]
) -> CaseResult:
    """Send one call that reaches the gateway code and check every invariant."""
    seq, runs = target.audit_seq(), target.counter.calls
    answer = send()
    target.flush_audit()
    runs = target.counter.calls - runs
    reason = answer.reason or ("OK" if answer.code is grpc.StatusCode.OK else "(no ErrorInfo)")
    result = CaseResult(answer.code, reason, answer_problems(answer))
    records = target.records_after(seq)
    result.records = len(records)
    outcomes = [r for r in records if r.reason != ADMITTED]
    if len(outcomes) != 1 or records[-1] is not outcomes[0]:
        result.problems.append(f"audit records {[r.reason for r in records]} for one call")
    else:
        result.problems += record_problems(outcomes[0], answer, payload, tokens)
    for record in records[:-1]:
        result.problems += leak_problems(record, tokens)
    result.problems += write_ahead_problems(records, target, runs > 0, answer)
    problem = counter_problem(answer, runs)
    if problem:
        result.problems.append(problem)
    return result


def check_invoke(target: FuzzTarget, case: InvokeCase) -> CaseResult:
    """Run one generated Invoke against the target and check every invariant."""
    request = case.request()
    return check_reached(
        target, lambda: target.invoke(case.caller, request), case.payload, case.tokens
    )


def parses_as_request(raw: bytes) -> gateway_pb2.InvokeRequest | None:
    """The request ``raw`` decodes to, or None if protobuf refuses it."""
    try:
        return gateway_pb2.InvokeRequest.FromString(raw)
    except DecodeError:
        return None


def check_raw(target: FuzzTarget, caller: str, raw: bytes, token: str) -> CaseResult:
    """Send raw bytes as the request message and check what must hold for them.

    Bytes that decode are an ordinary request (unknown fields are ignored).
    Bytes that do not decode still reach the gateway: the server's tolerant
    deserializer hands the servicer a stand-in, which is refused as
    INVALID_REQUEST and audited as an empty request (size 0, no ids). Without
    it gRPC would answer UNKNOWN itself and nothing would be audited.

    ``token`` was put in the payload; it is a leak only if it reaches the record
    while no envelope field (which the record may hold) carries it.
    """
    request = parses_as_request(raw)
    if request is None:
        payload, marks = b"", (token,)
    else:
        envelope = (request.request_id, request.capability, request.version_constraint)
        envelope += (request.task_id, request.step_id)
        payload = request.payload
        marks = () if any(token in text for text in envelope) else (token,)
    result = check_reached(target, lambda: target.invoke_raw(caller, raw), payload, marks)
    if request is None:
        result.reached_gateway = False
        if result.code is grpc.StatusCode.OK or result.reason not in _UNDECODABLE_REASONS:
            result.problems.append(f"undecodable request answered {result.reason}")
    return result


_UNDECODABLE_REASONS = frozenset({"INVALID_REQUEST", "UNAUTHENTICATED"})
"""Identity is checked first, so ``anon`` hears UNAUTHENTICATED, everyone else this."""


# --- generators ------------------------------------------------------------------

CAPABILITIES = ("text.echo", "text.search", "kv.put", "kv.get", "notes.write")
VALID_CONSTRAINTS = (
    "",
    "*",
    "1",
    "1.0",
    "1.0.0",
    "=1.0.0",
    "==1",
    "^1",
    "^1.0",
    "~1.0",
    ">=1.0,<2",
)
UNSATISFIED_CONSTRAINTS = ("2", "^2", "0.9", "<1", ">1.0.0", "~1.1", ">=1,<1")

tokens = st.integers(0, 2**64 - 1).map(lambda n: f"PL{n:016x}Z")
"""Distinctive payload strings: any of them in an audit record is a leak."""

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63, max_value=2**200),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    # Lone surrogates: json.dumps(ensure_ascii=True) writes them as \udXXX escapes.
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3),
)

json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def deep_values(draw: st.DrawFn, token: str) -> Any:
    """``token`` under lists or objects nested up to 600 levels (parsers stop near 200)."""
    depth, as_list = draw(st.integers(1, 600)), draw(st.booleans())
    value: Any = token
    for _ in range(depth):
        value = [value] if as_list else {"a": value}
    return value


_FIELDS: dict[str, dict[str, int | None]] = {
    "text.echo": {"text": 1_000_000},
    "text.search": {"query": 200, "limit": None},
    "kv.put": {"key": 256, "value": 65_536},
    "kv.get": {"key": 256},
    "notes.write": {"note": None},
}
"""Input fields of each capability and the length limit of text fields (None: int or no limit)."""

_WRONG_TYPES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-5, 30),
    st.floats(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(["", "3", "1.5", "true", "NaN"]),
)


@st.composite
def _field_value(draw: st.DrawFn, name: str, limit: int | None) -> tuple[Any, str | None]:
    if name == "limit":
        return draw(st.integers(1, 20)), None
    if name == "query":
        return draw(st.sampled_from(["audit", "mtls basics", "spiffe id", "x" * 200])), None
    token = draw(tokens)
    cap = min(limit or CAP_BYTES, CAP_BYTES)
    pad = draw(st.sampled_from([0, 0, 0, 1, cap - len(token), cap + 1 - len(token)]))
    return token + draw(st.text(max_size=8)) + "y" * max(0, pad), token


@st.composite
def near_valid_objects(draw: st.DrawFn) -> tuple[str, dict[str, Any], list[str]]:
    """(capability, object, tokens): a valid input with fields dropped, retyped or added.

    Sometimes one unknown key is up to 20,000 characters long: error messages
    once echoed such keys, and gRPC dropped the over-long status trailer.
    """
    capability = draw(st.sampled_from(CAPABILITIES))
    marks: list[str] = []
    obj: dict[str, Any] = {}
    for name, limit in _FIELDS[capability].items():
        # Hypothesis leans to small draws: keep the valid choice the smallest one.
        if draw(st.integers(0, 9)) == 9:
            continue  # field missing
        value, token = draw(_field_value(name, limit))
        if draw(st.integers(0, 5)) == 5:
            value, token = draw(_WRONG_TYPES), None
        obj[name] = value
        if token:
            marks.append(token)
    if draw(st.integers(0, 3)) == 3:
        for _ in range(draw(st.integers(1, 2))):
            key = draw(st.text(max_size=20) | st.sampled_from(["Text", "note ", "__proto__"]))
            obj.setdefault(key, draw(json_values))
    if draw(st.integers(0, 3)) == 3:
        token = draw(tokens)
        # gRPC drops status trailers of 8-16 KiB and more; the message holds the key twice.
        size = draw(st.integers(0, 20_000) | st.integers(8_000, 20_000))
        obj[token + "k" * size] = draw(json_values)
        marks.append(token)
    return capability, obj, marks


def _encode(value: Any, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


_MANGLES = ("truncate", "append", "bom", "utf16", "latin1", "spaces", "nul")


def _mangle(raw: bytes, how: str, cut: int, junk: bytes) -> bytes:
    if how == "truncate":
        return raw[:cut]
    if how == "append":
        return raw + junk
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "utf16":
        return raw.decode("utf-8", "surrogatepass").encode("utf-16", "surrogatepass")
    if how == "latin1":
        return raw.replace(b'"', b'"\xe9', 1)
    if how == "nul":
        return raw[:cut] + b"\x00" + raw[cut:]
    return b" \n\t" + raw + b"\r\n "


@st.composite
def payloads(draw: st.DrawFn) -> tuple[str | None, bytes, tuple[str, ...]]:
    """(capability the payload was made for, or None; raw payload; its tokens).

    Kinds: near-valid inputs of each capability (most often), the same mangled
    (truncated, junk appended, BOM, UTF-16, invalid UTF-8, NUL, whitespace),
    arbitrary JSON, deep nesting, strings around bob's cap, arbitrary bytes.
    """
    kind = draw(
        st.sampled_from(["near", "near", "near", "mangled", "json", "deep", "huge", "bytes"])
    )
    token = draw(tokens)
    ascii_only = draw(st.booleans())
    if kind == "bytes":
        head, tail = draw(st.binary(max_size=64)), draw(st.binary(max_size=64))
        return None, head + token.encode() + tail, (token,)
    field_name = draw(st.sampled_from(["text", "note", "value", "key", "query"]))
    if kind == "json":
        value: Any = [draw(json_values), token]
        value = draw(st.sampled_from([value, {field_name: value}, {field_name: token}]))
        return None, _encode(value, ascii_only), (token,)
    if kind == "deep":
        return None, _encode({field_name: draw(deep_values(token))}, ascii_only), (token,)
    if kind == "huge":
        size = draw(st.integers(CAP_BYTES - 64, CAP_BYTES + 64) | st.integers(0, 2 * CAP_BYTES))
        return None, _encode({field_name: token + "z" * size}, ascii_only), (token,)
    capability, obj, marks = draw(near_valid_objects())
    raw = _encode(obj, ascii_only)
    if kind == "mangled":
        how = draw(st.sampled_from(_MANGLES))
        raw = _mangle(raw, how, draw(st.integers(0, len(raw))), draw(st.binary(max_size=8)))
        marks = [m for m in marks if m.encode() in raw]
    return capability, raw, tuple(marks)


capability_names = st.one_of(
    st.sampled_from(CAPABILITIES),
    st.sampled_from(["kv.delete", "no.such.thing", "Text.Echo", "text.echo ", "text", ""]),
    st.text(max_size=40),
    st.text(min_size=129, max_size=400),
)

constraints = st.one_of(
    st.sampled_from(VALID_CONSTRAINTS + UNSATISFIED_CONSTRAINTS),
    st.builds(
        lambda op, parts: op + ".".join(str(p) for p in parts),
        st.sampled_from(["", "^", "~", ">=", "<=", ">", "<", "=", "==", "=>", "^^", "!"]),
        st.lists(st.integers(-1, 10**10), max_size=4),
    ),
    st.text(max_size=40),
    st.text(alphabet="0123456789.^~<>=, *\u0661", max_size=200),
)

request_ids = st.one_of(
    st.from_regex(r"[A-Za-z0-9._:\-]{1,128}", fullmatch=True),
    st.sampled_from(["dup-1", "dup-2"]),  # replays
    st.just(""),
    st.text(alphabet="abc", min_size=129, max_size=300),
    st.text(max_size=160),
    st.sampled_from(["bad id", "r\n", "r\x00", "\u00fc", "\u0661\u0662\u0663", "req-1\n"]),
)

deadlines = st.one_of(
    st.just(("abs", 0)),
    st.tuples(st.just("abs"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("abs"), st.sampled_from([-1, 1, 2**63 - 1, -(2**63), 10**15])),
    st.tuples(st.just("rel"), st.integers(-(10**9), -1)),  # already passed
    st.tuples(st.just("rel"), st.integers(0, 50)),  # about to pass
    st.tuples(st.just("rel"), st.integers(1000, 10**12)),
)

plain_characters = st.characters(exclude_categories=["Cc", "Cf", "Cs", "Zl", "Zp"])
"""Characters the door lets through in ids and keys (control and bidi ones are INVALID_REQUEST)."""

side_strings = st.one_of(
    st.just(""),
    st.text(max_size=20),
    st.text(plain_characters, max_size=20),
    st.text(min_size=120, max_size=300),
    st.text(plain_characters, min_size=120, max_size=300),
)
"""Task and step ids: any text, and text the door admits, so calls still reach deeper checks."""

idempotency_keys = st.one_of(
    st.just(""),
    st.sampled_from(["k1", "k2", "k3"]),
    st.text(max_size=40),
    st.text(plain_characters, max_size=40),
)


def _sometimes(draw: st.DrawFn, usual: st.SearchStrategy[T], odd: st.SearchStrategy[T]) -> T:
    """``odd`` one time in five, else ``usual`` (the smaller draw, which hypothesis favours)."""
    return draw(odd) if draw(st.integers(0, 4)) == 4 else draw(usual)


@st.composite
def invoke_cases(draw: st.DrawFn) -> InvokeCase:
    """A whole Invoke: caller, envelope and payload; each envelope field is odd one time in five."""
    made_for, payload, marks = draw(payloads())
    usual_id = st.from_regex(r"[A-Za-z0-9._:\-]{1,40}", fullmatch=True).map(lambda i: (i, True))
    request_id, fresh = _sometimes(
        draw, usual_id, st.tuples(request_ids, st.booleans().map(lambda b: not b))
    )
    return InvokeCase(
        caller=draw(st.sampled_from(FUZZ_CALLERS)),
        request_id=request_id,
        capability=_sometimes(
            draw, st.just(made_for) if made_for else st.sampled_from(CAPABILITIES), capability_names
        ),
        constraint=_sometimes(draw, st.sampled_from(VALID_CONSTRAINTS), constraints),
        payload=payload,
        deadline=_sometimes(draw, st.just(("rel", 30_000)), deadlines),
        task_id=draw(side_strings),
        step_id=draw(side_strings),
        idempotency_key=draw(idempotency_keys),
        tokens=marks,
        fresh=fresh,
    )


def _field(number: int, wire_type: int, body: bytes) -> bytes:
    tag = bytes([(number << 3) | wire_type])
    if wire_type == 2:
        return tag + _varint(len(body)) + body
    return tag + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@st.composite
def raw_requests(draw: st.DrawFn) -> tuple[bytes, str]:
    """(request message bytes, the token in their payload): random, mutated valid, or crafted.

    Crafted cases hold invalid UTF-8 in a string field, the wrong wire type for
    a known field, or a varint that never ends.
    """
    token = draw(tokens)
    valid = gateway_pb2.InvokeRequest(
        # Fixed width: the draws below depend on the message length, which
        # must not change when hypothesis replays this case.
        request_id=f"raw-{next(_FRESH_IDS) % 10**12:012d}",
        capability="text.echo",
        payload=json.dumps({"text": token}).encode(),
    ).SerializeToString()
    kind = draw(st.sampled_from(["random", "flip", "truncate", "utf8", "wiretype", "varint"]))
    if kind == "random":
        return draw(st.binary(max_size=256)) + token.encode() + draw(st.binary(max_size=256)), token
    if kind == "flip":
        index = draw(st.integers(0, len(valid) - 1))
        raw = valid[:index] + bytes([draw(st.integers(0, 255))]) + valid[index + 1 :]
    elif kind == "truncate":
        raw = valid[: draw(st.integers(0, len(valid) - 1))]
    elif kind == "utf8":
        # A string field (1 request_id, 2 capability, 3 constraint, 6-8) holding invalid UTF-8.
        number = draw(st.sampled_from([1, 2, 3, 6, 7, 8]))
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"a\x80b", b"\xf8\x88"]))
        raw = valid + _field(number, 2, bad)
    elif kind == "wiretype":
        number = draw(st.integers(1, 8))
        raw = valid + _field(number, draw(st.sampled_from([0, 1, 5])), b"\x01" * 8)
    else:
        raw = valid + bytes([0x28]) + b"\xff" * draw(st.integers(1, 12))  # field 5 varint
    return raw, token
