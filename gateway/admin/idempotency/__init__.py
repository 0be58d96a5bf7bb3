"""Operator actions on idempotency keys: list, resolve, release; one backend per store."""
