"""The public card as A2A 0.3 clients read it, with its 0.3 fields under a signature of their own.

A 0.3 client (a2a-go 0.3, the Java SDK 0.3, a2a-sdk 0.3) reads the card at
``/.well-known/agent-card.json``, as 1.0 clients do, and sends no
``A2A-Version`` (there was none in 0.3). It dials the fields 1.0 dropped:
``url`` and ``preferredTransport`` (and ``additionalInterfaces``), and it
needs the security scheme's ``type``. This form is the 1.0 card plus those
fields: the a2a-sdk's own merge (``agent_card_to_dict``, made from the
interfaces listed with protocol version 0.3), which a 1.0 client reads as well
(the a2a-sdk's parser drops the 0.3 fields when ``supportedInterfaces`` is there).

The 1.0 signature covers the 1.0 fields only (``supportedInterfaces``, the 0.3
interfaces among them): a 1.0 verifier canonicalizes the card it parsed,
without the 0.3 fields. So without more, whoever sits on the way could point
``url`` elsewhere and the card would still verify. The 0.3 fields therefore
get a signature of their own, a second entry of ``signatures``: a detached JWS
with the same key and header over the card's 0.3 canonical form
(:func:`v0_3_canonical`, as the a2a-sdk 0.3 signs and verifies: the 0.3 card
without ``signatures``, default and empty values left out, keys sorted,
compact). A 0.3 verifier reads the card into its 0.3 model, canonicalizes that
and finds the second signature valid; a 1.0 verifier finds the first valid
(spec 8.4.3: a client verifies at least one; multiple signatures may be present).
"""

from __future__ import annotations

import json
from typing import Any

from a2a.compat.v0_3 import types as types_v03
from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import a2a_pb2
from google.protobuf.json_format import MessageToDict

from gateway.server.a2a.card_signing import CardSigner


def v0_3_document(card: a2a_pb2.AgentCard, signer: CardSigner | None) -> dict[str, Any]:
    """``card`` (signed, with a 0.3 interface) as JSON with its 0.3 fields, those signed too.

    Raises:
        a2a.utils.errors.VersionNotSupportedError: ``card`` lists no 0.3 interface.
    """
    compat = to_compat_agent_card(card)
    document = agent_card_to_dict(card)
    if signer is not None:
        signature = signer.sign_payload(v0_3_canonical(compat))
        document.setdefault("signatures", []).append(MessageToDict(signature))
    return document


def v0_3_canonical(card: types_v03.AgentCard) -> bytes:
    """The bytes an A2A 0.3 signature covers: ``card`` as the a2a-sdk 0.3 canonicalizes it."""
    dumped = card.model_dump(
        exclude={"signatures"}, exclude_defaults=True, exclude_none=True, by_alias=True
    )
    return json.dumps(_without_empty(dumped), separators=(",", ":"), sort_keys=True).encode()


def _without_empty(value: Any) -> Any:
    # The a2a-sdk 0.3's rule, kept exactly (it drops False and 0 as well): a
    # verifier recomputes these bytes with it.
    if isinstance(value, dict):
        cleaned = {key: _without_empty(item) for key, item in value.items()}
        return {key: item for key, item in cleaned.items() if item}
    if isinstance(value, list):
        return [item for item in map(_without_empty, value) if item]
    return value if value not in ("", [], {}) else None
