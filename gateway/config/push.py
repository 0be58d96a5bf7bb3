"""``[push]``: A2A push notifications to the callers' webhooks (docs/a2a-push.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from gateway.config.fields import FrozenTable


class PushSettings(FrozenTable):
    """Whether this agent sends A2A push notifications, and within which bounds.

    Which hosts a caller's webhooks may name is its grant's ``push_hosts``
    (the policy file); this table is the agent's side of it.

    Attributes:
        enabled: Offer push notifications (default false: the four push-config
            methods and a SendMessage carrying a push config are refused
            ``PUSH_NOTIFICATION_NOT_SUPPORTED``, and the card says so).
        ca: A PEM file of CA certificates trusted for the webhooks' TLS
            certificates, besides the system's (or instead of them, with
            ``system_roots = false``). A webhook's certificate is always
            verified for the URL's host name.
        system_roots: Trust the system's CA store for webhooks (default true).
        connect_timeout: Seconds to connect and finish the TLS handshake.
        timeout: Seconds one delivery attempt may take in all (connect, send,
            the receiver's answer); the spec recommends 10-30.
        max_attempts: Attempts per notification before it is given up
            (each audited; the first one counts).
        retry_initial: Seconds before the second attempt; each later wait
            doubles, up to ``retry_max``, and is jittered (half to all of it).
        retry_max: Longest wait between two attempts, in seconds.
        max_configs_per_task: Push configs one task may have
            (``PUSH_CONFIG_LIMIT`` above it).
        max_pending_per_peer: Notifications of one caller waiting for delivery;
            above it new ones are dropped (audited ``PUSH_BACKLOG_FULL``).
        max_concurrent: Deliveries under way at once, all callers together.
        max_concurrent_per_peer: Deliveries of one caller under way at once
            (one per push config at a time: a webhook gets its events in order).
    """

    enabled: bool = False
    ca: Path | None = None
    system_roots: bool = True
    connect_timeout: float = Field(default=5.0, gt=0, le=60, allow_inf_nan=False)
    timeout: float = Field(default=10.0, gt=0, le=120, allow_inf_nan=False)
    max_attempts: int = Field(default=6, ge=1, le=20)
    retry_initial: float = Field(default=1.0, ge=0.01, le=600, allow_inf_nan=False)
    retry_max: float = Field(default=300.0, ge=0.01, le=86_400, allow_inf_nan=False)
    max_configs_per_task: int = Field(default=10, ge=1, le=100)
    max_pending_per_peer: int = Field(default=1000, ge=1, le=1_000_000)
    max_concurrent: int = Field(default=16, ge=1, le=1024)
    max_concurrent_per_peer: int = Field(default=4, ge=1, le=256)

    @model_validator(mode="after")
    def _coherent(self) -> PushSettings:
        if self.retry_max < self.retry_initial:
            raise ValueError("push.retry_max must be at least push.retry_initial")
        if self.enabled and not self.system_roots and self.ca is None:
            raise ValueError("push.system_roots = false needs push.ca (else no webhook is trusted)")
        return self
