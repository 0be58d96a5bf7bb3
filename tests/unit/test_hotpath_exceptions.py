"""Refusals leave no exception behind, on the compiled path as on the Python one.

A mypyc coroutine that awaits inside an ``except`` block keeps the exception
it handles set on the thread while it is suspended; every exception raised
meanwhile by any other call takes it as ``__context__``. With the servicer
compiled, 32 refusals in flight grew one chain by a link per refusal: every
refused exception (its traceback and frames) stayed alive for the life of the
process, and each raise walked the whole chain (a fifth of a refusal's CPU
after a few thousand). The AST check keeps the pattern out of the compiled
modules; the runtime check runs concurrent refusals over real mTLS and looks at
what the event loop's thread is left holding (CI runs this file again with the
compiled build, ``.ci/run``).
"""

from __future__ import annotations

import ast
import asyncio
import sys
from pathlib import Path

from gateway import hotpath
from gateway.client.peer_client import PeerClient
from gateway.errors import CapabilityNotGranted, GatewayError
from gateway.runtime.agent import Agent
from tests.support import Pki, WriteCounter, audit_rows

REPO = Path(__file__).resolve().parents[2]
IN_FLIGHT = 32
ROUNDS = 4


def awaits_in_handlers(source: str) -> list[int]:
    """Lines of every ``await``/``async with``/``async for`` inside an except or finally block."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Try | ast.TryStar):
            continue
        blocks = [handler.body for handler in node.handlers] + [node.finalbody]
        for block in blocks:
            for statement in block:
                for inner in ast.walk(statement):
                    if isinstance(inner, ast.Await | ast.AsyncWith | ast.AsyncFor):
                        lines.append(inner.lineno)
    return sorted(lines)


def test_the_scan_finds_an_await_in_an_except_block() -> None:
    source = (
        "async def f():\n"
        "    try:\n"
        "        await g()\n"
        "    except ValueError:\n"
        "        await h()\n"
        "    finally:\n"
        "        async with x:\n"
        "            pass\n"
    )
    assert awaits_in_handlers(source) == [5, 7]


def test_no_compiled_module_awaits_inside_except_or_finally() -> None:
    found = {
        module: lines
        for module in hotpath.COMPILED_MODULES
        if (lines := awaits_in_handlers((REPO / (module.replace(".", "/") + ".py")).read_text()))
    }
    assert found == {}


def context_chain_of_a_fresh_exception() -> int:
    """How many exceptions a newly raised one is chained to (0 when nothing is being handled)."""
    try:
        raise LookupError("probe")
    except LookupError as probe:
        links, context = 0, probe.__context__
        while context is not None:
            links, context = links + 1, context.__context__
        return links


async def test_concurrent_refusals_leave_no_exception_on_the_thread(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    async with PeerClient(alice.config.id, alice.address, pki.material("carol")) as carol:

        async def refused_once() -> GatewayError:
            try:
                await carol.invoke("text.search", {"query": "x"})
            except GatewayError as err:
                return err
            raise AssertionError("text.search was not refused")

        for _ in range(ROUNDS):
            errors = await asyncio.gather(*(refused_once() for _ in range(IN_FLIGHT)))
            assert {type(err) for err in errors} == {CapabilityNotGranted}
            assert {err.reason for err in errors} == {"CAPABILITY_NOT_GRANTED"}
            assert sys.exc_info() == (None, None, None)
            assert context_chain_of_a_fresh_exception() == 0
    rows = audit_rows(alice.config.audit_db)
    assert [(row.reason, row.capability) for row in rows] == [
        ("CAPABILITY_NOT_GRANTED", "text.search")
    ] * (IN_FLIGHT * ROUNDS)
    assert counter.calls == 0
