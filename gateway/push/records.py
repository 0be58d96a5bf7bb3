"""The audit records of push notifications: every attempt, refusal and config change.

They use the record format every call uses (:class:`~gateway.audit.AuditRecord`),
so the chain's bytes and old logs are unchanged; nothing of a body, URL path
or query, token or credential is in them:

- a delivery attempt: ``peer_id`` the webhook's owner, ``request_id`` the
  notification id (the JWS ``jti``, the same on every attempt), ``task_id``,
  ``payload_size``/``payload_sha256`` of the body sent, ``latency_ms`` of the
  attempt, ``capability`` empty, ``detail`` starting ``A2A push`` with the
  config id, ``host:port``, the address connected to, ``attempt=N/MAX``, the
  receiver's HTTP status and what comes next (``retry_in_ms=``, ``gave_up``).
  Decision ``allow`` with ``OK`` (delivered) or what failed
  (``PUSH_TIMEOUT``, ``PUSH_TLS_FAILED``, ``PUSH_CONNECT_FAILED``,
  ``PUSH_DNS_FAILED``, ``PUSH_HTTP_STATUS``, ``PUSH_REDIRECT_REFUSED``);
  decision ``refuse`` when the policy stopped it before anything was sent
  (``PUSH_HOST_NOT_ALLOWED``: the grant no longer names the host;
  ``PUSH_ADDRESS_REFUSED``: the name resolved to an address it may not reach).
- notifications dropped because the caller's backlog was full: one refused
  record per caller and second, ``PUSH_BACKLOG_FULL``, ``detail`` ``A2A push
  dropped=N``.
- a config made or deleted: ``allow``/``OK``, ``detail`` the method, the
  config id and ``host:port``.
"""

from __future__ import annotations

import hashlib
import time

from gateway.audit import AuditRecord
from gateway.audit.record import Decision
from gateway.push.sender import Attempt

OPERATION = "A2A push"
BACKLOG_FULL = "PUSH_BACKLOG_FULL"


def _record(
    peer_id: str,
    decision: Decision,
    reason: str,
    task_id: str,
    detail: str,
    *,
    request_id: str = "",
    body: bytes = b"",
    latency_ms: float = 0.0,
) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=int(time.time() * 1000),
        request_id=request_id,
        peer_id=peer_id,
        capability="",
        version_constraint="",
        served_version="",
        decision=decision,
        reason=reason,
        payload_size=len(body),
        payload_sha256=hashlib.sha256(body).hexdigest() if body else "",
        latency_ms=latency_ms,
        task_id=task_id,
        detail=detail,
    )


def attempt_record(
    *,
    owner: str,
    task_id: str,
    config_id: str,
    notification_id: str,
    shown: str,
    body: bytes,
    attempt: Attempt,
    number: int,
    most: int,
    retry_in_ms: int | None,
    latency_ms: float,
) -> AuditRecord:
    """The record of attempt ``number`` (of at most ``most``) of one notification.

    ``retry_in_ms``: when the next attempt is due (None: this was the last).
    """
    parts = [f"{OPERATION} config={config_id} host={shown}"]
    if attempt.address:
        parts.append(f"address={attempt.address}")
    parts.append(f"attempt={number}/{most}")
    if attempt.status:
        parts.append(f"status={attempt.status}")
    if attempt.note:
        parts.append(f"why={attempt.note}")
    if attempt.reason != "OK":
        parts.append("gave_up" if retry_in_ms is None else f"retry_in_ms={retry_in_ms}")
    return _record(
        owner,
        "refuse" if attempt.refused else "allow",
        attempt.reason,
        task_id,
        " ".join(parts),
        request_id=notification_id,
        body=body,
        latency_ms=latency_ms,
    )


def dropped_record(owner: str, task_id: str, count: int) -> AuditRecord:
    """``count`` notifications of ``owner`` dropped because its backlog was full."""
    return _record(owner, "refuse", BACKLOG_FULL, task_id, f"{OPERATION} dropped={count}")


def config_record(
    owner: str, task_id: str, operation: str, config_id: str, shown: str = ""
) -> AuditRecord:
    """A config made (or replaced) or deleted by its owner with ``operation``."""
    host = f" host={shown}" if shown else ""
    return _record(owner, "allow", "OK", task_id, f"A2A {operation} config={config_id}{host}")
