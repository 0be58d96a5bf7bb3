"""PeerClient request ids: never repeated within a client or across clients, always valid."""

from __future__ import annotations

from gateway.client.peer_client import RequestIds
from gateway.inbound.call import REQUEST_ID


def test_ids_of_one_client_never_repeat_and_are_valid_request_ids() -> None:
    ids = RequestIds()
    drawn = [ids.next() for _ in range(20000)]
    assert len(set(drawn)) == len(drawn)
    assert all(REQUEST_ID.fullmatch(each) for each in drawn)


def test_two_clients_draw_different_prefixes() -> None:
    first, second = RequestIds(), RequestIds()
    one, other = first.next(), second.next()
    assert one != other
    assert one.split("-")[0] != other.split("-")[0]
    assert len(one.split("-")[0]) == 16
