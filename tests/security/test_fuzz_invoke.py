"""Fuzzing Invoke over real mTLS: every answer is precise, audited once, and leaks nothing.

Each generated call goes to one real agent (``fuzz_target``) and must:

* end with an expected status (never INTERNAL or UNKNOWN) carrying
  ``ErrorInfo(domain="a2agw.v1")`` whose reason maps to that very status;
* add exactly one outcome audit record, whose reason is the one the caller
  got and whose payload size and digest are the payload's, preceded by one
  write-ahead ``ADMITTED`` record when a write capability was admitted (and
  only then); no record holds any of the strings planted in the payload;
* run ``notes.write`` once for a fresh OK answer for it, and never otherwise.

After all of it a plain echo still succeeds. ``scripts/fuzz_long.py`` runs the
same generators and checks for 10,000+ cases.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.helpers.fuzz_invoke import (
    CAP_BYTES,
    FUZZ_CALLERS,
    FuzzTarget,
    InvokeCase,
    check_invoke,
    check_raw,
    invoke_cases,
    raw_requests,
)

pytestmark = pytest.mark.fuzz

FUZZ_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


@FUZZ_SETTINGS
@given(case=invoke_cases())
def test_fuzzed_invoke_is_answered_precisely_audited_once_and_leaks_nothing(
    fuzz_target: FuzzTarget, case: InvokeCase
) -> None:
    result = check_invoke(fuzz_target, case)
    event(f"{result.code.name} {result.reason}")  # see --hypothesis-show-statistics
    assert not result.problems, (result.code.name, result.reason, result.problems)


@settings(FUZZ_SETTINGS, max_examples=100)
@given(caller=st.sampled_from(FUZZ_CALLERS), raw=raw_requests())
def test_raw_request_bytes_are_refused_or_served_never_crash(
    fuzz_target: FuzzTarget, caller: str, raw: tuple[bytes, str]
) -> None:
    result = check_raw(fuzz_target, caller, *raw)
    event(f"{'decoded' if result.reached_gateway else 'undecodable'} {result.reason}")
    assert not result.problems, (result.code.name, result.reason, result.problems)


def _case(payload: bytes, capability: str = "text.echo", **fields: Any) -> InvokeCase:
    """bob calling ``capability`` with a fresh request id; ``PL...Z`` in the payload is planted."""
    planted = tuple(m.decode() for m in re.findall(rb"PL[0-9a-z]+Z", payload))
    values = {"caller": "bob", "request_id": "edge", "constraint": "", "fresh": True} | fields
    return InvokeCase(capability=capability, payload=payload, tokens=planted, **values)


def _echo_of_size(token: bytes, size: int) -> bytes:
    head, tail = b'{"text":"' + token, b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def _nested(depth: int) -> bytes:
    return b'{"text":' + b"[" * depth + b'"PLdeepZ"' + b"]" * depth + b"}"


EDGE_CASES: dict[str, tuple[InvokeCase, str]] = {
    # Sizes around bob's cap: the last allowed byte and the first refused one.
    "at the cap": (_case(_echo_of_size(b"PLcapZ", CAP_BYTES)), "OK"),
    "one past the cap": (_case(_echo_of_size(b"PLcapZ", CAP_BYTES + 1)), "PAYLOAD_TOO_LARGE"),
    "nesting 500 deep": (_case(_nested(500)), "INVALID_INPUT"),
    "lone surrogate escape": (_case(b'{"text":"PLsurrZ\\ud800"}'), "INVALID_INPUT"),
    "surrogate pair escape": (_case(b'{"text":"PLpairZ\\ud83d\\ude00"}'), "OK"),
    "invalid UTF-8": (_case(b'{"text":"PLutfZ\xff"}'), "INVALID_INPUT"),
    "NUL escape": (_case(b'{"text":"PLnulZ\\u0000"}'), "OK"),
    "raw control character": (_case(b'{"text":"PLctlZ\x01"}'), "INVALID_INPUT"),
    "duplicate keys": (_case(b'{"text":"PLdupZ","text":"b"}'), "OK"),
    "top-level array": (_case(b'["PLarrZ"]'), "INVALID_INPUT"),
    "empty payload": (_case(b""), "INVALID_INPUT"),
    "5,000-digit integer": (
        _case(b'{"query":"audit","limit":' + b"9" * 5_000 + b"}", "text.search"),
        "INVALID_INPUT",
    ),
    "60,000-digit integer": (
        _case(b'{"query":"audit","limit":' + b"9" * 60_000 + b"}", "text.search"),
        "INVALID_INPUT",
    ),
    "float for int": (_case(b'{"query":"audit","limit":3.0}', "text.search"), "INVALID_INPUT"),
    "bool for int": (_case(b'{"query":"audit","limit":true}', "text.search"), "INVALID_INPUT"),
    "kv key past its limit": (
        _case(json.dumps({"key": "PLkvZ" + "k" * 256, "value": ""}).encode(), "kv.put"),
        "INVALID_INPUT",
    ),
    "deadline passed": (
        _case(b'{"note":"PLlateZ"}', "notes.write", deadline=("rel", -1)),
        "DEADLINE_EXCEEDED",
    ),
    "deadline int64 max": (
        _case(b'{"note":"PLmaxZ"}', "notes.write", deadline=("abs", 2**63 - 1)),
        "OK",
    ),
    # Negative is not "no deadline" (issue 9): refused before anything runs.
    "deadline int64 min": (
        _case(b'{"note":"PLminZ"}', "notes.write", deadline=("abs", -(2**63))),
        "INVALID_REQUEST",
    ),
    "deadline -1": (
        _case(b'{"note":"PLnegZ"}', "notes.write", deadline=("abs", -1)),
        "INVALID_REQUEST",
    ),
    "request id 129 chars": (
        _case(b'{"text":"PLridZ"}', request_id="r" * 129, fresh=False),
        "INVALID_REQUEST",
    ),
    "constraint 129 chars": (_case(b'{"text":"PLconZ"}', constraint="1" * 129), "INVALID_REQUEST"),
    "capability name 10,000 chars": (
        _case(b'{"text":"PLcapnZ"}', capability="a" * 10_000),
        "CAPABILITY_NOT_GRANTED",
    ),
    "request id used twice": (
        _case(b'{"text":"PLdup2Z"}', request_id="edge-twice", fresh=False),
        "OK",
    ),
    "request id used twice, again": (
        _case(b'{"text":"PLdup3Z"}', request_id="edge-twice", fresh=False),
        "REPLAYED_REQUEST",
    ),
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_case_has_its_exact_reason_and_one_clean_record(
    fuzz_target: FuzzTarget, name: str
) -> None:
    case, reason = EDGE_CASES[name]
    result = check_invoke(fuzz_target, case)
    assert not result.problems, result.problems
    assert result.reason == reason


def test_long_unknown_key_is_refused_as_invalid_input(fuzz_target: FuzzTarget) -> None:
    payload = json.dumps({"note": "x", "PLkeyZ" + "k" * 10_000: 1}).encode()
    result = check_invoke(fuzz_target, _case(payload, "notes.write"))
    assert not result.problems, result.problems
    assert (result.code, result.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_INPUT")


def test_invalid_input_message_holds_no_payload_content(fuzz_target: FuzzTarget) -> None:
    token = "PLsecretZ"
    answer = fuzz_target.invoke(
        "bob", _case(json.dumps({"note": "x", token: 1}).encode(), "notes.write").request()
    )
    assert answer.reason == "INVALID_INPUT"
    assert token not in answer.message


def test_write_whose_output_exceeds_the_cap_runs_once(fuzz_target: FuzzTarget) -> None:
    # frank may send notes.write 11 bytes: {"note":""} fits, its output {"stored":N} does not.
    # The size of an output is only known once the write ran, so the answer is
    # OUTPUT_TOO_LARGE and the idempotency record keeps it: a retry gets the same
    # answer and never a second write (nor IDEMPOTENCY_IN_DOUBT).
    runs = fuzz_target.counter.calls
    key = f"once-{uuid.uuid4().hex}"
    reasons = [
        check_invoke(
            fuzz_target,
            _case(b'{"note":""}', "notes.write", caller="frank", idempotency_key=key),
        ).reason
        for _ in range(2)
    ]
    assert reasons == ["OUTPUT_TOO_LARGE", "OUTPUT_TOO_LARGE"]
    assert fuzz_target.counter.calls - runs == 1


def test_key_of_a_write_that_never_started_is_not_in_doubt(fuzz_target: FuzzTarget) -> None:
    prefix = f"never-started-{uuid.uuid4().hex}"
    for attempt in range(80):
        key, runs = f"{prefix}-{attempt}", fuzz_target.counter.calls
        # A deadline a few ms away: still ahead at admission, passed once the
        # write-ahead record and the idempotency claim are committed.
        first = check_invoke(
            fuzz_target,
            _case(
                b'{"note":"PLdoubtZ"}',
                "notes.write",
                idempotency_key=key,
                deadline=("rel", 1 + attempt % 8),
            ),
        )
        if first.reason == "DEADLINE_EXCEEDED" and first.records == 2:
            assert fuzz_target.counter.calls == runs  # notes.write did not run
            break
    else:
        pytest.skip("no deadline fell between admission and the run on this machine")
    retry = check_invoke(
        fuzz_target, _case(b'{"note":"PLdoubtZ"}', "notes.write", idempotency_key=key)
    )
    assert retry.reason == "OK", retry.reason


def test_server_keeps_serving_after_the_fuzzing(fuzz_target: FuzzTarget) -> None:
    assert fuzz_target.echo_still_works()
