"""Session fixtures (real certificates, agents on 127.0.0.1:0, SQLite, PostgreSQL) and the tiers.

A bare ``pytest -q`` runs the fast tier: every test without a tier marker. The rest
(``slow``, ``postgres``, ``interop``, ``spire``, ``fuzz``, ``netns``, ``browser``) runs with
``--tier=rest``; ``--tier=full`` runs both, and naming tests (a path, ``-k``, ``-m``) runs what
was named, whatever its tier. Each test is in exactly one tier, and the fast tier says at
the end how many tests it left to the rest.
"""

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

TIER_MARKERS = ("slow", "postgres", "interop", "spire", "fuzz", "netns", "browser")
"""A test with any of these markers is in the rest tier; every other test is fast."""
FOLDER_MARKERS = {"interop": "interop", "spire": "spire"}
"""Folders (under tests/) whose every test carries a marker without saying so."""
POSTGRES_FIXTURES = frozenset({"postgres_cluster", "pg_dsn"})
TIERS = ("fast", "rest", "full")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        choices=TIERS,
        default=None,
        help="fast: tests without a tier marker (what a bare `pytest` runs); rest: the tests "
        f"marked {', '.join(TIER_MARKERS)}; full: both (the default once tests are named)",
    )


def chosen_tier(config: pytest.Config) -> str:
    """The tier this run selects: ``--tier``, else fast for a bare run, else full."""
    tier: str | None = config.getoption("--tier")
    if tier is not None:
        return tier
    named = (
        config.args_source is not pytest.Config.ArgsSource.TESTPATHS
        or bool(config.getoption("keyword"))
        or bool(config.getoption("markexpr"))
    )
    return "full" if named else "fast"


def tier_of(item: pytest.Item) -> str:
    """``rest`` for a test with a tier marker, ``fast`` for every other test."""
    return "rest" if any(item.get_closest_marker(name) for name in TIER_MARKERS) else "fast"


def _add_implied_markers(item: pytest.Item) -> None:
    """Markers a test carries by where it is or what it uses, so none is forgotten."""
    folder = item.path.relative_to(item.config.rootpath / "tests").parts[0]
    if folder in FOLDER_MARKERS:
        item.add_marker(FOLDER_MARKERS[folder])
    params = getattr(getattr(item, "callspec", None), "params", {})
    uses_postgres = POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())) or any(
        isinstance(value, str) and value.startswith("postgres") for value in params.values()
    )
    if uses_postgres:
        item.add_marker("postgres")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        _add_implied_markers(item)
    tier = chosen_tier(config)
    config.stash[_TIER] = tier
    if tier == "full":
        return
    kept = [item for item in items if tier_of(item) == tier]
    left = [item for item in items if tier_of(item) != tier]
    config.stash[_LEFT] = len(left)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    tier, left = config.stash.get(_TIER, "full"), config.stash.get(_LEFT, 0)
    if tier == "fast" and left:
        terminalreporter.write_line(
            f"fast tier: {left} tests of the rest tier not run "
            "(`pytest -q --tier=rest` runs them, `pytest -q --tier=full` runs every test)"
        )


_TIER = pytest.StashKey[str]()
_LEFT = pytest.StashKey[int]()


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
def postgres_cluster(request: pytest.FixtureRequest) -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster for the session (skipped only if none is installed)."""
    if request.config.stash.get(_TIER, "full") == "fast":
        pytest.fail(
            "the fast tier never starts PostgreSQL: mark this test @pytest.mark.postgres (a test"
            " naming pg_dsn or postgres_cluster, or given a 'postgres...' parameter, is already)"
        )
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
