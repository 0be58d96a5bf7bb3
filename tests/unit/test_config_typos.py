"""Problems of a config or policy file are named in the file's words, not pydantic's."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_agent_config
from gateway.errors import ConfigError
from policies.grants import PeerGrant
from policies.policy_file import load_policy

GRANT_KEYS = PeerGrant.model_fields
AGENT = """\
id = "spiffe://example.org/agent/alice"
lisen = "127.0.0.1:7001"
policy = "policy.toml"
audit_db = "audit.sqlite"
state_dir = "state"
workers = "two"

[tls]
ca = "ca.pem"
cert = "alice.pem"
key = "alice.key"
expiry_warnin = "5m"

[console]
listen = "127.0.0.1:9465"
alow_remote = true

[[peers]]
id = "spiffe://example.org/agent/bob"
adress = "127.0.0.1:7002"
"""


def problems(path: Path, text: str, load: object) -> list[str]:
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load(path)  # type: ignore[operator]
    return sorted(line.removeprefix(f"{path}: ") for line in caught.value.message.splitlines())


def test_agent_config_typos_say_the_key_meant(tmp_path: Path) -> None:
    assert problems(tmp_path / "alice.toml", AGENT, load_agent_config) == [
        "console.alow_remote: unknown key (did you mean allow_remote?)",
        "lisen: unknown key (did you mean listen?)",
        "peers[0].address: missing: this key is required here",
        "peers[0].adress: unknown key (did you mean address?)",
        "tls.expiry_warnin: unknown key (did you mean expiry_warning?)",  # not tls.files.…
        "workers: expected a whole number",
    ]


def test_a_tls_source_that_does_not_exist_names_the_ones_that_do(tmp_path: Path) -> None:
    text = AGENT.replace('ca = "ca.pem"', 'source = "vault"').replace("lisen", "listen")
    assert "tls: source must be one of 'files', 'workload-api'" in problems(
        tmp_path / "alice.toml", text, load_agent_config
    )


def test_policy_typos_say_the_key_meant_and_never_the_value(tmp_path: Path) -> None:
    text = """\
version = 1
[[grants]]
peer = "spiffe://example.org/agent/bob"
capabilites = ["text.echo"]
max_payload_bytes = "postgresql://user:secret@db/x"
expires_at = "2030-01-01T00:00:00Z"
max_risk = "nuclear"
frobnicate = 1
"""
    found = problems(tmp_path / "policy.toml", text, load_policy)
    grant = "grants[0] (peer spiffe://example.org/agent/bob)"
    assert found == [
        f"{grant}.capabilites: unknown key (did you mean capabilities?)",
        f"{grant}.capabilities: missing: this key is required here",
        f"{grant}.frobnicate: unknown key (the keys here: {', '.join(sorted(GRANT_KEYS))})",
        f"{grant}.max_payload_bytes: expected a whole number",
        f"{grant}.max_risk: expected 'read', 'write' or 'external'",
    ]
    assert not any("secret" in line for line in found)
