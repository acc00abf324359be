"""alltoall, reducescatter, grouped collectives, join and process sets on real Gloo groups."""

import pytest
import torch

import torchring as hvd


def test_alltoall_equal_parts(rank, size):
    tensor = torch.arange(size * 2, dtype=torch.float32).reshape(size * 2, 1) + 100 * rank
    output = hvd.alltoall(tensor)
    expected = torch.cat([torch.arange(rank * 2, rank * 2 + 2, dtype=torch.float32).reshape(2, 1) + 100 * r
                          for r in range(size)])
    assert torch.equal(output, expected)


def test_alltoall_with_splits_returns_received_splits(rank, size):
    splits = [r + 1 for r in range(size)]  # rank r sends r'+1 rows to rank r'
    tensor = torch.full((sum(splits), 2), float(rank))
    output, received = hvd.alltoall(tensor, splits=splits)
    assert received.tolist() == [rank + 1] * size
    assert torch.equal(output, torch.cat([torch.full((rank + 1, 2), float(r)) for r in range(size)]))


def test_alltoall_splits_must_be_integers(size):
    with pytest.raises(ValueError, match="integers"):
        hvd.alltoall(torch.ones(size), splits=torch.ones(size, dtype=torch.float32))
    output, received = hvd.alltoall(torch.ones(size), splits=torch.ones(size, dtype=torch.int32))
    assert received.dtype == torch.int32 and output.shape == (size,)


def test_grouped_allreduce_is_differentiable(rank, size):
    tensors = [torch.full((3,), float(rank), requires_grad=True), torch.ones(2, 2, requires_grad=True)]
    results = hvd.grouped_allreduce(tensors, average=True)
    for result in results:
        result.backward(torch.ones_like(result))
    assert torch.equal(tensors[0].grad, torch.ones(3)) and torch.equal(tensors[1].grad, torch.ones(2, 2))


def test_alltoall_bad_splits_are_value_errors(size):
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.ones(size * 2), splits=[1] * (size + 1))
    with pytest.raises(ValueError, match="add up"):
        hvd.alltoall(torch.ones(size * 2), splits=[5] * size)


def test_alltoall_gradient_travels_back(rank, size):
    tensor = torch.ones(size, 3, requires_grad=True)
    output = hvd.alltoall(tensor)
    (output * (rank + 1)).sum().backward()
    expected = torch.tensor([[r + 1.0] * 3 for r in range(size)])
    assert torch.equal(tensor.grad, expected)


@pytest.mark.parametrize("rows", [6, 7])
def test_reducescatter_sum_and_average(rank, size, rows):
    tensor = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * (rank + 1)
    total = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * sum(r + 1 for r in range(size))
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    summed = hvd.reducescatter(tensor, op=hvd.Sum, name=f"rs.sum.{rows}")
    assert torch.equal(summed, total[start:start + counts[rank]])
    averaged = hvd.reducescatter(tensor, name=f"rs.avg.{rows}")
    assert torch.allclose(averaged, total[start:start + counts[rank]] / size)


def test_reducescatter_gradient_is_gathered(rank, size):
    tensor = torch.ones(size * 2, 1, requires_grad=True)
    hvd.reducescatter(tensor, op=hvd.Sum).sum().backward()
    assert torch.equal(tensor.grad, torch.full((size * 2, 1), float(size)))  # Horovod: times size for Sum


def test_grouped_allreduce_forms(rank, size):
    tensors = [torch.full((2,), float(rank)), torch.full((3, 1), float(rank + 1))]
    results = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    assert torch.equal(results[0], torch.full((2,), float(sum(range(size)))))
    assert torch.equal(results[1], torch.full((3, 1), float(sum(r + 1 for r in range(size)))))
    handle = hvd.grouped_allreduce_async(tensors, op=hvd.Max, name="grouped.max")
    assert [t.tolist() for t in hvd.synchronize(handle)] == [[size - 1.0] * 2, [[float(size)]] * 3]
    returned = hvd.grouped_allreduce_(tensors, op=hvd.Sum)
    assert returned[0] is tensors[0] and torch.equal(tensors[0], torch.full((2,), float(sum(range(size)))))


def test_grouped_allgather_and_reducescatter(rank, size):
    gathered = hvd.grouped_allgather([torch.full((rank + 1,), float(rank)), torch.tensor([rank])])
    assert gathered[1].tolist() == list(range(size))
    assert gathered[0].shape[0] == sum(r + 1 for r in range(size))
    scattered = hvd.grouped_reducescatter([torch.ones(size, 2), torch.ones(size * 2)], op=hvd.Sum)
    assert torch.equal(scattered[0], torch.full((1, 2), float(size)))
    assert torch.equal(scattered[1], torch.full((2,), float(size)))


def test_grouped_mismatch_fails_on_every_rank(rank):
    with pytest.raises(RuntimeError, match="Mismatched"):
        hvd.grouped_allreduce([torch.ones(2), torch.ones(2 + rank)], name="grouped.bad")
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()


def test_join_with_uneven_work(rank, size):
    steps = 1 + rank  # the last rank works longest
    for step in range(steps):
        result = hvd.allreduce(torch.ones(3), name=f"uneven.{step}")
        still_working = sum(1 for r in range(size) if r + 1 > step)
        assert torch.allclose(result, torch.full((3,), still_working / size))
    assert hvd.join() == size - 1


def test_allgather_and_broadcast_fail_while_a_rank_has_joined(rank, size):
    if rank == 0:
        last = hvd.join()
    else:
        # named: only these ranks submit them, so automatic names would drift apart from rank 0's
        with pytest.raises(RuntimeError, match="join"):
            hvd.allgather(torch.ones(2, 3), name="joined.gather")
        with pytest.raises(RuntimeError, match="join"):
            hvd.broadcast(torch.ones(3), root_rank=1, name="joined.broadcast")
        last = hvd.join()
    assert last != 0
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_join_returns_the_same_value_everywhere(rank, size):
    last = hvd.join()
    assert hvd.allgather(torch.tensor([last])).tolist() == [last] * size


def test_process_sets_at_init_and_collectives_within_them(rank, size):
    hvd.shutdown()
    evens = hvd.ProcessSet(range(0, size, 2))
    lasts = hvd.ProcessSet([size - 1])
    hvd.init(process_sets=[evens, lasts])
    try:
        assert evens.process_set_id == 1 and lasts.process_set_id == 2
        assert evens.included() == (rank % 2 == 0)
        assert evens.rank() == (rank // 2 if rank % 2 == 0 else -1)
        if evens.included():
            result = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=evens)
            assert result.item() == sum(range(0, size, 2))
            root = evens.ranks[-1]
            assert hvd.broadcast(torch.tensor([rank]), root_rank=root, process_set=evens).item() == root
            assert hvd.allgather(torch.tensor([rank]), process_set=evens).tolist() == evens.ranks
        else:
            with pytest.raises(ValueError, match="not a member"):
                hvd.allreduce(torch.ones(1), process_set=evens)
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size
    finally:
        hvd.shutdown()
        hvd.init()


def test_broadcast_root_outside_the_process_set_is_a_value_error(rank, size):
    hvd.shutdown()
    first = hvd.ProcessSet([0])
    hvd.init(process_sets=[first])
    try:
        if rank == 0:
            with pytest.raises(ValueError, match="root_rank"):
                hvd.broadcast(torch.ones(1), root_rank=size - 1, process_set=first)
    finally:
        hvd.shutdown()
        hvd.init()


def test_dynamic_process_sets(rank, size):
    with pytest.raises(ValueError, match="dynamic"):
        hvd.add_process_set([0])
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    try:
        with pytest.raises(ValueError, match="already exists"):
            hvd.add_process_set(list(reversed(range(size))))  # the same ranks as the global set
        pair = hvd.add_process_set([size - 1])
        assert pair.process_set_id is not None and pair.ranks == [size - 1]
        with pytest.raises(ValueError, match="already exists"):
            hvd.add_process_set(hvd.ProcessSet([size - 1]))
        if pair.included():
            assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=pair).item() == 1
        assert hvd.remove_process_set(hvd.global_process_set) is False
        assert hvd.remove_process_set(pair) is True
        assert pair.process_set_id is None
        again = hvd.add_process_set([0])
        assert again.process_set_id is not None
    finally:
        hvd.shutdown()
        hvd.init()


def test_global_process_set_covers_every_rank(size):
    assert hvd.global_process_set.ranks == list(range(size))
    assert hvd.global_process_set.size() == size and hvd.global_process_set.included()


def test_fused_allreduces_of_mixed_kinds_give_each_its_own_result(rank, size):
    tensors = [torch.full((3,), float(rank)), torch.full((2, 2), float(rank), dtype=torch.float64),
               torch.full((5,), rank, dtype=torch.int64), torch.full((4,), float(rank + 1))]
    results = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="fused.mixed")
    total = sum(range(size))
    assert torch.equal(results[0], torch.full((3,), float(total)))
    assert torch.equal(results[1], torch.full((2, 2), float(total), dtype=torch.float64))
    assert torch.equal(results[2], torch.full((5,), total, dtype=torch.int64))
    assert torch.equal(results[3], torch.full((4,), float(total + size)))
    averaged = hvd.grouped_allreduce([torch.full((2,), float(rank)), torch.full((7,), 2.0 * rank)])
    assert torch.allclose(averaged[0], torch.full((2,), total / size))
    assert torch.allclose(averaged[1], torch.full((7,), 2.0 * total / size))


def test_sparse_allreduce_async_sums_or_averages_every_ranks_entries(rank, size):
    tensor = torch.sparse_coo_tensor(torch.tensor([[rank, size]]), torch.tensor([rank + 1.0, 1.0]), (size + 1,),
                                     check_invariants=True)
    average = hvd.synchronize(hvd.sparse_allreduce_async(tensor, name="sparse.avg", op=hvd.Average))
    total = hvd.synchronize(hvd.sparse_allreduce_async(tensor, name="sparse.sum", op=hvd.Sum))
    assert average.is_sparse and total.is_sparse
    expected = torch.tensor([r + 1.0 for r in range(size)] + [float(size)])
    assert torch.equal(total.to_dense(), expected)
    assert torch.allclose(average.to_dense(), expected / size)
    with pytest.raises(ValueError, match="not defined for sparse"):
        hvd.sparse_allreduce_async(tensor, name="sparse.max", op=hvd.Max)
    with pytest.raises(ValueError, match="sparse COO tensor"):
        hvd.sparse_allreduce_async(torch.ones(2), name="sparse.dense")
