"""``[[upstreams]]``: strict config validation, schema contracts, the runner's narrow channel."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from capabilities.builtin.echo import EchoInput, EchoOutput
from capabilities.context import CallContext
from capabilities.registry import Capability, capability
from capabilities.runner import run_capability
from capabilities.schema_models import SchemaNotSupported, contract_model
from gateway.config import AgentConfig, load_agent_config
from gateway.errors import AgentConfigError, CapabilityFailed, PeerUnavailable, UpstreamUnavailable
from gateway.runtime.agent import Agent
from tests.agent_process import write_agent_toml
from tests.support import Pki, agent_config, spiffe, write_policy

LEGACY = spiffe("legacy")
SKILL = {
    "skill": "echo",
    "capability": "legacy.echo",
    "version": "1.0.0",
    "risk": "read",
    "timeout": 5.0,
}


def toml_config(tmp_path: Path, pki: Pki, upstreams: str) -> Path:
    policy = write_policy(tmp_path / "p.toml", [])
    path = write_agent_toml(
        tmp_path / "bob.toml",
        pki,
        "bob",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=tmp_path / "a.sqlite",
        state_dir=tmp_path / "s",
    )
    path.write_text(path.read_text() + "\n" + upstreams)
    return path


def entry(**fields: Any) -> dict[str, Any]:
    return {"skills": [SKILL], **fields}


def config_with(pki: Pki, tmp_path: Path, *upstreams: dict[str, Any]) -> AgentConfig:
    plain = agent_config(pki, tmp_path, "bob", write_policy(tmp_path / "p.toml", []))
    return AgentConfig.model_validate({**plain.model_dump(), "upstreams": list(upstreams)})


def test_the_documented_example_loads(pki: Pki, tmp_path: Path) -> None:
    path = toml_config(
        tmp_path,
        pki,
        f"""[[upstreams]]
id = "{LEGACY}"
address = "10.0.0.5:50051"
binding = "grpc"
[[upstreams.skills]]
skill = "echo"
capability = "legacy.echo"
version = "1.0.0"
risk = "read"
timeout = 5.0
""",
    )
    upstream = load_agent_config(path).upstreams[0]
    assert (upstream.name, upstream.plaintext, upstream.skills[0].capability) == (
        LEGACY,
        False,
        "legacy.echo",
    )


@pytest.mark.parametrize(
    ("upstream", "problem"),
    [
        (entry(address="10.0.0.5:50051"), "id: required unless address is a loopback IP"),
        (entry(address="localhost:50051"), "id: required unless address is a loopback IP"),
        (
            entry(binding="jsonrpc", url="http://10.0.0.5/a2a"),
            "url: plaintext http:// only to a loopback IP",
        ),
        (entry(binding="jsonrpc", url="https://10.0.0.5/a2a"), "id: required for an https url"),
        (
            entry(id=LEGACY, binding="jsonrpc", url="http://127.0.0.1/a2a"),
            "url: http:// cannot prove the id",
        ),
        (entry(binding="jsonrpc", url="ftp://127.0.0.1/a2a"), "url: must be http:// or https://"),
        (entry(binding="jsonrpc", address="127.0.0.1:1"), "binding jsonrpc takes url, not address"),
        (entry(url="http://127.0.0.1/a2a"), "binding grpc takes address (host:port), not url"),
        (entry(binding="rest", address="127.0.0.1:1"), "Input should be 'grpc' or 'jsonrpc'"),
        ({"address": "127.0.0.1:1", "skills": []}, "at least 1 item"),
        (
            entry(address="127.0.0.1:1", skills=[SKILL, {**SKILL, "capability": "legacy.other"}]),
            "a skill id appears twice",
        ),
        (
            entry(address="127.0.0.1:1", skills=[{**SKILL, "skill": "bad skill"}]),
            "must be 1-128 characters",
        ),
        (
            entry(address="127.0.0.1:1", skills=[{**SKILL, "capability": "Legacy Echo"}]),
            "dotted lowercase",
        ),
        (
            entry(address="127.0.0.1:1", skills=[{**SKILL, "version": "1.0"}]),
            "not a MAJOR.MINOR.PATCH",
        ),
        (
            entry(address="127.0.0.1:1", skills=[{**SKILL, "risk": "admin"}]),
            "'read', 'write' or 'external'",
        ),
        (entry(address="127.0.0.1:1", skills=[{**SKILL, "timeout": 0}]), "greater than 0"),
        (
            entry(address="127.0.0.1:1", skills=[{**SKILL, "extra": 1}]),
            "Extra inputs are not permitted",
        ),
        (
            entry(
                address="127.0.0.1:1",
                skills=[{**SKILL, "input_schema": {"type": "object", "patternProperties": {}}}],
            ),
            "unsupported JSON Schema: patternProperties",
        ),
    ],
)
def test_invalid_upstreams_are_refused_naming_the_key(
    pki: Pki, tmp_path: Path, upstream: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match="upstreams") as caught:
        config_with(pki, tmp_path, upstream)
    assert problem in str(caught.value)


def test_plaintext_non_loopback_in_a_file_is_config_invalid(pki: Pki, tmp_path: Path) -> None:
    path = toml_config(
        tmp_path,
        pki,
        '[[upstreams]]\nbinding = "jsonrpc"\nurl = "http://192.0.2.7:41241/a2a"\n'
        '[[upstreams.skills]]\nskill = "echo"\ncapability = "legacy.echo"\nversion = "1.0.0"\n'
        'risk = "read"\ntimeout = 5.0\n',
    )
    with pytest.raises(AgentConfigError) as caught:
        load_agent_config(path)
    assert caught.value.reason == "CONFIG_INVALID"
    assert str(caught.value) == (
        f"CONFIG_INVALID: {path}: upstreams[0]: url: plaintext http:// only to a loopback IP"
    )


def test_duplicate_upstreams_and_capability_names_are_refused(pki: Pki, tmp_path: Path) -> None:
    one = entry(address="127.0.0.1:1")
    with pytest.raises(ValueError, match="the same upstream appears twice"):
        config_with(pki, tmp_path, one, one)
    with pytest.raises(ValueError, match="a capability name appears twice"):
        config_with(pki, tmp_path, one, entry(address="127.0.0.1:2"))
    with pytest.raises(ValueError, match="cannot be this agent itself"):
        config_with(pki, tmp_path, entry(id=spiffe("bob"), address="127.0.0.1:2"))


async def test_a_skill_clashing_with_a_module_capability_is_config_invalid(
    pki: Pki, tmp_path: Path
) -> None:
    skill = {**SKILL, "capability": "text.echo"}  # also registered by capabilities.builtin
    config = config_with(pki, tmp_path, entry(address="127.0.0.1:1", skills=[skill]))
    with pytest.raises(
        AgentConfigError, match=r"upstreams\[0\]\.skills\[0\]\.capability: text.echo@1.0.0"
    ):
        await Agent(config).start()


def test_schema_subset_is_closed() -> None:
    model = contract_model("M", {"type": "object", "properties": {"n": {"type": "integer"}}})
    assert model.model_validate_json(b"{}").model_dump() == {}
    assert model.model_validate_json(b'{"n": 2}').model_dump() == {"n": 2}
    for bad in (b'{"n": null}', b'{"n": "2"}', b'{"m": 1}'):
        with pytest.raises(ValueError):
            model.model_validate_json(bad)
    for schema in (
        {"type": "array", "items": {"type": "string"}},
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "x"}}},
        {"type": "object", "properties": {"a": {"type": "array"}}},
        {"type": "object", "properties": {"e": {"type": "string", "enum": [1]}}},
        {"type": "object", "properties": {"s": {"type": "string", "maxLength": "9"}}},
        {"type": "object", "required": ["x"]},
    ):
        with pytest.raises(SchemaNotSupported):
            contract_model("Bad", schema)


def _raising(error: Exception, upstream: str = "") -> Capability:
    @capability("legacy.echo", "1.0.0", risk="read")
    async def raises(inp: EchoInput, ctx: CallContext) -> EchoOutput:
        """Raise the error given."""
        raise error

    return Capability(raises.contract, raises.handler, upstream=upstream)


@pytest.mark.parametrize(
    ("error", "upstream", "passed_on"),
    [
        (UpstreamUnavailable("x", upstream=LEGACY), LEGACY, True),
        (UpstreamUnavailable("x", upstream=spiffe("other")), LEGACY, False),
        (UpstreamUnavailable("x", upstream=LEGACY), "", False),
        (PeerUnavailable("x"), LEGACY, False),
    ],
)
async def test_only_an_upstream_capability_reports_its_own_upstream_unreachable(
    error: Exception, upstream: str, passed_on: bool
) -> None:
    ctx = CallContext(peer_id=spiffe("alice"), request_id="r1", deadline=time.monotonic() + 5)
    with pytest.raises((UpstreamUnavailable, CapabilityFailed)) as caught:
        await run_capability(_raising(error, upstream), EchoInput(text="hi"), ctx)
    assert (caught.value is error) is passed_on
    assert caught.value.reason == ("PEER_UNAVAILABLE" if passed_on else "CAPABILITY_FAILED")


def test_streaming_is_for_both_bindings_and_off_by_default(pki: Pki, tmp_path: Path) -> None:
    grpc_entry = entry(id=LEGACY, address="127.0.0.1:50051", streaming=True)
    assert config_with(pki, tmp_path, grpc_entry).upstreams[0].streaming is True
    jsonrpc = entry(id=LEGACY, binding="jsonrpc", url="https://10.0.0.7:41241/a2a", streaming=True)
    assert config_with(pki, tmp_path, jsonrpc).upstreams[0].streaming is True
    plain = entry(id=LEGACY, binding="jsonrpc", url="https://10.0.0.7:41241/a2a")
    assert config_with(pki, tmp_path, plain).upstreams[0].streaming is False
