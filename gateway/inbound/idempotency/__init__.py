"""Idempotency keys: the serving store (``store``), the operator's actions on the same
table (``operator``), and their SQLite and PostgreSQL backends side by side."""
