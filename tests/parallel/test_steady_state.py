"""The steady state settled by the probe (``runtime.coordination.cycles``): same results, same checks."""

import time

import pytest
import torch

import torchring as hvd
from torchring import settings
from torchring.runtime import context


def _exchange():
    return context.current().engine._cycles


def _steady_loop(rank, size, steps=20):
    for step in range(steps):
        total = hvd.allreduce(torch.full((4,), float(rank + step)), name="steady.loop", op=hvd.Sum)
        assert torch.equal(total, torch.full((4,), float(sum(range(size)) + size * step)))


def test_a_loop_of_cached_requests_is_settled_by_the_probe(rank, size):
    if not settings.read("CONTROL_PROBE"):
        pytest.skip("TORCHRING_CONTROL_PROBE=0 (test_parallel_suite runs this file with the default too)")
    before = _exchange().settled_cycles
    _steady_loop(rank, size)
    assert _exchange().settled_cycles > before


def test_a_mismatch_after_the_steady_state_still_raises_on_every_rank(rank, size):
    _steady_loop(rank, size, steps=5)
    with pytest.raises(hvd.HorovodInternalError, match="steady.loop"):
        hvd.allreduce(torch.ones(4 + (rank == 1)), name="steady.loop")
    _steady_loop(rank, size, steps=5)  # the job carries on, and settles again
    assert _exchange().probing or _exchange().exchanges > 0


def test_a_cached_request_some_ranks_announce_late_still_completes(rank, size):
    _steady_loop(rank, size, steps=3)
    for _ in range(3):
        handles = []
        if rank == 0:
            handles.append(hvd.allreduce_async(torch.ones(2), name="steady.late", op=hvd.Sum))
        else:
            time.sleep(0.05)  # rank 0's request is pending alone for a few cycles
            handles.append(hvd.allreduce_async(torch.ones(2), name="steady.late", op=hvd.Sum))
        assert torch.equal(hvd.synchronize(handles[0]), torch.full((2,), float(size)))


def test_grouped_cached_requests_are_released_together(rank, size):
    for _ in range(4):
        outputs = hvd.grouped_allreduce([torch.full((3,), float(rank)), torch.ones(2)], name="steady.group",
                                        op=hvd.Sum)
        assert torch.equal(outputs[0], torch.full((3,), float(sum(range(size)))))
        assert torch.equal(outputs[1], torch.full((2,), float(size)))
