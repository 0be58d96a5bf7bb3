"""The official A2A TCK against a native agent (``tck.conformance``) over JSON-RPC: no MUST fails.

It runs ``scripts/tck/run.sh`` (docs/conformance.md) for one SUT and one binding. The kit's
checkout and its venvs come from the cache outside the clone that ``.ci/run`` warms
(``WARM_ONLY=1 scripts/tck/run.sh``, which needs the kit's git source and PyPI); with a cold cache
the test skips, touching no network. All three SUTs on all three bindings are the separate job
``scripts/tck/run.sh``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.agent_process import REPO

RUN = REPO / "scripts" / "tck" / "run.sh"
NOT_CACHED = 77
"""run.sh's exit status with REQUIRE_CACHE=1 when the kit or a venv is not in the cache."""


@pytest.mark.slow
def test_every_must_of_the_kit_passes_natively_over_jsonrpc(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SUTS": "native",
        "BINDINGS": "jsonrpc",
        "REQUIRE_CACHE": "1",
        "CHECK": "1",
        "RESULTS_DIR": str(tmp_path / "results"),
        "GATEWAY_VENV": str(Path(sys.executable).parent.parent),
        "RUN_TIMEOUT": "300",
    }
    run = subprocess.run(
        ["bash", str(RUN)], env=env, capture_output=True, text=True, timeout=420, check=False
    )
    if run.returncode == NOT_CACHED:
        pytest.skip(f"the TCK cache is cold: {run.stderr.strip().splitlines()[-1]}")
    results = json.loads((tmp_path / "results" / "native-jsonrpc.json").read_text())["tests"]
    must_failed = [
        test["nodeid"]
        for test in results
        if test["level"] == "MUST" and test["outcome"] in ("failed", "error")
    ]
    passed = [test for test in results if test["outcome"] == "passed"]
    assert (must_failed, run.returncode) == ([], 0), run.stdout + run.stderr[-4000:]
    assert len(passed) >= 90, f"only {len(passed)} tests passed: did the kit reach the agent?"
