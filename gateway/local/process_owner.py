"""Who a process is, as an owner id (``host:pid:nonce``), and whether one is gone.

Task leases (``gateway.plans.store.lease``) and idempotency claims
(``gateway.inbound.idempotency``) name their holder this way, so a restart can
take over what a killed process on this host left behind without waiting for
an expiry. Only the standard library: any layer may use it.
"""

from __future__ import annotations

import os
import socket
import uuid


def new_owner_id() -> str:
    """A fresh owner id for this process: ``host:pid:nonce``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def holder_gone(owner: str) -> bool:
    """True only if ``owner`` names a process on this host that no longer exists.

    Anything unsure (another host, a malformed id, a pid that is alive or that
    belongs to another user) is False: the lease then has to expire.
    """
    host, _, rest = owner.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # e.g. PermissionError: it exists
        return False
    return False
