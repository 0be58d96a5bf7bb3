"""A payload's SHA-256 is the same whether it is hashed at once or on a hashing thread."""

from __future__ import annotations

import hashlib
import multiprocessing
import threading

import pytest

import gateway.inbound.payload_digest as payload_digest
from gateway.inbound.payload_digest import THREAD_MIN_BYTES, PayloadDigest


def _hashed_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the threads that hash on the pool from now on."""
    names: list[str] = []
    real = payload_digest._sha256_hex

    def recorded(payload: bytes) -> str:
        names.append(threading.current_thread().name)
        return real(payload)

    monkeypatch.setattr(payload_digest, "_sha256_hex", recorded)
    return names


@pytest.mark.parametrize("size", [0, 1, THREAD_MIN_BYTES - 1, THREAD_MIN_BYTES, 1 << 20])
def test_digest_is_sha256_at_every_size(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    assert PayloadDigest.of(payload).hex() == hashlib.sha256(payload).hexdigest()


def test_a_small_payload_is_hashed_at_once_a_large_one_on_a_hashing_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = _hashed_on(monkeypatch)
    small = PayloadDigest.of(b"a" * (THREAD_MIN_BYTES - 1))
    assert names == []  # hashed in the constructor, not handed to a thread
    assert small.hex() == hashlib.sha256(b"a" * (THREAD_MIN_BYTES - 1)).hexdigest()
    large = b"b" * THREAD_MIN_BYTES
    assert PayloadDigest.of(large).hex() == hashlib.sha256(large).hexdigest()
    assert len(names) == 1 and names[0].startswith("a2agw-sha256")
    assert names[0] != threading.current_thread().name


def _digest_in_child(payload: bytes, queue: multiprocessing.Queue[str]) -> None:
    queue.put(PayloadDigest.of(payload).hex())


def test_a_forked_child_gets_hashing_threads_of_its_own() -> None:
    payload = b"c" * (THREAD_MIN_BYTES * 2)
    PayloadDigest.of(payload).hex()  # the parent's pool now has a thread
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[str] = context.Queue()
    child = context.Process(target=_digest_in_child, args=(payload, queue))
    child.start()
    try:
        # The child inherits the pool object but not its threads: without a
        # pool of its own, its digest would never come.
        assert queue.get(timeout=20) == hashlib.sha256(payload).hexdigest()
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
