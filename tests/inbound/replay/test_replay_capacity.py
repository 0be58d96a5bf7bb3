"""A replay window that fills up refuses new calls; it never forgets an id within its window."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gateway.client.peer_client import PeerClient
from gateway.config import load_agent_config
from gateway.errors import AgentConfigError, GatewayError, StateUnavailable
from gateway.transport.status import from_rpc_error
from gateway.wire.v1 import gateway_pb2
from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    raw_invoke,
    standard_registry,
    started,
    write_policy,
)

MOST_CALLS = 6000  # the loop's bound: a 1024-id window fills long before this


async def test_a_full_window_refuses_state_unavailable_and_runs_nothing(
    pki: Pki, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo", "notes.write"])])
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"replay_window_ids": 1024}
    )
    counter = WriteCounter()
    agent = await started(config, standard_registry(counter, config.state_dir))
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            accepted: list[str] = []
            refusal: GatewayError | None = None
            for n in range(MOST_CALLS):
                try:
                    await bob.invoke("text.echo", {"text": "x"}, request_id=f"id-{n}")
                except GatewayError as err:
                    refusal = err
                    break
                accepted.append(f"id-{n}")
            assert isinstance(refusal, StateUnavailable)
            assert len(accepted) >= 1024
            writes_before = counter.calls
            crowded = f"id-{len(accepted)}"  # refused, so not stored: its slots are still full
            err = await raw_invoke(  # a write with it is refused before it runs
                pki,
                agent,
                "bob",
                gateway_pb2.InvokeRequest(
                    request_id=crowded, capability="notes.write", payload=b'{"note":"n"}'
                ),
            )
            assert err.code() is grpc.StatusCode.UNAVAILABLE
            assert from_rpc_error(err).reason == "STATE_UNAVAILABLE"
            assert counter.calls == writes_before
            for request_id in (accepted[0], accepted[len(accepted) // 2], accepted[-1]):
                with pytest.raises(GatewayError) as again:  # still remembered: never forgotten
                    await bob.invoke("text.echo", {"text": "x"}, request_id=request_id)
                assert again.value.reason == "REPLAYED_REQUEST"
        await agent.audit.flush()
        rows = audit_rows(agent.config.audit_db)
        full = [r for r in rows if r.reason == "STATE_UNAVAILABLE"]
        assert [r.request_id for r in full] == [crowded, crowded]
        assert all(r.decision == "refuse" for r in full)
        assert sum(r.reason == "OK" for r in rows) == len(accepted)
    finally:
        await agent.stop()


def test_the_window_size_is_validated_and_read_from_the_config_file(
    pki: Pki, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [])
    path = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=tmp_path / "a.sqlite",
        state_dir=tmp_path / "s",
    )
    text = path.read_text()
    assert load_agent_config(path).replay_window_ids == 2_097_152
    path.write_text("replay_window_ids = 4096\n" + text)
    assert load_agent_config(path).replay_window_ids == 4096
    path.write_text("replay_window_ids = 100\n" + text)
    with pytest.raises(AgentConfigError, match="replay_window_ids"):
        load_agent_config(path)
