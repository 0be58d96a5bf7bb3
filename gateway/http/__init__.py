"""Serving HTTP/1.1 on the agent's event loop: uvicorn listeners, bounded connections, guards.

The console, the metrics endpoint and the A2A HTTPS bindings are Starlette
(or plain ASGI) apps served by uvicorn on a socket bound here
(:mod:`~gateway.http.listener`). Console and metrics speak through
:mod:`~gateway.http.connection` (uvicorn's httptools protocol with bounded
request heads, a connection budget, one request per connection and the
verified client certificate in the scope); both refuse DNS-rebound names
with one middleware (:mod:`~gateway.http.guards`).
"""
