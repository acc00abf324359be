"""An idle engine woken by another rank waits briefly for its own request (``Engine._await_own_request``):
the ranks run the same program, so the request is usually about to come, and a cycle entered empty
would cost every rank a second one. One process, the engine's own thread, a waker this test drives."""

import threading
import time

import pytest
import torch

import torchring as hvd
from torchring.runtime import context
from torchring.runtime.coordination.wakeup import Waker


class _DrivenWaker(Waker):
    """Records what the engine listens for; the test plays the rank that wakes it."""

    def __init__(self) -> None:
        self.listening = threading.Event()
        self.epoch = -1
        self.on_wake = None

    def listen(self, epoch, on_wake):
        self.epoch, self.on_wake = epoch, on_wake
        self.listening.set()

    def wake_from_another_rank(self):
        self.listening.clear()
        self.on_wake(self.epoch)


def _cycles(engine) -> int:
    return engine._cycles.settled_cycles + engine._cycles.exchanges


def _await(predicate, timeout: float = 10.0) -> None:
    """Poll ``predicate`` (engine state that no event announces) until it holds, at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the engine did not get there within 10 s"
        time.sleep(0.001)


@pytest.fixture
def idle_engine():
    """An initialised single-rank runtime whose engine is idle and listens on a waker the test drives."""
    hvd.init()
    engine = context.current().engine
    waker = _DrivenWaker()
    engine._waker = waker
    hvd.barrier()  # a cycle: the engine then goes idle and listens on the driven waker
    assert waker.listening.wait(10)
    yield engine, waker
    hvd.shutdown()


def test_a_woken_engine_with_nothing_queued_waits_for_its_own_request(idle_engine):
    engine, waker = idle_engine
    waiting = threading.Event()
    original = engine._await_own_request

    def noted():
        waiting.set()
        original()

    engine._await_own_request = noted
    engine._wake_grace_s = 60.0  # far longer than the test takes: only the request ends the wait
    before = _cycles(engine)
    waker.wake_from_another_rank()
    assert waiting.wait(10), "a woken engine with nothing queued did not wait for its own request"
    assert _cycles(engine) == before
    total = hvd.allreduce(torch.ones(3), name="grace.own", op=hvd.Sum)
    assert torch.equal(total, torch.ones(3))
    assert _cycles(engine) == before + 1, "the request should have gone out in the cycle the wake started"


def test_the_wait_ends_after_the_grace_when_this_rank_has_nothing(idle_engine):
    engine, waker = idle_engine
    engine._wake_grace_s = 0.01
    before = _cycles(engine)
    waker.wake_from_another_rank()
    _await(lambda: _cycles(engine) > before)  # an empty cycle, as the rank that woke it needs
    assert waker.listening.wait(10), "the engine should go idle again after the empty cycle"
    assert torch.equal(hvd.allreduce(torch.ones(2), name="grace.after", op=hvd.Sum), torch.ones(2))
