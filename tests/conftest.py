"""Session fixtures: real certificates, real agents on 127.0.0.1:0, real SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    make_pki,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.postgres import PostgresCluster, remove_cluster, start_cluster


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """One CA for the session with agents alice, bob, carol, dave, mallory; plus a foreign CA."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def counter() -> WriteCounter:
    return WriteCounter()


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, counter: WriteCounter) -> AsyncIterator[Agent]:
    """Agent alice serving built-ins + notes.write; bob is granted a typical set."""
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            grant(
                "bob",
                ["text.echo@^1", "text.search@^1", "notes.write@1", "kv.put@1", "kv.get"],
                max_payload_bytes=1024,
            ),
            grant("carol", ["text.echo", "notes.write"], max_risk="read"),
            grant("dave", ["text.echo"], expires_at="2020-01-01T00:00:00Z"),
        ],
    )
    config = agent_config(pki, tmp_path, "alice", policy)
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    yield agent
    await agent.stop()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster for the session (skipped only if none is installed)."""
    cluster = start_cluster()
    if cluster is None:
        pytest.skip("PostgreSQL binaries not found (apt-get install postgresql)")
    yield cluster
    remove_cluster(cluster)


@pytest.fixture
def pg_dsn(postgres_cluster: PostgresCluster) -> str:
    """A DSN of a fresh, empty database on the session's cluster."""
    return postgres_cluster.fresh_database()


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest) -> dict[str, str]:
    """Each state backend in turn: {} keeps SQLite; PostgreSQL puts audit and state in one DSN."""
    if request.param == "sqlite":
        return {}
    dsn: str = request.getfixturevalue("pg_dsn")
    return {"audit_db": dsn, "state_db": dsn}
