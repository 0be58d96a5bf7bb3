"""``[console]``: the read-only operator console."""

from __future__ import annotations

from pydantic import (
    model_validator,
)

from gateway.config.addresses import (
    ListenAddress,
    is_loopback_literal,
)
from gateway.config.fields import FrozenTable
from policies.identity import SpiffeId


class ConsoleSettings(FrozenTable):
    """The read-only operator console in the browser (``[console]``; absent: off).

    Attributes:
        listen: ``host:port`` of its HTTP listener (port 0 picks one). Must be
            a loopback IP literal unless ``allow_remote`` is true.
        allow_remote: Serve beyond this machine. Then the listener speaks
            TLS with the agent's certificate and requires a client
            certificate from the agent's CA whose SPIFFE ID is in ``operators``.
        operators: SPIFFE IDs allowed to open the console remotely (required
            with ``allow_remote``; meaningless without it, so refused there).
    """

    listen: ListenAddress = "127.0.0.1:9465"
    allow_remote: bool = False
    operators: tuple[SpiffeId, ...] = ()

    @model_validator(mode="after")
    def _loopback_unless_operators(self) -> ConsoleSettings:
        host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"console.listen {self.listen!r}: expected host:port")
        if self.allow_remote and not self.operators:
            raise ValueError(
                "console.allow_remote needs console.operators: the SPIFFE IDs whose client "
                "certificates may open it"
            )
        if not self.allow_remote and self.operators:
            raise ValueError("console.operators only apply with console.allow_remote = true")
        if not self.allow_remote and not is_loopback_literal(host.strip("[]")):
            raise ValueError(
                f"console.listen {self.listen!r} is not a loopback address; set "
                "console.allow_remote = true (and console.operators) to serve it remotely"
            )
        return self
