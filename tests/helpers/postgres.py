"""A throwaway PostgreSQL cluster for tests: initdb + pg_ctl in a temp dir, on 127.0.0.1.

PostgreSQL refuses to run as root, so when the tests run as root the server
runs as the ``postgres`` system user (``runuser``). Each test gets its own
database (``fresh_database``), so tests never see each other's rows.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

from gateway.postgres.pool import StatePool
from gateway.storage import connection_source, location


def find_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<ver>/bin`` with initdb, or one on PATH."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresCluster:
    """One running test cluster; ``dsn(db)`` names a database on it."""

    bin_dir: Path
    data_dir: Path
    root: Path
    port: int
    as_user: list[str]
    fsync: bool = False

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        # Tests run without fsync (faster, nothing to lose); benchmarks keep it on.
        durability = "" if self.fsync else " -c fsync=off"
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root}{durability}"
        self._ctl("-w", "-l", str(self.root / "server.log"), "-o", options, "start")

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: connections are cut, as when a server goes away."""
        self._ctl("-w", "-m", "fast", "stop")

    def fresh_database(self) -> str:
        """A new empty database; returns its DSN."""
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)


def start_cluster(*, fsync: bool = False) -> PostgresCluster | None:
    """initdb + start a cluster in a fresh temp dir; None if no PostgreSQL is installed."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        return None
    root = Path(tempfile.mkdtemp(prefix="a2agw-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = root / "data"
    subprocess.run(
        [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    cluster = PostgresCluster(bin_dir, data, root, _free_port(), as_user, fsync)
    cluster.start()
    return cluster


def remove_cluster(cluster: PostgresCluster) -> None:
    """Stop (if running) and delete the cluster's files."""
    try:
        cluster.stop()
    except subprocess.CalledProcessError:
        pass  # already stopped
    shutil.rmtree(cluster.root, ignore_errors=True)


def state_pool(dsn: str, what: str = "state store") -> StatePool:
    """The pool the storage factory would give a PostgreSQL store for ``dsn``."""
    return StatePool(connection_source(location(dsn)), what)
