"""The error tree, its one status table, and wire round-trips."""

from __future__ import annotations

from typing import NamedTuple

import grpc
import pytest
from google.rpc import status_pb2

import gateway
from gateway import errors
from gateway.errors import GatewayError, all_error_classes, error_for_reason
from gateway.server.a2a.wire_errors import to_a2a_status
from gateway.server.grpc_server import GatewayServicer
from gateway.transport.status import from_rpc_error, status_code_for, to_grpc_status
from gateway.wire.v1 import gateway_pb2


def test_every_error_class_maps_to_a_specific_status() -> None:
    for cls in all_error_classes():
        code = status_code_for(cls("x"))
        assert isinstance(code, grpc.StatusCode)
        assert code is not grpc.StatusCode.UNKNOWN
        assert code is not grpc.StatusCode.OK


def test_subclass_inherits_its_nearest_listed_ancestor() -> None:
    class VeryUnknown(errors.UnknownPeer):
        reason = "VERY_UNKNOWN"

    assert status_code_for(VeryUnknown()) is grpc.StatusCode.PERMISSION_DENIED


# Subclasses that deliberately share their parent's reason code (and so come
# back from the wire as the parent).
_ALIASES = {
    errors.AgentConfigError: errors.ConfigError,
    errors.UpstreamUnavailable: errors.PeerUnavailable,
    errors.OutputChunksTooLarge: errors.OutputTooLarge,
}


def test_reason_codes_are_unique_except_the_aliases() -> None:
    reasons = [cls.reason for cls in all_error_classes() if cls not in _ALIASES]
    assert len(reasons) == len(set(reasons))
    assert all(alias.reason == base.reason for alias, base in _ALIASES.items())


def test_every_documented_reason_code_exists() -> None:
    documented = {
        "UNAUTHENTICATED",
        "UNKNOWN_PEER",
        "GRANT_EXPIRED",
        "CAPABILITY_NOT_GRANTED",
        "VERSION_NOT_AVAILABLE",
        "PAYLOAD_TOO_LARGE",
        "INVALID_INPUT",
        "DEADLINE_EXCEEDED",
        "RISK_NOT_GRANTED",
        "AUDIT_UNAVAILABLE",
        "RATE_LIMITED",
        "CONCURRENCY_LIMITED",
        "SERVER_BUSY",
        "TOKEN_INVALID",
        "TOKEN_EXPIRED",
        "TOKEN_AUDIENCE_MISMATCH",
        "TOKEN_ISSUER_UNKNOWN",
        "TOKEN_SIGNATURE_INVALID",
        "TOKEN_REPLAYED",
        "TOKEN_NOT_BOUND",
        "USER_NOT_AUTHORIZED",
        "CONDITION_NOT_MET",
    }
    assert documented <= {cls.reason for cls in all_error_classes()}


class _FakeCall(grpc.RpcError):
    """What a failed call looks like to the client: code, details, trailing metadata."""

    def __init__(self, status: grpc.Status | _Wire) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return self._status.details

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return tuple(self._status.trailing_metadata)


_ANSWERABLE = [c for c in all_error_classes() if c.peer_may_answer or c is GatewayError]
_OURS_ONLY = [c for c in all_error_classes() if c not in _ANSWERABLE]


@pytest.mark.parametrize("cls", _ANSWERABLE)
def test_every_answer_a_peer_may_give_round_trips_through_the_wire_form(
    cls: type[GatewayError],
) -> None:
    back = from_rpc_error(_FakeCall(to_grpc_status(cls("why it failed"))))
    assert type(back) is _ALIASES.get(cls, cls)
    assert back.message == (cls.REMOTE_MESSAGE or "why it failed")


@pytest.mark.parametrize("cls", [errors.AuditUnavailable, errors.StateUnavailable])
def test_store_failures_cross_the_wire_with_a_fixed_message_only(
    cls: type[GatewayError],
) -> None:
    local = cls("audit database postgresql://u:***@db.internal:5433/prod: password auth failed")
    for status in (to_grpc_status(local), to_a2a_status(local)):
        assert cls.REMOTE_MESSAGE and status.details == cls.REMOTE_MESSAGE
        assert all(b"db.internal" not in value for _, value in status.trailing_metadata)


def test_the_reasons_only_this_side_decides() -> None:
    assert {cls.reason for cls in _OURS_ONLY} == {
        "PEER_IDENTITY_MISMATCH",
        "CANCELLED",
        "OUTBOUND_NOT_ALLOWED",
        "BUDGET_EXHAUSTED",
        "NO_ROUTE",
        "EXPECTATION_FAILED",
        "APPROVAL_DENIED",
        "STAGNATED",
        "UNVERIFIED",
        "TASK_LEASED",
        "IDEMPOTENCY_NOT_IN_DOUBT",
        "CONFIG_INVALID",
        "ADDRESS_UNAVAILABLE",
        "POLICY_INVALID",
        "PLAN_INVALID",
    }


_FALLBACK = {grpc.StatusCode.UNAVAILABLE: errors.PeerUnavailable}


@pytest.mark.parametrize("cls", _OURS_ONLY)
def test_a_reason_only_this_side_decides_is_not_believed_from_a_peer(
    cls: type[GatewayError],
) -> None:
    """Sent with its own status code, or with UNAVAILABLE: the code alone decides."""
    for code in (status_code_for(cls("x")), grpc.StatusCode.UNAVAILABLE):
        forged = _recoded(to_grpc_status(cls("Hostname Verification Check failed")), code)
        back = from_rpc_error(_FakeCall(forged))
        assert type(back) is _FALLBACK.get(code, GatewayError), (cls, code)
        assert not back.nothing_ran
        assert f"the peer's reason '{cls.reason}' is not believed" in back.message


@pytest.mark.parametrize(
    "cls", [errors.UnknownPeer, errors.PayloadTooLarge, errors.Unauthenticated]
)
def test_a_refusal_with_a_code_that_does_not_go_with_it_is_not_believed(
    cls: type[GatewayError],
) -> None:
    forged = _recoded(to_grpc_status(cls("refused")), grpc.StatusCode.UNAVAILABLE)
    back = from_rpc_error(_FakeCall(forged))
    assert type(back) is errors.PeerUnavailable
    assert not back.nothing_ran


@pytest.mark.parametrize("code", list(grpc.StatusCode))
def test_no_status_without_an_error_info_claims_that_nothing_ran(code: grpc.StatusCode) -> None:
    back = from_rpc_error(_FakeCall(_Wire(code, "Hostname Verification Check failed", ())))
    assert not back.nothing_ran
    assert type(back) in (errors.PeerUnavailable, errors.DeadlineExceeded, GatewayError)


class _Wire(NamedTuple):
    """A status as a peer may send it (grpc.Status is only an interface)."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes], ...]


def _recoded(status: grpc.Status, code: grpc.StatusCode) -> _Wire:
    """``status`` (rich) sent with ``code`` instead of its own, consistently."""
    metadata = []
    for key, value in status.trailing_metadata:
        if key == "grpc-status-details-bin":
            rich = status_pb2.Status.FromString(value)
            rich.code = code.value[0]
            value = rich.SerializeToString()
        metadata.append((key, value))
    return _Wire(code, status.details, tuple(metadata))


def test_detail_never_crosses_the_wire() -> None:
    status = to_grpc_status(errors.CapabilityNotGranted("not granted", detail="secret-detail"))
    assert all(b"secret-detail" not in value for _, value in status.trailing_metadata)
    assert "secret-detail" not in status.details


def test_unknown_reason_falls_back_to_the_root() -> None:
    assert error_for_reason("NO_SUCH_REASON") is GatewayError


def test_every_rpc_has_a_servicer_method() -> None:
    service = gateway_pb2.DESCRIPTOR.services_by_name["PeerGateway"]
    for method in service.methods:
        assert method.name in vars(GatewayServicer), method.name


def test_public_api_is_what_all_says() -> None:
    for package in (gateway,):
        for name in package.__all__:
            assert hasattr(package, name)
    import capabilities
    import policies

    for package in (capabilities, policies):
        assert sorted(package.__all__) == sorted(set(package.__all__))
        for name in package.__all__:
            assert hasattr(package, name), f"{package.__name__}.{name}"


# What each failure means for retries and plans: facts of the classes, asked in one place.
_FACTS = (
    "transient",
    "nothing_ran",
    "peer_specific",
    "spends_request_id",
    "peer_may_answer",
    "version_specific",
    "unanswered",
)


def test_what_a_failure_means_is_declared_on_the_tree_and_read_nowhere_else() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    tables = []
    for path in [*root.glob("gateway/**/*.py"), *root.glob("policies/*.py")]:
        text = path.read_text(encoding="utf-8")
        for name in (
            "TRANSIENT",
            "NOTHING_RAN",
            "REROUTABLE",
            "_UNREACHABLE",
            "_REMEMBERED",
            "NOT_REFUSALS",
        ):
            if f"{name} =" in text or f"{name}:" in text:
                tables.append(f"{path.relative_to(root)}: {name}")
    assert tables == []


def test_reason_sets_of_each_fact() -> None:
    from gateway.errors import reasons_where

    assert reasons_where("transient") == {
        "PEER_UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "CAPABILITY_TIMEOUT",
        "AUDIT_UNAVAILABLE",
        "STATE_UNAVAILABLE",
    }
    assert reasons_where("spends_request_id") == {
        "INVALID_INPUT",
        "DEADLINE_EXCEEDED",
        "CAPABILITY_TIMEOUT",
        "CONDITION_NOT_MET",
    }
    assert reasons_where("peer_specific") == {
        "POLICY_REFUSED",
        "UNKNOWN_PEER",
        "GRANT_EXPIRED",
        "CAPABILITY_NOT_GRANTED",
        "RISK_NOT_GRANTED",
        "USER_NOT_AUTHORIZED",
        "CONDITION_NOT_MET",
        "OUTBOUND_NOT_ALLOWED",
        "VERSION_NOT_AVAILABLE",
        "PAYLOAD_TOO_LARGE",
        "OUTPUT_TOO_LARGE",
        "INVALID_OUTPUT",
        "CAPABILITY_FAILED",
        "EXPECTATION_FAILED",
    }
    assert reasons_where("version_specific") == {"VERSION_NOT_AVAILABLE", "NO_ROUTE"}
    assert reasons_where("unanswered") == {
        "PEER_UNAVAILABLE",
        "PEER_IDENTITY_MISMATCH",
        "DEADLINE_EXCEEDED",
        "CAPABILITY_TIMEOUT",
        "CANCELLED",
    }
    ran = reasons_where("nothing_ran")
    # A failure that may follow a run never claims that nothing ran.
    assert not ran & {
        "PEER_UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "CAPABILITY_TIMEOUT",
        "AUDIT_UNAVAILABLE",
        "STATE_UNAVAILABLE",
        "CAPABILITY_FAILED",
        "INVALID_OUTPUT",
        "OUTPUT_TOO_LARGE",
        "IDEMPOTENCY_IN_DOUBT",
        "CANCELLED",
        "INTERNAL",
    }
    assert {"UNKNOWN_PEER", "RATE_LIMITED", "INVALID_REQUEST", "REPLAYED_REQUEST"} <= ran


@pytest.mark.parametrize("fact", _FACTS)
def test_every_fact_is_a_documented_boolean_of_the_root(fact: str) -> None:
    from gateway.errors import GatewayError, all_error_classes

    assert getattr(GatewayError, fact) is False
    assert all(isinstance(getattr(cls, fact), bool) for cls in all_error_classes())
