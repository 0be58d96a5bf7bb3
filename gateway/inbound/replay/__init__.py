"""Replay protection (a request id is accepted once per peer): the interface and backends."""
