"""The a2a-sdk's own log lines, kept as facts, without the request text they quote.

The a2a-sdk logs a request it cannot parse at ERROR or WARNING with the
parser's message and traceback, and pydantic's ``input_value=...`` or
protobuf's ``ParseError`` text quote the request's values: a metadata string,
a role, a ``historyLength``, a data part, each verbatim in our log. It logs
whole request bodies at DEBUG. The gateway decides and audits every such
request itself (reason code, sizes, no content), so of the SDK's lines only
the facts are kept: which SDK module, the level, the exception's type. The
text, its arguments and the traceback are withheld. And the level is at
most WARNING: what the SDK calls an error here is a request it could not
read or one the gateway refused (both answered and audited by the edge);
the gateway's own failures are logged as ERROR under ``gateway.*``. Once
the gateway has refused the request in hand (:func:`gateway_refused`, in
the request's own context), the SDK's lines about it are kept at DEBUG: a
refusal is not the agent's error, and a refused stream would otherwise log
a line that a refused ``SendMessage`` does not.

:func:`withhold_a2a_sdk_text` puts one handler on the ``a2a`` logger (every
SDK module logs under it) and stops its records from reaching other handlers
as they are; each becomes a new record, with a fixed message, handed to the
``gateway.a2a_sdk`` logger and so to the process's handlers. Idempotent; an
agent calls it when it starts. A handler someone attached to an ``a2a.*``
logger directly still sees the SDK's own records: that is their choice.

The MCP SDK's records (logger ``mcp``) are relayed the same way, to
``gateway.mcp_sdk``: they quote MCP requests and the answers of fronted MCP
servers (a parse error's text, a ``Host`` header it refused).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

SDK_LOGGER = "a2a"
"""The a2a-sdk's top logger: its modules log as ``a2a.server...``, ``a2a.client...``."""

RELAY_LOGGER = "gateway.a2a_sdk"
"""Where the kept facts are logged (propagates to the process's handlers)."""

WITHHELD = "a2a-sdk %s: %s (text withheld: it may quote the request; the audit has the decision)"
"""The message of every relayed line: the SDK module and the exception type (or 'no exception')."""

MCP_SDK_LOGGER = "mcp"
"""The MCP SDK's top logger (``mcp.server...``, ``mcp.client...``): its lines quote
requests and the answers of fronted MCP servers alike, so they are relayed the same way."""
MCP_RELAY_LOGGER = "gateway.mcp_sdk"
MCP_WITHHELD = "mcp-sdk %s: %s (text withheld: it may quote a request or an answer)"


_REFUSED = ContextVar("a2agw_refused_by_the_gateway", default=False)
"""Set in a request's context once the gateway has refused it (each request has its own)."""


def gateway_refused() -> None:
    """The request in hand is refused by the gateway (answered and audited with its reason)."""
    _REFUSED.set(True)


def _skill_less_card_notice(record: logging.LogRecord) -> bool:
    """The SDK's notice that a card has no skills: the public card has none by design
    (a caller's skills are on its extended card), so it is no warning here."""
    args = record.args if isinstance(record.args, tuple) else ()
    return record.name == "a2a.utils.proto_utils" and args[1:3] == ("AgentCard", "skills")


class _FactsOnly(logging.Handler):
    """Relays each SDK record as its logger, level (see above) and exception type, nothing else."""

    def __init__(self, relay: str = RELAY_LOGGER, message: str = WITHHELD) -> None:
        super().__init__()
        self._relay = relay
        self._message = message

    def emit(self, record: logging.LogRecord) -> None:
        kind = record.exc_info[0] if record.exc_info else None
        relay = logging.getLogger(self._relay)
        quiet = _REFUSED.get() or _skill_less_card_notice(record)
        level = logging.DEBUG if quiet else min(record.levelno, logging.WARNING)
        if not relay.isEnabledFor(level):
            return
        relay.handle(
            relay.makeRecord(
                self._relay,
                level,
                record.pathname,
                record.lineno,
                self._message,
                (record.name, kind.__name__ if kind is not None else "no exception"),
                None,
                func=record.funcName,
            )
        )


def withhold_a2a_sdk_text() -> None:
    """Route the a2a-sdk's and the MCP SDK's log records through :class:`_FactsOnly`
    (once per process)."""
    for name, handler in (
        (SDK_LOGGER, _FactsOnly()),
        (MCP_SDK_LOGGER, _FactsOnly(MCP_RELAY_LOGGER, MCP_WITHHELD)),
    ):
        sdk = logging.getLogger(name)
        if not any(isinstance(known, _FactsOnly) for known in sdk.handlers):
            sdk.addHandler(handler)
        sdk.propagate = False
