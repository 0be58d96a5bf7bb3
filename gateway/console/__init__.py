"""The read-only operator console: server-rendered pages on the agent's own listener.

``[console]`` in the agent config turns it on (``gateway.config.ConsoleSettings``).
Pages: live decisions (server-sent events fed from the audit log as records
commit), refusals by peer and reason over time, grants, the agent's
certificate, upstream agents, the audit chain and checkpoints, calls in
flight. No build step, nothing fetched from elsewhere: the style sheet and
the one script ship in ``static/``; a strict Content-Security-Policy allows
only this origin. Values are ids, names, sizes and codes, escaped; never
payload content.
"""

from gateway.console.server import ConsoleServer

__all__ = ["ConsoleServer"]
