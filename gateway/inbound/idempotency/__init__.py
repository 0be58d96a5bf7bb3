"""Idempotency keys: the interface (``store``) and its SQLite and PostgreSQL backends."""
