"""Reading policy files (TOML) into a validated, indexed ``Policy``."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.display import printable
from gateway.errors import ConfigError, PolicyFileError
from gateway.regular_files import NOT_REGULAR, read_regular_file
from policies.grants import OutboundRule, PeerGrant, PolicyDocument

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 16 * 1024 * 1024
"""Largest policy or agent config file read (about 100,000 grants); a larger one is refused."""


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


def describe_validation_error(source: str, err: ValidationError, data: Any = None) -> str:
    """One line per problem: ``file: key: why``, keys written TOML-style."""
    lines = []
    for problem in err.errors():
        key = _toml_key(problem["loc"], data)
        # Keys, values and the path come from outside: a newline in one must
        # not forge a second problem line, nor ESC or bidi codes reach a terminal.
        lines.append(printable(f"{source}: {key or '(top level)'}: {problem['msg']}"))
    return "\n".join(lines)


def _toml_key(loc: tuple[int | str, ...], data: Any) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            peer = _peer_at(data, parts, item)
            parts[-1] = f"{parts[-1]}[{item}]" + (f" (peer {peer})" if peer else "")
        else:
            parts.append(str(item))
    return ".".join(parts)


def _peer_at(data: Any, parts: list[str], index: int) -> str | None:
    if len(parts) != 1 or not isinstance(data, dict):
        return None
    table = data.get(parts[0])
    if isinstance(table, list) and index < len(table) and isinstance(table[index], dict):
        peer = table[index].get("peer")
        return peer if isinstance(peer, str) else None
    return None


def parse_toml_model(
    model: type[M], text: str, source: str, error: type[ConfigError]
) -> tuple[M, dict[str, Any]]:
    """Parse TOML text into ``model``; raises ``error`` with file/key/why lines."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise error(printable(f"{source}: not valid TOML: {err}")) from err
    except RecursionError as err:  # tomllib recurses once per nesting level
        raise error(printable(f"{source}: not valid TOML: nested too deeply")) from err
    try:
        return model.model_validate(data), data
    except ValidationError as err:
        raise error(describe_validation_error(source, err, data)) from err
    except RecursionError as err:
        raise error(printable(f"{source}: nested too deeply to validate")) from err


def read_text(path: Path, what: str, error: type[ConfigError]) -> str:
    """Read a UTF-8 regular file of at most ``MAX_FILE_BYTES``; OS errors become ``error``.

    The file is opened without blocking and must be a regular file: a FIFO
    would block the reader (the agent's event loop, on a reload) forever, and
    a device such as ``/dev/zero``, or a huge file, would be read until memory
    ran out. Either is refused as ``error``, before anything is parsed.
    """
    try:
        data = read_regular_file(path, MAX_FILE_BYTES + 1)
    except FileNotFoundError as err:
        raise error(printable(f"{path}: {what} file not found")) from err
    except OSError as err:
        if err.strerror == NOT_REGULAR:
            raise error(printable(f"{path}: {what} file is not a regular file")) from err
        raise error(printable(f"{path}: {what} file unreadable: {err}")) from err
    if len(data) > MAX_FILE_BYTES:
        raise error(printable(f"{path}: {what} file is larger than {MAX_FILE_BYTES} bytes"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(printable(f"{path}: {what} file unreadable: {err}")) from err


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
        lines.append("")
    for rule in document.outbound:
        lines += [
            "[[outbound]]",
            f"peer = {_toml_str(rule.peer)}",
            f"capabilities = [{', '.join(_toml_str(str(e)) for e in rule.capabilities)}]",
            "",
        ]
    return "\n".join(lines)


def _toml_str(value: str) -> str:
    # json.dumps escapes quotes, backslashes and C0 control characters in forms
    # TOML basic strings accept; TOML also forbids a raw DEL.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
