"""``[a2a]``: how this agent serves A2A and keeps its tasks."""

from __future__ import annotations

from datetime import timedelta

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from capabilities.contract import is_capability_name
from capabilities.versions import VersionConstraint, VersionSyntaxError
from gateway.config.addresses import (
    DialAddress,
    ListenAddress,
    https_base_url_problem,
)
from gateway.config.fields import Duration, FrozenTable
from gateway.display import has_unsafe_characters


class A2ASettings(FrozenTable):
    """How this agent serves A2A (``[a2a]``; the gRPC binding is always served).

    Attributes:
        http_listen: ``HOST:PORT`` serving the JSON-RPC and HTTP+JSON bindings
            over HTTPS (port 0 picks one). None (default): not served.
        http_url: ``https://NAME[:PORT]`` clients use, as the cards list it
            (default: ``https://HOST:PORT`` of ``http_listen`` as bound), for
            an agent that listens on ``0.0.0.0`` or behind a name.
        grpc_address: ``NAME:PORT`` clients use for the gRPC binding, as the
            cards list it (default: ``listen``'s host and the bound port), for
            an agent that listens on ``0.0.0.0`` or behind a name.
        default_capability: ``NAME`` or ``NAME@CONSTRAINT`` called for a
            SendMessage whose metadata names no capability (``a2agw.capability``),
            so a client that knows nothing of this gateway can still call the
            agent; the caller's grant decides as for any call. None: such a
            message is refused ``INVALID_REQUEST``.
        task_retention: Finished tasks (completed, failed, canceled) that last
            changed longer ago than this are deleted, at start and hourly
            (default ``"7d"``); ``GetTask`` then answers ``TASK_NOT_FOUND``.
            Unfinished tasks are never deleted.
        v0_3_compat: Also serve A2A 0.3 clients on the HTTP bindings (JSON-RPC
            ``message/send`` ..., REST ``/v1/...``), translated to 1.0 by the
            a2a-sdk's compat layer before the same servicer decides, and list
            the 0.3 interfaces (and v0.3 card fields) on the cards. Default
            True: most deployed A2A clients speak 0.3, and the translation
            adds no authority (docs/a2a-v0_3.md).
        stream_send_timeout: Seconds one write of an SSE stream may wait for
            its client to read (default 30, at most 3600): a stream whose client
            stops reading is ended then, so it holds no connection and buffer
            for longer (docs/a2a-http.md).
    """

    http_listen: ListenAddress | None = None
    http_url: str | None = None
    grpc_address: DialAddress | None = None
    default_capability: str | None = None
    task_retention: Duration = timedelta(days=7)
    v0_3_compat: bool = True
    stream_send_timeout: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)

    @field_validator("default_capability")
    @classmethod
    def _capability_and_constraint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if has_unsafe_characters(value) or value != value.strip():
            raise ValueError("default_capability holds whitespace or a control character")
        name, _, constraint = value.partition("@")
        if not is_capability_name(name):
            raise ValueError(f"default_capability: {name!r} is not a dotted lowercase name")
        try:
            VersionConstraint.parse(constraint)
        except VersionSyntaxError as err:
            raise ValueError(f"default_capability: version constraint: {err}") from err
        return value

    @model_validator(mode="after")
    def _positive_retention(self) -> A2ASettings:
        if self.task_retention <= timedelta(0):
            raise ValueError("task_retention must be positive")
        return self

    @field_validator("http_url")
    @classmethod
    def _https_url(cls, value: str | None) -> str | None:
        problem = None if value is None else https_base_url_problem(value)
        if problem is not None:
            raise ValueError(f"a2a.http_url {value!r}: expected https://NAME[:PORT] ({problem})")
        return value
