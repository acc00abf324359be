"""Waking idle engines through a real TCPStore (``runtime.coordination.wakeup``): a wake-up is set in the
store, reaches a listener, and a store that is gone makes the wake-up raise; a listener left on an epoch
nobody woke is released when it listens again; a deferred wake-up is paid only when the collective (a real
Gloo allreduce of two ranks, run here on two threads) waits for a peer; keys go key_history epochs later."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.gloo_pair import two_rank_groups
from tests.ports import free_port
from torchring.runtime.coordination.wakeup import DeferredWake, StoreWaker
from torchring.runtime.startup import discard_store_client

TIMEOUT = timedelta(seconds=10)


@pytest.fixture
def store():
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    yield port, dist.PrefixStore("job/wake/", server)  # the keys as the wakers of a job's ranks name them
    for role in ("wake-setter", "wake-listener"):
        discard_store_client("127.0.0.1", port, role)


def test_every_wake_up_is_set_in_the_store(store) -> None:
    port, server = store
    waker = StoreWaker("127.0.0.1", port, "job/wake/", TIMEOUT)
    waker.wake(3)
    server.wait(["3"], timedelta(seconds=10))
    for epoch in range(4, 40):
        waker.wake(epoch)
    waker.close()
    # a set is not answered, so another client's check may overtake the last sets: wait for every key
    # (a key never set fails the test with the store's timeout)
    server.wait([str(epoch) for epoch in range(4, 40)], timedelta(seconds=10))
    assert server.check([str(epoch) for epoch in range(3, 40)])


def test_a_listener_hears_a_wake_up_set_by_another_rank(store) -> None:
    port, server = store
    waker = StoreWaker("127.0.0.1", port, "job/wake/", TIMEOUT)
    heard: list[int] = []
    woken = threading.Event()
    waker.listen(7, lambda epoch: (heard.append(epoch), woken.set()))
    server.set("7", "1")  # what another rank's waker writes
    assert woken.wait(10)
    assert heard == [7]
    waker.close()


def test_a_store_that_is_gone_makes_a_wake_up_raise() -> None:
    port = free_port()
    serving = subprocess.Popen([sys.executable, "-c", (
        "import sys, datetime, torch.distributed as dist\n"
        f"store = dist.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False)\n"
        "print('ready', flush=True)\nsys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert serving.stdout.readline().strip() == "ready"
        waker = StoreWaker("127.0.0.1", port, "job/wake/", TIMEOUT)
        serving.kill()
        serving.wait()
        deadline = time.monotonic() + 30
        with pytest.raises(Exception):  # noqa: B017, PT011 - c10d's error type differs between torch versions
            while time.monotonic() < deadline:  # a write may still be buffered before the closed socket is seen
                waker.wake(1)
        waker.close()
    finally:
        serving.kill()
        for role in ("wake-setter", "wake-listener"):
            discard_store_client("127.0.0.1", port, role)


def _eventually(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_listener_left_on_an_epoch_nobody_woke_is_released_when_it_listens_again(store) -> None:
    port, server = store
    waker = StoreWaker("127.0.0.1", port, "job/wake/", TIMEOUT, key_history=2)
    heard: list[int] = []
    woken = threading.Event()
    waker.listen(4, heard.append)  # every rank left epoch 4 on its own: nobody sets its key
    waker.listen(5, lambda epoch: (heard.append(epoch), woken.set()))
    server.set("5", "1")  # another rank wakes epoch 5
    assert woken.wait(10)
    assert heard == [5]  # the release of epoch 4 is not a wake-up
    assert server.check(["4"])  # its key stays for key_history epochs (a late listener may still need it)
    waker.listen(6, heard.append)
    assert _eventually(lambda: not server.check(["4"]))  # and then goes
    waker.close()


def test_a_late_listener_skips_an_epoch_released_before_it_got_there(store) -> None:
    """The listener thread reaches epoch 4 only after its engine listened on 5 (releasing 4) and a peer
    deleted key 4: it must not wait on that key (nobody sets it again) but go on to epoch 5."""
    port, server = store
    waker = StoreWaker("127.0.0.1", port, "job/wake/", TIMEOUT)
    in_callback, go_on, woken = threading.Event(), threading.Event(), threading.Event()
    heard: list[int] = []
    waker.listen(3, lambda epoch: (in_callback.set(), go_on.wait(10)))
    server.set("3", "1")
    assert in_callback.wait(10)  # the listener thread is busy: it gets to the next epochs late
    waker.listen(4, heard.append)
    waker.listen(5, lambda epoch: (heard.append(epoch), woken.set()))  # releases 4: sets its key
    server.delete_key("4")  # a peer cleaned it up meanwhile
    go_on.set()
    server.set("5", "1")
    assert woken.wait(10), "the listener is stuck on the released epoch 4"
    assert heard == [5]
    started = time.monotonic()
    waker.close()
    assert time.monotonic() - started < 5


def _two_rank_allreduce(port: int, late_s: float, wake: DeferredWake) -> None:
    """Rank 0 awaits an allreduce through ``wake`` (which owes epoch 9); rank 1 joins it ``late_s`` later."""
    groups = two_rank_groups(port, TIMEOUT)
    tensors = [torch.ones(4), torch.ones(4)]
    late = threading.Thread(target=lambda: (time.sleep(late_s), groups[1].allreduce([tensors[1]]).wait()))
    late.start()
    wake.owe(9)
    wake.await_work(groups[0].allreduce([tensors[0]]))
    late.join()
    assert tensors[0].tolist() == [2.0] * 4


def test_a_deferred_wake_up_is_paid_when_the_peer_is_late_and_its_key_goes_after(store) -> None:
    port, server = store
    waker = StoreWaker("127.0.0.1", port, "job/wake/", TIMEOUT, key_history=1)
    peer = StoreWaker("127.0.0.1", port, "job/wake/", TIMEOUT)
    woken = threading.Event()
    peer.listen(9, lambda epoch: woken.set())  # an idle peer, listening
    _two_rank_allreduce(port, 0.3, DeferredWake(waker, grace_s=0.01))
    assert woken.wait(10)  # paid: the peer heard epoch 9
    waker.listen(10, lambda epoch: None)  # the listener thread deletes the keys older than key_history
    assert _eventually(lambda: not server.check(["9"]))
    waker.close()
    peer.close()


def test_a_deferred_wake_up_is_not_paid_when_the_peers_join_in_time(store) -> None:
    port, server = store
    waker = StoreWaker("127.0.0.1", port, "job/wake/", TIMEOUT)
    _two_rank_allreduce(port, 0.0, DeferredWake(waker, grace_s=5.0))
    assert not server.check(["9"])
    waker.close()
