"""Waking idle engines through a real TCPStore (``runtime.coordination.wakeup``): a wake-up is set in the
store, reaches a listener, and a store that is gone makes the wake-up raise."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from tests.ports import free_port
from torchring.runtime.coordination.wakeup import StoreWaker
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
    assert server.check([str(epoch) for epoch in range(4, 40)])


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
