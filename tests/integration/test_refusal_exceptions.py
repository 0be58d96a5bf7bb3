"""Concurrent refusals leave no exception behind on the event loop's thread.

The handler and the servicer await inside ``except`` blocks (the refusal's
audit record, then the status). A refused exception must end with its call:
if one stayed set on the thread while its coroutine was suspended, every
exception raised meanwhile by another call would take it as ``__context__``,
one chain growing by a link per refusal (memory held for the life of the
process, and a walk of the whole chain at every raise). 32 refusals in flight
over real mTLS, four times; then the thread holds nothing and a fresh
exception has no context.
"""

from __future__ import annotations

import asyncio
import sys

from gateway.client.peer_client import PeerClient
from gateway.errors import CapabilityNotGranted, GatewayError
from gateway.runtime.agent import Agent
from tests.support import Pki, WriteCounter, audit_rows

IN_FLIGHT = 32
ROUNDS = 4


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
