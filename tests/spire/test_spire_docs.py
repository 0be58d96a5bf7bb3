"""Every snippet of docs/spire.md not marked ``<!-- snippet: not-runnable: WHY -->`` runs here,
but for the walkthrough "Try it on one machine", which tests/deploy/test_walkthroughs.py runs."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from gateway.config import AgentConfig, TlsFiles, WorkloadApiTls
from gateway.config.fields import LifetimeShare
from policies.identity import svid_dns_name
from policies.policy_file import load_policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "spire.md"
_FENCE = re.compile(r"(<!-- snippet: not-runnable: [^\n]* -->\n)?```(\w+)\n(.*?)```", re.DOTALL)


WALKTHROUGH = re.compile(r"^## Try it on one machine.*?(?=^## )", re.M | re.S)


def runnable_snippets() -> list[tuple[str, str]]:
    text = WALKTHROUGH.sub("", DOC.read_text())
    return [(lang, body) for marker, lang, body in _FENCE.findall(text) if not marker]


def test_every_runnable_snippet_is_one_this_test_knows() -> None:
    kinds = [(lang, body.split("\n", 1)[0]) for lang, body in runnable_snippets()]
    assert kinds == [
        ("toml", 'id = "spiffe://example.org/agent/alice"'),
        ("sh", "a2a-gateway spiffe dns-name spiffe://example.org/agent/alice"),
        ("toml", "# alice-policy.toml"),
        ("toml", '[tls]                 # source = "files" is the default'),
    ]


def test_the_agent_config_policy_and_files_section_parse(tmp_path: Path) -> None:
    agent, _, policy, files = (body for _, body in runnable_snippets())
    config = AgentConfig.model_validate(tomllib.loads(agent))
    assert isinstance(config.tls, WorkloadApiTls)
    assert config.tls.socket == "unix:///run/spire/agent/public/api.sock"
    assert config.tls.expiry_warning == LifetimeShare(25.0)  # the default, written out
    (tmp_path / "alice-policy.toml").write_text(policy)
    grants = load_policy(tmp_path / "alice-policy.toml").document.grants
    assert [grant.peer for grant in grants] == ["spiffe://partner.example/agent/dave"]
    base = tomllib.loads(agent)
    base["tls"] = tomllib.loads(files)["tls"]
    assert isinstance(AgentConfig.model_validate(base).tls, TlsFiles)


def test_the_dns_name_command_prints_what_the_page_says() -> None:
    (command,) = (body.strip() for lang, body in runnable_snippets() if lang == "sh")
    args = command.split()[1:]
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    printed = result.stdout.strip()
    assert printed == svid_dns_name("spiffe://example.org/agent/alice")
    assert f"which prints `{printed}`" in DOC.read_text()
