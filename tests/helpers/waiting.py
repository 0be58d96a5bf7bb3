"""Bounded waits for a condition a test cannot await (hang detectors, never timing assertions)."""

from __future__ import annotations

import asyncio
from typing import Any


async def until(condition: Any, what: str) -> None:
    for _ in range(1000):  # bounded: 10 s at most
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")
