"""gRPC core's own log lines: off unless the operator asks for them.

gRPC core (C) writes its log lines straight to stderr through absl logging,
not through Python's ``logging``, and copies peer-controlled text into them
verbatim: a TLS client's server name (SNI) holding a newline and a JSON object
became a line that log readers took for one of our JSON events, and ESC
sequences reached terminals. gRPC offers no hook to route those lines through
our formatter, so every process the ``a2a-gateway`` command starts (workers
too: they inherit the environment) sets ``GRPC_VERBOSITY=NONE`` before grpc is
first imported. Nothing is lost that callers need: every refusal and failure
is logged by our own code and audited.

An operator who sets ``GRPC_VERBOSITY`` (``DEBUG``, ``INFO``, ``ERROR``) to
diagnose a connection gets gRPC's raw lines back, knowingly.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

VERBOSITY_VARIABLE = "GRPC_VERBOSITY"
"""The environment variable gRPC core reads (once, when it initialises)."""

QUIET = "NONE"
"""The value that silences gRPC core's logging (grpcio 1.85 honours it; ERROR does not)."""


def quiet_grpc_core(environ: MutableMapping[str, str] = os.environ) -> None:
    """Silence gRPC core's stderr lines unless ``GRPC_VERBOSITY`` is set already.

    Must run before ``grpc`` is first imported in the process.
    """
    environ.setdefault(VERBOSITY_VARIABLE, QUIET)
