"""Every collective, op, async and in-place form, on real Gloo groups."""

import os
from pathlib import Path

import pytest
import torch

import torchring as hvd
from torchring.runtime import context

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16]


def rank_tensor(rank: int, shape=(3, 4), dtype=torch.float32) -> torch.Tensor:
    return (torch.arange(12, dtype=torch.float64).reshape(3, 4)[: shape[0], : shape[1]] + rank).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_sum_matches_sum_of_rank_tensors(rank, size, dtype):
    result = hvd.allreduce(rank_tensor(rank, dtype=dtype), op=hvd.Sum, name=f"sum.{dtype}")
    expected = sum(rank_tensor(r, dtype=torch.float64) for r in range(size)).to(dtype)
    assert result.dtype == dtype
    assert torch.equal(result, expected)


def test_allreduce_average_is_the_default(rank, size):
    result = hvd.allreduce(torch.full((5,), float(rank)))
    assert torch.allclose(result, torch.full((5,), (size - 1) / 2))


def test_allreduce_average_flag_is_still_accepted(rank, size):
    summed = hvd.allreduce(torch.ones(3), average=False)
    averaged = hvd.allreduce(torch.ones(3), average=True)
    assert torch.equal(summed, torch.full((3,), float(size)))
    assert torch.equal(averaged, torch.ones(3))


def test_giving_both_op_and_average_is_an_error():
    with pytest.raises(ValueError, match="op"):
        hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum)


@pytest.mark.parametrize("op,reduce", [(hvd.Min, min), (hvd.Max, max)])
def test_allreduce_min_max(rank, size, op, reduce):
    result = hvd.allreduce(torch.tensor([rank, -rank], dtype=torch.int64), op=op)
    assert result.tolist() == [reduce(range(size)), reduce(-r for r in range(size))]


def test_allreduce_product(rank, size):
    result = hvd.allreduce(torch.tensor([rank + 1.0, 2.0]), op=hvd.Product)
    expected = 1.0
    for r in range(size):
        expected *= r + 1.0
    assert result.tolist() == [expected, 2.0**size]


def test_allreduce_prescale_and_postscale(rank, size):
    result = hvd.allreduce(torch.ones(4), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    assert torch.allclose(result, torch.full((4,), 2.0 * size * 0.25))


def test_allreduce_fp16_compression_keeps_dtype(rank, size):
    tensor = torch.full((8,), 0.5 + rank, dtype=torch.float32)
    result = hvd.allreduce(tensor, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert result.dtype == torch.float32
    assert torch.allclose(result, torch.full((8,), sum(0.5 + r for r in range(size))))


def test_allreduce_leaves_input_alone_and_in_place_form_overwrites(rank, size):
    tensor = torch.full((3,), float(rank))
    hvd.allreduce(tensor, op=hvd.Sum)
    assert torch.equal(tensor, torch.full((3,), float(rank)))
    returned = hvd.allreduce_(tensor, op=hvd.Sum)
    assert returned is tensor
    assert torch.equal(tensor, torch.full((3,), float(sum(range(size)))))


def test_allreduce_async_forms(rank, size):
    tensor = torch.full((2, 2), float(rank + 1))
    out_of_place = hvd.allreduce_async(tensor, op=hvd.Sum, name="async.out")
    in_place = hvd.allreduce_async_(tensor, op=hvd.Max, name="async.in")
    assert isinstance(out_of_place, int) and isinstance(in_place, int)
    total = sum(r + 1 for r in range(size))
    assert torch.equal(hvd.synchronize(out_of_place), torch.full((2, 2), float(total)))
    hvd.synchronize(in_place)
    assert torch.equal(tensor, torch.full((2, 2), float(size)))


def test_poll_turns_true_and_synchronize_returns_result(size):
    handle = hvd.allreduce_async(torch.ones(16), op=hvd.Sum, name="poll.me")
    while not hvd.poll(handle):
        pass
    assert torch.equal(hvd.synchronize(handle), torch.full((16,), float(size)))


def test_poll_of_an_unknown_handle_is_an_error():
    with pytest.raises(ValueError):
        hvd.poll(10**9)


def test_many_async_ops_complete_with_poll_false_at_first(rank, size):
    handles = [hvd.allreduce_async(torch.full((64,), float(i)), op=hvd.Sum) for i in range(100)]
    for i, handle in enumerate(handles):
        assert torch.equal(hvd.synchronize(handle), torch.full((64,), float(i * size)))


def test_out_of_order_submission_completes(rank, size):
    names = [f"ooo.{i}" for i in range(6)]
    order = names if rank % 2 == 0 else list(reversed(names))
    handles = {name: hvd.allreduce_async(torch.full((3,), float(names.index(name))), op=hvd.Sum, name=name)
               for name in order}
    for name in names:
        assert torch.equal(hvd.synchronize(handles[name]), torch.full((3,), float(names.index(name) * size)))


def test_allgather_with_different_first_dimensions(rank, size):
    tensor = torch.full((rank + 1, 2), float(rank))
    result = hvd.allgather(tensor)
    expected = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(size)])
    assert torch.equal(result, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8, torch.bool])
def test_allgather_equal_shapes(rank, size, dtype):
    tensor = (torch.arange(6).reshape(2, 3) + rank).to(dtype)
    result = hvd.allgather(tensor, name=f"gather.{dtype}")
    expected = torch.cat([(torch.arange(6).reshape(2, 3) + r).to(dtype) for r in range(size)])
    assert torch.equal(result, expected)


def test_allgather_async(rank, size):
    handle = hvd.allgather_async(torch.tensor([rank]))
    assert hvd.synchronize(handle).tolist() == list(range(size))


@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_forms(rank, size, root):
    root = root % size
    tensor = torch.full((4,), float(rank))
    copy = hvd.broadcast(tensor, root_rank=root, name=f"bcast.copy.{root}")
    assert torch.equal(copy, torch.full((4,), float(root)))
    assert torch.equal(tensor, torch.full((4,), float(rank)))
    handle = hvd.broadcast_async(tensor, root_rank=root, name=f"bcast.async.{root}")
    assert torch.equal(hvd.synchronize(handle), torch.full((4,), float(root)))
    hvd.synchronize(hvd.broadcast_async_(tensor, root_rank=root, name=f"bcast.async_.{root}"))
    assert torch.equal(tensor, torch.full((4,), float(root)))
    other = torch.full((2,), float(rank))
    assert hvd.broadcast_(other, root_rank=root) is other
    assert torch.equal(other, torch.full((2,), float(root)))


def test_broadcast_bool(rank):
    tensor = torch.tensor([rank == 0, rank != 0, True])
    assert hvd.broadcast(tensor, 0).tolist() == [True, False, True]


def test_broadcast_root_outside_the_job_is_an_error(size):
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(torch.ones(1), root_rank=size)


def test_barrier_returns_on_every_rank():
    for _ in range(3):
        hvd.barrier()


def test_in_place_op_on_a_non_contiguous_tensor_is_an_error():
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce_(torch.ones(4, 4).t())


def test_out_of_place_op_accepts_a_non_contiguous_tensor(size):
    tensor = torch.arange(16.0).reshape(4, 4).t()
    assert torch.equal(hvd.allreduce(tensor, op=hvd.Sum), tensor * size)


def test_shutdown_then_init_again_keeps_rank_and_size(rank, size):
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.init()
    assert (hvd.rank(), hvd.size()) == (rank, size)
    assert torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(size)))


def test_allreduce_gradient_is_the_allreduced_gradient(rank, size):
    tensor = torch.full((3,), float(rank), requires_grad=True)
    result = hvd.allreduce(tensor, op=hvd.Sum, name="grad.allreduce")
    assert result.requires_grad
    (result * (rank + 1)).sum().backward()
    assert torch.allclose(tensor.grad, torch.full((3,), float(sum(r + 1 for r in range(size)))))


def test_allgather_gradient_is_this_ranks_slice_of_the_averaged_gradient(rank, size):
    tensor = torch.ones(rank + 1, 2, requires_grad=True)
    gathered = hvd.allgather(tensor, name="grad.allgather")
    weights = torch.arange(gathered.shape[0], dtype=torch.float32).unsqueeze(1) * (rank + 1)
    (gathered * weights).sum().backward()
    offset = sum(r + 1 for r in range(rank))
    mean_scale = sum(r + 1 for r in range(size)) / size
    expected = torch.arange(offset, offset + rank + 1, dtype=torch.float32).unsqueeze(1).expand(-1, 2) * mean_scale
    assert torch.allclose(tensor.grad, expected)


def test_broadcast_gradient_goes_to_the_root_only(rank, size):
    tensor = torch.ones(4, requires_grad=True)
    hvd.broadcast(tensor, root_rank=0, name="grad.broadcast").sum().backward()
    assert torch.equal(tensor.grad, torch.ones(4) if rank == 0 else torch.zeros(4))


def test_start_and_stop_timeline_at_run_time(rank, tmp_path_factory):
    import json

    path = hvd.broadcast_object(str(tmp_path_factory.mktemp("timeline") / "t.json"), root_rank=0)
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(2), name="timed.tensor")
    hvd.stop_timeline()
    # Rank 0 negotiates: a request another rank sends before rank 0 has stopped its timeline is
    # recorded (as Horovod's coordinator does), so the other ranks wait for the stop first.
    hvd.barrier()
    hvd.allreduce(torch.ones(2), name="untimed.tensor")
    if rank == 0:
        with open(path) as file:
            names = {e["args"]["name"] for e in json.load(file) if e.get("name") == "process_name"}
        assert "allreduce.timed.tensor" in names and "allreduce.untimed.tensor" not in names


def test_repeated_requests_hit_the_response_cache_and_mismatches_are_still_caught(rank, size):
    cache = context.current().engine.response_cache
    hits_before = cache.hits
    for step in range(3):
        result = hvd.allreduce(torch.full((3,), float(rank + step)), name="cache.repeat", op=hvd.Sum)
        assert torch.equal(result, torch.full((3,), float(sum(range(size)) + size * step)))
    assert cache.hits - hits_before >= 2
    shape = (3,) if rank == 0 else (4,)  # cached on rank 0, new on the others: the check still runs
    with pytest.raises(hvd.TensorMismatchError, match="cache.repeat"):
        hvd.allreduce(torch.ones(shape), name="cache.repeat")
    assert torch.equal(hvd.allreduce(torch.ones(3), name="cache.repeat", op=hvd.Sum), torch.full((3,), float(size)))


def test_a_tiny_cache_reuses_slots_without_mixing_requests_up(rank, size, monkeypatch):
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "2")
    hvd.shutdown()
    hvd.init()
    try:
        assert context.current().engine.response_cache.capacity == 2
        for step in range(4):
            handles = [hvd.allreduce_async(torch.full((i + 1,), float(rank * 10 + i)), name=f"tiny.{i}", op=hvd.Sum)
                       for i in range(5)]
            for i, handle in enumerate(handles):
                expected = float(sum(r * 10 + i for r in range(size)))
                assert torch.equal(hvd.synchronize(handle), torch.full((i + 1,), expected)), (step, i)
    finally:
        monkeypatch.delenv("HOROVOD_CACHE_CAPACITY")
        hvd.shutdown()
        hvd.init()


def _gloo_threads() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(name for name in names if "gloo" in name)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_shutdown_destroys_its_groups_at_once_even_while_an_optimizer_holds_its_lane(size):
    """Groups left to the garbage collector may be destroyed at interpreter exit, where a Gloo thread
    releasing a tensor aborts the process; shutdown must destroy them itself."""
    hvd.shutdown()
    baseline = _gloo_threads()  # what other code in this process keeps (torch.distributed's own groups)
    hvd.init()
    model = torch.nn.Linear(4, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    for _ in range(3):  # the second step onwards runs on the optimizer's lane, a group of its own
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
    named = len(_gloo_threads()) > len(baseline)
    hvd.shutdown()
    left = _gloo_threads()
    hvd.init()
    if not named:
        pytest.skip("this torch does not name Gloo's threads (torch 2.4 does not)")
    assert left == baseline
