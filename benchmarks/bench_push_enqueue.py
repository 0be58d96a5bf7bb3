"""What a task event costs with push notifications: off, on without a webhook, on with one.

Run ``python benchmarks/bench_push_enqueue.py`` (about half a minute).

Every event a background A2A task publishes goes through
``BackgroundTask.publish``, which calls the push notifier's hook when
``[push]`` is enabled. This script times, in one process and one run, the
publish of the same events (a status update, and a ~1 KB output artifact
update) for a run with no listener:

- ``off``: ``[push]`` not enabled (no hook);
- ``listener``: off, and one stream follows the run (for scale: what a stream costs);
- ``no-webhook``: enabled, the task has no webhook (the hook's dict lookup);
- ``webhook``: enabled, the task has one webhook: the hook queues the event
  in memory (the task path), and ``writer`` is what the background writer then
  spends per event, off the task path but on the same event loop (the
  ``StreamResponse`` JSON, and the batched SQLite commit in a thread, which
  ``synchronous=FULL`` fsyncs), here in large batches; ``commit-alone`` is the
  wall time from publish to committed for an event published alone (the fsync's
  latency, spent in a thread while the loop goes on).

The phases alternate over ``--rounds`` rounds and the median per event is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from a2a.types import a2a_pb2

from gateway.audit import AuditLog
from gateway.config import PushSettings
from gateway.push.notifier import PushNotifier
from gateway.push.store.sqlite import SqlitePushStore
from gateway.server.a2a.push_wire import ends_task, notification_body
from gateway.server.a2a.task_events import BackgroundTask, output_event, status_event
from gateway.server.a2a.task_store.store import A2ATask, TaskOutcome

OWNER = "spiffe://example.org/agent/bob"


def task(task_id: str) -> A2ATask:
    return A2ATask(
        task_id=task_id,
        owner=OWNER,
        context_id="ctx",
        state=TaskOutcome.COMPLETED,
        capability="text.echo",
        served_version="1.0.0",
        output=b'{"text":"' + b"x" * 1000 + b'"}',
        evidence_sha256="e" * 64,
        remembered=False,
        reason="OK",
        message="",
        created_ms=1,
        updated_ms=2,
    )


def run_of(task_id: str, notify: Callable[[str, str, a2a_pb2.StreamResponse], None] | None) -> Any:
    run = BackgroundTask(task(task_id), cast(Any, None))
    run.notify = notify
    return run


def per_event_ns(run: Any, events: list[a2a_pb2.StreamResponse], count: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(count // len(events)):
        for event in events:
            run.publish(event)
    return (time.perf_counter_ns() - started) / count


async def main(rounds: int, count: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-push-"))
    store = SqlitePushStore(folder / "push.sqlite")
    settings = PushSettings(enabled=True, max_pending_per_peer=1_000_000)
    notifier = PushNotifier(
        store, settings, cast(AuditLog, None), notification_body, lambda _e: False
    )
    notifier.follow("with-webhook", "hook", OWNER)
    sample = task("with-webhook")
    working = replace(sample, state=TaskOutcome.WORKING, message="halfway")
    events = [status_event(working), output_event(sample)]
    assert not any(ends_task(e) for e in events)
    results: dict[str, list[float]] = {
        name: [] for name in ("off", "listener", "no-webhook", "webhook", "writer", "commit-alone")
    }
    for _ in range(rounds):
        results["off"].append(per_event_ns(run_of("t", None), events, count))
        followed = run_of("t", None)
        listener = followed.listen()
        results["listener"].append(per_event_ns(followed, events, count // 20))
        del listener
        hooked = (run_of("t", notifier.event), run_of("with-webhook", notifier.event))
        results["no-webhook"].append(per_event_ns(hooked[0], events, count))
        results["webhook"].append(per_event_ns(hooked[1], events, count))
        started = time.perf_counter_ns()
        await notifier.flush()
        results["writer"].append((time.perf_counter_ns() - started) / count)
        alone = run_of("with-webhook", notifier.event)
        started = time.perf_counter_ns()
        for _ in range(20):
            alone.publish(events[0])
            await notifier.flush()
        results["commit-alone"].append((time.perf_counter_ns() - started) / 20)
    store.close()
    print(f"per event, median of {rounds} rounds of {count} events (status + 1 KB artifact):")
    for name, values in results.items():
        print(f"  {name:>12}: {statistics.median(values) / 1000:9.3f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--count", type=int, default=20_000)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.rounds, arguments.count))
