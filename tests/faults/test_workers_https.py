"""``workers = 2`` with ``[a2a] http_listen``: both workers serve the one HTTPS port.

The agent runs as ``serve`` (a supervisor and two worker processes on one
SQLite state dir). Every new connection lands on either worker (the kernel
spreads them); ``worker.pid`` (tests.faults.worker_pid) over JSON-RPC says
which. A client of one kept-alive connection stays on its worker, so a task
started through one client is read, listed, followed and cancelled through a
client of the other worker, on JSON-RPC and on HTTP+JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from policies.identity import svid_dns_name
from tests.a2a_http_support import (
    V1_HEADERS,
    client_context,
    https_certificate,
    jsonrpc,
    message_params,
)
from tests.agent_process import AgentProcess, Launcher, worker_pids, write_agent_toml
from tests.support import Pki, audit_rows, grant, spiffe, write_policy

MAX_CONNECTIONS = 48  # fresh connections opened to reach a worker (a bound, never asserted)
FRESH_CALLS = 24  # per binding, each on a connection of its own
ANSWERED_ROUNDS = 30  # when written in the background, about one in eight was not there yet
POLL_ROUNDS = 400  # x 0.05 s: a bound for a slow runner, never asserted
SSE_HEADERS = {**V1_HEADERS, "Accept": "text/event-stream"}
BINDINGS = ["jsonrpc", "rest"]
BOB = spiffe("bob")


def _agent(pki: Pki, tmp_path: Path, launch: Launcher | None = None) -> AgentProcess:
    """alice as ``workers = 2`` serving HTTPS on ``localhost:0``; bob may run the job tasks."""
    grants = [grant("bob", ["worker.pid", "text.echo", "job.hang", "job.pause"])]
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "policy.toml", grants),
        audit_db=tmp_path / "audit.sqlite",
        state_dir=tmp_path / "state",
        modules=("tests.task_capabilities", "tests.faults.worker_pid"),
    )
    cert, key = https_certificate(pki, "alice", tmp_path / "tls")  # names localhost too
    text = config.read_text()
    text = text.replace(str(pki.dir / "alice.pem"), str(cert))
    text = text.replace(str(pki.dir / "alice.key"), str(key))
    config.write_text(f'workers = 2\n{text}\n[a2a]\nhttp_listen = "localhost:0"\n')
    return AgentProcess(config) if launch is None else AgentProcess(config, launch)


def _client(pki: Pki, caller: str | None = "bob") -> httpx.AsyncClient:
    """A client of one connection at a time, kept alive between its requests: one worker."""
    return httpx.AsyncClient(
        verify=client_context(pki, caller),
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        timeout=60.0,
    )


async def _pid(client: httpx.AsyncClient, url: str) -> int:
    """The pid of the worker that answers ``worker.pid`` on ``client``'s connection."""
    body = jsonrpc("SendMessage", message_params("worker.pid", {}))
    answer = await client.post(url + JSONRPC_PATH, json=body, headers=V1_HEADERS)
    assert answer.status_code == 200, answer.text
    task = answer.json()["result"]["task"]
    return int(task["artifacts"][0]["parts"][0]["data"]["pid"])


async def _clients_per_worker(
    pki: Pki, url: str, opened: list[httpx.AsyncClient], each: int
) -> dict[int, list[httpx.AsyncClient]]:
    """New clients until every worker has ``each`` of them: {pid: clients}."""
    by_pid: dict[int, list[httpx.AsyncClient]] = {}
    for _ in range(MAX_CONNECTIONS):
        client = _client(pki)
        opened.append(client)
        by_pid.setdefault(await _pid(client, url), []).append(client)
        if len(by_pid) == 2 and all(len(found) >= each for found in by_pid.values()):
            break
    return by_pid


async def _unary(
    client: httpx.AsyncClient, url: str, binding: str, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    """One unary A2A call on ``binding``; its result (JSON-RPC) or body (HTTP+JSON)."""
    if binding == "jsonrpc":
        response = await client.post(
            url + JSONRPC_PATH, json=jsonrpc(method, params), headers=V1_HEADERS
        )
    elif method == "SendMessage":
        response = await client.post(
            url + REST_PATH + "/message:send", json=params, headers=V1_HEADERS
        )
    elif method == "GetTask":
        response = await client.get(f"{url}{REST_PATH}/tasks/{params['id']}", headers=V1_HEADERS)
    elif method == "CancelTask":
        path = f"{url}{REST_PATH}/tasks/{params['id']}:cancel"
        response = await client.post(path, json={}, headers=V1_HEADERS)
    else:
        assert method == "ListTasks"
        response = await client.get(url + REST_PATH + "/tasks", headers=V1_HEADERS)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    if binding == "jsonrpc":
        assert "error" not in body, body
        body = body["result"]
    return body


async def _events(
    client: httpx.AsyncClient, url: str, binding: str, method: str, params: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    """The events of a SendStreamingMessage or SubscribeToTask on ``binding``."""
    if binding == "jsonrpc":
        target, body = url + JSONRPC_PATH, jsonrpc(method, params, 7)
    elif method == "SendStreamingMessage":
        target, body = url + REST_PATH + "/message:stream", params
    else:
        target, body = f"{url}{REST_PATH}/tasks/{params['id']}:subscribe", {}
    async with client.stream("POST", target, json=body, headers=SSE_HEADERS) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                event: dict[str, Any] = json.loads(line[5:])
                yield event["result"] if binding == "jsonrpc" else event


def _state(event: dict[str, Any]) -> str:
    """The task state an event carries (the task's, or its status update's)."""
    status = (event.get("task") or event.get("statusUpdate") or {}).get("status", {})
    return str(status.get("state", "")).removeprefix("TASK_STATE_")


def _background(capability: str, tag: str) -> dict[str, Any]:
    params = message_params(capability, {"tag": tag})
    params["configuration"] = {"returnImmediately": True}
    return params


async def _close(opened: list[httpx.AsyncClient]) -> None:
    for client in opened:
        await client.aclose()


async def test_fresh_connections_reach_both_workers_on_both_bindings(
    pki: Pki, tmp_path: Path
) -> None:
    agent = _agent(pki, tmp_path)
    opened: list[httpx.AsyncClient] = []
    try:
        agent.start()
        url = agent.https_url
        assert url.startswith("https://localhost:")  # said once, by the supervisor
        workers = worker_pids(agent)
        served: dict[str, list[int]] = {binding: [] for binding in BINDINGS}
        for binding in BINDINGS:
            for _ in range(FRESH_CALLS):
                async with _client(pki) as client:  # a new connection for each call
                    body = await _unary(
                        client, url, binding, "SendMessage", message_params("worker.pid", {})
                    )
                served[binding].append(int(body["task"]["artifacts"][0]["parts"][0]["data"]["pid"]))
        # Both workers list the one port on their cards, anonymous and extended.
        by_pid = await _clients_per_worker(pki, url, opened, 1)
        cards = {}
        for pid, (client, *_) in by_pid.items():
            public = (await client.get(url + "/.well-known/agent-card.json")).json()
            extended = await _unary(client, url, "jsonrpc", "GetExtendedAgentCard", {})
            assert await _pid(client, url) == pid  # the same connection all along
            cards[pid] = (public["supportedInterfaces"], extended["supportedInterfaces"])
        await _close(opened)
        assert agent.terminate() == 0
    finally:
        await _close(opened)
        agent.ensure_stopped()
    for binding in BINDINGS:  # the kernel spread the connections of each binding
        assert set(served[binding]) == set(workers), binding
    assert sorted(cards) == sorted(workers)
    first, second = cards.values()
    assert first == second
    listed = {entry["url"] for entry in first[0]}
    assert {url + JSONRPC_PATH, url + REST_PATH} <= listed
    rows = audit_rows(tmp_path / "audit.sqlite")
    pid_calls = [r for r in rows if r.capability == "worker.pid"]
    assert len(pid_calls) == 2 * FRESH_CALLS + len(opened) + len(cards)  # and one more each
    assert {(r.decision, r.reason) for r in pid_calls} == {("allow", "OK")}


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_task_run_by_one_worker_is_read_followed_and_cancelled_through_the_other(
    pki: Pki, tmp_path: Path, binding: str
) -> None:
    agent = _agent(pki, tmp_path)
    opened: list[httpx.AsyncClient] = []
    try:
        agent.start()
        url = agent.https_url
        by_pid = await _clients_per_worker(pki, url, opened, 2)
        workers = worker_pids(agent)
        assert sorted(by_pid) == sorted(workers)
        runner = by_pid[workers[0]][0]
        follower, other = by_pid[workers[1]][:2]

        # A blocking call answered by one worker is there for the other at once.
        echoed = await _unary(
            runner, url, binding, "SendMessage", message_params("text.echo", {"text": "hi"})
        )
        echo_id = echoed["task"]["id"]
        seen = await _unary(other, url, binding, "GetTask", {"id": echo_id})
        assert (seen["id"], _state({"task": seen})) == (echo_id, "COMPLETED")
        assert seen["artifacts"] == echoed["task"]["artifacts"]

        # A background task on the runner: polled, followed and cancelled on the other.
        started = await _unary(runner, url, binding, "SendMessage", _background("job.hang", "x"))
        hang_id = started["task"]["id"]
        polled = await _unary(other, url, binding, "GetTask", {"id": hang_id})
        assert _state({"task": polled}) in {"SUBMITTED", "WORKING"}
        listed = await _unary(other, url, binding, "ListTasks", {})
        assert {echo_id, hang_id} <= {task["id"] for task in listed["tasks"]}  # and worker.pid's
        events = _events(follower, url, binding, "SubscribeToTask", {"id": hang_id})
        first = await anext(events)
        assert first["task"]["id"] == hang_id
        canceled = await _unary(other, url, binding, "CancelTask", {"id": hang_id})
        assert _state({"task": canceled}) == "CANCELED"
        rest = [event async for event in events]

        # A stream runs where it was sent; its task is there for the other worker.
        streamed = [
            event
            async for event in _events(
                other, url, binding, "SendStreamingMessage", message_params("job.pause", {})
            )
        ]
        paused_id = streamed[0]["task"]["id"]
        after = await _unary(runner, url, binding, "GetTask", {"id": paused_id})
        assert _state({"task": after}) == "COMPLETED"
        # Every client stayed on its worker.
        assert await _pid(runner, url) == workers[0]
        assert [await _pid(client, url) for client in (follower, other)] == [workers[1]] * 2
        await _close(opened)
        assert agent.terminate() == 0
    finally:
        await _close(opened)
        agent.ensure_stopped()
    states = [_state(event) for event in rest]
    assert states[-1] == "CANCELED"
    assert set(states[:-1]) <= {"WORKING"}  # a WORKING change, if it was seen
    assert rest[-1]["statusUpdate"]["status"]["message"]["metadata"]["a2agw.reason"] == "CANCELLED"
    assert [_state(event) for event in streamed][-1] == "COMPLETED"
    rows = audit_rows(tmp_path / "audit.sqlite")
    hang = [(r.decision, r.reason, r.detail) for r in rows if r.capability == "job.hang"]
    assert hang == [("allow", "CANCELLED", f"A2A CancelTask by {BOB}")]


async def test_a_task_one_worker_answered_is_there_on_the_other_when_answered(
    pki: Pki, tmp_path: Path
) -> None:
    agent = _agent(pki, tmp_path)
    opened: list[httpx.AsyncClient] = []
    try:
        agent.start()
        url = agent.https_url
        by_pid = await _clients_per_worker(pki, url, opened, 1)
        first, second = (clients[0] for clients in by_pid.values())
        found = []
        for n in range(ANSWERED_ROUNDS):  # each way in turn
            sender, reader = (first, second) if n % 2 else (second, first)
            params = message_params("text.echo", {"text": f"{n}"})
            task_id = (await _unary(sender, url, "jsonrpc", "SendMessage", params))["task"]["id"]
            answer = await reader.post(
                url + JSONRPC_PATH, json=jsonrpc("GetTask", {"id": task_id}), headers=V1_HEADERS
            )
            found.append(answer.json().get("result", {}).get("id") == task_id)
        await _close(opened)
        assert agent.terminate() == 0
    finally:
        await _close(opened)
        agent.ensure_stopped()
    assert found == [True] * ANSWERED_ROUNDS


async def test_a_worker_killed_mid_task_ends_it_interrupted_for_a_follower_on_the_other(
    pki: Pki, tmp_path: Path
) -> None:
    agent = _agent(pki, tmp_path)
    opened: list[httpx.AsyncClient] = []
    try:
        agent.start()
        url = agent.https_url
        by_pid = await _clients_per_worker(pki, url, opened, 1)
        victim, survivor = worker_pids(agent)
        assert sorted(by_pid) == sorted([victim, survivor])
        started = await _unary(
            by_pid[victim][0], url, "jsonrpc", "SendMessage", _background("job.hang", "k")
        )
        task_id = started["task"]["id"]
        events = _events(by_pid[survivor][0], url, "rest", "SubscribeToTask", {"id": task_id})
        first = await anext(events)
        assert _state(first) in {"SUBMITTED", "WORKING"}
        os.kill(victim, signal.SIGKILL)
        # The victim's lease runs out; a sibling's sweep (or its successor's) ends the task.
        rest = [event async for event in events]
        async with _client(pki) as client:  # whichever worker this lands on
            final = await _unary(client, url, "jsonrpc", "GetTask", {"id": task_id})
        assert agent.stdout is not None
        while len(worker_pids(agent)) < 3 and agent.stdout.next_line(60.0) is not None:
            pass  # the supervisor's line for the restarted worker
        assert len(worker_pids(agent)) == 3
        await _close(opened)
        assert agent.terminate() == 0
    finally:
        await _close(opened)
        agent.ensure_stopped()
    assert [_state(event) for event in rest][-1] == "FAILED"
    assert rest[-1]["statusUpdate"]["status"]["message"]["metadata"]["a2agw.reason"] == (
        "TASK_INTERRUPTED"
    )
    assert _state({"task": final}) == "FAILED"
    assert final["status"]["message"]["metadata"]["a2agw.reason"] == "TASK_INTERRUPTED"


def _serial(response: httpx.Response) -> int:
    """The serial of the certificate the server presented on ``response``'s connection."""
    ssl_object = response.extensions["network_stream"].get_extra_info("ssl_object")
    return x509.load_der_x509_certificate(ssl_object.getpeercert(binary_form=True)).serial_number


async def _serial_and_pid(pki: Pki, url: str) -> tuple[int, int]:
    """(served certificate serial, worker pid) of one call over a new connection."""
    async with _client(pki) as client:
        body = jsonrpc("SendMessage", message_params("worker.pid", {}))
        answer = await client.post(url + JSONRPC_PATH, json=body, headers=V1_HEADERS)
        pid = int(answer.json()["result"]["task"]["artifacts"][0]["parts"][0]["data"]["pid"])
        return _serial(answer), pid


async def test_every_worker_presents_a_rotated_certificate(pki: Pki, tmp_path: Path) -> None:
    agent = _agent(pki, tmp_path)
    try:
        agent.start()
        url, workers = agent.https_url, worker_pids(agent)
        cert_path = tmp_path / "tls" / "alice-https.pem"
        old = x509.load_pem_x509_certificate(cert_path.read_bytes()).serial_number
        before = {
            pid: serial for serial, pid in [await _serial_and_pid(pki, url) for _ in range(8)]
        }
        cert, key = pki.ca.mint(
            uris=[spiffe("alice")], dns_names=[svid_dns_name(spiffe("alice")), "localhost"]
        )
        (tmp_path / "tls" / "alice-https.key").write_bytes(key)
        cert_path.write_bytes(cert)
        new = x509.load_pem_x509_certificate(cert).serial_number
        assert agent.proc is not None
        os.kill(agent.proc.pid, signal.SIGHUP)  # the supervisor passes it to every worker
        after: dict[int, int] = {}
        for _ in range(POLL_ROUNDS):
            serial, pid = await _serial_and_pid(pki, url)
            after[pid] = serial
            if sorted(after) == sorted(workers) and set(after.values()) == {new}:
                break
            await asyncio.sleep(0.05)
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    assert set(before.values()) == {old}
    assert sorted(after) == sorted(workers) and set(after.values()) == {new}


FD_LIMIT = 256
"""The agent's descriptor limit in the budget test: 128 connections a worker, 32 anonymous."""
ANONYMOUS_PER_WORKER = FD_LIMIT // 2 // 4
ANONYMOUS_TRIED = 120  # each worker is offered at least its budget (all but surely)


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _launch_with_low_fd_limit(args: list[str], **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(args, text=True, preexec_fn=_low_fd_limit, **kw)


async def _anonymous_card_reader(url: str, context: ssl.SSLContext) -> asyncio.StreamWriter | None:
    """A connection without a certificate that read the public card (None: it was dropped)."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    try:
        reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
        writer.write(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: localhost\r\n\r\n")
        status = await asyncio.wait_for(reader.readline(), 20)
    except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
        return None
    if not status.startswith(b"HTTP/1.1 200"):
        writer.close()
        return None
    return writer  # kept alive: it holds its place


async def test_each_worker_holds_its_own_https_connection_budget(pki: Pki, tmp_path: Path) -> None:
    agent = _agent(pki, tmp_path, _launch_with_low_fd_limit)
    held: list[asyncio.StreamWriter] = []
    try:
        agent.start()
        context = client_context(pki, None)
        for _ in range(ANONYMOUS_TRIED):
            writer = await _anonymous_card_reader(agent.https_url, context)
            if writer is not None:
                held.append(writer)
        kept = len(held)
        for writer in held:
            writer.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    assert kept == 2 * ANONYMOUS_PER_WORKER  # one budget per worker, both full
