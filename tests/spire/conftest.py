"""One SPIRE deployment for the module: two trust domains, federated, three spire-agents.

- ``example.org``: spire-server, spire-agents ``alice-node`` and ``bob-node``;
  entries ``agent/alice`` (also federates with ``other.test``) and ``agent/bob``,
  each parented to its own node, so each socket hands out one SVID.
- ``other.test``: spire-server, spire-agent ``dave-node``; entry ``agent/dave``,
  federated with ``example.org``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.agents import spiffe
from tests.helpers.spire_lab import (
    DAVE,
    OTHER_DOMAIN,
    Spire,
    SpireLab,
    spire_bin,
)


@pytest.fixture(scope="module")
def spire() -> Iterator[Spire]:
    lab = SpireLab(spire_bin())
    try:
        server, other = lab.server("example.org"), lab.server(OTHER_DOMAIN)
        server.federate_with(other)
        other.federate_with(server)
        alice_node, bob_node = lab.agent(server, "alice-node"), lab.agent(server, "bob-node")
        dave_node = lab.agent(other, "dave-node")
        server.register(alice_node.node_id, spiffe("alice"), federates_with=(OTHER_DOMAIN,))
        server.register(bob_node.node_id, spiffe("bob"))
        other.register(dave_node.node_id, DAVE, federates_with=("example.org",))
        yield Spire(lab, server, other, alice_node, bob_node, dave_node)
    finally:
        lab.close()
