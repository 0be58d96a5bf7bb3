"""Debian's chromium for the console's browser tests: where it is, how it starts, the marks."""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000
"""How long a page may take to show what a test waits for."""

BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"{CHROMIUM} is not installed (Debian package chromium; .ci/run installs it)",
    ),
]
"""A browser test's ``pytestmark``: the rest tier, and a skip saying why without chromium."""
