"""The policy document: per-peer grants (inbound) and outbound rules.

Everything here is a frozen pydantic model that validates when the file is
loaded; nothing is allowed unless a grant says so.
"""

from __future__ import annotations

import ipaddress
import math
import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from capabilities.contract import CapabilityName, Risk
from capabilities.versions import ConstraintText, VersionConstraint
from policies.conditions import ConditionError, compiled
from policies.identity import SpiffeId
from policies.users import ClaimValue

MAX_PAYLOAD_CEILING = 4 * 1024 * 1024
"""No grant may allow a payload above the server-wide message ceiling."""


ConditionName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,63}$")]
"""A condition's name (shown in refusals): lowercase letters, digits, ``_`` and ``-``."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CapabilityGrant(_Frozen):
    """One ``capability@constraint`` entry of a grant."""

    name: CapabilityName
    constraint: ConstraintText = ""

    @classmethod
    def parse(cls, entry: str) -> CapabilityGrant:
        """Parse ``name`` or ``name@constraint``; raises ValidationError."""
        return cls.model_validate(_entry_fields(entry))

    @property
    def version_constraint(self) -> VersionConstraint:
        """The parsed constraint."""
        return VersionConstraint.parse(self.constraint)

    def __str__(self) -> str:
        return f"{self.name}@{self.constraint}" if self.constraint else self.name


def _entry_fields(entry: str) -> dict[str, str]:
    name, _, constraint = entry.partition("@")
    return {"name": name.strip(), "constraint": constraint.strip()}


def _entries(value: object) -> object:
    if isinstance(value, list | tuple):
        return tuple(_entry_fields(v) if isinstance(v, str) else v for v in value)
    return value


MAX_PUSH_HOSTS = 64
"""Most entries one grant's ``push_hosts`` may hold."""
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def push_host_entry(entry: str) -> str:
    """``entry`` of ``push_hosts`` in its one spelling: a lowercase DNS name, ``*.NAME``
    or an IP address as :mod:`ipaddress` writes it (IPv4-mapped IPv6: its IPv4 address).

    Raises:
        ValueError: anything else (a port, a scheme, a CIDR range, a bare ``*``,
            ``*.`` over a single label, a trailing dot, an IPv6 zone, non-ASCII).
    """
    if not isinstance(entry, str) or "%" in entry:
        raise ValueError(f"push_hosts: {str(entry)[:80]!r} is not a host name or an address")
    try:
        address = ipaddress.ip_address(entry)
    except ValueError:
        pass
    else:  # an IPv4-mapped IPv6 address is the IPv4 address it carries
        mapped = getattr(address, "ipv4_mapped", None)
        return str(mapped or address)
    wildcard = entry.startswith("*.")
    name = entry[2:] if wildcard else entry
    if not is_dns_name(name.lower()):
        raise ValueError(f"push_hosts: {entry[:80]!r} is not a DNS name, *.NAME or an IP address")
    if wildcard and name.count(".") < 1:
        raise ValueError(f"push_hosts: {entry[:80]!r}: *. needs a name of two labels or more")
    return entry.lower()


def is_dns_name(name: str) -> bool:
    """True for a lowercase LDH name (labels of 1-63, at most 253 characters, no trailing
    dot) whose last label is not all digits (so never a numeric IPv4 spelling)."""
    if not name or len(name) > 253 or not name.isascii():
        return False
    labels = name.split(".")
    return all(_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()


class PeerGrant(_Frozen):
    """What one peer (by SPIFFE ID) may call on this agent.

    Attributes:
        peer: The peer's SPIFFE ID, as proven by its certificate.
        capabilities: Granted ``capability@constraint`` entries.
        max_payload_bytes: Largest raw input (and output) payload for this peer.
        expires_at: When the grant stops working (RFC 3339 with offset).
        max_risk: Highest risk the peer may call; no limit when absent.
        max_calls_per_second: Token-bucket refill rate for this peer's calls
            (``RATE_LIMITED`` above it); no rate limit when absent.
        burst: Bucket size: calls the peer may make at once after an idle
            spell (only with ``max_calls_per_second``; default: the rate
            rounded up, at least 1).
        max_in_flight: Calls of this peer running here at once
            (``CONCURRENCY_LIMITED`` above it); no limit when absent.
        users: ``"required"``: every call under this grant must carry a
            verified user (``USER_NOT_AUTHORIZED`` otherwise, nothing runs);
            ``"optional"`` (default): a user is carried and audited if sent.
        user_claims: Claims the user must have (``USER_NOT_AUTHORIZED``
            otherwise): each equals the value, or a list claim (or the
            space-separated ``scope``) contains it. Implies a user is required.
        when: Named CEL conditions (``policies.conditions``), compiled when the
            file loads; each must be true (``CONDITION_NOT_MET`` names the
            first that is not). A plain string is one condition named ``when``.
        push_hosts: Hosts this peer's A2A push-notification webhooks may name
            (default none: no push for this peer). Each entry is a DNS name
            (``hooks.example.com``), ``*.`` and a name of two labels or more
            (any name below it, at any depth), or an IP address. A webhook's
            name must resolve to public addresses only, unless the address it
            resolves to is itself an entry here (docs/a2a-push.md).
    """

    peer: SpiffeId
    capabilities: tuple[CapabilityGrant, ...]
    max_payload_bytes: int = Field(gt=0, le=MAX_PAYLOAD_CEILING)
    expires_at: datetime
    max_risk: Risk | None = None
    max_calls_per_second: float | None = Field(default=None, gt=0, le=1_000_000)
    burst: int | None = Field(default=None, ge=1, le=1_000_000)
    max_in_flight: int | None = Field(default=None, ge=1, le=100_000)
    users: Literal["optional", "required"] = "optional"
    user_claims: tuple[tuple[str, ClaimValue], ...] = Field(default=(), max_length=64)
    when: tuple[tuple[ConditionName, str], ...] = Field(default=(), max_length=16)
    push_hosts: tuple[str, ...] = Field(default=(), max_length=MAX_PUSH_HOSTS)

    @field_validator("capabilities", mode="before")
    @classmethod
    def _entries(cls, value: object) -> object:
        return _entries(value)

    @field_validator("user_claims", mode="before")
    @classmethod
    def _claim_table(cls, value: object) -> object:
        # A TOML table; kept as pairs so the frozen grant stays hashable.
        return tuple(value.items()) if isinstance(value, dict) else value

    @field_validator("when", mode="before")
    @classmethod
    def _named_conditions(cls, value: object) -> object:
        if isinstance(value, str):
            return (("when", value),)
        return tuple(value.items()) if isinstance(value, dict) else value

    @field_validator("when")
    @classmethod
    def _conditions_compile(cls, value: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        for name, expression in value:
            try:
                compiled(expression)
            except ConditionError as err:
                raise ValueError(f"condition {name!r}: {err}") from err
        return value

    @property
    def needs_user(self) -> bool:
        """True if every call under this grant must carry a verified user."""
        return self.users == "required" or bool(self.user_claims)

    @field_validator("push_hosts")
    @classmethod
    def _push_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        hosts = tuple(push_host_entry(entry) for entry in value)
        if len(set(hosts)) != len(hosts):
            raise ValueError("push_hosts: an entry appears twice")
        return hosts

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> PeerGrant:
        if self.burst is not None and self.max_calls_per_second is None:
            raise ValueError("burst needs max_calls_per_second (it is the token bucket's size)")
        return self

    @property
    def bucket_size(self) -> int:
        """Token-bucket size: ``burst``, else the rate rounded up (at least 1)."""
        if self.burst is not None:
            return self.burst
        return max(1, math.ceil(self.max_calls_per_second or 1))

    @field_validator("expires_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("expires_at needs a UTC offset, e.g. 2027-01-01T00:00:00Z")
        return value

    def entries_for(self, capability: str) -> tuple[CapabilityGrant, ...]:
        """The entries of this grant that name ``capability``."""
        return tuple(entry for entry in self.capabilities if entry.name == capability)

    def allows_risk(self, risk: Risk) -> bool:
        """True if ``risk`` is within ``max_risk``."""
        return self.max_risk is None or risk.rank <= self.max_risk.rank


class OutboundRule(_Frozen):
    """Which capabilities this agent may send to one peer.

    Attributes:
        peer: The receiving peer's SPIFFE ID.
        capabilities: Capability names (``name`` or ``name@constraint``) it may receive.
    """

    peer: SpiffeId
    capabilities: tuple[CapabilityGrant, ...]

    @field_validator("capabilities", mode="before")
    @classmethod
    def _entries(cls, value: object) -> object:
        return _entries(value)


class PolicyDocument(_Frozen):
    """A whole policy file: deny by default, allow what the grants name."""

    version: Literal[1] = 1
    grants: tuple[PeerGrant, ...] = ()
    outbound: tuple[OutboundRule, ...] = ()

    @model_validator(mode="after")
    def _unique_peers(self) -> PolicyDocument:
        for table, items in (("grants", self.grants), ("outbound", self.outbound)):
            seen: set[str] = set()
            for item in items:
                if item.peer in seen:
                    raise ValueError(f"{table}: peer {item.peer} appears twice")
                seen.add(item.peer)
        return self
