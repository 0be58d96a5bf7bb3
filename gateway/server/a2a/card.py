"""Agent cards: the public one (for registries) and the one each caller gets.

The public card says how to reach and authenticate to the agent and nothing
about what anyone may call there. The extended card (``GetExtendedAgentCard``)
is built for the calling peer from its grant: one skill per capability it may
call, and the contracts in the extension ``urn:a2agw:capability-contracts:v1``.

Extension params (a JSON object)::

    max_payload_bytes   the caller's payload cap here (input and output)
    grant_expires_at    when the caller's grant ends (RFC 3339)
    push_hosts          the hosts the caller's push webhooks may name (its grant's)
    capabilities        {NAME: {version, versions, risk, idempotent, timeout_seconds,
                                input_schema, output_schema, preconditions}}

``version`` is the highest version the caller may call (what an empty
constraint is served); ``versions`` lists every version it may call.

The public card says ``capabilities.push_notifications`` when ``[push]`` is
enabled; a caller's card says it only if its grant also names webhook hosts.

Both cards list every interface the agent serves (:class:`CardIssuer`:
gRPC, and JSON-RPC and HTTP+JSON when ``[a2a] http_listen`` is set) and,
when the issuer has a signer, are signed (``gateway.server.a2a.card_signing``).

The public card is served in two JSON forms (:class:`PublicCardDocuments`):
:func:`card_json`, the A2A 1.0 form, valid against the 1.0 JSON schema (whose
objects take no other property) with ``"skills": []``; and, when the agent
also serves 0.3, the form 0.3 clients read (``gateway.server.a2a.card_v0_3``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from a2a.types import a2a_pb2
from google.protobuf.json_format import MessageToDict

from capabilities.registry import Capability
from gateway.server.a2a.card_signing import CardSigner
from gateway.server.a2a.card_v0_3 import v0_3_document
from policies.grants import PeerGrant
from policies.identity import svid_dns_name

CONTRACTS_EXTENSION_URI = "urn:a2agw:capability-contracts:v1"
"""URI of the card extension carrying the caller's capability contracts."""
PROTOCOL_BINDING = "GRPC"
JSONRPC_BINDING = "JSONRPC"
REST_BINDING = "HTTP+JSON"
PROTOCOL_VERSION = "1.0"
LEGACY_PROTOCOL_VERSION = "0.3"
"""Listed for the HTTP bindings too when ``[a2a] v0_3_compat`` is on."""
MTLS_SCHEME = "mtls"
BEARER_SCHEME = "bearer"
"""The card's name for ``Authorization: Bearer`` tokens (``[identity.tokens]``)."""
_MEDIA = "application/json"


def _gateway_version() -> str:
    try:
        return metadata.version("a2a-peer-gateway")
    except metadata.PackageNotFoundError:
        return "0.0.0"


@dataclass(frozen=True)
class BearerTokens:
    """What the cards say of the bearer tokens accepted (``[identity.tokens]``).

    Attributes:
        audience: The ``aud`` a token must name.
        token_only: A token alone identifies a caller on the HTTPS bindings.
        trust_domains: The trust domains whose JWT-SVIDs are accepted.
        oidc_issuers: ``(name, iss)`` of the OIDC issuers trusted.
    """

    audience: str
    token_only: bool
    trust_domains: tuple[str, ...] = ()
    oidc_issuers: tuple[tuple[str, str], ...] = ()

    def schemes(self) -> dict[str, a2a_pb2.SecurityScheme]:
        """The bearer scheme, and one OpenID Connect scheme per OIDC issuer."""
        sources = [f"JWT-SVIDs of {domain}" for domain in self.trust_domains]
        sources += [f"tokens of {iss}" for _, iss in self.oidc_issuers]
        binding = (
            "bound to the client certificate when one is presented; alone on the HTTPS bindings"
            if self.token_only
            else "bound to the client certificate (sub or cnf.x5t#S256)"
        )
        schemes = {
            BEARER_SCHEME: a2a_pb2.SecurityScheme(
                http_auth_security_scheme=a2a_pb2.HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    bearer_format="JWT",
                    description=(
                        f"{'; '.join(sources)}, audience {self.audience}, {binding}. "
                        "The user a call acts for: header A2AGW-User-Token."
                    ),
                )
            )
        }
        for name, iss in self.oidc_issuers:
            schemes[f"oidc-{name}"] = a2a_pb2.SecurityScheme(
                open_id_connect_security_scheme=a2a_pb2.OpenIdConnectSecurityScheme(
                    open_id_connect_url=iss.rstrip("/") + "/.well-known/openid-configuration",
                    description="The issuer of the bearer and user tokens it signs.",
                )
            )
        return schemes

    def requirements(self) -> list[a2a_pb2.SecurityRequirement]:
        """Beside mTLS alone: a token alone (token-only callers) or with the certificate."""
        needed = [BEARER_SCHEME] if self.token_only else [MTLS_SCHEME, BEARER_SCHEME]
        return [a2a_pb2.SecurityRequirement(schemes={n: a2a_pb2.StringList() for n in needed})]


@dataclass(frozen=True)
class CardIssuer:
    """Where the agent is served and who signs its cards.

    Attributes:
        grpc_address: ``host:port`` of the gRPC binding.
        jsonrpc_url: URL of the JSON-RPC binding ("" when not served).
        rest_url: Base URL of the HTTP+JSON binding ("" when not served).
        v0_3: The HTTP bindings also serve A2A 0.3 (``[a2a] v0_3_compat``).
        sign: Signs a finished card, and its 0.3 form (None: unsigned).
        bearer: The bearer tokens accepted (None: certificates only).
        push: The agent sends push notifications (``[push] enabled``).
    """

    grpc_address: str
    jsonrpc_url: str = ""
    rest_url: str = ""
    v0_3: bool = False
    sign: CardSigner | None = None
    bearer: BearerTokens | None = None
    push: bool = False

    def interfaces(self) -> list[a2a_pb2.AgentInterface]:
        """Every interface served, gRPC first (the card's preferred one).

        The 0.3 interfaces come after every 1.0 one, JSON-RPC first: a 1.0
        client takes the first interface of its binding, and the a2a-sdk
        makes the card's v0.3 fields (``url``, ``preferredTransport``) from
        the first 0.3 interface, which 0.3 clients (a2a-go: JSON-RPC or
        gRPC only) then call.
        """
        served = [
            (PROTOCOL_BINDING, self.grpc_address, PROTOCOL_VERSION),
            (JSONRPC_BINDING, self.jsonrpc_url, PROTOCOL_VERSION),
            (REST_BINDING, self.rest_url, PROTOCOL_VERSION),
        ]
        if self.v0_3:
            served += [
                (JSONRPC_BINDING, self.jsonrpc_url, LEGACY_PROTOCOL_VERSION),
                (REST_BINDING, self.rest_url, LEGACY_PROTOCOL_VERSION),
            ]
        return [
            a2a_pb2.AgentInterface(url=url, protocol_binding=binding, protocol_version=version)
            for binding, url, version in served
            if url
        ]

    def signed(self, card: a2a_pb2.AgentCard) -> a2a_pb2.AgentCard:
        """``card`` with the agent's signature, if this issuer signs."""
        return card if self.sign is None else self.sign(card)


@dataclass(frozen=True)
class PublicCardDocuments:
    """The signed public card and the JSON forms it is served in.

    Attributes:
        card: The card (signed if the issuer signs).
        v1_0: Its A2A 1.0 form (:func:`card_json`).
        v0_3: Its form for 0.3 clients (the 1.0 form plus the 0.3 fields, which a
            second signature covers); None when the agent does not serve 0.3.
        built_at: When it was built (seconds since the epoch): it changes only then.
    """

    card: a2a_pb2.AgentCard
    v1_0: dict[str, Any]
    v0_3: dict[str, Any] | None
    built_at: float


class PublicCardCache:
    """The signed public card, built once and again after ``invalidate`` (start, rotation)."""

    def __init__(self, agent_id: str, issuer: Callable[[], CardIssuer]) -> None:
        self._agent_id = agent_id
        self._issuer = issuer
        self._documents: PublicCardDocuments | None = None

    def get(self) -> a2a_pb2.AgentCard:
        """The card for the interfaces and key in force (built and signed when first asked)."""
        return self.documents().card

    def documents(self) -> PublicCardDocuments:
        """The card and its JSON forms (built and signed when first asked)."""
        if self._documents is None:
            issuer = self._issuer()
            card = public_card(self._agent_id, issuer)
            interfaces = card.supported_interfaces
            legacy = any(i.protocol_version == LEGACY_PROTOCOL_VERSION for i in interfaces)
            v0_3 = v0_3_document(card, issuer.sign) if legacy else None
            self._documents = PublicCardDocuments(card, card_json(card), v0_3, time.time())
        return self._documents

    def invalidate(self) -> None:
        """Build the card anew when next asked for (a port was bound, the key rotated)."""
        self._documents = None


def card_json(card: a2a_pb2.AgentCard) -> dict[str, Any]:
    """``card`` in its A2A 1.0 JSON form: its own fields only, ``skills`` present.

    ``skills`` is REQUIRED, so a card without any says ``[]``, which the proto's
    JSON form leaves out. The signature is the same either way: the a2a-sdk,
    which signs and verifies cards, leaves empty lists out of what it signs.
    """
    document: dict[str, Any] = MessageToDict(card)
    document.setdefault("skills", [])
    return document


def _issuer(address: str | CardIssuer) -> CardIssuer:
    return address if isinstance(address, CardIssuer) else CardIssuer(address)


def public_card(agent_id: str, address: str | CardIssuer) -> a2a_pb2.AgentCard:
    """The card anyone may see: interfaces, security scheme, no skills (signed if so set)."""
    issuer = _issuer(address)
    return issuer.signed(_unsigned_public_card(agent_id, issuer))


def _unsigned_public_card(agent_id: str, issuer: CardIssuer) -> a2a_pb2.AgentCard:
    card = a2a_pb2.AgentCard(
        name=agent_id,
        description=(
            "A2A Peer Gateway agent. Callers authenticate with an X.509-SVID client "
            "certificate; the skills a caller may use are on its extended card."
        ),
        version=_gateway_version(),
        supported_interfaces=issuer.interfaces(),
        capabilities=a2a_pb2.AgentCapabilities(
            streaming=True,
            push_notifications=issuer.push,
            extended_agent_card=True,
            extensions=[
                a2a_pb2.AgentExtension(
                    uri=CONTRACTS_EXTENSION_URI,
                    description="Contracts of what the caller may call (on its extended card).",
                    required=False,
                )
            ],
        ),
        security_schemes={
            MTLS_SCHEME: a2a_pb2.SecurityScheme(
                mtls_security_scheme=a2a_pb2.MutualTlsSecurityScheme(
                    description=(
                        "Mutual TLS with X.509-SVIDs of this agent's trust domain. Verify "
                        f"the server certificate's one URI SAN: {agent_id}. A client that "
                        "can verify only a host name may use the DNS name "
                        f"{svid_dns_name(agent_id)}, if the certificate carries it."
                    )
                )
            )
        },
        security_requirements=[
            a2a_pb2.SecurityRequirement(schemes={MTLS_SCHEME: a2a_pb2.StringList()})
        ],
        default_input_modes=[_MEDIA],
        default_output_modes=[_MEDIA],
    )
    if issuer.bearer is not None:
        for name, scheme in issuer.bearer.schemes().items():
            card.security_schemes[name].CopyFrom(scheme)
        card.security_requirements.extend(issuer.bearer.requirements())
    return card


def extended_card(
    agent_id: str, address: str | CardIssuer, grant: PeerGrant, visible: Sequence[Capability]
) -> a2a_pb2.AgentCard:
    """The card for one caller: its skills and their contracts, nothing it may not call."""
    issuer = _issuer(address)
    card = _unsigned_public_card(agent_id, issuer)
    latest: dict[str, Capability] = {}
    versions: dict[str, list[str]] = {}
    for cap in visible:  # the registry yields versions in ascending order
        latest[cap.name] = cap
        versions.setdefault(cap.name, []).append(str(cap.version))
    contracts: dict[str, Any] = {}
    for name, cap in latest.items():
        card.skills.append(_skill(cap))
        contracts[name] = _contract(cap, versions[name])
    # Push for this caller: offered here, and its grant names a webhook host.
    card.capabilities.push_notifications = issuer.push and bool(grant.push_hosts)
    extension = card.capabilities.extensions[0]
    extension.params.update(
        {
            "max_payload_bytes": grant.max_payload_bytes,
            "grant_expires_at": grant.expires_at.isoformat(),
            "push_hosts": list(grant.push_hosts),
            "capabilities": contracts,
        }
    )
    return issuer.signed(card)


def _skill(cap: Capability) -> a2a_pb2.AgentSkill:
    contract = cap.contract
    return a2a_pb2.AgentSkill(
        id=contract.name,
        name=contract.name,
        description=contract.description or contract.name,
        tags=[
            f"risk:{contract.risk.value}",
            "idempotent" if contract.idempotent else "not-idempotent",
        ],
        examples=[example.to_json() for example in contract.examples],
        input_modes=[_MEDIA],
        output_modes=[_MEDIA],
    )


def _contract(cap: Capability, versions: list[str]) -> dict[str, Any]:
    contract = cap.contract
    return {
        "version": str(contract.version),
        "versions": versions,
        "risk": contract.risk.value,
        "idempotent": contract.idempotent,
        "timeout_seconds": contract.timeout_seconds,
        "input_schema": contract.input_schema(),
        "output_schema": contract.output_schema(),
        "preconditions": list(contract.preconditions),
    }
