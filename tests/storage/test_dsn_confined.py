"""Only the storage factory knows a location's type: no other module names the DSN class."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.postgres.source import ConnectionSource
from gateway.storage import connection_source, location

ROOT = Path(__file__).resolve().parents[2]
# The DSN module defines it and the factory decides by it.
MAY_NAME = {"gateway/storage/factory.py", "gateway/postgres/dsn.py"}
_NAMED = re.compile(r"\bPostgresDsn\b")


def test_no_module_but_the_factory_and_the_dsn_module_names_the_dsn_type() -> None:
    naming = sorted(
        str(path.relative_to(ROOT))
        for package in ("gateway", "policies", "capabilities", "benchmarks", "scripts")
        for path in (ROOT / package).rglob("*.py")
        if "wire" not in path.parts
        and str(path.relative_to(ROOT)) not in MAY_NAME
        and _NAMED.search(path.read_text(encoding="utf-8"))
    )
    assert naming == []


def test_a_location_is_a_file_unless_it_is_a_postgresql_url(tmp_path: Path) -> None:
    assert location(str(tmp_path / "audit.sqlite")) == tmp_path / "audit.sqlite"
    database = location(" postgresql://gw:s3cret@127.0.0.1:1/state ")
    assert not isinstance(database, Path)
    source = connection_source(database)
    assert isinstance(source, ConnectionSource)
    # It names the database in messages without the password.
    assert str(source) == "postgresql://gw:***@127.0.0.1:1/state"
    assert "s3cret" not in repr(source)


def test_a_sqlite_file_has_no_connection_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a PostgreSQL database"):
        connection_source(tmp_path / "audit.sqlite")
