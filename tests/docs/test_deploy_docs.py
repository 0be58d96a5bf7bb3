"""The deployment docs are code: the unit verifies and its ExecStart serves, the manifests
validate against the Kubernetes schemas, the TOML is a valid config, the image is non-root,
and every shell or Python snippet is either run here or marked not-runnable."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway.config import AgentConfig
from tests.agent_process import REPO, LineReader, write_agent_toml
from tests.support import Pki, write_policy

DOCS = REPO / "docs"
NOT_RUNNABLE = "<!-- snippet: not-runnable: "
RUNNABLE_LANGUAGES = {"sh", "bash", "shell", "console", "python", "py"}
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def fences(path: Path) -> list[tuple[str, str, bool]]:
    """(language, text, marked not-runnable) of every fenced block in ``path``."""
    text = path.read_text()
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append((match.group(1), match.group(2), before.strip().startswith(NOT_RUNNABLE)))
    return found


def only(path: Path, language: str) -> list[str]:
    return [text for lang, text, _ in fences(path) if lang == language]


@pytest.mark.parametrize("page", ["deploy.md", "console.md"])
def test_every_shell_or_python_snippet_is_marked_or_run(page: str) -> None:
    # This suite runs the unit (ini), the manifests (yaml), the TOML and the image definition;
    # shell lines that need a real systemd, cluster or image build are marked not-runnable.
    blocks = fences(DOCS / page)
    assert blocks
    unmarked = [text for lang, text, marked in blocks if lang in RUNNABLE_LANGUAGES and not marked]
    assert unmarked == []


def _unit() -> str:
    [unit] = only(DOCS / "deploy.md", "ini")
    return unit


def test_the_systemd_unit_is_hardened() -> None:
    settings = dict(
        line.split("=", 1)
        for line in _unit().splitlines()
        if "=" in line and not line.startswith("#")
    )
    expected = {
        "DynamicUser": "yes",
        "StateDirectory": "a2a-gateway",
        "StateDirectoryMode": "0700",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
    }
    assert {key: settings.get(key) for key in expected} == expected
    assert settings["LoadCredential"].startswith("tls.key:")


def _config_for_exec_start(pki: Pki, tmp_path: Path) -> Path:
    return write_agent_toml(
        tmp_path / "agent.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "alice-policy.toml", []),
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "state",
    )


def _exec_start(config: Path) -> list[str]:
    [line] = [line for line in _unit().splitlines() if line.startswith("ExecStart=")]
    words = shlex.split(line.removeprefix("ExecStart="))
    assert words[0] == "/usr/local/bin/a2a-gateway"
    assert words[-2:] == ["--config", "/etc/a2a-gateway/agent.toml"]
    installed = Path(sys.executable).parent / "a2a-gateway"  # the same entry point, installed here
    return [str(installed), *words[1:-1], str(config)]


def test_the_unit_exec_start_line_serves_and_stops_cleanly(pki: Pki, tmp_path: Path) -> None:
    command = _exec_start(_config_for_exec_start(pki, tmp_path))
    proc = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out = LineReader(proc.stdout)
        line = out.next_line(60)
        assert line is not None and " serving on 127.0.0.1:" in line, proc.stderr
        os.kill(proc.pid, signal.SIGTERM)  # what systemctl stop sends
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_the_unit_passes_systemd_analyze_verify(pki: Pki, tmp_path: Path) -> None:
    config = _config_for_exec_start(pki, tmp_path)
    unit = _unit().replace(
        next(line for line in _unit().splitlines() if line.startswith("ExecStart=")),
        "ExecStart=" + shlex.join(_exec_start(config)),
    )
    path = tmp_path / "a2a-gateway.service"
    path.write_text(unit)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "Unknown" not in result.stderr and "a2a-gateway.service" not in result.stderr


def test_the_toml_snippets_are_valid_configs() -> None:
    [agent_toml] = only(DOCS / "deploy.md", "toml")
    config = AgentConfig.model_validate(tomllib.loads(agent_toml))
    assert str(config.tls.key) == "/run/credentials/a2a-gateway.service/tls.key"
    assert config.metrics is not None and config.metrics.listen == "127.0.0.1:9464"
    [console_toml] = only(DOCS / "console.md", "toml")
    with_console = AgentConfig.model_validate(
        {**tomllib.loads(agent_toml), **tomllib.loads(console_toml)}
    )
    assert with_console.console is not None and not with_console.console.allow_remote


def _manifests() -> list[dict[str, Any]]:
    import yaml

    [text] = only(DOCS / "deploy.md", "yaml")
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_the_kubernetes_manifests_validate_against_the_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.utils.latest_version()
    documents = _manifests()
    assert [doc["kind"] for doc in documents] == ["ConfigMap", "Deployment", "Service", "Secret"]
    for doc in documents:
        kubernetes_validate.validate(doc, version, strict=True)  # raises on any violation
    bad = {**documents[2], "spec": {**documents[2]["spec"], "ports": [{"port": "seven"}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)  # the validator can fail


def test_the_deployment_probes_health_and_runs_locked_down() -> None:
    config_map, deployment, service, _secret = _manifests()
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    [password] = container["env"]
    assert password["name"] == "PGPASSWORD" and "secretKeyRef" in password["valueFrom"]
    secret_volumes = [v for v in pod["volumes"] if "secret" in v]
    assert [v["secret"]["secretName"] for v in secret_volumes] == ["a2a-gateway-alice-tls"]
    config = AgentConfig.model_validate(tomllib.loads(config_map["data"]["agent.toml"]))
    assert config.metrics is not None and config.metrics.listen.endswith(":9464")
    assert "password" not in str(config.audit_db).lower() and ":@" not in str(config.audit_db)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": int(config.listen.rsplit(":", 1)[1]), "metrics": 9464}
    assert service["spec"]["ports"][0]["targetPort"] == "grpc"


def test_the_container_image_runs_as_a_non_root_user() -> None:
    [definition] = only(DOCS / "deploy.md", "dockerfile")
    users = [line.split()[1] for line in definition.splitlines() if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert int(users[-1].split(":")[0]) >= 1000
    entry = next(line for line in definition.splitlines() if line.startswith("ENTRYPOINT "))
    assert '"a2a-gateway"' in entry
