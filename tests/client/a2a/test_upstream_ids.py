"""Which message and context ids a caller's message carries to an upstream (``upstream_ids``)."""

from __future__ import annotations

import pytest

from gateway.client.a2a import upstream_ids
from gateway.client.a2a.upstream_ids import MAX_ID_CHARS, UpstreamIds

ALICE, CAROL = "spiffe://example.org/agent/alice", "spiffe://example.org/agent/carol"


def test_a_callers_message_id_is_sent_as_it_is() -> None:
    ids = UpstreamIds()
    assert ids.message_id(ALICE, "tck-complete-task-1") == "tck-complete-task-1"
    assert ids.message_id(ALICE, "tck-complete-task-1") == "tck-complete-task-1"  # its own again


def test_another_callers_same_id_keeps_it_as_a_prefix_and_differs() -> None:
    ids = UpstreamIds()
    ids.message_id(ALICE, "m-1")
    first, second = ids.message_id(CAROL, "m-1"), ids.message_id(CAROL, "m-1")
    assert first.startswith("m-1:") and len(first) == len("m-1:") + 16
    assert first != second != "m-1"
    assert ids.message_id(ALICE, "m-1") == "m-1"  # the first sender keeps it


def test_a_suffixed_id_is_at_most_128_characters() -> None:
    ids = UpstreamIds()
    long = "x" * MAX_ID_CHARS
    ids.message_id(ALICE, long)
    other = ids.message_id(CAROL, long)
    assert len(other) == MAX_ID_CHARS and other.startswith("x" * 100)


def test_no_id_gets_a_new_one() -> None:
    ids = UpstreamIds()
    made = ids.message_id(ALICE, "")
    assert len(made) == 32 and made != ids.message_id(ALICE, "")


def test_only_the_latest_ids_are_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upstream_ids, "REMEMBERED_IDS", 2)
    ids = UpstreamIds()
    for message_id in ("a", "b", "c"):  # "a" is forgotten
        ids.message_id(ALICE, message_id)
    assert ids.message_id(CAROL, "a") == "a"
    assert ids.message_id(CAROL, "c") != "c"


def test_contexts_are_the_upstreams_per_caller_and_context() -> None:
    ids = UpstreamIds()
    assert ids.context_id(ALICE, "ctx") == ""  # never the caller's own text
    ids.remember_context(ALICE, "ctx", "up-1")
    assert ids.context_id(ALICE, "ctx") == "up-1"
    assert ids.context_id(CAROL, "ctx") == ""  # another caller's "ctx" is another context
    assert ids.context_id(ALICE, "other") == ""
    ids.remember_context(ALICE, "", "up-2")  # no caller context: nothing to keep
    assert ids.context_id(ALICE, "") == ""


@pytest.mark.parametrize("named", ["", "x" * 257, "a\nb"])
def test_an_upstream_context_not_fit_to_send_again_is_not_kept(named: str) -> None:
    ids = UpstreamIds()
    ids.remember_context(ALICE, "ctx", named)
    assert ids.context_id(ALICE, "ctx") == ""


def test_only_the_latest_contexts_are_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upstream_ids, "REMEMBERED_CONTEXTS", 1)
    ids = UpstreamIds()
    ids.remember_context(ALICE, "one", "up-1")
    ids.remember_context(ALICE, "two", "up-2")
    assert (ids.context_id(ALICE, "one"), ids.context_id(ALICE, "two")) == ("", "up-2")
