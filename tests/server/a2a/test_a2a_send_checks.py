"""SendMessage is checked before its data part is converted, and refuses what Invoke refuses.

A data part holding NaN cannot become JSON: decoding it is refused
INVALID_REQUEST. So a NaN deep inside a part is a probe: any other answer
proves the part was never decoded.
"""

from __future__ import annotations

import hashlib

import grpc
import pytest
from a2a.types import a2a_pb2
from google.protobuf import struct_pb2

from gateway.audit import AuditRecord
from gateway.runtime.agent import Agent
from gateway.server.a2a.messages import MAX_METADATA_KEYS
from gateway.transport.status import from_rpc_error
from gateway.wire.v1 import gateway_pb2
from tests.helpers.a2a_grpc import V1, A2APeer, data_request, last_record, output_of, poisoned
from tests.helpers.agents import Pki, WriteCounter, audit_rows, raw_invoke, spiffe

UNDECODABLE = "the data part holds a number JSON cannot carry"


async def refusal(peer: A2APeer, request: a2a_pb2.SendMessageRequest) -> grpc.aio.AioRpcError:
    """The error ``request`` is refused with over the raw stub (no SDK conversions)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await peer.stub.SendMessage(request, metadata=V1, timeout=20)
    return info.value


def size_of(request: a2a_pb2.SendMessageRequest) -> int:
    return int(request.message.parts[0].data.ByteSize())


async def only_new_record(agent: Agent, before: int) -> AuditRecord:
    await agent.audit.flush()
    rows = audit_rows(agent.config.audit_db)[before:]
    assert len(rows) == 1, rows
    return rows[0]


# --- item 1: identity, grant, limits and cap before the part is converted ------


@pytest.mark.parametrize(
    ("caller", "capability", "blob", "reason", "code"),
    [
        ("mallory", "notes.write", 3_000_000, "UNKNOWN_PEER", grpc.StatusCode.PERMISSION_DENIED),
        ("dave", "text.echo", 100_000, "GRANT_EXPIRED", grpc.StatusCode.PERMISSION_DENIED),
        ("bob", "nope.nope", 100, "CAPABILITY_NOT_GRANTED", grpc.StatusCode.PERMISSION_DENIED),
        ("carol", "notes.write", 100, "RISK_NOT_GRANTED", grpc.StatusCode.PERMISSION_DENIED),
        ("bob", "notes.write", 3_000_000, "PAYLOAD_TOO_LARGE", grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("bob", "notes.write", 2_000, "PAYLOAD_TOO_LARGE", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
async def test_refusals_up_to_the_cap_never_decode_the_data_part(
    pki: Pki,
    alice: Agent,
    counter: WriteCounter,
    caller: str,
    capability: str,
    blob: int,
    reason: str,
    code: grpc.StatusCode,
) -> None:
    request = poisoned(capability, blob)
    before = len(audit_rows(alice.config.audit_db))
    async with A2APeer(pki, alice, caller) as peer:
        err = await refusal(peer, request)
    assert (err.code(), from_rpc_error(err).reason) == (code, reason)  # not INVALID_REQUEST
    record = await only_new_record(alice, before)
    assert (record.peer_id, record.decision, record.reason, record.capability) == (
        spiffe(caller),
        "refuse",
        reason,
        capability,
    )
    # The serialized size of the part, and no digest: nothing was converted or hashed.
    assert (record.payload_size, record.payload_sha256) == (size_of(request), "")
    assert counter.calls == 0


async def test_an_admitted_part_is_decoded_and_its_failure_audited(
    alice: Agent, bob: A2APeer, counter: WriteCounter
) -> None:
    request = poisoned("notes.write", 0)
    err = await refusal(bob, request)
    assert (err.code(), from_rpc_error(err).reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    assert err.details() == UNDECODABLE
    record = await last_record(alice)
    assert (record.reason, record.payload_size, record.payload_sha256) == (
        "INVALID_REQUEST",
        size_of(request),
        "",
    )
    assert counter.calls == 0


async def test_the_json_a_part_becomes_is_within_the_cap_too(
    alice: Agent, bob: A2APeer, counter: WriteCounter
) -> None:
    # 300 control characters: ~310 bytes as protobuf, 1800 as JSON ("\u0001" each).
    request = data_request("notes.write", {"note": "\x01" * 300})
    assert size_of(request) < 1024
    err = await refusal(bob, request)
    assert from_rpc_error(err).reason == "PAYLOAD_TOO_LARGE"
    record = await last_record(alice)
    payload = b'{"note":"' + b"\\u0001" * 300 + b'"}'
    assert (record.reason, record.payload_size, record.payload_sha256) == (
        "PAYLOAD_TOO_LARGE",
        len(payload),
        hashlib.sha256(payload).hexdigest(),
    )
    assert counter.calls == 0


async def test_an_allowed_data_call_is_audited_with_the_digest_of_its_json(
    alice: Agent, bob: A2APeer, counter: WriteCounter
) -> None:
    task = await bob.send(data_request("notes.write", {"note": "a"}))
    assert output_of(task) == {"stored": 1} and counter.calls == 1
    record = await last_record(alice)
    payload = b'{"note":"a"}'
    assert (record.reason, record.payload_size, record.payload_sha256) == (
        "OK",
        len(payload),
        hashlib.sha256(payload).hexdigest(),
    )


# --- item 2: context_id is an id ---------------------------------------------

BAD_CONTEXT_IDS = [
    "c" * 129,
    "c" * 1_000_000,
    "ctx\n1",
    "ctx\x00",
    "ctx\u202e1",
    "ctx\u2028",
    "ctx 1",
    "ctx/1",
    "ctx-é",
]


@pytest.mark.parametrize("context_id", BAD_CONTEXT_IDS, ids=lambda c: repr(c[:12]))
async def test_a_context_id_that_is_not_an_id_is_refused_and_nothing_is_stored(
    alice: Agent, bob: A2APeer, counter: WriteCounter, context_id: str
) -> None:
    request = data_request("notes.write", {"note": "a"})
    request.message.context_id = context_id
    err = await refusal(bob, request)
    assert (err.code(), from_rpc_error(err).reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    assert err.details() == "context_id must be empty or 1-128 characters of [A-Za-z0-9._:-]"
    record = await last_record(alice)
    assert (record.decision, record.reason, record.peer_id) == (
        "refuse",
        "INVALID_REQUEST",
        spiffe("bob"),
    )
    assert counter.calls == 0
    listed = await bob.stub.ListTasks(a2a_pb2.ListTasksRequest(), metadata=V1)
    assert listed.total_size == 0


async def test_a_context_id_of_128_id_characters_is_kept(alice: Agent, bob: A2APeer) -> None:
    context_id = "A-z0.9_:" * 16
    request = data_request("text.echo", {"text": "t"})
    request.message.context_id = context_id
    task = await bob.send(request)
    assert task.context_id == context_id
    listed = await bob.stub.ListTasks(a2a_pb2.ListTasksRequest(context_id=context_id), metadata=V1)
    assert [t.id for t in listed.tasks] == [task.id]


# --- item 5: the capability name is refused, never normalized (both doors) ---

UNSAFE = [
    "\t",
    "\n",
    "\r",
    "\x0b",
    "\x0c",
    "\x00",
    "\x1b",
    "\x1f",
    "\x7f",
    "\x85",
    "\x9b",
    "\u2028",
    "\u2029",
    "\u061c",
    "\u200e",
    "\u200f",
    "\u202a",
    "\u202e",
    "\u2066",
    "\u2069",
]
"""One of each class: C0 whitespace and controls, DEL, C1 (NEL, CSI), separators, bidi."""
PLAIN_SPACES = [" ", "\u00a0", "\u2003", "\u3000"]
"""Whitespace that displays safely: not refused as unsafe, but never stripped either."""


def capability_texts(char: str) -> list[tuple[str, str]]:
    """(name, constraint) spellings of notes.write with ``char`` around or inside."""
    return [
        ("notes.write" + char, ""),
        (char + "notes.write", ""),
        ("notes." + char + "write", ""),
        ("notes.write", "1" + char),
        ("notes.write", char + "1"),
    ]


async def both_doors(
    pki: Pki, alice: Agent, bob: A2APeer, name: str, constraint: str, n: int
) -> tuple[str, str]:
    """The reason A2A and Invoke refuse ``name@constraint`` with."""
    text = f"{name}@{constraint}" if constraint else name
    a2a = await refusal(bob, data_request(text, {"note": "a"}))
    invoke = await raw_invoke(
        pki,
        alice,
        "bob",
        gateway_pb2.InvokeRequest(
            request_id=f"inv-{n}",
            capability=name,
            version_constraint=constraint,
            payload=b'{"note":"a"}',
        ),
    )
    return from_rpc_error(a2a).reason, from_rpc_error(invoke).reason


@pytest.mark.parametrize("char", UNSAFE, ids=lambda c: f"U+{ord(c):04X}")
async def test_an_unsafe_character_in_the_capability_is_refused_on_both_doors(
    pki: Pki, alice: Agent, bob: A2APeer, counter: WriteCounter, char: str
) -> None:
    for n, (name, constraint) in enumerate(capability_texts(char)):
        before = len(audit_rows(alice.config.audit_db))
        reasons = await both_doors(pki, alice, bob, name, constraint, n)
        assert reasons == ("INVALID_REQUEST", "INVALID_REQUEST"), (name, constraint)
        await alice.audit.flush()
        rows = audit_rows(alice.config.audit_db)[before:]
        assert [(r.decision, r.reason) for r in rows] == [("refuse", "INVALID_REQUEST")] * 2
    assert counter.calls == 0


@pytest.mark.parametrize("char", PLAIN_SPACES, ids=lambda c: f"U+{ord(c):04X}")
async def test_plain_whitespace_in_a_name_is_not_stripped_and_answers_as_invoke(
    pki: Pki, alice: Agent, bob: A2APeer, counter: WriteCounter, char: str
) -> None:
    # Constraints are left out: the version parser itself allows spaces ("^1 || ^2").
    for n, (name, constraint) in enumerate(capability_texts(char)[:3]):
        reasons = await both_doors(pki, alice, bob, name, constraint, n)
        assert reasons == ("CAPABILITY_NOT_GRANTED",) * 2, (name, reasons)
    assert counter.calls == 0


# --- item 6: every a2agw.* metadata value is a string --------------------------

NON_STRINGS: list[tuple[str, struct_pb2.Value]] = [
    ("a2agw.skill", struct_pb2.Value(number_value=5)),
    ("a2agw.replayed", struct_pb2.Value(bool_value=True)),
    ("a2agw.reason", struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)),
    ("a2agw.served_version", struct_pb2.Value(list_value=struct_pb2.ListValue())),
    ("a2agw.anything", struct_pb2.Value(struct_value=struct_pb2.Struct())),
    ("a2agw.idempotency_key", struct_pb2.Value(number_value=1)),
    ("a2agw.capability", struct_pb2.Value(bool_value=True)),
]


@pytest.mark.parametrize(("key", "value"), NON_STRINGS, ids=[key for key, _ in NON_STRINGS])
async def test_non_string_gateway_metadata_is_refused(
    alice: Agent, bob: A2APeer, counter: WriteCounter, key: str, value: struct_pb2.Value
) -> None:
    request = data_request("notes.write", {"note": "a"})
    request.message.metadata.fields[key].CopyFrom(value)
    err = await refusal(bob, request)
    assert from_rpc_error(err).reason == "INVALID_REQUEST"
    assert err.details() == f"message metadata {key!r} must be a string"
    record = await last_record(alice)
    assert (record.decision, record.reason) == ("refuse", "INVALID_REQUEST")
    assert counter.calls == 0


async def test_string_gateway_metadata_and_foreign_metadata_are_accepted(
    bob: A2APeer, counter: WriteCounter
) -> None:
    request = data_request("notes.write", {"note": "a"})
    request.message.metadata["a2agw.skill"] = "anything"
    request.message.metadata["client.retries"] = 5
    request.message.metadata["client.flags"] = {"x": True}
    task = await bob.send(request)
    assert output_of(task) == {"stored": 1} and counter.calls == 1


async def test_metadata_maps_past_the_bound_are_refused_before_their_keys_are_read(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    # Found by a resource probe: a peer granted 4 KB of payload sent a 4 MiB metadata map
    # (270,000 keys) with a small note; every key was read on the event loop (0.8 s of
    # CPU per call, every other peer waiting), and the write ran.
    request = data_request("notes.write", {"note": "n"})
    for n in range(MAX_METADATA_KEYS):  # 128 on the request, 128 on its message, plus one
        (request.metadata if n % 2 else request.message.metadata)[f"k{n}"] = "v"
    before = len(audit_rows(alice.config.audit_db))
    async with A2APeer(pki, alice, "bob") as peer:
        err = await refusal(peer, request)
        del request.message.metadata["k0"]  # exactly at the bound: read and run
        request.message.message_id = "at-the-bound"
        answer = await peer.stub.SendMessage(request, metadata=V1, timeout=20)
    assert (err.code(), from_rpc_error(err).reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    assert f"metadata holds {MAX_METADATA_KEYS + 1} keys; at most {MAX_METADATA_KEYS}" in (
        err.details() or ""
    )
    assert answer.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    await alice.audit.flush()
    rows = audit_rows(alice.config.audit_db)[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in rows] == [
        (spiffe("bob"), "refuse", "INVALID_REQUEST"),
        (spiffe("bob"), "allow", "ADMITTED"),
        (spiffe("bob"), "allow", "OK"),
    ]
    assert counter.calls == 1


@pytest.mark.parametrize("raw", [b'{"note":"hi"}', b"", b"{"])
async def test_a_lone_json_raw_part_is_the_payload_itself(
    alice: Agent, bob: A2APeer, counter: WriteCounter, raw: bytes
) -> None:
    request = data_request("notes.write", {})
    request.message.ClearField("parts")
    request.message.parts.add(raw=raw, media_type="application/json")
    if raw == b'{"note":"hi"}':
        await bob.stub.SendMessage(request, metadata=V1, timeout=20)
        reason, runs = "OK", 1
    else:
        err = await refusal(bob, request)
        assert (err.code(), from_rpc_error(err).reason) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_INPUT",
        )
        reason, runs = "INVALID_INPUT", 0
    record = await last_record(alice)
    # The bytes as sent, even none: the part's media type is not counted as a file part's.
    assert (record.reason, record.payload_size) == (reason, len(raw))
    assert record.payload_sha256 == hashlib.sha256(raw).hexdigest()
    assert counter.calls == runs
