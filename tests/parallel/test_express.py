"""Express cycles (``runtime.coordination.express``) on real Gloo groups: a repeated small allreduce is settled
and reduced by one collective, with the same results, scaling and checks as the probe and the all-gather."""

import time

import pytest
import torch

import torchring as hvd
from torchring import settings
from torchring.runtime import context
from torchring.runtime.coordination.express import MAX_BYTES


def _exchange():
    return context.current().engine._cycles


def _until_express(step, least, most=200):
    """``step(0)``, ``step(1)``, ... at least ``least`` times, then until an express cycle released what it
    carried (``most`` at most: then it fails). How soon that happens depends on how the ranks are scheduled
    (ranks that seldom arrive together leave the cycles to the probe). Every rank stops after the same step:
    a hit needs every rank's submission, so between one step's end and its next submission a rank reads the
    same count as every other."""
    before = _exchange().express_hits
    for index in range(most):
        step(index)
        if index + 1 >= least and _exchange().express_hits > before:
            return
    raise AssertionError(f"no express cycle released what it carried in {most} steps")


@pytest.fixture(autouse=True)
def _express_on():
    if not settings.read("CONTROL_PROBE") or not settings.read("CONTROL_EXPRESS"):
        pytest.skip("express cycles are off in this job (test_parallel_suite runs this file with them on too)")


def _expected(op, values, dtype):
    """What Horovod's allreduce gives for each rank's ``values`` (small integers: every sum is exact)."""
    stacked = torch.stack(values).double()
    if op in (hvd.Sum, hvd.Average):
        result = stacked.sum(0).to(dtype)
        if op == hvd.Average:  # in the tensor's dtype; integers through float64, truncated (as Horovod)
            result = result / len(values) if dtype.is_floating_point else \
                (result.double() * (1.0 / len(values))).to(dtype)
        return result
    if op == hvd.Min:
        return stacked.min(0).values.to(dtype)
    if op == hvd.Max:
        return stacked.max(0).values.to(dtype)
    return stacked.prod(0).to(dtype)


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_a_loop_of_one_blocking_allreduce_goes_express_with_exact_results(rank, size, op, dtype):
    def step(index):
        values = [torch.arange(6, dtype=torch.float64).to(dtype) + r + index % 3 for r in range(size)]
        result = hvd.allreduce(values[rank].clone(), name=f"express.{op}.{dtype}", op=op)
        assert torch.equal(result, _expected(op, values, dtype)), (index, result)

    _until_express(step, least=12)


def test_scaling_applies_to_the_tensor_only(rank, size):
    def step(_):
        tensor = torch.full((5,), float(rank + 1))
        hvd.allreduce_(tensor, name="express.scaled", op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
        assert torch.equal(tensor, torch.full((5,), float(sum(range(1, size + 1)))))
        averaged = hvd.allreduce(torch.full((2, 3), float(rank)), name="express.average")
        assert torch.allclose(averaged, torch.full((2, 3), (size - 1) / 2))

    _until_express(step, least=10)


def test_an_allreduce_between_barriers_goes_express_and_the_barriers_still_hold(rank, size):
    def step(index):
        hvd.barrier()
        total = hvd.allreduce(torch.tensor([float(rank), float(index)]), name="express.between", op=hvd.Sum)
        assert torch.equal(total, torch.tensor([float(sum(range(size))), float(index * size)]))

    _until_express(step, least=12)


def test_a_late_rank_gets_the_same_results(rank, size):
    for step in range(10):
        if rank == step % size:
            time.sleep(0.02)  # the others' express cycles run without this rank's tensor, then with it
        total = hvd.allreduce(torch.full((3,), float(rank * step)), name="express.late", op=hvd.Sum)
        assert torch.equal(total, torch.full((3,), float(step * sum(range(size)))))


def test_a_mismatch_in_the_middle_of_an_express_loop_raises_on_every_rank_and_the_loop_resumes(rank, size):
    def step(_):
        assert torch.equal(hvd.allreduce(torch.ones(4), name="express.mismatch", op=hvd.Sum),
                           torch.full((4,), float(size)))

    _until_express(step, least=8)
    with pytest.raises(hvd.HorovodInternalError, match="express.mismatch"):
        hvd.allreduce(torch.ones(4 + (rank == size - 1)), name="express.mismatch", op=hvd.Sum)
    _until_express(step, least=8)


def test_other_operations_between_express_cycles_keep_their_results(rank, size):
    for step in range(8):
        total = hvd.allreduce(torch.tensor([1.0]), name="express.mixed", op=hvd.Sum)
        assert total.item() == size
        gathered = hvd.allgather(torch.tensor([rank, step]), name="express.mixed.gather")
        assert gathered.tolist() == [v for r in range(size) for v in (r, step)]
        value = hvd.broadcast(torch.tensor([float(rank + step)]), root_rank=0, name="express.mixed.bcast")
        assert value.item() == step
        handles = [hvd.allreduce_async(torch.full((2,), float(i)), name=f"express.mixed.async.{i}", op=hvd.Sum)
                   for i in range(3)]
        for i, handle in enumerate(handles):
            assert torch.equal(hvd.synchronize(handle), torch.full((2,), float(i * size)))


def test_a_tensor_larger_than_the_express_limit_takes_the_probe_and_its_own_collective(rank, size):
    before = (_exchange().express_hits, _exchange().settled_cycles)
    numel = MAX_BYTES // 4 + 1
    for _ in range(6):
        total = hvd.allreduce(torch.ones(numel), name="express.large", op=hvd.Sum)
        assert torch.equal(total, torch.full((numel,), float(size)))
    after = (_exchange().express_hits, _exchange().settled_cycles)
    # (the first cycles may still be express cycles carrying the last test's allreduce, which they miss)
    assert after[0] == before[0] and after[1] > before[1]


def test_a_timeline_started_in_an_express_loop_records_every_operation(rank, size, tmp_path_factory):
    import json

    path = hvd.broadcast_object(str(tmp_path_factory.mktemp("timeline") / "t.json"), root_rank=0)
    for _ in range(8):
        hvd.allreduce(torch.ones(2), name="express.timed", op=hvd.Sum)
    hvd.start_timeline(path)
    for _ in range(5):
        assert hvd.allreduce(torch.ones(2), name="express.timed", op=hvd.Sum).tolist() == [size, size]
    hvd.stop_timeline()
    hvd.barrier()
    if rank == 0:  # rank 0's timeline turns settling (and so express cycles) off: each operation is recorded
        with open(path) as file:
            ends = [e for e in json.load(file) if e.get("ph") == "E" and "dtype" in e.get("args", {})]
        assert len(ends) >= 5, ends


def test_a_rank_that_joins_in_an_express_loop_counts_as_zeros(rank, size):
    for _ in range(8):
        assert hvd.allreduce(torch.ones(3), name="express.join", op=hvd.Sum).tolist() == [size] * 3
    if rank == size - 1:
        hvd.join()
        return
    for _ in range(3):  # the last rank has joined: it takes part with zeros
        assert hvd.allreduce(torch.ones(3), name="express.join", op=hvd.Sum).tolist() == [size - 1] * 3
    hvd.join()


def _burst(rank, step, count=12, late=False):
    """``count`` in-place allreduces started together then waited for; ``late``: this rank pauses halfway."""
    tensors = [torch.full((4 + i % 3,), float(rank * 100 + step + i)) for i in range(count)]
    handles = []
    for i, tensor in enumerate(tensors):
        if late and i == count // 2:
            time.sleep(0.02)  # the others' cycles run with half of this rank's burst, then with the rest
        handles.append(hvd.allreduce_async_(tensor, name=f"express.burst.{i}", op=hvd.Sum))
    return [hvd.synchronize(handle) for handle in handles]


def test_a_loop_of_the_same_burst_goes_express_with_exact_results_even_when_a_rank_is_late(rank, size):
    def step(index):
        results = _burst(rank, index, late=rank == index % size and index % 4 == 3)
        for i, result in enumerate(results):
            expected = float(sum(r * 100 + index + i for r in range(size)))
            assert torch.equal(result, torch.full((4 + i % 3,), expected)), (index, i, result)

    _until_express(step, least=16)


def test_a_loop_of_an_averaged_and_scaled_burst_goes_express_with_the_scaling_on_the_tensors_only(rank, size):
    def step(index):
        # the tensors exist before the burst starts (making one lets the engine run a cycle in the middle)
        tensors = [torch.full((3,), float(rank + i + index)) for i in range(8)]
        handles = [hvd.allreduce_async(tensor, name=f"express.avg.{i}", op=hvd.Average, prescale_factor=2.0,
                                       postscale_factor=0.5) for i, tensor in enumerate(tensors)]
        for i, handle in enumerate(handles):
            expected = sum(r + i + index for r in range(size)) / size
            assert torch.allclose(hvd.synchronize(handle), torch.full((3,), expected)), (index, i)

    _until_express(step, least=16)


def test_a_burst_of_mixed_dtypes_is_not_carried_and_keeps_its_results(rank, size):
    for step in range(8):
        handles = [hvd.allreduce_async(torch.full((3,), float(rank + step), dtype=dtype), name=f"express.mixed.{i}",
                                       op=hvd.Sum) for i, dtype in enumerate([torch.float32, torch.float64] * 2)]
        for handle in handles:
            assert hvd.synchronize(handle).tolist() == [float(sum(range(size)) + size * step)] * 3


def test_a_mismatch_in_the_middle_of_a_burst_loop_fails_that_allreduce_on_every_rank_and_the_loop_resumes(rank, size):
    for step in range(6):
        _burst(rank, step)
    odd = rank == size - 1
    tensors = [torch.ones(4 + i % 3 + (odd and i == 5)) for i in range(12)]
    handles = [hvd.allreduce_async_(tensor, name=f"express.burst.{i}", op=hvd.Sum) for i, tensor in enumerate(tensors)]
    for i, handle in enumerate(handles):
        if i == 5:
            with pytest.raises(hvd.HorovodInternalError, match="express.burst.5"):
                hvd.synchronize(handle)
        else:
            assert torch.equal(hvd.synchronize(handle), torch.full((4 + i % 3,), float(size)))
    def step(index):
        results = _burst(rank, index)
        assert torch.equal(results[0], torch.full((4,), float(sum(r * 100 + index for r in range(size)))))

    _until_express(step, least=16)
