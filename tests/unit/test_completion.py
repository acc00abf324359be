"""The completer finishes launched works in order off the engine thread; fusion buffers are pooled."""

from __future__ import annotations

import threading
import time

import torch

from torchring.runtime.dataplane.completion import Completer, Launched
from torchring.runtime.dataplane.executor import FusionBufferPool


class SlowWork:
    """Stands in for a c10d Work whose wait takes a while (no process group involved)."""

    def __init__(self, seconds: float, error: Exception | None = None) -> None:
        self.seconds = seconds
        self.error = error

    def wait(self) -> bool:
        time.sleep(self.seconds)
        if self.error is not None:  # a new error each time, as c10d raises: a failed work goes to the group
            raise type(self.error)(*self.error.args)  # reaper, and one referring to its own error never leaves it
        return True


def test_works_finish_in_launch_order_and_flush_waits_for_all():
    failures = []
    completer = Completer("test-completer", failures.append)
    finished = []
    completer.add(Launched(SlowWork(0.05), lambda: "first"), lambda result, error: finished.append(result))
    completer.add(Launched(SlowWork(0.0), lambda: "second"), lambda result, error: finished.append(result))
    completer.add(Launched.done("third"), lambda result, error: finished.append(result))
    completer.flush()
    assert finished == ["first", "second", "third"] and failures == []
    completer.add(Launched.done("inline"), lambda result, error: finished.append(result))
    assert finished[-1] == "inline"  # nothing ahead of it: finished at once
    completer.close()


def test_a_failed_work_reports_its_error_and_the_failure():
    failures = []
    completer = Completer("test-completer", failures.append)
    outcomes = []
    completer.add(Launched(SlowWork(0.0, RuntimeError("peer reset")), lambda: "never"),
                  lambda result, error: outcomes.append((result, str(error))))
    completer.flush()
    assert outcomes == [(None, "peer reset")]
    assert [str(f) for f in failures] == ["peer reset"]
    completer.close()


def test_fusion_buffers_are_reused_and_bounded():
    pool = FusionBufferPool(limit=2)
    like = torch.zeros(1)
    first = pool.acquire(like, 100)
    second = pool.acquire(like, 50)
    assert first.data_ptr() != second.data_ptr()
    pool.release(first)
    again = pool.acquire(like, 80)
    assert again.data_ptr() == first.data_ptr()  # the released buffer fits and is reused

    acquired = []
    waiter = threading.Thread(target=lambda: acquired.append(pool.acquire(like, 10)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not acquired  # two in use: the third waits
    pool.release(second)
    waiter.join(5)
    assert acquired and acquired[0].data_ptr() == second.data_ptr()


def test_a_too_small_free_buffer_is_replaced():
    pool = FusionBufferPool(limit=2)
    small = pool.acquire(torch.zeros(1, dtype=torch.float64), 10)
    pool.release(small)
    large = pool.acquire(torch.zeros(1, dtype=torch.float64), 1000)
    assert large.numel() == 1000 and large.dtype == torch.float64
    pool.release(large)
    assert pool.acquire(torch.zeros(1, dtype=torch.float64), 5).data_ptr() == large.data_ptr()
