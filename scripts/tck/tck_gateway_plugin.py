"""pytest plugin run.sh loads into the A2A TCK (``-p tck_gateway_plugin``); no kit file is edited.

1. mTLS, when A2AGW_TCK_CA, A2AGW_TCK_CERT and A2AGW_TCK_KEY are set: every ``httpx.Client`` /
   ``httpx.AsyncClient`` made with the default ``verify`` (the kit's JSON-RPC and HTTP+JSON
   clients, and the module-level ``httpx.get/post`` its tests and card fixture call) trusts the CA
   and presents the client SVID; ``GrpcClient._connect`` opens a ``grpc.secure_channel`` with the
   same credentials, checking A2AGW_TCK_GRPC_TARGET_NAME (the gateway's SVID DNS name) in the
   server certificate.
2. Loopback only: the kit's push-notification ``WebhookReceiver`` binds 127.0.0.1 (its default
   is 0.0.0.0).
3. Kit fixes, each for one defect of the kit (docs/conformance.md has the evidence), chosen with
   A2AGW_TCK_KIT_FIXES: ``all`` (default), ``none``, or a comma-separated list of the names in
   ``FIXES``.
4. Results: with A2AGW_TCK_RESULTS_JSON set, one JSON object per test (nodeid, outcome, RFC 2119
   level, requirement id, transport, skip reason or failure message) is written there.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_CA = os.environ.get("A2AGW_TCK_CA")
_CERT = os.environ.get("A2AGW_TCK_CERT")
_KEY = os.environ.get("A2AGW_TCK_KEY")
_TARGET_NAME = os.environ.get("A2AGW_TCK_GRPC_TARGET_NAME")
_WEBHOOK_CERT = os.environ.get("A2AGW_TCK_WEBHOOK_CERT")
_WEBHOOK_KEY = os.environ.get("A2AGW_TCK_WEBHOOK_KEY")
_CARD_PATH = "/.well-known/agent-card.json"


# --------------------------------------------------------------------------- mTLS
def _patch_httpx_mtls() -> None:
    import httpx

    ctx = ssl.create_default_context(cafile=_CA)
    ctx.load_cert_chain(str(_CERT), str(_KEY))
    for cls in (httpx.Client, httpx.AsyncClient):
        original = cls.__init__

        def __init__(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> None:
            if kwargs.get("verify", True) is True:
                kwargs["verify"] = ctx
            _original(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign]


def _patch_grpc_mtls() -> None:
    import grpc
    from specification.generated import a2a_pb2_grpc
    from tck.transport import grpc_client

    credentials = grpc.ssl_channel_credentials(
        Path(str(_CA)).read_bytes(), Path(str(_KEY)).read_bytes(), Path(str(_CERT)).read_bytes()
    )
    options = []
    if _TARGET_NAME:
        options = [
            ("grpc.ssl_target_name_override", _TARGET_NAME),
            ("grpc.default_authority", _TARGET_NAME),
        ]

    def _connect(self: Any) -> None:
        if self._channel is not None:
            with contextlib.suppress(Exception):
                self._channel.close()
        self._channel = grpc.secure_channel(self.base_url, credentials, options=options)
        self._stub = a2a_pb2_grpc.A2AServiceStub(self._channel)

    grpc_client.GrpcClient._connect = _connect


def _patch_webhook_loopback() -> None:
    from tck.webhook import server

    original = server.WebhookReceiver.start

    def start(self: Any) -> None:
        self.host = "127.0.0.1"
        original(self)

    server.WebhookReceiver.start = start


# --------------------------------------------------------------------------- kit fixes
def _fix_jsonrpc_url() -> None:
    """The JSON-RPC client posts to ``<interface url>/``, not to the interface URL.

    ``tck/transport/jsonrpc_client.py`` makes ``httpx.Client(base_url=url)`` and posts to "/",
    which httpx joins as ``url + "/"``. The spec (9.x, the card's ``supportedInterfaces[].url``)
    says the interface URL is where JSON-RPC requests go, and the kit's own raw-httpx tests post
    there exactly. An agent whose JSON-RPC URL has a path (ours: ``/a2a/jsonrpc``) answers 404 to
    ``/a2a/jsonrpc/``. The fix posts to the URL exactly.
    """
    import httpx
    from tck.transport.jsonrpc_client import JsonRpcClient

    original_init = JsonRpcClient.__init__

    def __init__(self: Any, base_url: str) -> None:
        original_init(self, base_url)
        merge = self._client._merge_url
        exact = httpx.URL(base_url)

        def _merge_url(url: Any) -> httpx.URL:
            return exact if str(url) == "/" else merge(url)

        self._client._merge_url = _merge_url

    JsonRpcClient.__init__ = __init__


def _fix_unique_message_ids() -> None:
    """The kit reuses message ids across tests.

    ``tck_id()`` is session-wide and the tests' module-level sample messages are built once, so
    about 13 requirements send the same ``messageId`` (e.g. ``tck-complete-task-<session>-<t>``).
    The spec (3.2 Message) makes ``messageId`` unique per message; an agent that refuses a replayed
    id (ours, per caller) fails every test after the first. The fix appends ``-u<N>`` to each id
    the transport clients send, keeping the ``tck-<scenario>`` prefix agents route on.
    """
    from tck.transport.grpc_client import GrpcClient
    from tck.transport.http_json_client import HttpJsonClient
    from tck.transport.jsonrpc_client import JsonRpcClient

    counter = itertools.count(1)
    for cls in (GrpcClient, HttpJsonClient, JsonRpcClient):
        for name in ("send_message", "send_streaming_message"):
            original = getattr(cls, name)

            def send(
                self: Any, message: dict[str, Any], *args: Any, _original: Any = original, **kw: Any
            ) -> Any:
                if isinstance(message, dict) and message.get("messageId"):
                    message = {**message, "messageId": f"{message['messageId']}-u{next(counter)}"}
                return _original(self, message, *args, **kw)

            setattr(cls, name, send)


def _fix_stream_error_read() -> None:
    """An HTTP+JSON streaming error answer is closed unread, then read: ``ResponseNotRead``.

    ``HttpJsonClient._request_streaming`` sends with ``stream=True`` and, on a status >= 400,
    closes the response without ``read()``; the response's ``error`` property then calls
    ``response.json()``, which raises ``httpx.ResponseNotRead`` in the test instead of reporting
    the agent's error. The fix reads an error answer's body before the kit closes it.
    """
    from tck.transport.http_json_client import HttpJsonClient

    original_init = HttpJsonClient.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        send = self._client.send

        def _send(request: Any, *a: Any, **kw: Any) -> Any:
            response = send(request, *a, **kw)
            if kw.get("stream") and response.status_code >= 400:
                response.read()
            return response

        self._client.send = _send

    HttpJsonClient.__init__ = __init__


def _fix_card_version_header() -> None:
    """The kit fetches the agent card without ``A2A-Version``.

    The card fixture (``tests/compatibility/conftest.py``) and the caching tests call
    ``httpx.get(".../.well-known/agent-card.json")`` with no ``A2A-Version`` header, though spec
    3.6.1 says clients send it with every request, and a request without one is a 0.3 request.
    An agent that serves both versions (ours, ``[a2a] v0_3_compat``) answers the 0.3 card form,
    which the kit then validates against the 1.0 schema. The fix sends ``A2A-Version: 1.0`` on a
    card fetch that names no version.
    """
    import httpx

    original_get = httpx.get

    def get(url: Any, *args: Any, **kwargs: Any) -> Any:
        if str(url).endswith(_CARD_PATH):
            headers = dict(kwargs.get("headers") or {})
            if not any(k.lower() == "a2a-version" for k in headers):
                headers["A2A-Version"] = "1.0"
            kwargs["headers"] = headers
        return original_get(url, *args, **kwargs)

    httpx.get = get


def _fix_https_webhook() -> None:
    """The kit's push webhook receiver speaks plain HTTP only.

    ``tck/webhook/server.py`` serves ``http://<host>:<port>/webhook`` and has no TLS option, so an
    agent that takes only ``https`` webhook URLs (ours: spec 13.2 says webhook URLs SHOULD use
    HTTPS, and a webhook is an SSRF door) refuses the push config and the delivery tests skip.
    With A2AGW_TCK_WEBHOOK_CERT/KEY set (run.sh: a loopback certificate of the dev CA, which the
    agents' ``[push] ca`` trusts), the receiver serves TLS and names an ``https`` URL.
    """
    if not (_WEBHOOK_CERT and _WEBHOOK_KEY):
        return
    from tck.webhook import server

    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(_WEBHOOK_CERT, _WEBHOOK_KEY)
    original_start = server.WebhookReceiver.start

    def start(self: Any) -> None:
        original_start(self)
        self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)

    def url(self: Any, webhook_host: str = "localhost") -> str:
        return f"https://{webhook_host}:{self.port}/webhook"

    server.WebhookReceiver.start = start
    server.WebhookReceiver.url = url


FIXES: dict[str, Callable[[], None]] = {
    "jsonrpc-url": _fix_jsonrpc_url,
    "unique-message-ids": _fix_unique_message_ids,
    "stream-error-read": _fix_stream_error_read,
    "card-version-header": _fix_card_version_header,
    "https-webhook": _fix_https_webhook,
}
"""Every kit fix by name (A2AGW_TCK_KIT_FIXES picks them)."""


def _chosen_fixes(setting: str) -> list[str]:
    setting = setting.strip() or "all"
    if setting == "all":
        return list(FIXES)
    if setting == "none":
        return []
    names = [name.strip() for name in setting.split(",") if name.strip()]
    unknown = sorted(set(names) - set(FIXES))
    if unknown:
        raise pytest.UsageError(f"A2AGW_TCK_KIT_FIXES: unknown fix {unknown}; known: {list(FIXES)}")
    return names


def pytest_configure(config: pytest.Config) -> None:
    _patch_webhook_loopback()
    for name in _chosen_fixes(os.environ.get("A2AGW_TCK_KIT_FIXES", "all")):
        FIXES[name]()
    if _CA and _CERT and _KEY:
        _patch_httpx_mtls()
        _patch_grpc_mtls()
    config.stash[_results_key] = []


# --------------------------------------------------------------------------- results
_results_key = pytest.StashKey[list[dict[str, Any]]]()
_REQ_RE = re.compile(r"([A-Z][A-Z0-9_]+-[A-Z]+-\d+[a-z]?)")
_LEVELS = ("must", "should", "may")


def _level_and_requirement(item: pytest.Item) -> tuple[str, str | None]:
    requirement: str | None = None
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        requirement = getattr(callspec.params.get("requirement"), "id", None)
    if requirement is None:
        doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
        match = _REQ_RE.search(doc)
        if match:
            requirement = match.group(1)
    for level in _LEVELS:
        if item.get_closest_marker(level) is not None:
            return level.upper(), requirement
    if requirement is not None:
        with contextlib.suppress(Exception):
            from tck.requirements.registry import get_requirement_by_id

            return get_requirement_by_id(requirement).level.value.upper(), requirement
    return "UNMARKED", requirement


def _transport(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "transport" in callspec.params:
        return str(callspec.params["transport"])
    for name in ("grpc", "jsonrpc", "http_json"):
        if item.get_closest_marker(name) is not None:
            return name
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    results = item.config.stash.get(_results_key, None)
    if results is None:
        return
    failed_setup = report.when == "setup" and not report.passed
    failed_teardown = report.when == "teardown" and report.failed
    if report.when != "call" and not failed_setup and not failed_teardown:
        return
    if hasattr(report, "wasxfail"):
        state = "xfailed" if report.skipped else "xpassed"
    elif report.skipped:
        state = "skipped"
    elif report.failed:
        state = "error" if report.when != "call" else "failed"
    else:
        state = "passed"
    message = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])
    elif report.failed or hasattr(report, "wasxfail"):
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        if hasattr(report, "wasxfail") and not message:
            message = str(report.wasxfail)
    level, requirement = _level_and_requirement(item)
    results.append(
        {
            "nodeid": report.nodeid,
            "outcome": state,
            "level": level,
            "requirement": requirement,
            "transport": _transport(item),
            "message": message.strip()[:2000],
            "duration": round(report.duration, 3),
        }
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("A2AGW_TCK_RESULTS_JSON")
    if not path:
        return
    results = session.config.stash.get(_results_key, [])
    Path(path).write_text(json.dumps({"exitstatus": int(exitstatus), "tests": results}, indent=1))
