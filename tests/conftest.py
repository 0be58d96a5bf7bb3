"""Session fixtures (real certificates, agents on 127.0.0.1:0, SQLite, PostgreSQL) and the tiers.

A bare ``pytest -q`` runs the fast tier: every test without a tier marker. The rest
(``slow``, ``postgres``, ``interop``, ``spire``, ``fuzz``, ``netns``, ``browser``) runs with
``--tier=rest``; ``--tier=full`` runs both, and naming tests (a path, ``-k``, ``-m``) runs what
was named, whatever its tier. Each test is in exactly one tier, and the fast tier says at
the end how many tests it left to the rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from capabilities.registry import Capability, CapabilityRegistry
from gateway.config import AgentConfig
from gateway.runtime.agent import Agent
from tests.helpers.a2a_http import serving_https
from tests.helpers.agents import (
    ALICE_GRANTS,
    AgentFactory,
    Pki,
    WriteCounter,
    agent_config,
    make_pki,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.mcp import serving_mcp
from tests.helpers.postgres import PostgresCluster, remove_cluster, start_cluster
from tests.helpers.tiers import FOLDER_MARKERS, POSTGRES_FIXTURES, TIER_MARKERS

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
async def make_agent(
    pki: Pki, tmp_path: Path, counter: WriteCounter
) -> AsyncIterator[AgentFactory]:
    """Agents as most tests need them, each a keyword away from the default alice.

    ``grants``/``outbound`` make its policy file; ``peers`` are agents (or id and address)
    it may call; ``capabilities`` join the built-ins and ``counter``'s ``notes.write`` (or
    ``registry`` replaces them all); ``https`` serves the A2A HTTP bindings on localhost,
    ``mcp`` the MCP door;
    ``stores`` puts audit and state elsewhere (a DSN); any other keyword is an
    ``AgentConfig`` field, and a dict for a section (``a2a={"stream_send_timeout": 1.0}``)
    changes only those keys. Every agent it made stops after the test.
    """
    agents: list[Agent] = []
    yield _factory(pki, tmp_path, counter, agents)
    for agent in reversed(agents):
        await agent.stop()


@pytest.fixture(scope="module")
async def make_shared_agent(
    pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[AgentFactory]:
    """``make_agent`` for a module whose tests only read: its agents serve every test of
    the module and stop after the last. A test that writes, counts records or changes the
    agent takes ``make_agent`` instead."""
    agents: list[Agent] = []
    yield _factory(pki, tmp_path_factory.mktemp("shared"), WriteCounter(), agents)
    for agent in reversed(agents):
        await agent.stop()


def _factory(pki: Pki, base: Path, counter: WriteCounter, agents: list[Agent]) -> AgentFactory:
    async def make(
        name: str = "alice",
        *,
        grants: Sequence[dict[str, Any]] = ALICE_GRANTS,
        outbound: Sequence[dict[str, Any]] = (),
        peers: Sequence[Agent | tuple[str, str]] = (),
        capabilities: Sequence[Capability] = (),
        registry: CapabilityRegistry | None = None,
        https: bool = False,
        mcp: bool = False,
        stores: dict[str, str] | None = None,
        **settings: Any,
    ) -> Agent:
        policy = write_policy(base / f"{name}-policy.toml", list(grants), list(outbound))
        dials = [
            peer if isinstance(peer, tuple) else (peer.config.id, peer.address) for peer in peers
        ]
        config = agent_config(pki, base, name, policy, dials, stores=stores)
        if https:
            config = serving_https(config, pki, base / f"{name}-https")
        if mcp:
            config = serving_mcp(config, pki, base / f"{name}-mcp")
        if settings:
            config = config.model_copy(update=_merged(config, settings))
        if registry is None:
            registry = standard_registry(counter, base / f"{name}-state")
            for each in capabilities:
                registry.register(each)
        agent = await started(config, registry)
        agents.append(agent)
        return agent

    return make


def _merged(config: AgentConfig, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        key: getattr(config, key).model_copy(update=value)
        if isinstance(value, dict) and isinstance(getattr(config, key), BaseModel)
        else value
        for key, value in settings.items()
    }


@pytest.fixture
async def alice(make_agent: AgentFactory) -> Agent:
    """Agent alice serving built-ins + notes.write; bob is granted a typical set."""
    return await make_agent()


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
