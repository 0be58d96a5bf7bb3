"""Transport: what the serving and calling sides share, the lowest layer that knows gRPC.

TLS material (files, live rotation, SPIFFE Workload API), SVID checks, and the
one status table between the error tree of ``gateway.errors`` and gRPC status.
The serving edge is ``gateway.server``; the calling side is ``gateway.client``.
"""
