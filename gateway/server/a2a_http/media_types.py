"""Media types on the HTTPS port: what a request body must be declared as, what answers say.

Requests: a body is taken only when declared JSON (:func:`declared_json`):
``application/json`` (JSON-RPC, spec 9.1), ``application/a2a+json``
(HTTP+JSON, spec 11.1) or another ``application/*+json`` (RFC 6839),
parameters allowed. A browser sends a cross-site POST without asking first (no
CORS preflight) only as a form (urlencoded, multipart), ``text/plain`` or with
no ``Content-Type`` at all, and it presents the client certificate it holds:
refusing those keeps such a post from running a write as that certificate's agent.

Answers: ``application/json`` on every binding. A2A 1.0.0 (spec 11.1, the text
the official conformance kit checks) says HTTP+JSON answers are
``application/json``; 1.0.1 says ``application/a2a+json`` SHOULD be used, which
the a2a-sdk's REST routes send. ``application/json`` is a MUST of the one and
allowed by the other, every client reads it, and it matches the 1.0.0 error
table this agent follows (UNIMPLEMENTED, 409, 415), so the SDK's answers are
relabelled (:func:`relabelled`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import ContentTypeNotSupported

REST_MEDIA_TYPE = "application/json"
"""What the HTTP+JSON binding answers with (spec 1.0.0 section 11.1)."""
V0_3_REST_MEDIA_TYPE = "application/json"
"""What A2A 0.3's HTTP+JSON binding answers with."""
_SDK_REST_MEDIA_TYPE = "application/a2a+json"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_READS = frozenset({"A2A SubscribeToTask"})
"""What a bodyless POST may ask without naming a media type (the edge's operation names):
the a2a-sdk's REST client subscribes so, and a subscription changes nothing."""


def declared_json(request: Request, operation: str) -> None:
    """Refuse a body, or a write, not declared JSON, before it is read.

    Every POST needs a JSON media type, a bodyless one too (a ``:cancel`` with
    an empty body is a write), but a bodyless subscription.

    Raises:
        ContentTypeNotSupported: what ``request`` declares is not JSON.
    """
    if request.method not in _BODY_METHODS:
        return
    declared = request.headers.get("content-type", "")
    if is_json(declared):
        return
    bodyless = "transfer-encoding" not in request.headers and request.headers.get(
        "content-length", "0"
    ) in ("", "0")
    if bodyless and operation in _READS:
        return
    shown = declared.partition(";")[0].strip()[:64]
    raise ContentTypeNotSupported(
        f"the request body must be JSON (Content-Type application/json or "
        f"application/a2a+json), not {shown or 'undeclared'!r}"
    )


def is_json(content_type: str) -> bool:
    """Whether the ``Content-Type`` value ``content_type`` names a JSON media type."""
    media_type = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def relabelled(response: Response) -> Response:
    """``response``, an SDK answer labelled ``application/a2a+json`` relabelled as JSON."""
    if response.headers.get("content-type", "").startswith(_SDK_REST_MEDIA_TYPE):
        response.headers["content-type"] = REST_MEDIA_TYPE
    return response
