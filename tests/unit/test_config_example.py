"""The example in ``gateway.config.agent``'s docstring is a valid agent config."""

from __future__ import annotations

import tomllib

from gateway.config import agent as agent_module
from gateway.config.agent import AgentConfig


def _example() -> str:
    doc = agent_module.__doc__ or ""
    block = doc.split("Example::", 1)[1].split("\n\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines)


def test_the_docstring_example_parses_and_validates() -> None:
    data = tomllib.loads(_example())
    config = AgentConfig.model_validate(data)
    assert config.a2a.http_listen == "127.0.0.1:7443"
    assert config.a2a.default_capability == "text.echo@^1"
    assert config.upstreams[0].skills[0].capability == "legacy.echo"
    assert config.console is not None
    assert config.push.enabled
