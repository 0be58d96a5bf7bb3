"""ListTasks as the official JavaScript SDK (@a2a-js/sdk) sees it, on all three bindings.

Each binding gets a context of its own holding three of bob's tasks: A
(``job.watch``, started first with ``returnImmediately``), then B and C
(``text.echo``, completed), then A cancelled, so A changed last. bob lists the
context two tasks a page (tests/interop/node-a2a/probe_list_tasks.mjs, against
``a2a-gateway serve`` with mTLS). The A2A 1.0 specification, 3.1.4 List Tasks:
"Tasks MUST be sorted by last update time in descending order", and
``ListTasksResponse.page_size`` is "the page size used for this response"
(its examples answer ``pageSize: 10`` with one task; a2a-sdk's own task stores
answer the page size asked for, not the number of tasks on the page).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.agents import Pki, spiffe
from tests.helpers.node_projects import A2A_JS, node_ready
from tests.helpers.served_agent import Served, serve_alice

NODE_DIR = A2A_JS
BINDINGS = ("JSONRPC", "HTTP+JSON", "GRPC")
BOB = spiffe("bob")


@pytest.fixture(scope="module")
def served(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serve_alice(
        pki,
        tmp_path_factory.mktemp("probe-list"),
        bob_may=["text.echo@^1", "job.watch"],
        bob_cap=1024,
        compat=None,
        modules=("tests.helpers.task_capabilities",),
    )


@pytest.fixture(scope="module")
def listed(pki: Pki, served: Served, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node_ready(NODE_DIR, "@a2a-js/sdk")
    config = tmp_path_factory.mktemp("probe-list-js") / "config.json"
    config.write_text(
        json.dumps(
            {
                "https_url": served.process.https_url,
                "server_id": spiffe("alice"),
                "ca": str(pki.dir / "ca.pem"),
                "cert": str(pki.dir / "bob.pem"),
                "key": str(pki.dir / "bob.key"),
            }
        )
    )
    result = subprocess.run(
        ["node", str(NODE_DIR / "probe_list_tasks.mjs"), str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=NODE_DIR,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answer: dict[str, Any] = json.loads(result.stdout)
    for binding in BINDINGS:
        got = answer[binding]
        assert "error" not in got, got
        assert got["transport"] == binding
        assert got["states"] == [5, 3, 3]  # A CANCELED, B and C COMPLETED
    return answer


@pytest.mark.parametrize("binding", BINDINGS)
def test_list_tasks_is_sorted_by_last_update_newest_first(
    listed: dict[str, Any], binding: str
) -> None:
    got = listed[binding]
    ids = [task_id for page in got["pages"] for task_id in page["ids"]]
    # A was cancelled after C completed, and C after B: A, C, B.
    assert ids == [got["a"], got["c"], got["b"]], got


@pytest.mark.parametrize("binding", BINDINGS)
def test_list_tasks_answers_the_page_size_it_used(listed: dict[str, Any], binding: str) -> None:
    got = listed[binding]
    assert [(len(p["ids"]), p["pageSize"], p["totalSize"], p["more"]) for p in got["pages"]] == [
        (2, 2, 3, True),
        (1, 2, 3, False),  # the last page: one task, listed with the page size asked for
    ], got


def test_listing_leaves_the_audit_log_as_the_calls_made_it(
    listed: dict[str, Any], served: Served
) -> None:
    """No side effect: the six echoes and three cancels (and carol's echo), no refusal."""
    expected = Counter(
        {
            (BOB, "text.echo", "allow", "OK"): 6,
            (BOB, "job.watch", "allow", "CANCELLED"): 3,
            (spiffe("carol"), "text.echo", "allow", "OK"): 1,
        }
    )
    assert served.records_once_committed(expected) == expected
