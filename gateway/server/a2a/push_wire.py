"""A2A push notifications on the wire: configs as the methods carry them, events as POSTed.

:mod:`gateway.push` knows nothing of the A2A SDK's types; this module is
where they meet it:

- :func:`config_request` reads a ``TaskPushNotificationConfig`` (its
  ``authentication`` optional), :func:`wire_config` writes one back;
- :func:`notification_body` is an event's POST body: the ``StreamResponse``
  in the JSON of the HTTP+JSON binding (``application/a2a+json``, spec 4.3.3);
- :func:`ends_task` tells the last event of a task (a terminal status, or
  the Message a run answered with).
"""

from __future__ import annotations

from a2a.types import a2a_pb2
from google.protobuf import json_format

from capabilities.canonical import compact_json
from gateway.push.configs import ConfigRequest
from gateway.push.store.store import PushConfig

_ENDS = frozenset(
    {
        a2a_pb2.TASK_STATE_COMPLETED,
        a2a_pb2.TASK_STATE_FAILED,
        a2a_pb2.TASK_STATE_CANCELED,
        a2a_pb2.TASK_STATE_REJECTED,
    }
)


def config_request(wire: a2a_pb2.TaskPushNotificationConfig) -> ConfigRequest:
    """What ``wire`` asks for (checked by :func:`gateway.push.configs.accepted`)."""
    authentication = wire.authentication if wire.HasField("authentication") else None
    return ConfigRequest(
        config_id=wire.id,
        url=wire.url,
        token=wire.token,
        auth_scheme="" if authentication is None else authentication.scheme,
        auth_credentials="" if authentication is None else authentication.credentials,
    )


def wire_config(config: PushConfig) -> a2a_pb2.TaskPushNotificationConfig:
    """``config`` as the push-config methods answer it (its owner's secrets included)."""
    wire = a2a_pb2.TaskPushNotificationConfig(
        id=config.config_id, task_id=config.task_id, url=config.url, token=config.token
    )
    if config.auth_scheme:
        wire.authentication.scheme = config.auth_scheme
        wire.authentication.credentials = config.auth_credentials
    return wire


def notification_body(event: a2a_pb2.StreamResponse) -> bytes:
    """The POST body of ``event``: its ``StreamResponse`` JSON (HTTP+JSON binding form)."""
    return compact_json(json_format.MessageToDict(event))


def ends_task(event: a2a_pb2.StreamResponse) -> bool:
    """True for a task's last event: a terminal status update, or a Message answer."""
    if event.HasField("status_update"):
        return event.status_update.status.state in _ENDS
    return bool(event.HasField("message"))
