"""``GET /.well-known/agent-card.json``: the form of the public card a client gets, its caching.

Form (``gateway.server.a2a.card.PublicCardDocuments``), chosen by the
``A2A-Version`` the request names (header, else query parameter; spec 3.6.1):

- ``1.x`` (or any version but 0.3): the A2A 1.0 form, valid against the 1.0
  JSON schema.
- none, or ``0.3``: a request naming no version is a 0.3 request (spec 3.6.2:
  "Agents MUST interpret empty value as 0.3 version"), and no 0.3 client names
  one. With ``[a2a] v0_3_compat`` it gets the 0.3 form: the 1.0 form plus the
  0.3 fields 0.3 clients dial (``url``, ``preferredTransport``), a second
  signature covering those. Without it, the 1.0 form.

Caching (spec 8.6): ``Cache-Control: public, max-age=300`` (:data:`MAX_AGE`),
``Vary: A2A-Version``, ``Last-Modified`` (when the card was built) and an
``ETag``; ``If-None-Match`` with it answers ``304``. The ETag is weak, a digest
of the form without its signature values: ECDSA signs the same bytes
differently each time, so every rebuild, and every replica of the agent behind
one name, serves the same card with other signature bytes, all of which verify;
the signature header (the key chain, ``x5c``) is in the digest, so a rotation
changes the ETag, as does any change of the card. ``If-Modified-Since`` is not
evaluated (the spec's MAY): replicas build their cards at different moments,
and a full answer is never wrong.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

from starlette.responses import JSONResponse, Response

from gateway.server.a2a.card import PublicCardDocuments
from gateway.server.a2a_http.context import is_v0_3_version

MAX_AGE = 300
"""Seconds a client may use the card without asking again. The card changes when the
agent's certificate rotates (it is signed with the new key), which SVIDs do at half
their lifetime, an hour or more for SPIRE's defaults: a card cached this long is
still signed by a certificate that has not expired."""
_VARY = "A2A-Version"


@dataclass(frozen=True)
class _Served:
    body: bytes
    headers: dict[str, str]


class CardRoute:
    """Serves the public card: the form the request asks for, with its validators."""

    def __init__(self, v0_3_compat: bool) -> None:
        self._v0_3_compat = v0_3_compat
        self._documents: PublicCardDocuments | None = None
        self._forms: dict[bool, _Served] = {}

    def respond(
        self, documents: PublicCardDocuments, version: str | None, if_none_match: str | None
    ) -> Response:
        """The answer to a GET naming ``version`` (None: none) and ``If-None-Match``."""
        served = self._served(documents, self._v0_3_compat and is_v0_3_version(version))
        if if_none_match is not None and _matches(if_none_match, served.headers["ETag"]):
            return Response(status_code=304, headers=served.headers)
        return Response(served.body, media_type="application/json", headers=served.headers)

    def _served(self, documents: PublicCardDocuments, v0_3: bool) -> _Served:
        if documents is not self._documents:  # built anew: a port bound, a rotation
            self._documents, self._forms = documents, {}
        served = self._forms.get(v0_3)
        if served is None:
            form = documents.v0_3 if v0_3 and documents.v0_3 is not None else documents.v1_0
            headers = {
                "Cache-Control": f"public, max-age={MAX_AGE}",
                "ETag": _etag(form),
                "Last-Modified": formatdate(documents.built_at, usegmt=True),
                "Vary": _VARY,
            }
            served = _Served(bytes(JSONResponse(form).body), headers)
            self._forms[v0_3] = served
        return served


def _etag(form: dict[str, Any]) -> str:
    unsigned = {
        **form,
        "signatures": [
            {key: value for key, value in signature.items() if key != "signature"}
            for signature in form.get("signatures", [])
        ],
    }
    content = json.dumps(unsigned, sort_keys=True, separators=(",", ":")).encode()
    return f'W/"{hashlib.sha256(content).hexdigest()[:32]}"'


def _matches(if_none_match: str, etag: str) -> bool:
    """Whether ``If-None-Match`` names ``etag``, compared weakly (RFC 9110 13.1.2)."""
    candidates = [candidate.strip() for candidate in if_none_match.split(",")]
    ours = etag.removeprefix("W/")
    return "*" in candidates or any(c.removeprefix("W/") == ours for c in candidates)
