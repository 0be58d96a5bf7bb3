"""The security suites' fixture: one fuzz target (a real agent over mTLS) for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.agents import Pki
from tests.helpers.fuzz_invoke import FuzzTarget


@pytest.fixture(scope="session")
def fuzz_target(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    """One real agent for every fuzz test of the session."""
    target = FuzzTarget(pki, tmp_path_factory.mktemp("fuzz-agent"))
    yield target
    target.close()
