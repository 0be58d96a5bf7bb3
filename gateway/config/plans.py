"""``[plans]``: how this agent runs plans."""

from __future__ import annotations

from capabilities.contract import Risk
from gateway.config.fields import FrozenTable


class PlanSettings(FrozenTable):
    """How this agent runs plans.

    Attributes:
        approval_min_risk: Steps whose route has this risk or above wait for a
            person's approval (``a2a-gateway tasks --approve``) in every plan this
            agent runs, whatever the plan says (None: only plans that ask).
    """

    approval_min_risk: Risk | None = None
