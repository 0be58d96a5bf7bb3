"""The IdempotencyStore and ReplayWindow contracts, run against every backend.

Each backend is opened twice on the same state where the backend is shared
(a SQLite file opened ``shared`` by two workers, a PostgreSQL table used by two
replicas, an mmap file): what one instance wrote, the other must honour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.errors import IdempotencyConflict, IdempotencyInDoubt
from gateway.inbound.idempotency.postgres import PostgresIdempotencyStore
from gateway.inbound.idempotency.sqlite import SqliteIdempotencyStore
from gateway.inbound.idempotency.store import IdempotencyStore, StoredAnswer
from gateway.inbound.replay.mmap import ReplayTable
from gateway.inbound.replay.postgres import PostgresReplayWindow
from gateway.inbound.replay.store import ReplayWindow
from tests.helpers.postgres import state_pool

ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"
IDENT = (BOB, "notes.write", "k1")
ANSWER = StoredAnswer("sha-1", "1.0.0", b'{"stored":1}', "e" * 64)

Opener = Callable[[], IdempotencyStore]


@pytest.fixture(params=["sqlite", "sqlite-shared", "postgres"])
def open_keys(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens an idempotency store of one backend on the same state each time."""
    opened: list[IdempotencyStore] = []

    def open_one() -> IdempotencyStore:
        store: IdempotencyStore
        if request.param == "postgres":
            store = PostgresIdempotencyStore(
                state_pool(request.getfixturevalue("pg_dsn"), "idempotency store"), ALICE
            )
        else:
            path = tmp_path / "idempotency.sqlite"
            store = SqliteIdempotencyStore(path, shared=request.param == "sqlite-shared")
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        store.close()


async def test_a_completed_key_answers_its_retry_and_refuses_another_payload(
    open_keys: Opener,
) -> None:
    store = open_keys()

    assert await store.claim(IDENT, "sha-1", "1.0.0") is None
    await store.complete(IDENT, ANSWER)

    assert await store.claim(IDENT, "sha-1") == ANSWER
    with pytest.raises(IdempotencyConflict):
        await store.claim(IDENT, "sha-2")


async def test_a_key_left_in_doubt_is_never_run_again(open_keys: Opener) -> None:
    store = open_keys()
    assert await store.claim(IDENT, "sha-1") is None

    store.leave_in_doubt(IDENT)

    with pytest.raises(IdempotencyInDoubt):
        await store.claim(IDENT, "sha-1")


async def test_a_released_claim_may_run_again(open_keys: Opener) -> None:
    store = open_keys()
    assert await store.claim(IDENT, "sha-1") is None

    await store.release(IDENT)

    assert await store.claim(IDENT, "sha-1") is None


async def test_keys_of_other_peers_and_capabilities_are_apart(open_keys: Opener) -> None:
    store = open_keys()
    assert await store.claim(IDENT, "sha-1") is None
    await store.complete(IDENT, ANSWER)

    assert await store.claim((ALICE, "notes.write", "k1"), "sha-1") is None
    assert await store.claim((BOB, "notes.read", "k1"), "sha-1") is None


# An unshared SQLite file has one owner: opening it again cuts the first one's claims off.
@pytest.mark.parametrize("open_keys", ["sqlite-shared", "postgres"], indirect=True)
async def test_a_claim_held_by_one_sharer_is_refused_to_the_other(open_keys: Opener) -> None:
    first, second = open_keys(), open_keys()
    assert await first.claim(IDENT, "sha-1") is None

    with pytest.raises(IdempotencyInDoubt):  # running elsewhere: never a second write
        await second.claim(IDENT, "sha-1")
    await first.complete(IDENT, ANSWER)
    assert await second.claim(IDENT, "sha-1") == ANSWER


WindowOpener = Callable[[], ReplayWindow]


@pytest.fixture(params=["memory", "mmap", "postgres"])
def open_window(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WindowOpener]:
    """Opens a replay window of one backend (on the same state, where it is shared)."""
    opened: list[ReplayWindow] = []

    def open_one() -> ReplayWindow:
        window: ReplayWindow
        if request.param == "postgres":
            window = PostgresReplayWindow(
                state_pool(request.getfixturevalue("pg_dsn"), "replay window"), ALICE
            )
        elif request.param == "mmap":
            window = ReplayTable(tmp_path / "replay.window", capacity=64)
        else:
            window = ReplayTable(None, capacity=64)
        opened.append(window)
        return window

    yield open_one
    for window in opened:
        window.close()


async def test_a_request_id_is_accepted_once_per_peer(open_window: WindowOpener) -> None:
    window = open_window()

    assert await window.first_seen(BOB, "req-1") is True
    assert await window.first_seen(BOB, "req-1") is False
    assert await window.first_seen(ALICE, "req-1") is True
    assert await window.first_seen(BOB, "req-2") is True
    assert window.window_seconds > 0 and window.max_entries > 0


async def test_a_preloaded_id_is_a_replay_unless_the_window_is_shared(
    open_window: WindowOpener,
) -> None:
    window = open_window()

    window.preload([(BOB, "old-1", 1.0)])

    assert await window.first_seen(BOB, "old-1") is window.shared


@pytest.mark.parametrize("open_window", ["mmap", "postgres"], indirect=True)
async def test_workers_or_replicas_share_one_window(open_window: WindowOpener) -> None:
    first, second = open_window(), open_window()

    assert await first.first_seen(BOB, "req-1") is True
    assert await second.first_seen(BOB, "req-1") is False
