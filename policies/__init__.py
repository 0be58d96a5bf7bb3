"""Policies: peer identity, grants, decisions and policy files."""

from policies.decisions import Admission, admit, callable_capabilities, grant_for
from policies.grants import CapabilityGrant, OutboundRule, PeerGrant, PolicyDocument
from policies.identity import is_spiffe_id, spiffe_id_from_pem, svid_dns_name
from policies.policy_file import Policy, load_policy
from policies.store import PolicyStore

__all__ = [
    "Admission",
    "CapabilityGrant",
    "OutboundRule",
    "PeerGrant",
    "Policy",
    "PolicyDocument",
    "PolicyStore",
    "admit",
    "callable_capabilities",
    "grant_for",
    "is_spiffe_id",
    "load_policy",
    "spiffe_id_from_pem",
    "svid_dns_name",
]
