"""The services of an agent, in the order they start; they stop in reverse.

Read from the bottom up, the list is the order of a graceful stop, and each
place in it keeps a promise:

1. health says NOT_SERVING (and ``/readyz`` "stopping") before anything else
   stops, then the console goes, then gRPC health says NOT_SERVING for good;
2. running plan tasks are interrupted (they stay resumable), running A2A
   tasks end ``FAILED`` (``TASK_INTERRUPTED``) with their streams, while the
   servers still carry those streams;
3. the watchers and the purge and flush loops end;
4. the HTTPS and gRPC servers stop; calls still running after the grace are
   cancelled, and the agent waits for them: each queues its audit record
   (``CANCELLED``) as it unwinds, before the log closes;
5. the counted limit refusals are written; queued push notifications are
   committed and deliveries under way get the grace to finish (a cut one is
   attempted again after a restart); the A2A task store is flushed;
6. the MCP upstreams close (stdio servers are stopped), the peer and
   upstream clients close, then the audit log (everything
   queued is committed), then, with the resources, the state stores and
   telemetry (``/metrics`` answers until then).

A service that is not configured (no ``[a2a] http_listen``, no console, no
Workload API) is not in the list. Starting follows the same list from the
top: nothing serves before the audit log is open, the replay window reloaded,
orphaned A2A tasks ended and the MCP upstreams' tools listed and registered.
"""

from __future__ import annotations

import asyncio
from functools import partial

from gateway.identity import keep_keys_fresh, load_keys
from gateway.outbound.mcp_upstream_capabilities import register_mcp_upstreams
from gateway.runtime.checkpoint_signing import keep_signer_certificate
from gateway.runtime.parts import Parts
from gateway.runtime.service_stack import BackgroundLoop, Service, Step
from gateway.runtime.upkeep import (
    flush_all_refusals,
    flush_refusals_periodically,
    purge_completed_keys,
    purge_periodically,
    remember_recent_request_ids,
)


def agent_services(
    parts: Parts, *, watch_policy: bool = True, watch_tls: bool = True
) -> list[Service]:
    """Every service of ``parts`` in start order.

    Args:
        parts: The composed agent.
        watch_policy: Poll the policy file and reload it when it changes.
        watch_tls: Poll the certificate files and reload them when they change.
    """
    config, handler = parts.config, parts.handler
    services: list[Service] = [
        # Its listener closes with the telemetry, after everything else (see resources).
        Step("metrics endpoint", parts.telemetry.start),
        Step("audit log", partial(_open_audit, parts), partial(_close_audit, parts)),
        Step("peer clients", on_stop=partial(_close_clients, parts)),
        Step("replay window", partial(_reload_replay_window, parts)),
        Step("idempotency purge", partial(purge_completed_keys, config, parts.idempotency)),
        Step("A2A task recovery", partial(_recover_a2a, parts), partial(_flush_a2a, parts)),
        *([_push_deliveries(parts)] if parts.push is not None else []),
        Step("limit refusal log", on_stop=partial(_flush_refusals, parts)),
    ]
    if parts.workload_api is not None:
        services.append(_workload_api_feed(parts))
    tokens = handler.pipeline.tokens
    if tokens is not None:
        services.append(Step("token issuers' keys", partial(load_keys, tokens)))
    if parts.mcp_upstreams:
        services.append(
            Step("MCP upstreams", partial(_start_mcp_upstreams, parts), partial(_close_mcp, parts))
        )
    services += [
        Step("calls in flight", on_stop=handler.wait_running),
        parts.grpc,
        *([parts.https] if parts.https is not None else []),
        *([parts.mcp] if parts.mcp is not None else []),
        Step("public card", partial(_invalidate_card, parts)),  # the ports are known now
    ]
    if watch_policy:
        services.append(BackgroundLoop("policy watcher", parts.policies.watch))
    if watch_tls:
        services.append(BackgroundLoop("certificate watcher", parts.live_tls.watch))
    if tokens is not None:
        services.append(BackgroundLoop("token keys refresh", partial(keep_keys_fresh, tokens)))
    services += [
        BackgroundLoop(
            "idempotency purge loop", partial(purge_periodically, config, parts.idempotency)
        ),
        BackgroundLoop(
            "limit refusal flush loop", partial(flush_refusals_periodically, handler.limit_refusals)
        ),
        Step("A2A runs", on_stop=partial(_interrupt_a2a_runs, parts)),
        Step("plans", on_stop=partial(_interrupt_plans, parts)),
        Step("serving status", on_stop=partial(_not_serving_for_good, parts)),
    ]
    if parts.console is not None:
        services.append(Step("console", parts.console.start, partial(_stop_console, parts)))
    services.append(Step("health", partial(_publish_health, parts), partial(_stop_health, parts)))
    return services


async def _open_audit(parts: Parts) -> None:
    if parts.checkpoints is not None:  # before the first checkpoint it signs
        keep_signer_certificate(parts.config, parts.live_tls.current)
    await parts.audit.start()


async def _close_audit(parts: Parts, _grace: float) -> None:
    await parts.audit.close()


async def _close_clients(parts: Parts, _grace: float) -> None:
    await parts.clients.close()
    for upstream in parts.upstreams:
        await upstream.close()


async def _start_mcp_upstreams(parts: Parts) -> None:
    """Connect every MCP upstream, pin its listed tools and register them, before serving."""
    try:
        await asyncio.gather(*(upstream.start() for upstream in parts.mcp_upstreams))
        register_mcp_upstreams(parts.registry, parts.mcp_upstreams)
    except BaseException:
        await _close_mcp(parts, 0.0)  # a start that fails leaves no server process behind
        raise
    parts.telemetry.metrics.label_capabilities(cap.name for cap in parts.registry)


async def _close_mcp(parts: Parts, _grace: float) -> None:
    await asyncio.gather(*(upstream.close() for upstream in parts.mcp_upstreams))


async def _reload_replay_window(parts: Parts) -> None:
    await asyncio.to_thread(remember_recent_request_ids, parts.config, parts.replay)


async def _recover_a2a(parts: Parts) -> None:
    await parts.a2a_runs.recover()  # orphans of an earlier run end FAILED before serving
    parts.a2a_runs.start_upkeep()


async def _flush_a2a(parts: Parts, _grace: float) -> None:
    await parts.a2a_runs.shutdown()  # done already, unless a start failed before "A2A runs"
    await parts.a2a_tasks.flush()


def _push_deliveries(parts: Parts) -> Step:
    push = parts.push
    assert push is not None
    # Stops after the A2A runs ended (their last events are queued) and before the
    # audit log closes (every attempt is recorded).
    return Step("push deliveries", push.start, push.stop)


async def _flush_refusals(parts: Parts, _grace: float) -> None:
    flush_all_refusals(parts.handler.limit_refusals)


def _workload_api_feed(parts: Parts) -> Step:
    feed = parts.workload_api
    assert feed is not None

    async def start() -> None:
        feed.start(parts.live_tls)

    async def stop(_grace: float) -> None:
        await feed.stop()

    return Step("Workload API feed", start, stop)


async def _invalidate_card(parts: Parts) -> None:
    parts.public_card.invalidate()


async def _interrupt_a2a_runs(parts: Parts, _grace: float) -> None:
    await parts.a2a_runs.shutdown()


async def _interrupt_plans(parts: Parts, _grace: float) -> None:
    await parts.plans.shutdown()


async def _not_serving_for_good(parts: Parts, _grace: float) -> None:
    await parts.grpc.enter_shutdown()


async def _stop_console(parts: Parts, _grace: float) -> None:
    if parts.console is not None:
        await parts.console.stop()


async def _publish_health(parts: Parts) -> None:
    parts.health.start()
    parts.status.started = True


async def _stop_health(parts: Parts, _grace: float) -> None:
    parts.status.stopping = True
    await parts.health.stop()
