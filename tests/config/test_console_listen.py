"""Probe: ``[console] listen`` is checked when the config loads, like every other address.

``console.listen = "127.0.0.1:99999"`` passed ``config check`` (``ok:``) and
``serve`` then died on ``bind()`` with ``internal error: OverflowError`` (exit
70) after the gRPC server had started.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config import ConsoleSettings


@pytest.mark.parametrize(
    ("listen", "problem"),
    [
        ("127.0.0.1:99999", "port 99999 is outside 0..65535"),
        ("127.0.0.1:65536", "port 65536 is outside 0..65535"),
        ("127.0.0.1:\u0669\u0660", "is not a number"),  # Arabic-Indic digits: isdigit() only
    ],
)
def test_a_console_listen_outside_the_port_range_is_refused_when_the_config_loads(
    listen: str, problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem):
        ConsoleSettings(listen=listen)


def test_good_console_listen_addresses_still_load() -> None:
    assert ConsoleSettings(listen="127.0.0.1:0").listen == "127.0.0.1:0"
    assert ConsoleSettings(listen="[::1]:65535").listen == "[::1]:65535"
