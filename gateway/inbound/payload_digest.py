"""A payload's SHA-256, hashed off the event loop when the payload is large.

Every call's audit record holds the hex SHA-256 of its payload, but nothing
reads it until the call's record is built, after the input is validated and
the capability has run (or, with an idempotency key, at the claim). A 256 KB
payload takes the event loop ~0.15 ms to hash; ``hashlib`` lets go of the GIL
while it hashes more than 2 KB, so a payload of at least
:data:`THREAD_MIN_BYTES` is hashed on a small pool of threads, on the other
core, while the loop validates and runs it. A smaller one is hashed at once:
handing it to a thread would cost the loop more than hashing it.

The digest is the same either way (a test compares both); only where it is
computed changes.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

THREAD_MIN_BYTES = 64 * 1024
"""Payloads of at least this many bytes are hashed on a thread (~35 µs of hashing)."""

_HASHING_THREADS = 2
"""At most two payloads hashed at once: more would only compete with the loop for cores."""


class PayloadDigest:
    """The hex SHA-256 of one payload: known now, or being computed on a thread.

    ``hex()`` returns it, waiting for the thread if it is not done yet (it
    usually is: the loop had the call's whole admission to do meanwhile).
    """

    __slots__ = ("_future", "_hex")

    def __init__(self, hex_digest: str, future: Future[str] | None = None) -> None:
        self._hex = hex_digest
        self._future = future

    @classmethod
    def of(cls, payload: bytes) -> PayloadDigest:
        """Start hashing ``payload``: at once if small, else on a hashing thread."""
        if len(payload) < THREAD_MIN_BYTES:
            return cls(hashlib.sha256(payload).hexdigest())
        return cls("", _pool().submit(_sha256_hex, payload))

    def hex(self) -> str:
        """64 lowercase hex characters ("" for the digest of a pending payload)."""
        future = self._future
        if future is not None:
            self._hex = future.result()
            self._future = None
        return self._hex


def _sha256_hex(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_executor_pid = 0


def _pool() -> ThreadPoolExecutor:
    """The process's hashing threads, made on first use (and again in a forked child,
    which inherits the pool object but none of its threads)."""
    global _executor, _executor_pid
    pid = os.getpid()
    if _executor is None or _executor_pid != pid:
        with _lock:
            if _executor is None or _executor_pid != pid:
                _executor = ThreadPoolExecutor(
                    max_workers=_HASHING_THREADS, thread_name_prefix="a2agw-sha256"
                )
                _executor_pid = pid
    return _executor
