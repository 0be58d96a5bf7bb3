"""The HTTP bindings' error table: every error class has an HTTP status and a JSON-RPC code."""

from __future__ import annotations

import grpc
from a2a.utils.errors import A2A_REASON_TO_ERROR, JSON_RPC_ERROR_CODE_MAP

from gateway.errors import ERROR_DOMAIN, all_error_classes
from gateway.server.a2a.wire_errors import SPEC_DOMAIN, SPEC_REASONS, to_a2a_status
from gateway.server.a2a_http.wire_errors import (
    GATEWAY_REFUSAL_CODE,
    HTTP_STATUS,
    from_grpc_status,
    http_status,
    jsonrpc_code,
    jsonrpc_error,
    rest_error,
)
from gateway.transport.status import STATUS_TABLE


def test_every_grpc_code_of_the_status_table_has_an_http_status() -> None:
    used = set(STATUS_TABLE.values()) - {grpc.StatusCode.INTERNAL}
    assert used <= set(HTTP_STATUS), used - set(HTTP_STATUS)


def test_every_error_class_renders_on_both_bindings_with_its_reason() -> None:
    for cls in all_error_classes():
        error = cls("why")
        body = jsonrpc_error(error, 3)["error"]
        rest = rest_error(error)["error"]
        assert body["message"] == rest["message"] == f"{error.reason}: why"
        for infos in (body["data"], rest["details"]):
            assert infos[-1]["domain"] == ERROR_DOMAIN and infos[-1]["reason"] == error.reason
            assert all(info["metadata"] == {"a2agw.reason": error.reason} for info in infos)
        assert rest["code"] == http_status(error)


def test_spec_errors_get_the_specs_code_and_come_first() -> None:
    for cls, spec_reason in SPEC_REASONS.items():
        error = cls("why")
        sdk_class = A2A_REASON_TO_ERROR[spec_reason]
        assert jsonrpc_code(error) == JSON_RPC_ERROR_CODE_MAP[sdk_class]
        first = rest_error(error)["error"]["details"][0]
        assert (first["domain"], first["reason"]) == (SPEC_DOMAIN, spec_reason)
    others = [
        cls for cls in all_error_classes() if not any(issubclass(cls, s) for s in SPEC_REASONS)
    ]
    assert others and all(jsonrpc_code(cls("x")) == GATEWAY_REFUSAL_CODE for cls in others)


def test_a_servicer_status_reads_back_as_the_same_error() -> None:
    for cls in all_error_classes():
        error = cls("why")
        back = from_grpc_status(to_a2a_status(error))
        # A store failure's own message names the store; callers get a fixed one.
        assert (back.reason, back.message) == (cls.reason, error.remote_message)
