"""Credentials and internals never leave in errors: DSNs redacted locally, fixed messages remotely.

Every DSN form libpq takes is redacted wherever a message names it (URL
userinfo, ``?password=``, keyword/value ``password=``, a malformed token the
driver quotes back). A remote caller of an agent whose store fails gets the
reason code and a fixed message: no host, port, user, database or driver text.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from capabilities.registry import CapabilityRegistry
from gateway.client.peer_client import PeerClient
from gateway.errors import AuditUnavailable, GatewayError, StateUnavailable
from gateway.postgres.dsn import PostgresDsn, redact_credentials
from tests.helpers.agent_process import REPO, write_agent_toml
from tests.helpers.agents import Pki, WriteCounter, agent_config, grant, started, write_policy
from tests.helpers.cli import run_cli
from tests.helpers.postgres import PostgresCluster, state_pool

SECRET = "S3cret-pw"


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"postgresql://gw:{SECRET}@db.example:5432/audit", "postgresql://gw:***@db.example:5432/audit"),
        (f"postgres://gw:{SECRET}@db/a?sslmode=require", "postgres://gw:***@db/a?sslmode=require"),
        (f"postgresql://gw@db/a?password={SECRET}&sslmode=require", "postgresql://gw@db/a?password=***&sslmode=require"),
        (f"postgresql://gw@db/a?sslmode=require&PassWord={SECRET}", "postgresql://gw@db/a?sslmode=require&PassWord=***"),
        (f"postgresql://gw@db/a?sslpassword={SECRET}", "postgresql://gw@db/a?sslpassword=***"),
        ("postgresql://gw:pw%zz@db/a", "postgresql://gw:***@db/a"),
        (f"postgresql://gw:p@{SECRET}@db/a", "postgresql://gw:***@db/a"),
        (f"host=db password={SECRET} dbname=a", "host=db password=*** dbname=a"),
        (f"host=db password = '{SECRET} x' dbname=a", "host=db password = *** dbname=a"),
        (f"PGPASSWORD={SECRET} psql", "PGPASSWORD=*** psql"),
        ("postgresql://gw@db:5432/a", "postgresql://gw@db:5432/a"),  # nothing secret
        ("password authentication failed for user gw", "password authentication failed for user gw"),
    ],
)  # fmt: skip
def test_every_credential_form_is_redacted(text: str, kept: str) -> None:
    assert redact_credentials(text) == kept


@pytest.mark.parametrize(
    ("url", "driver_says", "secret"),
    [
        ("postgresql://gw:pw%zz@db/a", 'invalid percent-encoded token: "pw%zz"', "pw%zz"),
        ("postgresql://gw:p%40ss%2Fw0rd@db/a", "password p@ss/w0rd was refused", "p@ss/w0rd"),
        (f"postgresql://gw:x@{SECRET}@db/a", f"failed to resolve host '{SECRET}@db'", SECRET),
        (f"postgresql://gw@db/a?password={SECRET}", f"bad value {SECRET}", SECRET),
    ],
)
def test_a_driver_message_repeating_the_secret_is_scrubbed(
    url: str, driver_says: str, secret: str
) -> None:
    dsn = PostgresDsn(url)
    assert secret not in str(dsn) and secret not in repr(dsn)
    assert secret not in dsn.scrub(driver_says)
    assert secret not in dsn.why(ValueError(driver_says + "\nsecond line"))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://gw:S3cret pw@db/a", "postgresql://gw:***@db/a"),
        ("postgresql://gw:S3cret\tpw@db/a", "postgresql://gw:***@db/a"),
        ("postgresql://gw:S3cret\npw@db/a", "postgresql://gw:***@db/a"),
        ("postgresql://gw:a b/c@db/a", "postgresql://gw:***@db/a"),
        ("postgresql://gw@db/a?password=S3cret pw&sslmode=require", "postgresql://gw@db/a?password=***&sslmode=require"),
        ("postgresql://gw@db/a?application_name=a b", "postgresql://gw@db/a?application_name=a b"),
    ],
)  # fmt: skip
def test_a_dsn_password_holding_whitespace_is_redacted(url: str, shown: str) -> None:
    # Whitespace ended the token redact_credentials looks at: `S3cret pw` was shown whole.
    dsn = PostgresDsn(url)
    assert str(dsn) == shown and repr(dsn) == f"PostgresDsn({shown!r})"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as its own process: ``serve`` owns its process's signals."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "--db", "postgresql://gw:pw%zz@127.0.0.1:1/audit"],
        ["audit", "--db", f"postgresql://gw:{SECRET}@127.0.0.1:1/audit"],
        ["audit", "--db", f"postgresql://gw@127.0.0.1:1/audit?password={SECRET}"],
        ["audit", "--db", f"host=127.0.0.1 port=1 password={SECRET}"],
        ["db", "init", "--dsn", f"host=127.0.0.1 port=1 password={SECRET}"],
        ["db", "init", "--dsn", f"postgresql://gw:{SECRET}@127.0.0.1:1/audit"],
    ],
)
def test_cli_errors_never_echo_a_password(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.returncode != 0 and result.stderr, result
    secret = "pw%zz" if "pw%zz" in args[-1] else SECRET
    assert secret not in result.stderr and secret not in result.stdout, result.stderr
    assert "***" in result.stderr or "no such file" in result.stderr, result.stderr


@pytest.mark.slow
def test_serve_names_an_unreachable_database_without_its_password(pki: Pki, tmp_path: Path) -> None:
    dsn = f"postgresql://gw@127.0.0.1:1/audit?password={SECRET}"
    config = write_agent_toml(
        tmp_path / "alice.toml", pki, "alice", listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])]),
        audit_db=dsn, state_dir=tmp_path / "state",
    )  # fmt: skip
    result = _cli("serve", "--config", str(config))
    assert result.returncode == 1, result
    assert result.stderr.startswith("refused: AUDIT_UNAVAILABLE: audit database ")
    assert "password=***" in result.stderr
    assert SECRET not in result.stderr + result.stdout


async def test_remote_callers_get_a_fixed_message_when_the_database_is_down(
    pki: Pki,
    tmp_path: Path,
    postgres_cluster: PostgresCluster,
    pg_dsn: str,
    counter: WriteCounter,
) -> None:
    parts = urlsplit(pg_dsn)
    assert parts.hostname and parts.port and parts.username
    # Trust authentication ignores the password; it is there to be leaked, or not.
    dsn = pg_dsn.replace(f"{parts.username}@", f"{parts.username}:{SECRET}@")
    registry = CapabilityRegistry()
    registry.register(counter.capability())
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["notes.write"])])
    stores = {"audit_db": dsn, "state_db": dsn}
    agent = await started(agent_config(pki, tmp_path, "alice", policy, stores=stores), registry)
    internals = [parts.hostname, str(parts.port), parts.username, parts.path.strip("/"), SECRET]
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            await bob.invoke("notes.write", {"note": "a"}, idempotency_key="k-before")
            postgres_cluster.stop()
            try:
                refusals: list[GatewayError] = []
                for n in range(3):
                    with pytest.raises(GatewayError) as info:
                        await bob.invoke(
                            "notes.write", {"note": "b"}, idempotency_key=f"k-{n}", timeout=30
                        )
                    refusals.append(info.value)
            finally:
                postgres_cluster.start()
        assert counter.calls == 1
        for err in refusals:
            assert isinstance(err, AuditUnavailable | StateUnavailable), err
            assert err.message == type(err).REMOTE_MESSAGE, err.message
            assert not [word for word in internals if word in err.message], err.message
    finally:
        await asyncio.wait_for(agent.stop(), 60)


@pytest.mark.slow
def test_the_pool_log_never_repeats_the_password(caplog: pytest.LogCaptureFixture) -> None:
    """psycopg_pool logs each failed connect with libpq's message, which quotes a bad token."""
    pool = state_pool("postgresql://gw:pw%zz@127.0.0.1:1/state", "idempotency store")
    try:
        with (
            caplog.at_level("WARNING", logger="psycopg.pool"),
            pytest.raises(StateUnavailable) as info,
        ):
            pool.run(lambda conn: conn.execute("SELECT 1"))
    finally:
        pool.close()
    assert "pw%zz" not in info.value.message, info.value.message
    pool_lines = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"]
    assert pool_lines, "the pool logged no failed connect (nothing was checked)"
    assert not [line for line in pool_lines if "pw%zz" in line], pool_lines
