"""``[mcp]`` and ``[[mcp_upstreams]]``: this agent's capabilities as MCP tools, and MCP
servers whose tools this agent serves as capabilities."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from capabilities.contract import CapabilityName, Risk
from capabilities.versions import Version, VersionSyntaxError
from gateway.config.addresses import ListenAddress, is_loopback_literal
from gateway.config.fields import FrozenTable
from gateway.display import has_unsafe_characters
from policies.identity import SpiffeId

_TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-/]{1,128}")
_UPSTREAM_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
DEFAULT_ANSWER_BYTES = 4 * 1024 * 1024
"""The largest message an MCP upstream may send, unless its entry says otherwise."""


class McpSettings(FrozenTable):
    """How this agent serves its capabilities as MCP tools (``[mcp]``; absent: not served).

    Attributes:
        listen: ``HOST:PORT`` of the HTTPS listener serving MCP's Streamable
            HTTP transport at ``/mcp`` (port 0 picks one, with ``workers = 1``
            only: more workers share one fixed port).
        stream_send_timeout: Seconds one write of a call's event stream (its
            progress notifications and answer) may wait for the client to read
            (default 30, at most 3600); a client that reads nothing for longer
            has its connection dropped.
    """

    listen: ListenAddress
    stream_send_timeout: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)

    @property
    def port(self) -> int:
        """The configured port (0: the kernel picks one)."""
        return int(self.listen.rsplit(":", 1)[1])


class McpUpstreamTool(FrozenTable):
    """One tool of an MCP upstream, served here as a local capability.

    Its input and output schemas are the ones the server lists when the agent
    starts, pinned until the agent restarts.

    Attributes:
        tool: The server's tool name (1-128 of ``A-Za-z0-9_.-/``).
        capability: The capability name it becomes here (e.g. ``files.read``).
        version: That capability's ``MAJOR.MINOR.PATCH`` version.
        risk: ``read``, ``write`` or ``external``, as grants see it.
        timeout: Seconds one call may take, the server's answer included.
        idempotent: True if calling the tool twice with the same input is harmless.
        description: What it does, for callers. Default: the server's own
            description, escaped and cut to 2,000 characters, shown as data.
    """

    tool: str
    capability: CapabilityName
    version: str
    risk: Risk
    timeout: float = Field(gt=0, le=3600)
    idempotent: bool = False
    description: str = Field(default="", max_length=2000)

    @field_validator("tool")
    @classmethod
    def _tool_name(cls, value: str) -> str:
        if not _TOOL_NAME.fullmatch(value):
            raise ValueError("must be 1-128 characters of A-Za-z0-9_.-/")
        return value

    @field_validator("version")
    @classmethod
    def _semver(cls, value: str) -> str:
        try:
            Version.parse(value)
        except VersionSyntaxError as err:
            raise ValueError(str(err)) from err
        return value


class McpUpstreamEntry(FrozenTable):
    """An MCP server whose listed tools this agent serves as its own capabilities.

    Either a remote server (``url``: Streamable HTTP) or a local one the agent
    starts and talks to over its stdin and stdout (``command``).

    Attributes:
        name: How logs and audit details name it (``[a-z0-9-]``, 1-63).
        url: Its Streamable HTTP endpoint: ``https://...`` (needs ``id``) or
            ``http://`` to a loopback IP literal.
        id: The server's SPIFFE ID: the agent presents its own certificate and
            the server must present one for this ID (``https`` only).
        command: The program of a local stdio server (a name found on
            ``PATH``, or a path, relative to the config file's folder).
        args: Its arguments.
        env: Variables set for it. It inherits only ``PATH``, ``HOME``,
            ``LOGNAME``, ``SHELL``, ``TERM``, ``USER`` and the names in
            ``inherit_env`` from the agent's environment.
        inherit_env: Names of the agent's environment variables it also gets
            (a token kept out of the config file).
        cwd: Its working folder (default: the agent's).
        stderr_file: Where its standard error goes, appended (a private file,
            0600). Default: read and dropped, only its size logged.
        tools: The tools served here (at least one).
        max_answer_bytes: The largest message it may send (default 4 MiB);
            a larger one fails the call ``INVALID_OUTPUT`` and, on stdio,
            restarts the server.
        start_timeout: Seconds the agent waits at start for the server to
            connect and list its tools (default 30); then it refuses to start.
        restart_backoff_max: Longest pause, in seconds, between restarts of a
            stdio server that keeps dying (default 30; the pause doubles from
            half a second).
    """

    name: str
    url: str | None = Field(default=None, min_length=8, max_length=2000)
    id: SpiffeId | None = None
    command: str | None = Field(default=None, min_length=1, max_length=4096)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    inherit_env: tuple[str, ...] = ()
    cwd: Path | None = None
    stderr_file: Path | None = None
    tools: tuple[McpUpstreamTool, ...] = Field(min_length=1)
    max_answer_bytes: int = Field(default=DEFAULT_ANSWER_BYTES, ge=1024, le=64 * 1024 * 1024)
    start_timeout: float = Field(default=30.0, gt=0, le=600)
    restart_backoff_max: float = Field(default=30.0, ge=0.5, le=3600)

    @property
    def stdio(self) -> bool:
        """True for a local server the agent starts (``command``)."""
        return self.command is not None

    @property
    def label(self) -> str:
        """``mcp:NAME``: how audit details and logs name it, apart from A2A upstreams."""
        return f"mcp:{self.name}"

    @field_validator("name")
    @classmethod
    def _short_name(cls, value: str) -> str:
        if not _UPSTREAM_NAME.fullmatch(value):
            raise ValueError("must be 1-63 characters of a-z0-9- (starting alphanumeric)")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if "\x00" in text:
                raise ValueError(f"{key}: a value cannot hold a NUL character")
        return value

    @field_validator("inherit_env")
    @classmethod
    def _inherited_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for key in value:
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return value

    @field_validator("command", "args")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        texts = [value] if isinstance(value, str) else list(value or ())
        if any("\x00" in text for text in texts):
            raise ValueError("cannot hold a NUL character")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> McpUpstreamEntry:
        if (self.url is None) == (self.command is None):
            raise ValueError("give either url (Streamable HTTP) or command (stdio), not both")
        if self.url is not None:
            stdio_only = [
                key
                for key, value in (
                    ("args", self.args),
                    ("env", self.env),
                    ("inherit_env", self.inherit_env),
                    ("cwd", self.cwd),
                    ("stderr_file", self.stderr_file),
                )
                if value
            ]
            if stdio_only:
                raise ValueError(f"{stdio_only[0]} applies to a stdio server (command) only")
            self._check_url(self.url)
        elif self.id is not None:
            raise ValueError("id: a stdio server has no certificate to check; remove id")
        tools = [entry.tool for entry in self.tools]
        if len(tools) != len(set(tools)):
            raise ValueError("tools: a tool appears twice")
        return self

    def _check_url(self, url: str) -> None:
        if has_unsafe_characters(url) or any(c.isspace() for c in url):
            raise ValueError("url: no whitespace or control characters")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url: must be http:// or https:// with a host")
        if parts.username or parts.password or parts.fragment:
            raise ValueError("url: no credentials or fragment")
        if parts.scheme == "https" and self.id is None:
            raise ValueError("id: required for an https url (the server's identity is checked)")
        if parts.scheme == "http":
            if self.id is not None:
                raise ValueError("url: http:// cannot prove the id; use https:// or omit id")
            if not is_loopback_literal(parts.hostname):
                raise ValueError("url: plaintext http:// only to a loopback IP")
