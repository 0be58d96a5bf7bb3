"""docs/deploy.md is code: what it shows is what the repository ships and what tests/deploy/ runs.

These checks need nothing installed: the unit on the page is the repository's file and is
hardened, the TOML is a valid config, the Containerfile is multi-stage and non-root with a
health check, and every shell or Python snippet is either run or marked not-runnable. The
deployments themselves run in tests/deploy/ (systemd, podman, helm).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from gateway.config import AgentConfig
from tests.agent_process import REPO

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
    # Shell lines that need root, a real systemd, podman, helm or a cluster are marked
    # not-runnable here and run by tests/deploy/ instead, as their markers say.
    blocks = fences(DOCS / page)
    assert blocks
    unmarked = [text for lang, text, marked in blocks if lang in RUNNABLE_LANGUAGES and not marked]
    assert unmarked == []


def _unit() -> str:
    [unit] = only(DOCS / "deploy.md", "ini")
    return unit


def test_the_page_unit_is_the_repository_file() -> None:
    assert _unit() == (REPO / "deploy" / "systemd" / "a2a-gateway.service").read_text()


def test_the_systemd_unit_is_hardened() -> None:
    settings: dict[str, list[str]] = {}
    for line in _unit().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    expected = {
        "ExecStart": [
            "/opt/a2a-gateway/bin/a2a-gateway --log-format json serve"
            " --config /etc/a2a-gateway/agent.toml"
        ],
        "DynamicUser": ["yes"],
        "StateDirectory": ["a2a-gateway"],
        "StateDirectoryMode": ["0700"],
        "ProtectSystem": ["strict"],
        "ProtectHome": ["yes"],
        "PrivateTmp": ["yes"],
        "PrivateUsers": ["yes"],
        "NoNewPrivileges": ["yes"],
        "MemoryDenyWriteExecute": ["yes"],
        "CapabilityBoundingSet": [""],
        "AmbientCapabilities": [""],
        "SystemCallFilter": ["@system-service", "~@privileged @resources"],
    }
    assert {key: settings.get(key) for key in expected} == expected
    [credential] = settings["LoadCredential"]
    assert credential == "tls.key:/etc/a2a-gateway/pki/agent.key"


def test_the_install_makes_the_venv_the_unit_runs() -> None:
    [install] = [b for b in only(DOCS / "deploy.md", "sh") if "-m venv" in b]
    assert install.splitlines()[0] == "/usr/bin/python3 -m venv /opt/a2a-gateway"
    [exec_start] = [line for line in _unit().splitlines() if line.startswith("ExecStart=")]
    binary = exec_start.removeprefix("ExecStart=").split()[0]
    assert binary in install


def test_the_toml_snippets_are_valid_configs() -> None:
    [agent_toml] = only(DOCS / "deploy.md", "toml")
    config = AgentConfig.model_validate(tomllib.loads(agent_toml))
    assert str(config.tls.key) == "/run/credentials/a2a-gateway.service/tls.key"  # type: ignore[union-attr]
    assert config.metrics is not None and config.metrics.listen == "127.0.0.1:9464"
    [console_toml] = only(DOCS / "console.md", "toml")
    with_console = AgentConfig.model_validate(
        {**tomllib.loads(agent_toml), **tomllib.loads(console_toml)}
    )
    assert with_console.console is not None and not with_console.console.allow_remote


def _instructions(definition: str) -> list[tuple[str, str]]:
    joined = definition.replace("\\\n", " ")
    return [
        (line.split(None, 1)[0], line.split(None, 1)[1] if " " in line.strip() else "")
        for line in joined.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_the_containerfile_is_multi_stage_non_root_and_health_checked() -> None:
    steps = _instructions((REPO / "Containerfile").read_text())
    froms = [args for op, args in steps if op == "FROM"]
    assert froms == ["${BASE}-build AS build", "${BASE}"]
    runtime = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    assert ("USER", "10001:10001") in runtime
    copies = [args for op, args in runtime if op == "COPY"]
    assert copies == ["--from=build /opt/a2a-gateway /opt/a2a-gateway"]  # nothing of a checkout
    [health] = [args for op, args in runtime if op == "HEALTHCHECK"]
    assert "http://127.0.0.1:9464/readyz" in health
    build = steps[: [op for op, _ in steps].index("FROM", 2)]
    assert all(not args.startswith(". ") for op, args in build if op == "COPY")


def test_the_containerignore_admits_only_the_wheel_sources() -> None:
    patterns = [
        line
        for line in (REPO / ".containerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    assert [p for p in patterns if p.startswith("!")] == [
        "!pyproject.toml",
        "!README.md",
        "!gateway",
        "!capabilities",
        "!policies",
    ]
    assert {"**/*.key", "**/*.sqlite", "**/__pycache__"} <= set(patterns)
