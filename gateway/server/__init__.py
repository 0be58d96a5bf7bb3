"""The serving edge: the peer gRPC servicer, health, and the A2A bindings (gRPC, HTTP).

The top of the serving stack: it adapts each wire to ``InvokeCall`` and hands it
to ``gateway.inbound``. Nothing below it imports it.
"""
