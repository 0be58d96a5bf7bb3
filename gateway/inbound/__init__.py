"""Inbound pipeline: the protocol-neutral path every call takes.

Identity, request checks, policy, replay, input validation and deadline (in that
order, written once in ``gateway.inbound.pipeline``), then idempotency, running
the capability and auditing the outcome. Transport servicers only adapt to it.
"""
