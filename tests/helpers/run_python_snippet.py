"""Run one Python snippet file as a reader would, top-level ``await`` included.

Docs show client code as it sits inside an async function; compiling with
``PyCF_ALLOW_TOP_LEVEL_AWAIT`` runs exactly that text in one event loop.
"""

from __future__ import annotations

import ast
import asyncio
import sys
import types
from pathlib import Path


def main(path: str) -> None:
    """Execute the snippet at ``path`` in a fresh ``__main__`` namespace."""
    source = open(path, encoding="utf-8").read()
    code = compile(source, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    module = types.ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    result = eval(code, module.__dict__)  # the docs' own snippet, nothing else
    if asyncio.iscoroutine(result):
        asyncio.run(result)


if __name__ == "__main__":
    # A reader's interpreter does not see tests/helpers: its mcp.py would hide the MCP SDK.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
    main(sys.argv[1])
