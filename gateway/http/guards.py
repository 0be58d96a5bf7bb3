"""Middleware every endpoint of ours puts in front of its routes: the Host check, GET only.

:class:`LoopbackHostGuard`: a loopback listener answers only a request whose
``Host`` names this machine (an IP literal or ``localhost``, any port):
``421`` otherwise, ``400`` for two ``Host`` headers. A web page whose name an
attacker re-points at 127.0.0.1 (DNS rebinding) sends its same-origin
requests with its own name as ``Host``; answering them would let the page
read what the listener serves. A request without ``Host`` is not a
browser's and is answered.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from gateway.config.addresses import names_this_machine
from gateway.http.connection import TEXT

ASGIApp = Any


class LoopbackHostGuard:
    """Refuses requests whose ``Host`` does not name this machine (see the module)."""

    def __init__(self, app: ASGIApp, refusal: str = "") -> None:
        """``refusal``: the body of the ``421`` answer."""
        self._app = app
        self._refusal = refusal

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Answer 400 or 421 here, or pass the request on."""
        if scope["type"] == "http":
            hosts = [value for name, value in scope["headers"] if name == b"host"]
            if len(hosts) > 1:
                await Response(b"", 400, media_type=TEXT)(scope, receive, send)
                return
            if hosts and not names_this_machine(hosts[0].decode("latin-1")):
                await Response(self._refusal, 421, media_type=TEXT)(scope, receive, send)
                return
        await self._app(scope, receive, send)


class GetOnly:
    """Answers anything but ``GET`` with ``405`` (a read-only endpoint)."""

    def __init__(self, app: ASGIApp, refusal: str = "", media_type: str = TEXT) -> None:
        """``refusal`` and ``media_type``: the ``405`` answer's body and type."""
        self._app = app
        self._refusal = refusal
        self._media_type = media_type

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Answer 405 here, or pass the request on."""
        if scope["type"] == "http" and scope["method"] != "GET":
            answer = Response(self._refusal, 405, media_type=self._media_type)
            await answer(scope, receive, send)
            return
        await self._app(scope, receive, send)
