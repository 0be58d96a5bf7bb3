"""Reading policy files (TOML) into a validated, indexed ``Policy``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import PolicyFileError
from gateway.local.toml_files import parse_toml_model, read_text
from policies.grants import OutboundRule, PeerGrant, PolicyDocument


@dataclass(frozen=True, slots=True)
class Policy:
    """A loaded policy, indexed by peer for the request path.

    Attributes:
        document: The validated file contents.
        source: Where it came from (for messages), e.g. a file path.
    """

    document: PolicyDocument
    source: str
    grants: Mapping[str, PeerGrant]
    outbound: Mapping[str, OutboundRule]

    @classmethod
    def from_document(cls, document: PolicyDocument, source: str = "<memory>") -> Policy:
        """Index a validated document."""
        return cls(
            document=document,
            source=source,
            grants={grant.peer: grant for grant in document.grants},
            outbound={rule.peer: rule for rule in document.outbound},
        )

    def may_send(self, peer: str, capability: str) -> bool:
        """True if the outbound rules let this agent send ``capability`` to ``peer``."""
        rule = self.outbound.get(peer)
        return rule is not None and any(entry.name == capability for entry in rule.capabilities)


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file.

    Raises:
        PolicyFileError: unreadable file, bad TOML, or invalid content; the
            message names the file, the key and the problem.
    """
    text = read_text(path, "policy", PolicyFileError)
    document, _ = parse_toml_model(PolicyDocument, text, str(path), PolicyFileError)
    return Policy.from_document(document, str(path))


def render_policy(document: PolicyDocument) -> str:
    """TOML text of ``document`` that ``load_policy`` reads back unchanged."""
    lines = [f"version = {document.version}", ""]
    for grant in document.grants:
        lines += [
            "[[grants]]",
            f"peer = {_toml_str(grant.peer)}",
            f"capabilities = [{', '.join(_toml_str(str(e)) for e in grant.capabilities)}]",
            f"max_payload_bytes = {grant.max_payload_bytes}",
            f"expires_at = {_toml_str(grant.expires_at.isoformat())}",
        ]
        if grant.max_risk is not None:
            lines.append(f"max_risk = {_toml_str(grant.max_risk.value)}")
        if grant.max_calls_per_second is not None:
            lines.append(f"max_calls_per_second = {grant.max_calls_per_second!r}")
        if grant.burst is not None:
            lines.append(f"burst = {grant.burst}")
        if grant.max_in_flight is not None:
            lines.append(f"max_in_flight = {grant.max_in_flight}")
        if grant.users != "optional":
            lines.append(f"users = {_toml_str(grant.users)}")
        if grant.user_claims:
            claims = ", ".join(f"{_toml_str(k)} = {_toml_value(v)}" for k, v in grant.user_claims)
            lines.append(f"user_claims = {{ {claims} }}")
        if grant.when:
            conditions = ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in grant.when)
            lines.append(f"when = {{ {conditions} }}")
        if grant.push_hosts:
            lines.append(f"push_hosts = [{', '.join(_toml_str(h) for h in grant.push_hosts)}]")
        lines.append("")
    for rule in document.outbound:
        lines += [
            "[[outbound]]",
            f"peer = {_toml_str(rule.peer)}",
            f"capabilities = [{', '.join(_toml_str(str(e)) for e in rule.capabilities)}]",
            "",
        ]
    return "\n".join(lines)


def _toml_value(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int) else _toml_str(value)


def _toml_str(value: str) -> str:
    # json.dumps escapes quotes, backslashes and C0 control characters in forms
    # TOML basic strings accept; TOML also forbids a raw DEL.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
