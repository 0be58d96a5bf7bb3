"""What a push config may hold, and the headers a delivery to it carries.

A config asked for (the A2A ``TaskPushNotificationConfig``, as
:mod:`gateway.server.a2a.push_wire` reads it) is accepted when:

- its ``id`` is empty (one is made: a UUID) or an id (1-128 of ``[A-Za-z0-9._:-]``);
- its ``url`` is a webhook URL (:mod:`gateway.push.webhook_url`) whose host
  the caller's grant names in ``push_hosts`` (a grant without any:
  ``PUSH_NOT_GRANTED``);
- its ``token`` (``X-A2A-Notification-Token``) and ``authentication``
  (``Authorization: SCHEME CREDENTIALS``) are header-safe: a scheme is an HTTP
  token (RFC 9110), credentials and token printable ASCII with no line break,
  at most 4096 characters each, so nothing can be smuggled into the request.

Anything else is refused, naming the field but never quoting the token or the
credentials. A config stored is given back as it was accepted (its own
caller's secrets included: only the owner reads it).
"""

from __future__ import annotations

import re
import string
import uuid
from dataclasses import dataclass

from gateway.errors import InvalidRequest, PushNotGranted
from gateway.push.store.store import PushConfig
from gateway.push.webhook_url import WebhookUrl, check_granted, parse_webhook_url
from policies.grants import PeerGrant

CONFIG_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""What a push config id may be (so it may appear in audit records and logs)."""
MAX_SECRET_CHARS = 4096
_TCHAR = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
_HEADER_SAFE = frozenset(string.printable) - frozenset("\r\n\t\x0b\x0c")


@dataclass(frozen=True, slots=True)
class ConfigRequest:
    """A push config as a caller asks for it (nothing checked yet).

    Attributes:
        config_id: Its id ("": make one).
        url: The webhook URL.
        token: Sent as ``X-A2A-Notification-Token`` ("" none).
        auth_scheme: The ``Authorization`` scheme ("" none).
        auth_credentials: The credentials sent with it.
    """

    config_id: str
    url: str
    token: str = ""
    auth_scheme: str = ""
    auth_credentials: str = ""


def accepted(
    owner: str, task_id: str, grant: PeerGrant, asked: ConfigRequest, now_ms: int
) -> tuple[PushConfig, WebhookUrl]:
    """The config ``owner`` asks for on its task ``task_id``, and its parsed URL.

    Raises:
        PushNotGranted: the grant names no webhook host.
        PushUrlRefused: the URL is not one this caller may name.
        InvalidRequest: the id, token or authentication is not acceptable.
    """
    if not grant.push_hosts:
        raise PushNotGranted("this caller's grant names no webhook host (push_hosts)")
    config_id = asked.config_id or str(uuid.uuid4())
    if not CONFIG_ID.fullmatch(config_id):
        raise InvalidRequest("the push config id must be 1-128 characters of [A-Za-z0-9._:-]")
    url = parse_webhook_url(asked.url)
    check_granted(url, grant.push_hosts)
    scheme, credentials = asked.auth_scheme, asked.auth_credentials
    if scheme and not _TCHAR.fullmatch(scheme):
        raise InvalidRequest("authentication.scheme must be an HTTP auth scheme name")
    if credentials and not scheme:
        raise InvalidRequest("authentication.credentials needs authentication.scheme")
    _header_safe(credentials, "authentication.credentials")
    _header_safe(asked.token, "token")
    config = PushConfig(
        task_id=task_id,
        config_id=config_id,
        owner=owner,
        url=asked.url,
        token=asked.token,
        auth_scheme=scheme,
        auth_credentials=credentials,
        created_ms=now_ms,
    )
    return config, url


def _header_safe(value: str, field: str) -> None:
    if len(value) > MAX_SECRET_CHARS or not set(value) <= _HEADER_SAFE:
        raise InvalidRequest(
            f"{field} must be at most {MAX_SECRET_CHARS} printable ASCII characters "
            "without line breaks"
        )


def request_headers(config: PushConfig) -> dict[str, str]:
    """The headers a delivery to ``config`` carries besides the signature (spec 4.3.3)."""
    headers = {"A2A-Version": "1.0"}
    if config.auth_scheme:
        value = config.auth_scheme
        if config.auth_credentials:
            value = f"{value} {config.auth_credentials}"
        headers["Authorization"] = value
    if config.token:
        headers["X-A2A-Notification-Token"] = config.token
    return headers
