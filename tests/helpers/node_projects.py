"""The Node projects of the interop tests (pinned by their lock files) and their install."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

A2A_JS = Path(__file__).parents[1] / "interop" / "node-a2a"
"""The @a2a-js/sdk client project."""
GRPC_JS = Path(__file__).parents[1] / "interop" / "node"
"""The raw @grpc/grpc-js client project."""
MCP_JS = Path(__file__).parents[1] / "interop" / "node-mcp"
"""The @modelcontextprotocol/sdk client project."""


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


def descriptor_set(root: FileDescriptor, path: Path) -> Path:
    """``root`` and everything it imports, dependencies first."""
    files = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(file: FileDescriptor) -> None:
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            add(dependency)
        file.CopyToProto(files.file.add())

    add(root)
    path.write_bytes(files.SerializeToString())
    return path
