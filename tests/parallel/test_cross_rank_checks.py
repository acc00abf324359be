"""Ranks that disagree get a clear RuntimeError on every rank, and the job carries on."""

import time

import pytest
import torch

import torchring as hvd


def expect_mismatch(fn, *fragments):
    started = time.monotonic()
    with pytest.raises(RuntimeError) as error:
        fn()
    assert time.monotonic() - started < 10
    for fragment in fragments:
        assert fragment in str(error.value)
    assert isinstance(error.value, hvd.HorovodInternalError)
    # the next operation still works
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(hvd.size())))


def test_mismatched_shapes(rank):
    expect_mismatch(lambda: hvd.allreduce(torch.ones(4 + (rank == 1)), name="shape.check"),
                    "shape.check", "rank 1 sent [5]", "sent [4]")


def test_mismatched_dtypes(rank):
    dtype = torch.float64 if rank == 1 else torch.float32
    expect_mismatch(lambda: hvd.allreduce(torch.ones(3, dtype=dtype), name="dtype.check"),
                    "dtype.check", "float64", "float32")


def test_different_operations_may_share_a_name(rank, size):
    """As in Horovod, requests are named after their operation: allreduce 'x' and broadcast 'x' coexist."""
    reduced = hvd.allreduce_async(torch.full((3,), float(rank)), name="shared.name", op=hvd.Sum)
    broadcast = hvd.broadcast_async(torch.full((3,), float(rank)), 0, name="shared.name")
    assert torch.equal(hvd.synchronize(broadcast), torch.zeros(3))
    assert torch.equal(hvd.synchronize(reduced), torch.full((3,), float(sum(range(size)))))


def test_mismatched_reduction_ops(rank):
    op = hvd.Max if rank == 1 else hvd.Sum
    expect_mismatch(lambda: hvd.allreduce(torch.ones(3), op=op, name="redop.check"), "MAX", "SUM")


def test_mismatched_root_ranks(rank):
    root = 1 if rank == 1 else 0
    expect_mismatch(lambda: hvd.broadcast(torch.ones(3), root, name="root.check"), "root.check", "root")


def test_mismatched_allgather_trailing_dimensions(rank):
    tensor = torch.ones(2, 3 + (rank == 1))
    expect_mismatch(lambda: hvd.allgather(tensor, name="gather.check"), "gather.check", "[4]", "[3]")


def test_duplicate_in_flight_name_raises_at_once(rank):
    tensor = torch.ones(3)
    if rank == 0:
        first = hvd.allreduce_async(tensor, name="dup.check")
        with pytest.raises(ValueError, match="dup.check"):
            hvd.allreduce_async(tensor, name="dup.check")
        hvd.barrier()
    else:
        hvd.barrier()
        first = hvd.allreduce_async(tensor, name="dup.check")
    assert torch.equal(hvd.synchronize(first), torch.ones(3))
