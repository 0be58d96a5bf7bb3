"""``config check`` and ``plan check``: one line per finding, exit 1 on any error."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gateway.client.peer_client import PeerClient
from gateway.devtools.pki import CertificateAuthority
from policies.identity import svid_dns_name
from tests.helpers.agent_process import REPO, AgentProcess
from tests.helpers.agents import Pki, future, grant, spiffe, write_policy
from tests.helpers.cli import config_file
from tests.helpers.cli import run_cli as run
from tests.helpers.cli import run_cli_async as run_async


def run_process(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """The command as its own process: for ``serve``, which owns its process's signals."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_config_check_passes_a_good_config(pki: Pki, tmp_path: Path) -> None:
    config = config_file(pki, tmp_path, grants=[grant("bob", ["text.echo"])])
    result = run("config", "check", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"ok: {config}: agent {spiffe('alice')}, listen 127.0.0.1:0"
    assert f"ok: policy {tmp_path / 'alice-policy.toml'}: 1 grants, 0 outbound rules" in lines
    assert any(
        line.startswith(f"ok: certificate {pki.dir / 'alice.pem'}: {spiffe('alice')}, expires ")
        for line in lines
    )
    assert any(line.startswith("ok: modules: ") and "text.echo@1.0.0" in line for line in lines)
    assert all(line.startswith("ok: ") for line in lines)
    assert not (tmp_path / "alice-audit.sqlite").exists()  # nothing written


def test_config_check_names_each_problem_and_exits_1(pki: Pki, tmp_path: Path) -> None:
    past = "2020-01-01T00:00:00+00:00"
    config = config_file(
        pki,
        tmp_path,
        grants=[grant("bob", ["text.echo"], expires_at=past), grant("carol", ["no.such"])],
        outbound=[{"peer": spiffe("dave"), "capabilities": ["text.echo"]}],
        modules=("capabilities.builtin", "no_such_module_here"),
    )
    # carol's certificate under alice's name: the SPIFFE ID does not match.
    text = config.read_text().replace("alice.pem", "carol.pem").replace("alice.key", "carol.key")
    config.write_text(text)
    result = run("config", "check", "--config", str(config))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    policy = tmp_path / "alice-policy.toml"
    assert (
        f"warning: policy {policy}: grant of {spiffe('bob')} expired 2020-01-01 00:00:00+00:00"
        in lines
    )
    assert (
        f"error: certificate {pki.dir / 'carol.pem'}: agent id {spiffe('alice')} does not "
        f"match its certificate ({spiffe('carol')})"
    ) in lines
    assert any(
        line.startswith(
            "error: modules: capability module 'no_such_module_here' cannot be imported"
        )
        for line in lines
    )
    assert (
        f"warning: policy {policy}: outbound rule for {spiffe('dave')}, which is not in [[peers]]"
        in lines
    )
    assert "Traceback" not in result.stderr


def test_config_check_reports_a_config_that_does_not_parse(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('id = "not-a-spiffe-id"\n')
    result = run("config", "check", "--config", str(config))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith(f"error: {config}: ") for line in lines)
    assert not any(line.startswith(f"error: {config}: {config}: ") for line in lines)  # once
    assert any("not a SPIFFE ID" in line for line in lines)


def test_config_check_names_a_missing_file_once(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    result = run("config", "check", "--config", str(missing))
    assert result.returncode == 1
    assert result.stdout == f"error: {missing}: agent config file not found\n"


def test_config_check_reach_tries_peers_only_when_asked(pki: Pki, tmp_path: Path) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = f"127.0.0.1:{listening.getsockname()[1]}"
        down = f"127.0.0.1:{closed_port()}"
        config = config_file(pki, tmp_path, peers=[("bob", up), ("carol", down)])
        assert run("config", "check", "--config", str(config)).returncode == 0
        result = run("config", "check", "--config", str(config), "--reach")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert f"ok: peer {spiffe('bob')}: {up} accepts connections" in lines
    assert any(
        line.startswith(f"error: peer {spiffe('carol')}: {down} unreachable: ") for line in lines
    )


async def test_capability_modules_import_from_the_config_folder(pki: Pki, tmp_path: Path) -> None:
    module = f"shout_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from capabilities.contract import ContractModel\n"
        "from capabilities.registry import capability\n\n\n"
        "class Words(ContractModel):\n    text: str\n\n\n"
        '@capability("local.shout", "1.2.0", risk="read")\n'
        "async def shout(inp: Words) -> Words:\n"
        '    """Upper case."""\n'
        "    return Words(text=inp.text.upper())\n"
    )
    config = config_file(pki, tmp_path, grants=[grant("bob", ["local.shout"])], modules=(module,))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    checked = await run_async("config", "check", "--config", str(config), cwd=elsewhere)
    assert checked.returncode == 0, checked.stdout
    assert "ok: modules: 1 capabilities: local.shout@1.2.0" in checked.stdout.splitlines()

    explained = await run_async(
        "policy",
        "explain",
        "--policy",
        str(tmp_path / "alice-policy.toml"),
        "--peer",
        spiffe("bob"),
        "local.shout@^1",
        "--config",
        str(config),
        cwd=elsewhere,
    )
    assert explained.returncode == 0, explained.stderr
    assert explained.stdout.startswith("allow: every policy step passed")

    agent = AgentProcess(config)  # serve runs from the repository, not the config folder
    try:
        async with PeerClient(spiffe("alice"), agent.start(), pki.material("bob")) as bob:
            result = await bob.invoke("local.shout", {"text": "hi"})
        assert result.output() == {"text": "HI"}
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()

    backtested = await run_async(
        "policy",
        "replay",
        "--db",
        str(tmp_path / "alice-audit.sqlite"),
        "--policy",
        str(tmp_path / "alice-policy.toml"),
        "--config",
        str(config),
        cwd=elsewhere,
    )
    assert backtested.returncode == 0, backtested.stderr
    assert backtested.stdout.startswith("1 recorded policy decisions re-decided under ")
    assert "not judged without --config" not in backtested.stdout  # the modules did load

    resolved = await run_async(
        "idempotency",
        "resolve",
        "--config",
        str(config),
        "--peer",
        spiffe("bob"),
        "--capability",
        "local.shout",
        "--key",
        "k1",
        "--done",
        "--output-json",
        '{"text": "X"}',
        "--reason",
        "checked",
        cwd=elsewhere,
    )
    # The modules imported (no "cannot be imported", exit 2); the unknown key is refused.
    assert resolved.returncode == 1, resolved.stderr
    assert resolved.stderr.startswith("refused: IDEMPOTENCY_NOT_IN_DOUBT:")


def plan_file(base: Path, steps: list[dict[str, object]], max_risk: str = "read") -> Path:
    path = base / "plan.json"
    path.write_text(json.dumps({"goal": "check me", "max_risk": max_risk, "steps": steps}))
    return path


def test_plan_check_judges_each_step_without_creating_a_task(pki: Pki, tmp_path: Path) -> None:
    config = config_file(
        pki,
        tmp_path,
        outbound=[{"peer": spiffe("bob"), "capabilities": ["remote.thing"]}],
        peers=[("bob", f"127.0.0.1:{closed_port()}")],
    )
    plan = plan_file(
        tmp_path,
        [
            {"id": "echo", "capability": "text.echo", "version": "^1", "input": {"text": "x"}},
            {"id": "far", "capability": "remote.thing", "depends_on": ["echo"]},
            {"id": "put", "capability": "kv.put", "input": {"key": "k", "value": "v"}},
            {"id": "nowhere", "capability": "no.where"},
        ],
    )
    result = run("plan", "check", str(plan), "--config", str(config))
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"ok: {plan}: 4 steps, structure valid",
        "ok: step echo: text.echo@^1 runs here (risk read)",
        f"ok: step far: remote.thing@* may be sent to {spiffe('bob')} (their offers not asked)",
        "error: step put: kv.put@* has risk write; the plan allows up to read",
        "error: step nowhere: no local capability offers no.where@* and no outbound rule "
        "lets it go to a peer",
    ]
    assert not (tmp_path / "alice-state" / "tasks.sqlite").exists()
    listed = run("tasks", "--config", str(config), "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []

    good = plan_file(tmp_path, [{"id": "echo", "capability": "text.echo", "input": {"text": "x"}}])
    assert run("plan", "check", str(good), "--config", str(config)).returncode == 0

    cyclic = plan_file(
        tmp_path,
        [
            {"id": "a", "capability": "text.echo", "depends_on": ["b"]},
            {"id": "b", "capability": "text.echo", "depends_on": ["a"]},
        ],
    )
    result = run("plan", "check", str(cyclic), "--config", str(config))
    assert result.returncode == 1
    assert result.stdout.startswith(f"error: {cyclic}: ") and "cycle" in result.stdout


def test_policy_check_warns_of_expired_grants_and_shows_limits(tmp_path: Path) -> None:
    limited = grant("bob", ["text.echo"])
    limited.update(max_calls_per_second=5, burst=10, max_in_flight=2)
    old = grant("carol", ["text.echo"], expires_at="2020-01-01T00:00:00+00:00")
    policy = write_policy(tmp_path / "policy.toml", [limited, old])
    result = run("policy", "check", str(policy))
    assert result.returncode == 0
    assert (
        f"; expires {limited['expires_at']}; max_calls_per_second 5; burst 10; max_in_flight 2"
        in result.stdout.replace(str(future())[:0], "")
    )
    assert result.stderr == (
        f"warning: grant of {spiffe('carol')} expired 2020-01-01T00:00:00+00:00: "
        "its calls are refused GRANT_EXPIRED\n"
    )


@pytest.mark.slow
def test_output_to_a_reader_that_went_is_no_internal_error(tmp_path: Path) -> None:
    # Found by a newcomer walkthrough: `policy backtest ... | head -c 100` ended
    # "internal error: BrokenPipeError" with exit 70.
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "policy", "check", str(policy)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the command has started: its output meets a closed pipe
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 0
    assert stderr == ""


@pytest.mark.parametrize(
    ("size", "said"),
    [("-5", "must be 0..4194304 bytes, not -5"), ("4194305", "not 4194305"), ("1k", "'1k'")],
)
def test_policy_explain_refuses_a_size_no_payload_can_have(
    tmp_path: Path, size: str, said: str
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    explained = run(
        "policy", "explain", "--policy", str(policy), "--peer", spiffe("bob"), "text.echo",
        "--size", size,
    )  # fmt: skip
    assert explained.returncode == 2
    assert said in explained.stderr
    assert "Traceback" not in explained.stderr


_GREET = (
    "from capabilities.contract import ContractModel\n"
    "from capabilities.registry import capability\n\n\n"
    "class Words(ContractModel):\n    text: str\n\n\n"
    '@capability("demo.greet", {version!r}, risk={risk!r})\n'
    "async def greet(inp: Words) -> Words:\n"
    '    """Hello."""\n'
    "    return inp\n"
)
BROKEN_MODULES = {
    "twice": (  # two modules registering one capability
        {
            "greet_a": _GREET.format(version="1.2.0", risk="read"),
            "greet_b": _GREET.format(version="1.2.0", risk="read"),
        },
        "capability module 'greet_b' cannot register: DuplicateCapability: ",
    ),
    "bad_version": (
        {"greet_v": _GREET.format(version="1.2", risk="read")},
        "capability module 'greet_v' cannot be imported: VersionSyntaxError: ",
    ),
    "bad_risk": (
        {"greet_r": _GREET.format(version="1.2.0", risk="reed")},
        "capability module 'greet_r' cannot be imported: ValueError: ",
    ),
    "syntax_error": (
        {"greet_s": "def broken(:\n"},
        "capability module 'greet_s' cannot be imported: SyntaxError: ",
    ),
    "register_raises": (
        {"greet_x": "def register(registry, env):\n    raise RuntimeError('no database')\n"},
        "capability module 'greet_x' cannot register: RuntimeError: no database",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BROKEN_MODULES))
def test_a_broken_capability_module_is_a_clear_error_not_an_internal_one(
    pki: Pki, tmp_path: Path, case: str
) -> None:
    sources, expected = BROKEN_MODULES[case]
    suffix = uuid.uuid4().hex[:8]  # a fresh module name: the import cache spans tests
    names = []
    for name, source in sources.items():
        (tmp_path / f"{name}_{suffix}.py").write_text(source)
        names.append(f"{name}_{suffix}")
    expected = expected.replace("' cannot", f"_{suffix}' cannot")
    config = config_file(pki, tmp_path, grants=[grant("bob", ["demo.greet"])], modules=tuple(names))
    checked = run("config", "check", "--config", str(config))
    assert checked.returncode == 1, checked.stdout
    assert any(
        line.startswith(f"error: modules: {expected}") for line in checked.stdout.splitlines()
    )
    served = run_process("serve", "--config", str(config))
    assert served.returncode == 2, served.stderr
    assert expected in served.stderr
    for result in (checked, served):
        assert "internal error" not in result.stdout + result.stderr
        assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("command", ["call", "describe"])
def test_call_and_describe_name_our_own_bad_certificate_not_the_peer(
    pki: Pki, tmp_path: Path, command: str
) -> None:
    # alice's certificate with carol's key: nothing is sent, and the fault named is ours.
    config = config_file(pki, tmp_path, peers=[("bob", f"127.0.0.1:{closed_port()}")])
    config.write_text(config.read_text().replace("alice.key", "carol.key"))
    extra = ["text.echo", "--input", '{"text": "x"}'] if command == "call" else []
    result = run(command, "--config", str(config), "--peer", spiffe("bob"), *extra)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"error: certificate {pki.dir / 'alice.pem'}: "), result.stderr
    assert "PEER_UNAVAILABLE" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_config_check_notes_a_certificate_without_its_dns_name(pki: Pki, tmp_path: Path) -> None:
    # A certificate of the CA for alice's SPIFFE ID, without the derived DNS name: it
    # serves (gateway clients pin the URI SAN), and the check says who needs the name.
    cert, key = CertificateAuthority.load(pki.dir).mint(uris=[spiffe("alice")])
    (tmp_path / "alice-nodns.pem").write_bytes(cert)
    (tmp_path / "alice-nodns.key").write_bytes(key)
    config = config_file(pki, tmp_path)
    text = config.read_text().replace(str(pki.dir / "alice.pem"), str(tmp_path / "alice-nodns.pem"))
    config.write_text(text.replace(str(pki.dir / "alice.key"), str(tmp_path / "alice-nodns.key")))
    result = run("config", "check", "--config", str(config))
    assert result.returncode == 0, result.stdout
    assert (
        f"ok: certificate {tmp_path / 'alice-nodns.pem'}: carries only its SPIFFE ID (no DNS "
        f"name {svid_dns_name(spiffe('alice'))}): gateway clients pin the URI SAN; a gRPC "
        "client that can verify only a host name needs that name (docs/other-languages.md)"
    ) in result.stdout.splitlines()
    assert "warning" not in result.stdout
