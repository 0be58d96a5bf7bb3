"""Operator commands for the shared PostgreSQL database: ``db init`` and ``db migrate``."""

from __future__ import annotations

import argparse
from typing import Any

import psycopg

from gateway.errors import ConfigError
from gateway.postgres.dsn import is_dsn
from gateway.postgres.migrations import LATEST_VERSION, migrate, schema_version
from gateway.postgres.source import ConnectionSource
from gateway.storage import connection_source, location


def add_commands(commands: Any) -> None:
    """Register ``db init`` and ``db migrate``."""
    db = commands.add_parser("db", help="the shared PostgreSQL database (audit_db/state_db DSN)")
    sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    for name, text in (
        ("init", "create the schema in an empty database"),
        ("migrate", "apply pending schema migrations (agents also do this at start)"),
    ):
        action = sub.add_parser(name, help=text)
        action.add_argument("--dsn", required=True, help="postgresql://user@host:port/db")
        action.set_defaults(run=_run, action=name)


def dsn_argument(text: str) -> ConnectionSource:
    """``--dsn`` as its database; ConfigError if it is not a PostgreSQL URL."""
    if not is_dsn(text):
        raise ConfigError(f"--dsn {text!r}: expected postgresql://user@host:port/database")
    return connection_source(location(text))


def _run(args: argparse.Namespace) -> int:
    dsn = dsn_argument(args.dsn)
    try:
        with dsn.connect(timeout=10, autocommit=True) as conn:
            before = schema_version(conn)
            if args.action == "init" and before:
                print(f"{dsn}: already initialised (schema version {before}); see db migrate")
                return 0
            applied = migrate(conn, str(dsn))
    except psycopg.Error as err:
        raise ConfigError(f"database {dsn}: {dsn.why(err)}") from err
    if applied:
        print(f"{dsn}: applied migration(s) {', '.join(map(str, applied))}; now {LATEST_VERSION}")
    else:
        print(f"{dsn}: schema up to date (version {before})")
    return 0
