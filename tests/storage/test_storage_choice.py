"""The backend of every store is chosen in one place: gateway/storage/factory.py."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import gateway
from gateway.audit.store.postgres import PostgresAuditReader, PostgresChainWriter
from gateway.audit.store.sqlite import SqliteAuditReader, SqliteChainWriter
from gateway.audit.store.store import ChainWriter
from gateway.inbound.idempotency.postgres import PostgresIdempotencyStore
from gateway.inbound.idempotency.sqlite import SqliteIdempotencyStore
from gateway.inbound.idempotency.store import IdempotencyStore
from gateway.inbound.limits.admission import PeerCallLimits
from gateway.inbound.replay.mmap import ReplayTable
from gateway.inbound.replay.postgres import PostgresReplayWindow
from gateway.inbound.replay.store import ReplayWindow
from gateway.plans.store.postgres import PostgresPlanTaskStore
from gateway.plans.store.sqlite import SqlitePlanTaskStore
from gateway.plans.store.store import PlanTaskStore
from gateway.server.a2a.task_store.postgres import PostgresA2ATaskStore
from gateway.server.a2a.task_store.sqlite import SqliteA2ATaskStore
from gateway.server.a2a.task_store.store import A2ATaskStore
from gateway.storage import Stores, open_stores, prepare_shared_files
from tests.helpers.agents import Pki, agent_config

PACKAGE = Path(gateway.__file__).parent
MAY_CHOOSE = {PACKAGE / "storage" / "factory.py", PACKAGE / "postgres" / "dsn.py"}
"""The factory, and the DSN module's own ``local_file``."""


def _dsn_type_tests(path: Path) -> list[int]:
    """Lines of ``path`` that call ``isinstance(..., PostgresDsn)`` (alone or in a tuple)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
            and any(
                isinstance(name, ast.Name) and name.id == "PostgresDsn"
                for name in ast.walk(node.args[1])
            )
        ):
            found.append(node.lineno)
    return found


@pytest.mark.slow
def test_no_module_outside_the_factory_tests_for_a_dsn() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert PACKAGE / "runtime" / "agent.py" in modules  # the walk sees the package

    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in modules
        if path not in MAY_CHOOSE
        for line in _dsn_type_tests(path)
    ]

    assert found == []


def test_the_guard_sees_a_dsn_test(tmp_path: Path) -> None:
    module = tmp_path / "chooser.py"
    module.write_text(
        "def f(where):\n"
        "    if isinstance(where, str):\n"
        "        return 0\n"
        "    return isinstance(where, (PostgresDsn, bytes))\n"
    )

    assert _dsn_type_tests(module) == [4]
    assert sorted(_dsn_type_tests(PACKAGE / "storage" / "factory.py")) != []


TWINS: list[tuple[type, type, type | None]] = [
    (SqliteChainWriter, PostgresChainWriter, ChainWriter),
    (SqliteAuditReader, PostgresAuditReader, None),
    (SqliteIdempotencyStore, PostgresIdempotencyStore, IdempotencyStore),
    (ReplayTable, PostgresReplayWindow, ReplayWindow),
    (SqliteA2ATaskStore, PostgresA2ATaskStore, A2ATaskStore),
    (SqlitePlanTaskStore, PostgresPlanTaskStore, PlanTaskStore),
]
"""(SQLite class, PostgreSQL class, their shared interface) of each kind of state."""


@pytest.mark.parametrize(("sqlite", "postgres", "interface"), TWINS)
def test_no_backend_inherits_from_the_other(
    sqlite: type, postgres: type, interface: type | None
) -> None:
    assert not issubclass(postgres, sqlite)
    assert not issubclass(sqlite, postgres)
    if interface is not None:
        assert issubclass(sqlite, interface) and issubclass(postgres, interface)
        assert inspect.isabstract(interface)


def _close(stores: Stores) -> None:
    stores.idempotency.close()
    stores.replay.close()
    stores.a2a_tasks.close()
    stores.plan_tasks.close()


def test_open_stores_on_sqlite_opens_the_files_under_state_dir(pki: Pki, tmp_path: Path) -> None:
    config = agent_config(pki, tmp_path, "alice", tmp_path / "policy.toml")
    config.state_dir.mkdir(mode=0o700)

    stores = open_stores(config)
    try:
        assert type(stores.idempotency) is SqliteIdempotencyStore
        assert type(stores.replay) is ReplayTable
        assert type(stores.limits) is PeerCallLimits
        assert stores.limit_table is None
        assert type(stores.a2a_tasks) is SqliteA2ATaskStore
        assert type(stores.plan_tasks) is SqlitePlanTaskStore
        assert stores.shared is False
        assert sorted(p.name for p in config.state_dir.iterdir() if p.suffix == ".sqlite") == [
            "a2a-tasks.sqlite",
            "idempotency.sqlite",
            "tasks.sqlite",
        ]
    finally:
        _close(stores)


def test_open_stores_on_postgres_shares_them_with_replicas(
    pki: Pki, tmp_path: Path, pg_dsn: str
) -> None:
    config = agent_config(
        pki, tmp_path, "alice", tmp_path / "policy.toml", stores={"state_db": pg_dsn}
    )
    config.state_dir.mkdir(mode=0o700)

    stores = open_stores(config)
    try:
        assert type(stores.idempotency) is PostgresIdempotencyStore
        assert type(stores.replay) is PostgresReplayWindow
        assert type(stores.limits) is PeerCallLimits
        assert type(stores.a2a_tasks) is PostgresA2ATaskStore
        assert type(stores.plan_tasks) is PostgresPlanTaskStore
        assert stores.shared is True
        assert not any(p.suffix == ".sqlite" for p in config.state_dir.iterdir())
    finally:
        _close(stores)


def test_open_stores_with_workers_shares_the_files(pki: Pki, tmp_path: Path) -> None:
    config = agent_config(pki, tmp_path, "alice", tmp_path / "policy.toml").model_copy(
        update={"workers": 2}
    )
    config.state_dir.mkdir(mode=0o700)

    prepare_shared_files(config)
    stores = open_stores(config, worker=1)
    try:
        assert type(stores.replay) is ReplayTable
        assert stores.limit_table is not None and stores.limits is stores.limit_table
        assert stores.shared is True
        assert {"replay.window", "limits.table"} <= {p.name for p in config.state_dir.iterdir()}
    finally:
        _close(stores)
        if stores.limit_table is not None:
            stores.limit_table.close()
