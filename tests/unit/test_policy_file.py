"""Policy files: validation messages name file, key and problem; reload keeps the old policy."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from capabilities.builtin import echo, search
from capabilities.registry import CapabilityRegistry
from capabilities.versions import VersionConstraint
from gateway.errors import (
    CapabilityNotGranted,
    GrantExpired,
    PayloadTooLarge,
    PolicyFileError,
    RiskNotGranted,
    UnknownPeer,
    VersionNotAvailable,
)
from policies import PolicyStore, admit, load_policy
from policies.decisions import callable_capabilities
from tests.support import grant, spiffe, write_policy

NOW = datetime.now(UTC)


def problems(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyFileError) as info:
        load_policy(path)
    return info.value.message


def test_valid_file_loads(tmp_path: Path) -> None:
    policy = load_policy(write_policy(tmp_path / "p.toml", [grant("bob", ["text.echo@^1"])]))
    assert list(policy.grants) == [spiffe("bob")]
    assert str(policy.grants[spiffe("bob")].capabilities[0]) == "text.echo@^1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("grants = [", "not valid TOML"),
        (
            '[[grants]]\npeer = "bob"\ncapabilities = []\nmax_payload_bytes = 1\n'
            "expires_at = 2030-01-01T00:00:00Z\n",
            "grants[0] (peer bob).peer: 'bob' is not a SPIFFE ID",
        ),
        (
            '[[grants]]\npeer = "spiffe://e.org/a"\ncapabilities = ["Bad Name"]\n'
            "max_payload_bytes = 1\nexpires_at = 2030-01-01T00:00:00Z\n",
            "grants[0] (peer spiffe://e.org/a).capabilities[0].name",
        ),
        (
            '[[grants]]\npeer = "spiffe://e.org/a"\ncapabilities = ["x.y@>>1"]\n'
            "max_payload_bytes = 1\nexpires_at = 2030-01-01T00:00:00Z\n",
            "capabilities[0].constraint",
        ),
        (
            '[[grants]]\npeer = "spiffe://e.org/a"\ncapabilities = []\nmax_payload_bytes = 0\n'
            "expires_at = 2030-01-01T00:00:00Z\n",
            "max_payload_bytes: must be greater than 0",
        ),
        (
            '[[grants]]\npeer = "spiffe://e.org/a"\ncapabilities = []\nmax_payload_bytes = 1\n'
            'expires_at = "2030-01-01T00:00:00"\n',
            "expires_at: expires_at needs a UTC offset",
        ),
        (
            '[[grants]]\npeer = "spiffe://e.org/a"\ncapabilities = []\nmax_payload_bytes = 1\n'
            'expires_at = 2030-01-01T00:00:00Z\nmax_risk = "nuclear"\n',
            "max_risk",
        ),
        (
            '[[grants]]\npeer = "spiffe://e.org/a"\ncapabilities = []\nmax_payload_bytes = 1\n'
            "expires_at = 2030-01-01T00:00:00Z\nallow_all = true\n",
            "allow_all: unknown key",
        ),
        (
            '[[grants]]\npeer = "spiffe://e.org/a"\ncapabilities = []\nmax_payload_bytes = 1\n'
            "expires_at = 2030-01-01T00:00:00Z\n" * 2,
            "peer spiffe://e.org/a appears twice",
        ),
        ("version = 2\n", "version: expected 1"),
    ],
)
def test_invalid_files_explain_file_key_and_why(tmp_path: Path, text: str, expected: str) -> None:
    message = problems(tmp_path, text)
    assert message.startswith(str(tmp_path / "policy.toml") + ": ")
    assert expected in message


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="policy file not found"):
        load_policy(tmp_path / "absent.toml")


def test_reload_swaps_valid_and_keeps_old_on_invalid(tmp_path: Path) -> None:
    path = write_policy(tmp_path / "p.toml", [grant("bob", ["text.echo"])])
    store = PolicyStore(path)
    old = store.current
    write_policy(path, [grant("carol", ["text.echo"])])
    assert store.reload() is None
    assert list(store.current.grants) == [spiffe("carol")]
    current = store.current
    path.write_text("grants = [")
    error = store.reload()
    assert isinstance(error, PolicyFileError)
    assert store.current is current
    assert store.current is not old


def _registry() -> CapabilityRegistry:
    registry = CapabilityRegistry()
    registry.register(echo)
    registry.register(search)
    return registry


@pytest.mark.parametrize(
    ("grants", "capability", "constraint", "size", "error"),
    [
        ([], "text.echo", "", 1, UnknownPeer),
        (
            [grant("bob", ["text.echo"], expires_at="2001-01-01T00:00:00Z")],
            "text.echo",
            "",
            1,
            GrantExpired,
        ),
        ([grant("bob", ["text.search"])], "text.echo", "", 1, CapabilityNotGranted),
        ([grant("bob", ["text.echo@^2"])], "text.echo", "", 1, VersionNotAvailable),
        ([grant("bob", ["text.echo"])], "text.echo", "^2", 1, VersionNotAvailable),
        ([grant("bob", ["text.echo"], max_payload_bytes=10)], "text.echo", "", 11, PayloadTooLarge),
    ],
)
def test_decision_steps(
    tmp_path: Path, grants: list, capability: str, constraint: str, size: int, error: type
) -> None:
    policy = load_policy(write_policy(tmp_path / "p.toml", grants))
    with pytest.raises(error):
        admit(
            policy,
            _registry(),
            peer_id=spiffe("bob"),
            capability=capability,
            constraint=VersionConstraint.parse(constraint),
            payload_size=size,
            now=NOW,
        )


def test_exactly_at_the_cap_is_allowed(tmp_path: Path) -> None:
    policy = load_policy(
        write_policy(tmp_path / "p.toml", [grant("bob", ["text.echo"], max_payload_bytes=10)])
    )
    admission = admit(
        policy,
        _registry(),
        peer_id=spiffe("bob"),
        capability="text.echo",
        constraint=VersionConstraint.parse(""),
        payload_size=10,
        now=NOW,
    )
    assert admission.capability.contract.key == "text.echo@1.0.0"


def test_risk_above_grant(tmp_path: Path) -> None:
    from tests.support import WriteCounter

    registry = _registry()
    registry.register(WriteCounter().capability())
    policy = load_policy(
        write_policy(tmp_path / "p.toml", [grant("bob", ["notes.write"], max_risk="read")])
    )
    with pytest.raises(RiskNotGranted):
        admit(
            policy,
            registry,
            peer_id=spiffe("bob"),
            capability="notes.write",
            constraint=VersionConstraint.parse(""),
            payload_size=1,
            now=NOW,
        )
    _, visible = callable_capabilities(policy, registry, spiffe("bob"), NOW)
    assert visible == []


def test_a_key_cannot_forge_a_problem_line(tmp_path: Path) -> None:
    message = problems(tmp_path, '[[grants]]\n"x\\nforged: line" = 1\n')
    assert "x\\x0aforged: line: unknown key" in message
    assert all(line.startswith(str(tmp_path)) for line in message.splitlines())
