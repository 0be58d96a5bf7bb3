"""A text part as a text-only input, and ``[a2a] default_capability`` for plain A2A clients."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors

from gateway.config import A2ASettings, load_agent_config
from gateway.errors import AgentConfigError
from gateway.runtime.agent import Agent
from tests.a2a_support import V1, A2APeer, data_request, gateway_reason, output_of
from tests.agent_process import write_agent_toml
from tests.integration.a2a.conftest import last_record
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)

NOT_TEXT_ONLY = (
    'a text part is the input {"text": ...} only of a capability whose input is exactly one '
    "string field 'text'; this one's fields are: note; send a data part"
)


def text_message(text: str, capability: str | None = None) -> a2a_pb2.SendMessageRequest:
    """What a client that knows nothing of the gateway sends: one text part, no metadata."""
    message = a2a_pb2.Message(
        message_id=str(uuid.uuid4()), role=a2a_pb2.ROLE_USER, parts=[a2a_pb2.Part(text=text)]
    )
    if capability is not None:
        message.metadata["a2agw.capability"] = capability
    return a2a_pb2.SendMessageRequest(message=message)


# --- a text part --------------------------------------------------------------


async def test_a_text_part_is_the_text_of_a_text_only_capability(
    alice: Agent, bob: A2APeer
) -> None:
    task = await bob.send(text_message("hello", "text.echo@^1"))
    assert output_of(task) == {"text": "hello"}
    record = await last_record(alice)
    payload = b'{"text":"hello"}'
    assert (record.reason, record.capability, record.payload_size, record.payload_sha256) == (
        "OK",
        "text.echo",
        len(payload),
        hashlib.sha256(payload).hexdigest(),
    )


async def test_a_text_part_for_another_contract_is_invalid_input_and_nothing_runs(
    alice: Agent, bob: A2APeer, counter: WriteCounter
) -> None:
    with pytest.raises(a2a_errors.InvalidParamsError) as info:
        await bob.send(text_message("a note", "notes.write"))
    assert gateway_reason(info.value) == "INVALID_INPUT"
    rpc = info.value.__cause__
    assert isinstance(rpc, grpc.aio.AioRpcError) and rpc.details() == NOT_TEXT_ONLY
    record = await last_record(alice)
    assert (record.decision, record.reason, record.capability) == (
        "refuse",
        "INVALID_INPUT",
        "notes.write",
    )
    assert "a note" not in record.detail
    assert counter.calls == 0


async def test_a_text_part_over_the_cap_is_refused_before_it_is_decoded(
    alice: Agent, bob: A2APeer
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await bob.stub.SendMessage(text_message("é" * 600, "text.echo"), metadata=V1)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    record = await last_record(alice)
    assert (record.reason, record.payload_size, record.payload_sha256) == (
        "PAYLOAD_TOO_LARGE",
        1200,  # UTF-8 bytes
        "",
    )


# --- [a2a] default_capability ------------------------------------------------


@pytest.fixture
async def defaulted(pki: Pki, tmp_path: Path, counter: WriteCounter) -> AsyncIterator[Agent]:
    """alice with ``default_capability = "text.echo@^1"``; carol may call only notes.write."""
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            grant("bob", ["text.echo", "notes.write"], max_payload_bytes=1024),
            grant("carol", ["notes.write"]),
        ],
    )
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"a2a": A2ASettings(default_capability="text.echo@^1")}
    )
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    yield agent
    await agent.stop()


async def test_a_message_without_metadata_calls_the_default_capability(
    pki: Pki, defaulted: Agent
) -> None:
    async with A2APeer(pki, defaulted, "bob") as bob:
        task = await bob.send(text_message("plain client"))
        assert output_of(task) == {"text": "plain client"}
        assert task.metadata["a2agw.capability"] == "text.echo"
        record = await last_record(defaulted)
        assert (record.reason, record.capability, record.version_constraint) == (
            "OK",
            "text.echo",
            "^1",
        )
        # A message that names its capability is not redirected.
        named = await bob.send(data_request("notes.write", {"note": "n"}))
        assert output_of(named) == {"stored": 1}


async def test_the_grant_still_decides_for_the_default_capability(
    pki: Pki, defaulted: Agent, counter: WriteCounter
) -> None:
    async with A2APeer(pki, defaulted, "carol") as carol:
        with pytest.raises(a2a_errors.A2AError) as info:
            await carol.send(text_message("hi"))
    assert gateway_reason(info.value) == "CAPABILITY_NOT_GRANTED"
    record = await last_record(defaulted)
    assert (record.peer_id, record.decision, record.reason, record.capability) == (
        spiffe("carol"),
        "refuse",
        "CAPABILITY_NOT_GRANTED",
        "text.echo",
    )
    async with A2APeer(pki, defaulted, "mallory") as mallory:
        with pytest.raises(a2a_errors.A2AError) as info:
            await mallory.send(text_message("hi"))
    assert gateway_reason(info.value) == "UNKNOWN_PEER"
    assert counter.calls == 0


async def test_without_a_default_a_message_naming_nothing_is_invalid_request(
    alice: Agent, bob: A2APeer
) -> None:
    with pytest.raises(a2a_errors.InvalidRequestError):
        await bob.send(text_message("hi"))
    record = await last_record(alice)
    assert (record.reason, record.capability) == ("INVALID_REQUEST", "")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ('"Text.Echo"', "default_capability: 'Text.Echo' is not a dotted lowercase name"),
        (
            '"text.echo@>>1"',
            "default_capability: version constraint: not a version constraint: '>>1'",
        ),
        ('"text.echo\\n"', "default_capability holds whitespace or a control character"),
        ('" text.echo"', "default_capability holds whitespace or a control character"),
        ("5", "default_capability: expected a string (in quotes)"),
    ],
)
def test_a_bad_default_capability_is_refused_at_load_naming_file_and_key(
    pki: Pki, tmp_path: Path, value: str, problem: str
) -> None:
    path = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "p.toml", []),
        audit_db=tmp_path / "a.sqlite",
        state_dir=tmp_path / "s",
    )
    path.write_text(path.read_text() + f"\n[a2a]\ndefault_capability = {value}\n")
    with pytest.raises(AgentConfigError) as caught:
        load_agent_config(path)
    assert caught.value.reason == "CONFIG_INVALID"
    assert str(caught.value).startswith(f"CONFIG_INVALID: {path}: a2a.default_capability: ")
    assert problem in str(caught.value)


def test_a_good_default_capability_loads(pki: Pki, tmp_path: Path) -> None:
    path = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "p.toml", []),
        audit_db=tmp_path / "a.sqlite",
        state_dir=tmp_path / "s",
    )
    path.write_text(path.read_text() + '\n[a2a]\ndefault_capability = "text.echo@^1"\n')
    assert load_agent_config(path).a2a.default_capability == "text.echo@^1"
