"""docs/deploy.md's systemd install and unit, exactly as the page writes them.

- The page's install lines run with ``/opt`` moved under a temporary root.
- ``systemd-analyze verify --root`` then checks the page's unit against that root, and
  ``systemd-analyze security --offline`` rates it.
- The unit's ``ExecStart`` runs from that venv.
- systemd 252 itself runs the unit in a container (Debian's systemd in the image's build base,
  the image's venv at ``/opt/a2a-gateway``), and a peer calls the agent there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_process import LineReader
from tests.deploy.podman_lab import (
    REPO,
    agent_image,
    build_base_image,
    podman,
    podman_unavailable_reason,
    running,
    unique_name,
)
from tests.support import Pki, spiffe

DEPLOY_PAGE = REPO / "docs" / "deploy.md"
UNIT_FILE = REPO / "deploy" / "systemd" / "a2a-gateway.service"
UNIT = "a2a-gateway.service"
VENV = "/opt/a2a-gateway"
EXPOSURE_THRESHOLD = 1.5
"""The highest overall exposure accepted (``systemd-analyze security``; 0 safest, 10 least)."""

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


def _page_blocks(language: str) -> list[str]:
    text = DEPLOY_PAGE.read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def page_unit() -> str:
    [unit] = _page_blocks("ini")
    return unit


def page_install_lines() -> list[str]:
    [install] = [b for b in _page_blocks("sh") if b.startswith(f"/usr/bin/python3 -m venv {VENV}")]
    return install.strip().splitlines()


def page_agent_toml() -> str:
    [agent_toml] = [b for b in _page_blocks("toml") if "/run/credentials/" in b]
    return agent_toml


def exec_start_words() -> list[str]:
    [line] = [line for line in page_unit().splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def test_the_page_unit_is_the_repository_file() -> None:
    assert page_unit() == UNIT_FILE.read_text()


@pytest.fixture(scope="module")
def installed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root folder with the page's install done in it, the page's unit in
    ``etc/systemd/system``, and what ``verify`` looks up besides (systemd's own units,
    ``/bin/kill`` of ``ExecReload``)."""
    python = Path("/usr/bin/python3")
    if not python.exists():
        pytest.skip("no system Python at /usr/bin/python3 (the page's install uses it)")
    probe = subprocess.run(
        [str(python), "-c", "import ensurepip, venv"], capture_output=True, timeout=60
    )
    if probe.returncode != 0:
        pytest.skip("the system Python cannot make venvs (apt-get install python3-venv)")
    root = tmp_path_factory.mktemp("root")
    for line in page_install_lines():
        moved = line.replace(VENV, f"{root}{VENV}")
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", moved],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        assert result.returncode == 0, f"{line}: {result.stderr[-3000:]}"
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system" / UNIT).write_text(page_unit())
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "usr/bin").mkdir(exist_ok=True)
    shutil.copy("/usr/bin/kill", root / "usr/bin/kill")
    (root / "bin").symlink_to("usr/bin")
    return root


def _verify(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", UNIT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@needs_systemd_analyze
def test_the_installed_venv_prints_the_version(installed_root: Path) -> None:
    result = subprocess.run(
        [str(installed_root / VENV.lstrip("/") / "bin/a2a-gateway"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout.strip()) == (0, "a2a-gateway 0.1.0")


@needs_systemd_analyze
def test_systemd_analyze_verify_passes_on_the_page_unit(installed_root: Path) -> None:
    result = _verify(installed_root)
    assert (result.returncode, result.stderr) == (0, "")


@needs_systemd_analyze
def test_verify_fails_where_the_install_was_not_done(installed_root: Path, tmp_path: Path) -> None:
    # What the page's old unit (/usr/local/bin/a2a-gateway) met: a command nobody installed.
    bare = tmp_path / "root"
    shutil.copytree(installed_root, bare, symlinks=True, ignore=shutil.ignore_patterns("opt"))
    result = _verify(bare)
    assert result.returncode != 0
    assert f"Command {VENV}/bin/a2a-gateway is not executable" in result.stderr


@needs_systemd_analyze
def test_systemd_analyze_security_rates_the_unit_ok(installed_root: Path) -> None:
    result = subprocess.run(
        [
            "systemd-analyze",
            "security",
            "--offline=true",
            f"--root={installed_root}",
            f"--threshold={int(EXPOSURE_THRESHOLD * 10)}",
            UNIT,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    [score] = re.findall(rf"Overall exposure level for {UNIT}: ([0-9.]+)", result.stdout)
    assert float(score) <= EXPOSURE_THRESHOLD
    print(f"systemd-analyze security: {score}")  # the figure docs/deploy.md quotes
    assert f"rates it {score} (OK" in DEPLOY_PAGE.read_text()


def test_the_exec_start_line_serves_from_the_installed_venv(
    installed_root: Path, pki: Pki, tmp_path: Path
) -> None:
    words = exec_start_words()
    assert words[0] == f"{VENV}/bin/a2a-gateway"
    assert words[-2:] == ["--config", "/etc/a2a-gateway/agent.toml"]
    config = tmp_path / "agent.toml"
    (tmp_path / "alice-policy.toml").write_text("version = 1\n")
    config.write_text(
        page_agent_toml()
        .replace('"0.0.0.0:7001"', '"127.0.0.1:0"')
        .replace('"127.0.0.1:9464"', '"127.0.0.1:0"')
        .replace("/var/lib/a2a-gateway", str(tmp_path / "state"))
        .replace('"pki/ca.pem"', f'"{pki.dir / "ca.pem"}"')
        .replace('"pki/agent.pem"', f'"{pki.dir / "alice.pem"}"')
        .replace('"/run/credentials/a2a-gateway.service/tls.key"', f'"{pki.dir / "alice.key"}"')
    )
    command = [str(installed_root / words[0].lstrip("/")), *words[1:-1], str(config)]
    proc = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = LineReader(proc.stdout).next_line(60)
        assert line is not None and " serving on 127.0.0.1:" in line, proc.stderr
        os.kill(proc.pid, signal.SIGTERM)  # what systemctl stop sends
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=20)


# systemd 252 as init in a podman container. One change to the page's unit, as a drop-in:
# there, LoadCredential= leaves /run/credentials/a2a-gateway.service unreadable to the
# service (so for a minimal unit with User=nobody, too), so the test key is read from
# /etc/a2a-gateway/pki instead. Every other line of the unit applies as written.
_DROP_IN = "[Service]\nLoadCredential=\n"


@pytest.fixture(scope="module")
def systemd_image() -> Iterator[str]:
    """Debian's systemd (the image's build base) with the agent image's venv at /opt."""
    reason = podman_unavailable_reason()
    if reason:
        pytest.skip(reason)
    agent = agent_image()
    base = build_base_image()
    tag = f"localhost/{unique_name('a2agw-systemd')}"
    context = Path(os.environ.get("TMPDIR", "/tmp")) / unique_name("a2agw-systemd-context")
    context.mkdir()
    try:
        (context / "Containerfile").write_text(
            f'FROM {base}-build\nCOPY --from={agent} {VENV} {VENV}\nCMD ["/sbin/init"]\n'
        )
        podman("build", "--quiet", "--network=none", "-t", tag, str(context), timeout=600)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    try:
        yield tag
    finally:
        podman("rmi", "--force", tag, check=False)


def _etc_folder(pki: Pki, folder: Path) -> Path:
    etc = folder / "a2a-gateway"
    (etc / "pki").mkdir(parents=True)
    agent_toml = page_agent_toml().replace(
        '"/run/credentials/a2a-gateway.service/tls.key"', '"pki/agent.key"'
    )
    (etc / "agent.toml").write_text(agent_toml)
    (etc / "alice-policy.toml").write_text(
        "version = 1\n\n[[grants]]\n"
        f'peer = "{spiffe("bob")}"\ncapabilities = ["text.echo"]\n'
        'max_payload_bytes = 4096\nexpires_at = "2030-01-01T00:00:00Z"\n'
    )
    shutil.copy(pki.dir / "ca.pem", etc / "pki" / "ca.pem")
    shutil.copy(pki.dir / "alice.pem", etc / "pki" / "agent.pem")
    shutil.copy(pki.dir / "alice.key", etc / "pki" / "agent.key")
    (etc / "pki" / "agent.key").chmod(0o644)  # a throwaway key: the dynamic user must read it
    bob = folder / "bob"
    bob.mkdir()
    for name in ("ca.pem", "bob.pem", "bob.key"):
        shutil.copy(pki.dir / name, bob / name)
    (bob / "bob-policy.toml").write_text("version = 1\n")
    (bob / "bob.toml").write_text(
        f'id = "{spiffe("bob")}"\nlisten = "127.0.0.1:0"\npolicy = "bob-policy.toml"\n'
        'audit_db = "bob-audit.sqlite"\nstate_dir = "state"\n\n[tls]\n'
        'ca = "ca.pem"\ncert = "bob.pem"\nkey = "bob.key"\n\n'
        f'[[peers]]\nid = "{spiffe("alice")}"\naddress = "127.0.0.1:7001"\n'
    )
    return etc


def test_systemd_runs_the_page_unit_and_a_peer_calls_the_agent(
    systemd_image: str, pki: Pki, tmp_path: Path
) -> None:
    etc = _etc_folder(pki, tmp_path)
    name = unique_name("a2agw-systemd")
    run_args = ["--name", name, "--network=none", "--privileged", "--systemd=always"]
    with running([*run_args, systemd_image], name) as box:
        box.wait_until(
            lambda: (
                box.exec("systemctl", "is-system-running").stdout.strip() in ("running", "degraded")
            ),
            "systemd up",
        )
        podman("cp", str(etc), f"{name}:/etc/a2a-gateway")
        podman("cp", str(tmp_path / "bob"), f"{name}:/root/bob")
        podman("cp", str(UNIT_FILE), f"{name}:/etc/systemd/system/{UNIT}")
        drop_in = tmp_path / "test.conf"
        drop_in.write_text(_DROP_IN)
        assert box.exec("mkdir", "-p", f"/etc/systemd/system/{UNIT}.d").returncode == 0
        podman("cp", str(drop_in), f"{name}:/etc/systemd/system/{UNIT}.d/test.conf")
        started = box.exec("sh", "-c", f"systemctl daemon-reload && systemctl start {UNIT}")
        assert started.returncode == 0, started.stderr

        def ready() -> bool:
            probe = box.exec(
                "python3", "-c",
                "import urllib.request as u;"
                "print(u.urlopen('http://127.0.0.1:9464/readyz', timeout=2).read().decode())",
            )  # fmt: skip
            return probe.stdout.strip() == "SERVING"

        box.wait_until(ready, f"{UNIT} ready")
        call = box.exec(
            "sh", "-c",
            f"cd /root/bob && {VENV}/bin/a2a-gateway call --config bob.toml"
            f" --peer {spiffe('alice')} text.echo --input '{{\"text\": \"hi\"}}'",
        )  # fmt: skip
        assert call.returncode == 0, call.stderr
        assert json.loads(call.stdout) == {"text": "hi"}
        pid = box.exec("systemctl", "show", "-P", "MainPID", UNIT).stdout.strip()
        assert box.exec("systemctl", "reload", UNIT).returncode == 0  # SIGHUP: re-read, go on
        box.wait_until(ready, f"{UNIT} ready after reload")
        assert box.exec("systemctl", "show", "-P", "MainPID", UNIT).stdout.strip() == pid
        uid = box.exec("stat", "-c", "%u", f"/proc/{pid}").stdout.strip()
        assert box.exec("systemctl", "stop", UNIT).returncode == 0
        result = box.exec(
            "systemctl", "show", "-p", "Result", "-p", "ExecMainStatus", UNIT
        ).stdout.split()
        assert result == ["Result=success", "ExecMainStatus=0"], box.exec(
            "journalctl", "-u", UNIT, "--no-pager"
        ).stdout[-3000:]
        assert uid.isdigit() and int(uid) > 0  # DynamicUser: a fresh unprivileged user
