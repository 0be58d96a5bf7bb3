"""Calling existing A2A agents (``[[upstreams]]``) on their gRPC or HTTP binding."""
