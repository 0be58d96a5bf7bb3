"""The Node projects of the interop tests (pinned by their lock files) and their install."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

A2A_JS = Path(__file__).parents[1] / "interop" / "node-a2a"
"""The @a2a-js/sdk client project."""
GRPC_JS = Path(__file__).parents[1] / "interop" / "node"
"""The raw @grpc/grpc-js client project."""


def node_ready(project: Path, package: str) -> None:
    """Skip without node/npm; install ``project``'s locked packages unless ``package`` is there."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm not installed (.ci/run installs them)")
    if not (project / "node_modules" / package).is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--silent"],
            cwd=project,
            check=True,
            timeout=300,
        )
