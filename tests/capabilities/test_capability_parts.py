"""Parts, replies and their one canonical JSON; what contracts accept and give."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capabilities import (
    Accepts,
    AnyObject,
    Artifact,
    CallContext,
    ContractModel,
    DataPart,
    FilePart,
    Gives,
    MessageReply,
    TaskReply,
    TextPart,
    UrlPart,
    capability,
)
from capabilities.canonical import canonical_json
from capabilities.media_types import check_pattern, essence, matches
from capabilities.registry import Capability
from capabilities.replies import (
    REPLY_KEY,
    checked_reply,
    is_message_reply,
    part_from_json,
    reply_from_json,
    reply_json,
)
from capabilities.runner import run_capability
from gateway.errors import CapabilityFailed, InvalidOutput


class Out(ContractModel):
    n: int


class In(ContractModel):
    text: str


def _object(data: Any) -> dict[str, Any]:
    return Out.model_validate(data).model_dump(mode="json")


EVERY_PART = (
    TextPart("héllo", "text/markdown"),
    DataPart({"n": 1, "nested": [True, None]}),
    FilePart(b"\x00\xffbytes", "application/pdf", "a.pdf"),
    UrlPart("https://example.com/x?y=1", "text/plain", "x.txt"),
)


def test_a_reply_survives_its_canonical_json() -> None:
    task = TaskReply((Artifact(EVERY_PART, "all", "one of each"),), "done")
    message = MessageReply(EVERY_PART)
    for reply in (task, message):
        value = reply_json(reply)
        assert reply_from_json(value) == reply
        encoded = canonical_json(value)
        assert is_message_reply(encoded) is (reply is message)
    assert reply_from_json({"n": 1}) is None  # an output object


def test_the_canonical_form_is_documented_json() -> None:
    value = reply_json(TaskReply((Artifact((FilePart(b"tck", "text/plain", "o.txt"),)),)))
    assert canonical_json(value) == (
        b'{"a2agw.reply":"task","artifacts":[{"description":"","name":"",'
        b'"parts":[{"bytes":"dGNr","kind":"file","media_type":"text/plain","name":"o.txt"}]}],'
        b'"text":""}'
    )


@given(st.text(), st.binary(max_size=64), st.dictionaries(st.text(max_size=8), st.integers()))
def test_any_text_bytes_and_data_round_trip(text: str, data: bytes, obj: dict[str, int]) -> None:
    reply = MessageReply(
        (TextPart(text), FilePart(data, "application/octet-stream"), DataPart(obj))
    )
    assert reply_from_json(reply_json(reply)) == reply


@pytest.mark.parametrize(
    "value",
    [
        {"kind": "file", "bytes": "not base64!", "media_type": "a/b"},
        {"kind": "sound"},
        {"kind": "text", "text": 5},
        [],
    ],
)
def test_a_malformed_part_is_refused(value: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        part_from_json(value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TextPart(5),  # type: ignore[arg-type]
        lambda: TextPart("x", "not a type"),
        lambda: FilePart("text", "text/plain"),  # type: ignore[arg-type]
        lambda: FilePart(b"x", "text/plain", "a\nb"),
        lambda: UrlPart("https://x y"),
        lambda: UrlPart(""),
        lambda: Artifact(()),
        lambda: Artifact(("not a part",)),  # type: ignore[arg-type]
        lambda: MessageReply(()),
        lambda: TaskReply(("not an artifact",)),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_value_fails_where_it_is_made(make: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        make()


def test_only_what_the_contract_gives_passes() -> None:
    image = TaskReply((Artifact((FilePart(b"x", "image/png"),)),))
    with pytest.raises(ValueError, match="image/png"):
        checked_reply(image, Gives(files=("text/*",)), _object)
    assert checked_reply(image, Gives(files=("image/*",)), _object) == image
    with pytest.raises(ValueError, match="text part"):
        checked_reply(MessageReply((TextPart("t"),)), Gives(messages=True), _object)
    with pytest.raises(ValueError, match="no messages"):
        checked_reply(MessageReply((DataPart({"n": 1}),)), Gives(), _object)
    with pytest.raises(ValueError, match="messages only"):
        checked_reply(TaskReply(), Gives(messages=True, tasks=False), _object)
    with pytest.raises(ValueError, match="URL part"):
        checked_reply(MessageReply((UrlPart("u"),)), Gives(messages=True), _object)
    whole = checked_reply(MessageReply((DataPart({"n": 1}),)), Gives(messages=True), _object)
    assert whole == MessageReply((DataPart({"n": 1}),))


def test_media_types_and_patterns() -> None:
    assert essence("Text/Plain; charset=UTF-8") == "text/plain"
    assert essence("text") is None and essence("text/plain/x") is None
    assert matches(("text/*",), "text/markdown") and not matches(("text/*",), "image/png")
    assert matches(("*/*",), "a/b") and not matches((), "a/b")
    assert matches(("image/png",), "IMAGE/PNG") and not matches(("*/*",), "nonsense")
    for bad in ("*/png", "text", "text/plain;q=1", ""):
        with pytest.raises(ValueError):
            check_pattern(bad, "files")
    assert Accepts(files=("Text/*",)).files == ("text/*",)
    with pytest.raises(ValueError):
        Accepts(max_parts=0)
    with pytest.raises(ValueError):
        Gives(tasks=False, messages=False)


def test_the_decorator_reads_what_a_capability_gives_from_its_return_hint() -> None:
    @capability("a.message", "1.0.0", risk="read")
    async def message_only(inp: In, ctx: CallContext) -> MessageReply:
        return MessageReply((DataPart({}),))

    @capability("a.either", "1.0.0", risk="read")
    async def either(inp: In, ctx: CallContext) -> Out | MessageReply:
        return Out(n=1)

    @capability("a.task", "1.0.0", risk="read", gives=Gives(text=True))
    async def task(inp: In, ctx: CallContext) -> TaskReply:
        return TaskReply()

    assert message_only.contract.gives == Gives(tasks=False, messages=True)
    assert message_only.contract.output_model is AnyObject
    assert either.contract.gives == Gives(messages=True) and either.contract.output_model is Out
    assert task.contract.gives == Gives(text=True) and task.contract.output_model is AnyObject
    with pytest.raises(TypeError, match="one output model"):

        @capability("a.two", "1.0.0", risk="read")
        async def two(inp: In, ctx: CallContext) -> Out | In:
            return Out(n=1)


def _run(cap: Capability, payload: Any = None) -> Any:
    import asyncio
    import time

    ctx = CallContext("spiffe://x/agent/y", "r-1", time.monotonic() + 5)
    return asyncio.run(run_capability(cap, payload or AnyObject(), ctx))


def test_a_reply_is_digested_over_its_canonical_bytes_and_validated() -> None:
    @capability("r.kinds", "1.0.0", risk="read", gives=Gives(text=True))
    async def kinds(inp: AnyObject, ctx: CallContext) -> TaskReply:
        return TaskReply((Artifact((TextPart("t"), DataPart({"n": 2}))),), "ok")

    result = _run(kinds)
    assert result.payload == canonical_json(result.payload.value)
    assert result.evidence_sha256 == hashlib.sha256(result.payload).hexdigest()
    assert result.payload.value[REPLY_KEY] == "task"

    @capability("r.bad", "1.0.0", risk="read")
    async def bad(inp: AnyObject, ctx: CallContext) -> Out | TaskReply:
        return TaskReply((Artifact((DataPart({"n": "two"}),)),))

    with pytest.raises(InvalidOutput, match="violates its contract"):
        _run(bad)

    @capability("r.tagged", "1.0.0", risk="read")
    async def tagged(inp: AnyObject, ctx: CallContext) -> AnyObject:
        return AnyObject.model_validate({REPLY_KEY: "message", "parts": []})

    with pytest.raises(InvalidOutput, match="holding the key"):
        _run(tagged)


def test_asking_outside_a2a_fails_the_call() -> None:
    @capability("r.ask", "1.0.0", risk="read", asks_input=True)
    async def ask(inp: AnyObject, ctx: CallContext) -> AnyObject:
        await ctx.ask_input("?")
        return AnyObject()

    with pytest.raises(CapabilityFailed):
        _run(ask)
