"""The HTTP bindings' error table: every error class has an HTTP status and a JSON-RPC code."""

from __future__ import annotations

import grpc
from a2a.utils.errors import A2A_REASON_TO_ERROR, JSON_RPC_ERROR_CODE_MAP

from gateway.errors import ERROR_DOMAIN, all_error_classes, error_for_reason
from gateway.server.a2a.wire_errors import (
    SPEC_DOMAIN,
    SPEC_ERRORS,
    spec_error_for,
    to_a2a_status,
)
from gateway.server.a2a_http.wire_errors import (
    GATEWAY_REFUSAL_CODE,
    HTTP_STATUS,
    from_grpc_status,
    http_status,
    jsonrpc_code,
    jsonrpc_error,
    rest_error,
)
from gateway.transport.status import STATUS_TABLE, status_code_for


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


SPEC_HTTP = {  # A2A 1.0.0, section 5.4 (JSON-RPC code, HTTP status)
    "TASK_NOT_FOUND": (-32001, 404),
    "TASK_NOT_CANCELABLE": (-32002, 409),
    "PUSH_NOTIFICATION_NOT_SUPPORTED": (-32003, 400),
    "UNSUPPORTED_OPERATION": (-32004, 400),
    "CONTENT_TYPE_NOT_SUPPORTED": (-32005, 415),
    "VERSION_NOT_SUPPORTED": (-32009, 400),
    "INVALID_REQUEST": (-32600, 400),
    "INVALID_INPUT": (-32602, 400),
}


def test_spec_errors_get_the_specs_codes_and_come_first() -> None:
    assert set(SPEC_ERRORS) == set(SPEC_HTTP)
    for reason, (code, status) in SPEC_HTTP.items():
        error = error_for_reason(reason)("why")
        spec = SPEC_ERRORS[reason]
        assert (jsonrpc_code(error), http_status(error)) == (code, status)
        assert code == JSON_RPC_ERROR_CODE_MAP[A2A_REASON_TO_ERROR[spec.reason]]
        first = rest_error(error)["error"]["details"][0]
        assert (first["domain"], first["reason"]) == (SPEC_DOMAIN, spec.reason)
    others = [cls for cls in all_error_classes() if spec_error_for(cls("x")) is None]
    assert others and all(jsonrpc_code(cls("x")) == GATEWAY_REFUSAL_CODE for cls in others)


def test_the_spec_tables_grpc_codes_are_the_status_tables() -> None:
    for reason, spec in SPEC_ERRORS.items():
        assert status_code_for(error_for_reason(reason)("x")) is spec.grpc, reason


def test_a_servicer_status_reads_back_as_the_same_error() -> None:
    for cls in all_error_classes():
        error = cls("why")
        back = from_grpc_status(to_a2a_status(error))
        # A store failure's own message names the store; callers get a fixed one.
        assert (back.reason, back.message) == (cls.reason, error.remote_message)
