"""``runtime.startup``: store clients kept for the process, and the clock of ``init()``'s steps."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from tests.ports import free_port
from torchring.runtime.startup import StepClock, discard_store_client, store_client


def _server(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)


def test_a_client_is_handed_out_again_per_address_and_role():
    port = free_port()
    server = _server(port)
    first = store_client("127.0.0.1", port, timedelta(seconds=5))
    assert store_client("127.0.0.1", port, timedelta(seconds=5)) is first
    other_role = store_client("127.0.0.1", port, timedelta(seconds=5), role="listener")
    assert other_role is not first
    first.set("k", "v")
    assert server.get("k") == b"v"
    discard_store_client("127.0.0.1", port, "listener")
    assert store_client("127.0.0.1", port, timedelta(seconds=5), role="listener") is not other_role


def test_a_client_whose_server_is_gone_is_replaced_by_a_new_connection():
    port = free_port()
    server = _server(port)
    stale = store_client("127.0.0.1", port, timedelta(seconds=5))
    del server  # the server stops; a new one takes the port (a restarted launcher, an elastic re-init)
    server = _server(port)
    fresh = store_client("127.0.0.1", port, timedelta(seconds=5))
    assert fresh is not stale
    fresh.set("after", "1")
    assert server.get("after") == b"1"


def test_the_step_clock_adds_up_the_time_of_each_step_in_order():
    clock = StepClock()
    clock.lap("store")
    clock.lap("groups")
    clock.lap("store")
    assert list(clock.seconds) == ["store", "groups"]
    assert all(seconds >= 0 for seconds in clock.seconds.values())
    assert clock.summary().startswith("store ") and "total" in clock.summary()


def test_groups_are_not_counted_on_to_connect_lazily_where_the_program_turned_it_off(monkeypatch):
    from torchring.runtime.startup import lazy_connection_available

    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "0")
    assert not lazy_connection_available()
