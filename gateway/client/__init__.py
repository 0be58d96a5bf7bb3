"""The calling side: ``PeerClient`` for peers, the handshake, and the A2A upstream client.

A low layer: it speaks gRPC and HTTPS to other agents and knows nothing of the
inbound pipeline, plans or routing that call it (``gateway.outbound`` does).
"""
