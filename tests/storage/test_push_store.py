"""The PushStore contract, run against SQLite and PostgreSQL (two instances on one state).

What one instance wrote the other honours: a config is its owner's only; the
outbox hands out the oldest row of each webhook, once, until its lease passes
or it is released; rows go when finished, with their config, or past retention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.push.store.postgres import PostgresPushStore
from gateway.push.store.sqlite import SqlitePushStore
from gateway.push.store.store import Notification, PushConfig, PushStore
from tests.postgres import state_pool

ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"
CAROL = "spiffe://example.org/agent/carol"

Opener = Callable[[], PushStore]


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opened: list[PushStore] = []

    def open_one() -> PushStore:
        store: PushStore
        if request.param == "postgres":
            pool = state_pool(request.getfixturevalue("pg_dsn"), "push store")
            store = PostgresPushStore(pool, ALICE)
        else:
            store = SqlitePushStore(tmp_path / "push.sqlite")
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        store.close()


def config(config_id: str, task_id: str = "t1", owner: str = BOB, **kw: object) -> PushConfig:
    fields: dict[str, object] = {
        "task_id": task_id,
        "config_id": config_id,
        "owner": owner,
        "url": f"https://hooks.example/{config_id}",
        "token": "tok",
        "auth_scheme": "Bearer",
        "auth_credentials": "secret",
        "created_ms": 1000,
    }
    fields.update(kw)
    return PushConfig(**fields)  # type: ignore[arg-type]


def note(
    config_id: str, n: int, task_id: str = "t1", owner: str = BOB, at: int = 1000
) -> Notification:
    return Notification(owner, task_id, config_id, f"{config_id}-{n}", b'{"n":%d}' % n, at)


async def test_configs_are_their_owners_only(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    await one.put_config(config("a"))
    await one.put_config(config("b"))
    await one.put_config(config("a", url="https://hooks.example/changed"))  # replaced
    assert [c.config_id for c in await two.configs(BOB, "t1")] == ["a", "b"]
    found = await two.config(BOB, "t1", "a")
    assert found is not None and found.url == "https://hooks.example/changed"
    assert await two.config(CAROL, "t1", "a") is None
    assert await two.configs(CAROL, "t1") == []
    await two.put_config(config("a", owner=CAROL, url="https://evil.example/"))  # not hers
    found = await one.config(BOB, "t1", "a")
    assert found is not None and found.url == "https://hooks.example/changed"
    await two.delete_config(CAROL, "t1", "a")  # nothing of hers: nothing goes
    assert await one.config(BOB, "t1", "a") is not None


async def test_the_oldest_row_of_each_webhook_is_claimed_once(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    await one.put_config(config("a"))
    await one.put_config(config("b"))
    await one.enqueue([note("a", 1), note("a", 2), note("b", 1)])
    claimed = await one.claim(now_ms=10, lease_until_ms=100, limit=10)
    assert [d.notification.notification_id for d in claimed] == ["a-1", "b-1"]
    assert await two.claim(now_ms=20, lease_until_ms=100, limit=10) == []  # leased
    await two.finish(claimed[0].seq)  # a-1 delivered: a-2 is next
    again = await two.claim(now_ms=30, lease_until_ms=1000, limit=10)
    assert [d.notification.notification_id for d in again] == ["a-2"]
    assert again[0].notification.body == b'{"n":2}' and again[0].attempts == 0
    # b-1's lease passes: claimed again (its process died)
    late = await one.claim(now_ms=100, lease_until_ms=200, limit=10)
    assert [d.notification.notification_id for d in late] == ["b-1"]


async def test_a_retried_row_waits_its_turn_and_stays_first(open_store: Opener) -> None:
    store = open_store()
    await store.put_config(config("a"))
    await store.enqueue([note("a", 1), note("a", 2)])
    first = (await store.claim(10, 100, 10))[0]
    await store.retry_later(first.seq, attempts=1, next_ms=500)
    assert await store.claim(20, 100, 10) == []  # a-2 never overtakes a-1
    due = await store.claim(500, 600, 10)
    assert [(d.notification.notification_id, d.attempts) for d in due] == [("a-1", 1)]
    await store.release(due[0].seq)
    assert [d.seq for d in await store.claim(501, 600, 10)] == [due[0].seq]
    await store.release_all()
    assert [d.seq for d in await store.claim(502, 600, 1)] == [due[0].seq]


async def test_deleting_a_config_drops_its_rows_and_counts_follow(open_store: Opener) -> None:
    store = open_store()
    await store.put_config(config("a"))
    await store.put_config(config("c", task_id="t2", owner=CAROL))
    await store.enqueue([note("a", 1), note("a", 2), note("c", 1, "t2", CAROL)])
    assert await store.pending_by_owner() == {BOB: 2, CAROL: 1}
    await store.delete_config(BOB, "t1", "a")
    assert await store.pending_by_owner() == {CAROL: 1}
    assert await store.config(BOB, "t1", "a") is None


async def test_configs_after_a_row_and_retention(open_store: Opener) -> None:
    store = open_store()
    assert await store.last_config_seq() == 0
    await store.put_config(config("a", created_ms=1000))
    last = await store.last_config_seq()
    await store.put_config(config("b", created_ms=5000))
    after = await store.configs_after(last)
    assert [(task, cid, owner) for _, task, cid, owner in after] == [("t1", "b", BOB)]
    recent = await store.configs_after(await store.last_config_seq(), since_ms=4000)
    assert [cid for _, _, cid, _ in recent] == ["b"]
    await store.enqueue([note("a", 1, at=1000), note("b", 1, at=5000)])
    assert await store.prune(before_ms=2000) == 1
    assert [c.config_id for c in await store.configs(BOB, "t1")] == ["b"]
    assert await store.pending_by_owner() == {BOB: 1}


async def test_a_claim_leaves_out_the_owners_it_is_told_to(open_store: Opener) -> None:
    store = open_store()
    await store.put_config(config("a"))
    await store.put_config(config("c", task_id="t2", owner=CAROL))
    await store.enqueue([note("a", 1, at=1), note("c", 1, "t2", CAROL, at=2)])
    claimed = await store.claim(10, 100, 10, skip=[BOB])
    assert [d.notification.owner for d in claimed] == [CAROL]
    assert [d.notification.owner for d in await store.claim(10, 100, 10)] == [BOB]
