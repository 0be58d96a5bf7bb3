"""A2A 1.0 (``lf.a2a.v1.A2AService``, gRPC binding) served beside ``a2agw.v1``.

The only package that imports the a2a-sdk: its generated types and servicer
base stay at the transport edge; below it everything speaks ``InvokeCall``.
"""

from gateway.server.a2a.card import CONTRACTS_EXTENSION_URI, extended_card, public_card
from gateway.server.a2a.registration import add_a2a_servicer
from gateway.server.a2a.request_checks import SERVICE_NAME
from gateway.server.a2a.servicer import A2AServicer
from gateway.server.a2a.task_store.store import A2ATaskStore

__all__ = [
    "CONTRACTS_EXTENSION_URI",
    "SERVICE_NAME",
    "A2AServicer",
    "A2ATaskStore",
    "add_a2a_servicer",
    "extended_card",
    "public_card",
]
