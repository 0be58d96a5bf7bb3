"""cancel_and_wait: the task it stops ends quietly; a cancel aimed at its caller is kept."""

from __future__ import annotations

import asyncio

import pytest

from gateway.runtime.stopping import cancel_and_wait


async def test_the_cancelled_task_ends_and_its_cancel_stays_quiet() -> None:
    ran_cleanup = asyncio.Event()

    async def loop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ran_cleanup.set()

    task = asyncio.ensure_future(loop())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled()
    assert ran_cleanup.is_set()


async def test_a_cancel_of_the_caller_reaches_the_caller() -> None:
    release = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # cleanup that takes a while

    task = asyncio.ensure_future(slow_to_stop())
    await asyncio.sleep(0)
    stopper = asyncio.ensure_future(cancel_and_wait(task))
    await asyncio.sleep(0.01)
    stopper.cancel()  # say, a timeout around a stop
    with pytest.raises(asyncio.CancelledError):
        await stopper
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_another_exception_of_the_task_is_raised() -> None:
    async def fails_as_it_stops() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.ensure_future(fails_as_it_stops())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)
