"""Transport: the gRPC servers and client, TLS material, and the wire status mapping.

The only layer that knows gRPC. Everything below it speaks the error tree of
``gateway.errors`` and plain Python values.
"""
