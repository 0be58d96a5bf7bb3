"""Stopping a background task without losing a cancel aimed at the one who stops it."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended.

    Its own cancellation is expected and kept quiet; a cancel of the caller (a stop
    bounded by a timeout, say) still reaches the caller, which
    ``with suppress(CancelledError): await task`` would swallow as well. Any other
    exception ``task`` ended with is raised, as awaiting it would.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
