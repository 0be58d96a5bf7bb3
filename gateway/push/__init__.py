"""A2A push notifications: webhook configs, a durable outbox, signed and guarded deliveries.

A caller registers a webhook for one of its own tasks (the four push-config
methods, or ``SendMessage``'s ``task_push_notification_config``); every event
the task then publishes (the ``StreamResponse`` a stream would carry) is
queued once per webhook in a durable outbox and POSTed to the webhook by the
delivery worker, in order per webhook, with retries and backoff.

- ``webhook_url``: what a webhook URL may be (https, a host the caller's grant
  names) and ``addresses``: which addresses it may reach (public ones, or one
  the grant names); ``resolver``: the one DNS lookup per attempt, whose answer
  is the address connected to.
- ``signature``: the detached JWS over each body, signed with the agent's SVID
  key (``x5c``: its chain), so a receiver can tell who sent it.
- ``sender``: one delivery attempt (no redirects, bounded time, verified TLS).
- ``store/``: configs and the outbox (SQLite under ``state_dir``, PostgreSQL).
- ``configs``: the push-config methods' rules; ``notifier``: the hook the
  A2A tasks publish through; ``dispatcher``: the delivery worker (a service);
  ``records``: the audit records of deliveries and refusals (no payload).

See docs/a2a-push.md.
"""
