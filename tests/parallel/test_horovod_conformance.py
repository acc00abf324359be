"""Conformance with Horovod 0.28.1's ``horovod.torch`` API, exercised the way Horovod users and tests do.

Every test runs on every rank of a real job (2 or 3 ranks, CPU tensors over Gloo). Each rank runs the
same tests in the same order; a test that expects an error makes every rank reach the same
collectives whatever happens, so a failure on one rank does not leave the others waiting.

The reference behaviour is Horovod 0.28.1 on CPU with its Gloo controller (``horovodrun --gloo``):
``horovod/torch/mpi_ops.py``, ``functions.py``, ``optimizer.py``, ``sync_batch_norm.py``,
``horovod/torch/elastic/``, ``horovod/common/ops/gloo_operations.cc`` and
``horovod/common/controller.cc``. What Horovod itself refuses on CPU (``allreduce`` of
int8/uint8/int16/bool tensors, Adasum without MPI, alltoall of bool tensors) is not tested.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import itertools
import json
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import torchring as hvd

# dtypes Horovod's torch allreduce / grouped allreduce / reducescatter accept on CPU
REDUCE_TYPES = [torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]
INT_TYPES = (torch.int32, torch.int64)
# dtypes Horovod's torch allgather / broadcast / alltoall accept on CPU (int16 has its own test below,
# which re-initialises afterwards: on torchring it currently breaks the whole engine)
MOVE_TYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]
GRAD_TYPES = [torch.float32, torch.float64]
DIMS = (1, 2, 3)

# np.random.seed(1234); np.random.uniform() -- the factor Horovod's scaling tests use
SCALE_FACTOR = 0.1915194503788923

# the torch.optim classes Horovod's optimizer tests loop over (LBFGS and SparseAdam excluded, as there); this
# torch's own (Adafactor came with torch 2.5)
OPTIMIZER_CLASSES = [
    getattr(torch.optim, name) for name in ("ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax",
                                            "NAdam", "RAdam", "RMSprop", "Rprop", "SGD")
    if hasattr(torch.optim, name)
]


# ---- helpers -------------------------------------------------------------------------------------


def seeded(shape: Iterable[int], low: int = -100, high: int = 100, seed: int = 1234,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The same integer-valued tensor on every rank."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, tuple(shape), generator=generator).to(dtype)


def tolerance(dtype: torch.dtype) -> float:
    return {torch.float16: 2e-3, torch.float32: 1e-6, torch.float64: 1e-12}.get(dtype, 0.0)


def assert_values(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """``actual`` has ``dtype`` and equals ``expected`` (exactly for integers)."""
    assert actual.dtype == dtype, f"dtype {actual.dtype}, expected {dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    rtol = tolerance(dtype)
    if rtol == 0.0:
        assert torch.equal(actual.to(torch.float64), expected.to(torch.float64)), (actual, expected)
    else:
        assert torch.allclose(actual.to(torch.float64), expected.to(torch.float64), rtol=rtol, atol=1e-6), (
            actual, expected)


def horovod_scale(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """What Horovod's ``ScaleBufferCPUImpl`` makes of ``tensor * factor`` in the tensor's dtype.

    Integers are scaled in double precision and converted back (truncation toward zero), float16
    in float32 arithmetic, float32 with the factor rounded to float32, float64 in double.
    """
    if not tensor.dtype.is_floating_point:
        return (tensor.to(torch.float64) * factor).trunc().to(tensor.dtype)
    if tensor.dtype == torch.float16:
        return (tensor.to(torch.float32) * torch.tensor(factor, dtype=torch.float32)).to(torch.float16)
    return tensor * torch.tensor(factor, dtype=tensor.dtype)


def assert_same_on_all_ranks(tensor: torch.Tensor, name: str) -> None:
    gathered = hvd.allgather(tensor.detach().reshape(1, -1).clone(), name=name)
    for row in gathered:
        assert torch.equal(row, gathered[0]), f"{name} differs across ranks"


def assert_allreduce_still_works(size: int, name: str) -> None:
    result = hvd.allreduce(torch.ones(5), op=hvd.Sum, name=name)
    assert torch.equal(result, torch.full((5,), float(size)))


@contextlib.contextmanager
def reinitialized(process_sets=None, **env: str) -> Iterator[None]:
    """Shut down, set ``env``, ``hvd.init(...)``; afterwards shut down again and re-init plainly."""
    hvd.shutdown()
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        if process_sets is None:
            hvd.init()
        else:
            hvd.init(process_sets=process_sets)
        yield
    finally:
        hvd.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        hvd.init()


def shared_path(tmp_path_factory, name: str) -> str:
    """A file path chosen by rank 0 and known to every rank (all ranks run on this host)."""
    path = str(tmp_path_factory.mktemp("conformance") / name) if hvd.rank() == 0 else None
    return hvd.broadcast_object(path, root_rank=0, name=f"shared_path.{name}")


def even_odd_ranks(size: int) -> tuple[list[int], list[int]]:
    return [r for r in range(size) if r % 2 == 0], [r for r in range(size) if r % 2 == 1]


# ---- lifecycle, topology and build queries -------------------------------------------------------


def test_topology_queries(rank, size):
    for query in (hvd.size, hvd.rank, hvd.local_size, hvd.local_rank, hvd.cross_size, hvd.cross_rank):
        assert type(query()) is int, query.__name__
    assert 0 <= rank < size
    # torchring run / horovodrun -np N on one host
    assert (hvd.local_size(), hvd.local_rank()) == (size, rank)
    assert (hvd.cross_size(), hvd.cross_rank()) == (1, 0)
    assert hvd.is_homogeneous() is True
    assert hvd.is_initialized() is True
    assert hvd.allgather(torch.tensor([rank]), name="topology.ranks").tolist() == list(range(size))


def test_launcher_sets_horovod_rank_variables(rank, size):
    assert int(os.environ["HOROVOD_RANK"]) == rank
    assert int(os.environ["HOROVOD_SIZE"]) == size
    assert int(os.environ["HOROVOD_LOCAL_RANK"]) == hvd.local_rank()
    assert int(os.environ["HOROVOD_LOCAL_SIZE"]) == hvd.local_size()
    assert int(os.environ["HOROVOD_CROSS_RANK"]) == hvd.cross_rank()
    assert int(os.environ["HOROVOD_CROSS_SIZE"]) == hvd.cross_size()
    assert os.environ["HOROVOD_HOSTNAME"]


def test_build_and_capability_queries():
    for query in (hvd.gloo_built, hvd.gloo_enabled, hvd.mpi_built, hvd.mpi_enabled, hvd.cuda_built,
                  hvd.rocm_built, hvd.ccl_built, hvd.ddl_built):
        assert type(query()) is bool, query.__name__
    assert hvd.gloo_built() is True and hvd.gloo_enabled() is True
    assert hvd.mpi_enabled() is False
    nccl = hvd.nccl_built()
    assert type(nccl) is int and nccl >= 0
    with pytest.raises(ValueError):
        hvd.mpi_threads_supported()


def test_reduction_op_constants_and_exceptions():
    ops = [hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product]
    assert all(isinstance(op, int) for op in ops)
    assert len(set(ops)) == len(ops)
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert issubclass(hvd.HostsUpdatedInterrupt, RuntimeError)


def test_shutdown_then_queries_raise_and_init_restores_rank_and_size(rank, size):
    hvd.init()  # a second init while initialised does nothing
    assert (hvd.rank(), hvd.size()) == (rank, size)
    hvd.shutdown()
    try:
        assert hvd.is_initialized() is False
        for query in (hvd.size, hvd.rank, hvd.local_size, hvd.local_rank, hvd.cross_size, hvd.cross_rank):
            with pytest.raises(ValueError, match="has not been initialized"):
                query()
    finally:
        hvd.init()
    assert hvd.is_initialized() is True
    assert (hvd.rank(), hvd.size()) == (rank, size)
    assert_allreduce_still_works(size, "reinit.check")


def test_horovod_module_layout_is_importable():
    """Horovod scripts import these modules; ``--horovod-compat`` must serve each of them."""
    if importlib.util.find_spec("horovod") is None:
        from torchring.compat import SHIM_PATH

        sys.path.insert(0, str(SHIM_PATH))
    hvd_torch = importlib.import_module("horovod.torch")
    assert hvd_torch.allreduce is hvd.allreduce
    assert importlib.import_module("horovod").__version__.startswith("0.28.1")
    assert importlib.import_module("horovod.torch.mpi_ops").Sum == hvd.Sum
    assert importlib.import_module("horovod.torch.functions").broadcast_object is hvd.broadcast_object
    assert importlib.import_module("horovod.torch.compression").Compression is hvd.Compression
    assert importlib.import_module("horovod.torch.elastic").TorchState is hvd.elastic.TorchState
    assert importlib.import_module("horovod.torch.elastic.sampler").ElasticSampler is hvd.elastic.ElasticSampler
    assert importlib.import_module("horovod.common.exceptions").HorovodInternalError is hvd.HorovodInternalError
    # modules of horovod.torch / horovod.common that scripts also import from directly
    assert importlib.import_module("horovod.torch.optimizer").DistributedOptimizer is hvd.DistributedOptimizer
    assert importlib.import_module("horovod.torch.sync_batch_norm").SyncBatchNorm is hvd.SyncBatchNorm
    assert importlib.import_module("horovod.common.process_sets").ProcessSet is hvd.ProcessSet


# ---- allreduce -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_allreduce_sum(size, dtype):
    for dim in DIMS:
        tensor = seeded([17] * dim, dtype=dtype)
        summed = hvd.allreduce(tensor, average=False)
        assert_values(summed, tensor.to(torch.float64) * size, dtype)


@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_allreduce_average(dtype):
    for dim in DIMS:
        tensor = seeded([17] * dim, dtype=dtype)
        assert_values(hvd.allreduce(tensor, average=True), tensor, dtype)
        assert_values(hvd.allreduce(tensor), tensor, dtype)  # op=None means Average
        assert_values(hvd.allreduce(tensor, op=hvd.Average), tensor, dtype)


@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_allreduce_in_place(size, dtype):
    for dim in DIMS:
        tensor = seeded([17] * dim, dtype=dtype)
        expected = tensor.to(torch.float64) * size
        returned = hvd.allreduce_(tensor, average=False)
        assert returned is tensor
        assert_values(tensor, expected, dtype)
        handle = hvd.allreduce_async_(tensor, op=hvd.Average, name=f"inplace.async.{dtype}.{dim}")
        assert isinstance(handle, int)
        assert hvd.synchronize(handle) is tensor
        assert_values(tensor, expected, dtype)


def test_allreduce_leaves_its_input_unchanged(rank):
    tensor = torch.full((6,), float(rank))
    hvd.allreduce(tensor, op=hvd.Sum, name="input.unchanged")
    assert torch.equal(tensor, torch.full((6,), float(rank)))


def test_in_place_operations_need_contiguous_tensors():
    with pytest.raises(ValueError):
        hvd.allreduce_(torch.ones(4, 4).t())
    with pytest.raises(ValueError):
        hvd.broadcast_(torch.ones(4, 4).t(), root_rank=0)


def test_allreduce_async_fused_is_really_async(size):
    handles = []
    poll_was_false = False
    for dtype, dim in itertools.product(REDUCE_TYPES, DIMS):
        tensor = seeded([17] * dim, dtype=dtype)
        handle = hvd.allreduce_async(tensor, average=False)
        assert isinstance(handle, int)
        if not hvd.poll(handle):
            poll_was_false = True
        handles.append((dtype, tensor.to(torch.float64) * size, handle))
    assert poll_was_false, "hvd.poll() was always True: not an asynchronous operation?"
    for dtype, expected, handle in handles:
        assert_values(hvd.synchronize(handle), expected, dtype)


@pytest.mark.parametrize("op_name", ["Min", "Max", "Product"])
@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_allreduce_min_max_product(rank, size, op_name, dtype):
    stacked = seeded([size, 5, 7], low=-3, high=4, seed=99, dtype=dtype)
    result = hvd.allreduce(stacked[rank].clone(), op=getattr(hvd, op_name), name=f"mmp.{op_name}.{dtype}")
    reference = stacked.to(torch.float64)
    expected = {"Min": lambda: reference.min(0).values, "Max": lambda: reference.max(0).values,
                "Product": lambda: reference.prod(0)}[op_name]()
    assert_values(result, expected, dtype)


@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_allreduce_prescale(size, dtype):
    for dim in DIMS:
        tensor = seeded([17] * dim, dtype=dtype)
        summed = hvd.allreduce(tensor, average=False, prescale_factor=SCALE_FACTOR)
        assert_values(summed, horovod_scale(tensor, SCALE_FACTOR).to(torch.float64) * size, dtype)


@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_allreduce_postscale(size, dtype):
    for dim in DIMS:
        tensor = seeded([17] * dim, dtype=dtype)
        summed = hvd.allreduce(tensor, average=False, postscale_factor=SCALE_FACTOR)
        expected = horovod_scale((tensor.to(torch.float64) * size).to(dtype), SCALE_FACTOR)
        assert_values(summed, expected.to(torch.float64), dtype)


def test_allreduce_integer_average_rounds_toward_zero(rank, size):
    """Horovod averages by scaling the sum with 1/size in double precision and converting back to the
    integer type, which truncates toward zero (gloo_operations.cc GlooAllreduce::Execute,
    collective_operations ScaleBufferCPUImpl)."""
    values = [-1, -3, 5, 7, -11, 13, -2 * size - 1, 2 * size + 1]
    for dtype in INT_TYPES:
        tensor = torch.tensor(values if rank == 0 else [0] * len(values), dtype=dtype)
        result = hvd.allreduce(tensor, op=hvd.Average, name=f"int.average.{dtype}")
        expected = [int(v * (1.0 / size)) for v in values]
        assert result.dtype == dtype
        assert result.tolist() == expected


def test_allreduce_integer_average_with_postscale_scales_once(rank, size):
    """For Average, Horovod folds 1/size into the postscale factor: one scaling of the integer sum."""
    values = [5, 7, 9, 11, -5, -7]
    for dtype in INT_TYPES:
        tensor = torch.tensor(values if rank == 0 else [0] * len(values), dtype=dtype)
        result = hvd.allreduce(tensor, op=hvd.Average, postscale_factor=3.0, name=f"int.avg.post.{dtype}")
        expected = [int(v * (3.0 / size)) for v in values]
        assert result.tolist() == expected


def test_allreduce_op_and_average_together_is_an_error():
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(3), average=True, op=hvd.Sum)


def test_allreduce_fp16_compression(rank, size):
    tensor = torch.full((9,), 0.5 + rank, dtype=torch.float32)
    result = hvd.allreduce(tensor, op=hvd.Sum, compression=hvd.Compression.fp16, name="compressed.allreduce")
    assert result.dtype == torch.float32
    assert torch.allclose(result, torch.full((9,), sum(0.5 + r for r in range(size))))


def test_allreduce_shape_mismatch_raises_on_every_rank_and_later_ops_work(rank, size):
    with pytest.raises(RuntimeError):
        hvd.allreduce(torch.ones([17 + rank] * 3), name="mismatch.shape")
    # same number of elements, different number of dimensions
    dims = [17, 23 * 57] if rank == 0 else [17, 23, 57]
    with pytest.raises(RuntimeError):
        hvd.allreduce(torch.ones(dims), name="mismatch.ndim")
    assert_allreduce_still_works(size, "mismatch.shape.after")


def test_allreduce_dtype_mismatch_raises(rank, size):
    tensor = torch.ones([17] * 3, dtype=torch.int32 if rank % 2 == 0 else torch.float32)
    with pytest.raises(RuntimeError):
        hvd.allreduce(tensor, name="mismatch.dtype")
    assert_allreduce_still_works(size, "mismatch.dtype.after")


def test_allreduce_op_mismatch_raises(rank, size):
    with pytest.raises(RuntimeError):
        hvd.allreduce(torch.ones(4), op=hvd.Sum if rank == 0 else hvd.Max, name="mismatch.op")
    with pytest.raises(RuntimeError):
        hvd.allreduce(torch.ones(4), op=hvd.Sum, prescale_factor=1.0 if rank == 0 else 2.0,
                      name="mismatch.prescale")
    assert_allreduce_still_works(size, "mismatch.op.after")


def test_errors_are_horovod_internal_errors(rank):
    with pytest.raises(hvd.HorovodInternalError):
        hvd.allreduce(torch.ones([3 + rank]), name="mismatch.internal.error")


def _submit_kind(kind: str, name: str, rank: int, size: int) -> int:
    if kind == "allreduce":
        return hvd.allreduce_async(torch.ones(4, 3), name=name)
    if kind == "allgather":
        return hvd.allgather_async(torch.ones(4, 3), name=name)
    if kind == "broadcast":
        return hvd.broadcast_async(torch.ones(4, 3), root_rank=0, name=name)
    if kind == "alltoall":
        return hvd.alltoall_async(torch.ones(size, 3), name=name)
    return hvd.reducescatter_async(torch.ones(size, 3), name=name)


def _wait_for_file(path: str, timeout: float = 60.0) -> None:
    """Wait until another rank has created ``path`` (a signal that goes around torchring's engine)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout:g} s"
        time.sleep(0.005)


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"])
def test_duplicate_name_in_flight_is_a_value_error(rank, size, kind, tmp_path_factory):
    # Each rank in turn submits first while the others wait for its signal, so its first request
    # cannot have completed when it submits the second one with the same name.
    submitted = shared_path(tmp_path_factory, f"duplicate_name.{kind}")
    for submitter in range(size):
        name = f"duplicate_name.{kind}.{submitter}"
        if rank == submitter:
            handle = _submit_kind(kind, name, rank, size)
            with pytest.raises(ValueError):
                _submit_kind(kind, name, rank, size)
            open(f"{submitted}.{submitter}", "w").close()
        else:
            _wait_for_file(f"{submitted}.{submitter}")
            handle = _submit_kind(kind, name, rank, size)
        hvd.synchronize(handle)


def test_same_name_for_different_operation_types_in_flight_together(rank, size, tmp_path_factory):
    """Horovod names requests ``allreduce.<name>``, ``allgather.<name>``, ``broadcast.<name>``
    (torch/mpi_ops_v2.cc GetOpName), so different operations may share a user name."""
    kinds = ["allreduce", "allgather", "broadcast"]
    submitted = shared_path(tmp_path_factory, "shared_user_name.submitted")
    if rank != 0:
        _wait_for_file(submitted)  # rank 0's first request is surely still in flight when it submits the others
    handles, refused = {}, []
    for kind in kinds:
        try:
            handles[kind] = _submit_kind(kind, "shared.user.name", rank, size)
        except ValueError:
            refused.append(kind)
    if rank == 0:
        open(submitted, "w").close()
    everyone_refused = hvd.allgather_object(refused, name="shared.user.name.refusals")
    # complete every request on every rank, whatever was refused, so that no rank is left waiting
    results = {}
    for kind in kinds:
        if kind not in handles:
            handles[kind] = _submit_kind(kind, "shared.user.name", rank, size)
        results[kind] = hvd.synchronize(handles[kind])
    assert torch.equal(results["allreduce"], torch.ones(4, 3))
    assert torch.equal(results["allgather"], torch.ones(4 * size, 3))
    assert torch.equal(results["broadcast"], torch.ones(4, 3))
    assert everyone_refused == [[] for _ in range(size)]


@pytest.mark.parametrize("dtype", GRAD_TYPES, ids=str)
def test_allreduce_grad(size, dtype):
    for dim, average in itertools.product(DIMS, (False, True)):
        tensor = seeded([17] * dim, dtype=dtype).requires_grad_()
        reduced = hvd.allreduce(tensor, average=average, name=f"grad.allreduce.{dtype}.{dim}.{average}")
        reduced.backward(torch.ones([17] * dim, dtype=dtype))
        expected = torch.ones([17] * dim, dtype=dtype) * (1 if average else size)
        assert torch.allclose(tensor.grad, expected)


def test_sparse_allreduce_async_returns_a_callable_handle(rank, size):
    """``sparse_allreduce_async`` returns a function that waits and returns the reduced sparse tensor
    (torch/mpi_ops.py sparse_allreduce_async; test_torch.py test_async_sparse_allreduce)."""
    generator = torch.Generator().manual_seed(300 + rank)
    tensors = []
    for rows in [17, 32, 81, 12, 15, 23, 22]:
        dense = torch.rand(rows, 10, generator=generator)
        dense[dense < 0.8] = 0
        tensors.append(dense.to_sparse())
    allreduced = [hvd.allreduce(t.to_dense(), name=f"sparse.dense.{i}") for i, t in enumerate(tensors)]
    handles = [hvd.sparse_allreduce_async(t, op=hvd.Average, name=f"sparse.async.{i}") for i, t in enumerate(tensors)]
    gathered = [handle() for handle in handles]
    for reduced, result in zip(allreduced, gathered, strict=True):
        assert result.is_sparse
        assert torch.allclose(reduced, result.to_dense(), atol=1e-6)


# ---- grouped operations --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_grouped_allreduce(size, dtype):
    for dim in DIMS:
        tensors = [seeded([17] * dim, seed=s, dtype=dtype) for s in range(5)]
        summed = hvd.grouped_allreduce(tensors, average=False)
        assert isinstance(summed, list) and len(summed) == 5
        for result, tensor in zip(summed, tensors, strict=True):
            assert_values(result, tensor.to(torch.float64) * size, dtype)
        averaged = hvd.grouped_allreduce(tensors, average=True)
        for result, tensor in zip(averaged, tensors, strict=True):
            assert_values(result, tensor, dtype)


@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_grouped_allreduce_in_place_and_async(size, dtype):
    tensors = [seeded([17, 3], seed=s, dtype=dtype) for s in range(4)]
    expected = [t.to(torch.float64) * size for t in tensors]
    returned = hvd.grouped_allreduce_(tensors, average=False)
    for result, tensor, want in zip(returned, tensors, expected, strict=True):
        assert result is tensor
        assert_values(tensor, want, dtype)
    others = [seeded([5], seed=10 + s, dtype=dtype) for s in range(3)]
    handle = hvd.grouped_allreduce_async(others, op=hvd.Sum, name=f"grouped.async.{dtype}")
    for result, tensor in zip(hvd.synchronize(handle), others, strict=True):
        assert_values(result, tensor.to(torch.float64) * size, dtype)
    handle = hvd.grouped_allreduce_async_(others, op=hvd.Sum, name=f"grouped.async_.{dtype}")
    hvd.synchronize(handle)
    for tensor, seed in zip(others, range(3), strict=True):
        assert_values(tensor, seeded([5], seed=10 + seed).to(torch.float64) * size, dtype)


@pytest.mark.parametrize("dtype", GRAD_TYPES, ids=str)
def test_grouped_allreduce_grad(size, dtype):
    for dim, average in itertools.product(DIMS, (False, True)):
        tensors = [seeded([17] * dim, seed=s, dtype=dtype).requires_grad_() for s in range(5)]
        summed = hvd.grouped_allreduce(tensors, average=average)
        for result in summed:
            result.backward(torch.ones([17] * dim, dtype=dtype))
        for tensor in tensors:
            assert torch.allclose(tensor.grad, torch.ones([17] * dim, dtype=dtype) * (1 if average else size))


def test_grouped_allgather(rank, size):
    tensors = [torch.full((rank + 1 + i, 3), float(rank * 10 + i)) for i in range(3)]
    gathered = hvd.grouped_allgather(tensors, name="grouped.allgather")
    assert len(gathered) == 3
    for i, result in enumerate(gathered):
        expected = torch.cat([torch.full((r + 1 + i, 3), float(r * 10 + i)) for r in range(size)])
        assert torch.equal(result, expected)
    handle = hvd.grouped_allgather_async([torch.tensor([rank]), torch.tensor([[rank, rank]])])
    first, second = hvd.synchronize(handle)
    assert first.tolist() == list(range(size))
    assert second.tolist() == [[r, r] for r in range(size)]


def test_grouped_reducescatter(rank, size):
    tensors = [seeded([size * 2, 3], seed=s) for s in range(3)]
    results = hvd.grouped_reducescatter(tensors, op=hvd.Sum, name="grouped.reducescatter")
    for result, tensor in zip(results, tensors, strict=True):
        assert torch.equal(result, tensor[rank * 2:(rank + 1) * 2] * size)
    handle = hvd.grouped_reducescatter_async(tensors, op=hvd.Average)
    for result, tensor in zip(hvd.synchronize(handle), tensors, strict=True):
        assert torch.allclose(result, tensor[rank * 2:(rank + 1) * 2])


# ---- allgather -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=str)
def test_allgather(rank, size, dtype):
    for dim in DIMS:
        tensor = torch.ones([17] * dim).mul_(rank).to(dtype)
        gathered = hvd.allgather(tensor)
        assert gathered.dtype == dtype
        assert list(gathered.shape) == [17 * size] + [17] * (dim - 1)
        for r in range(size):
            part = gathered[r * 17:(r + 1) * 17].to(torch.float64)
            assert part.min() == r and part.max() == r


@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=str)
def test_allgather_variable_size(rank, size, dtype):
    sizes = [17, 32, 81, 12, 15, 23, 22][:size]
    for dim in DIMS:
        tensor = torch.ones([sizes[rank]] + [17] * (dim - 1)).mul_(rank).to(dtype)
        gathered = hvd.allgather(tensor)
        assert list(gathered.shape) == [sum(sizes)] + [17] * (dim - 1)
        for r in range(size):
            part = gathered[sum(sizes[:r]):sum(sizes[:r + 1])].to(torch.float64)
            assert list(part.shape) == [sizes[r]] + [17] * (dim - 1)
            assert part.min() == r and part.max() == r


def test_allgather_with_a_rank_contributing_no_rows(rank, size):
    tensor = torch.full((0 if rank == 0 else rank, 4), float(rank))
    gathered = hvd.allgather(tensor, name="allgather.empty.rank")
    assert torch.equal(gathered, torch.cat([torch.full((r, 4), float(r)) for r in range(1, size)]))


def test_allgather_async_fused_is_really_async(rank, size):
    handles = []
    poll_was_false = False
    for dtype, dim in itertools.product(MOVE_TYPES, DIMS):
        handle = hvd.allgather_async(torch.ones([17] * dim).mul_(rank).to(dtype))
        if not hvd.poll(handle):
            poll_was_false = True
        handles.append((handle, [17] * dim))
    assert poll_was_false, "hvd.poll() was always True: not an asynchronous operation?"
    for handle, shape in handles:
        gathered = hvd.synchronize(handle)
        for r in range(size):
            part = gathered[r * 17:(r + 1) * 17].to(torch.float64)
            assert list(part.shape) == shape and part.min() == r and part.max() == r


def test_allgather_shape_and_dtype_mismatch_raise(rank, size):
    shape = [17] * 3
    shape[1] = 10 * (rank + 1)
    with pytest.raises(RuntimeError):
        hvd.allgather(torch.ones(shape), name="allgather.mismatch.shape")
    with pytest.raises(RuntimeError):
        hvd.allgather(torch.ones([17] * 3, dtype=torch.int32 if rank % 2 == 0 else torch.float32),
                      name="allgather.mismatch.dtype")
    with pytest.raises(RuntimeError):
        hvd.allgather(torch.ones([4] * (2 if rank == 0 else 3)), name="allgather.mismatch.ndim")
    assert_allreduce_still_works(size, "allgather.mismatch.after")


@pytest.mark.parametrize("dtype", GRAD_TYPES, ids=str)
def test_allgather_grad(rank, size, dtype):
    sizes = [3, 2, 7, 4, 6, 8, 10][:size]
    for dim in DIMS:
        tensor = torch.ones([sizes[rank]] + [17] * (dim - 1), dtype=dtype).mul_(rank).requires_grad_()
        grad_ys = torch.cat([torch.ones([s] + [17] * (dim - 1), dtype=dtype) * r for r, s in enumerate(sizes)])
        hvd.allgather(tensor, name=f"grad.allgather.{dtype}.{dim}").backward(grad_ys)
        expected = torch.ones([sizes[rank]] + [17] * (dim - 1), dtype=dtype) * rank
        assert torch.allclose(tensor.grad, expected)


# ---- broadcast -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=str)
def test_broadcast(rank, size, dtype):
    for dim, root in itertools.product(DIMS, range(size)):
        tensor = torch.ones([17] * dim).mul_(rank).to(dtype)
        root_tensor = torch.ones([17] * dim).mul_(root).to(dtype)
        result = hvd.broadcast(tensor, root)
        assert result.dtype == dtype
        assert torch.equal(result, root_tensor)
        if rank != root:
            assert torch.equal(tensor, torch.ones([17] * dim).mul_(rank).to(dtype)), "input was modified"


@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=str)
def test_broadcast_in_place(rank, size, dtype):
    for dim, root in itertools.product(DIMS, range(size)):
        tensor = torch.ones([17] * dim).mul_(rank).to(dtype)
        result = hvd.broadcast_(tensor, root)
        assert result is tensor
        assert torch.equal(tensor, torch.ones([17] * dim).mul_(root).to(dtype))
    tensor = torch.full((3,), rank, dtype=dtype)
    hvd.synchronize(hvd.broadcast_async_(tensor, root_rank=size - 1, name=f"bcast.async_.{dtype}"))
    assert torch.equal(tensor, torch.full((3,), size - 1, dtype=dtype))


def test_broadcast_mismatches_raise(rank, size):
    shape = [17] * 3
    shape[1] = 10 * (rank + 1)
    with pytest.raises(RuntimeError):
        hvd.broadcast(torch.ones(shape), 0, name="broadcast.mismatch.shape")
    with pytest.raises(RuntimeError):
        hvd.broadcast(torch.ones([17] * 3, dtype=torch.int32 if rank % 2 == 0 else torch.float32), 0,
                      name="broadcast.mismatch.dtype")
    with pytest.raises(RuntimeError):
        hvd.broadcast(torch.ones([17] * 3), rank, name="broadcast.mismatch.root")
    assert_allreduce_still_works(size, "broadcast.mismatch.after")


@pytest.mark.parametrize("dtype", GRAD_TYPES, ids=str)
def test_broadcast_grad(rank, size, dtype):
    for dim, root in itertools.product(DIMS, range(size)):
        tensor = torch.ones([17] * dim, dtype=dtype).mul_(rank).requires_grad_()
        hvd.broadcast(tensor, root).backward(torch.ones([17] * dim, dtype=dtype))
        expected = torch.ones([17] * dim, dtype=dtype) * (1 if rank == root else 0)
        assert torch.allclose(tensor.grad, expected)


@pytest.mark.parametrize("kind", ["allgather", "broadcast", "alltoall"])
def test_int16_tensors_move_like_the_other_integer_types(rank, size, kind):
    """Horovod registers ShortTensor for allgather, broadcast and alltoall (torch/mpi_ops_v2.cc) and
    its Gloo ops handle HOROVOD_INT16 (gloo_operations.cc GetAlgorithmsForType)."""
    tensor = torch.full((size * 2, 3), rank, dtype=torch.int16)
    try:
        if kind == "allgather":
            result = hvd.allgather(tensor, name="int16.allgather")
            expected = torch.cat([torch.full((size * 2, 3), r, dtype=torch.int16) for r in range(size)])
        elif kind == "broadcast":
            result = hvd.broadcast(tensor, root_rank=size - 1, name="int16.broadcast")
            expected = torch.full((size * 2, 3), size - 1, dtype=torch.int16)
        else:
            result = hvd.alltoall(tensor, name="int16.alltoall")
            expected = torch.cat([torch.full((2, 3), r, dtype=torch.int16) for r in range(size)])
        assert result.dtype == torch.int16
        assert torch.equal(result, expected)
    finally:
        # start afresh whatever happened, so that a failure here cannot leak into later tests
        hvd.shutdown()
        hvd.init()
    assert_allreduce_still_works(size, f"int16.{kind}.after")


# ---- alltoall ------------------------------------------------------------------------------------


def _alltoall_input(rank: int, size: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    values = []
    for i in range(size):
        values += [i] * (rank + 1)
    tensor = torch.tensor(values, dtype=torch.float32)
    for _ in range(dim - 1):
        tensor = torch.cat((tensor.unsqueeze(1), tensor.unsqueeze(1)), dim=1)
    return tensor.to(dtype)


@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=str)
def test_alltoall_with_splits(rank, size, dtype):
    for dim in DIMS:
        tensor = _alltoall_input(rank, size, dim, dtype)
        splits = torch.tensor([rank + 1] * size, dtype=torch.int32)
        collected, received_splits = hvd.alltoall(tensor, splits)
        assert collected.dtype == dtype
        as_float = collected.to(torch.float64)
        assert as_float.min() == rank and as_float.max() == rank
        assert collected.numel() == size * (size + 1) // 2 * 2 ** (dim - 1)
        assert received_splits.tolist() == [r + 1 for r in range(size)]
        assert received_splits.dtype == torch.int32


@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=str)
def test_alltoall_equal_split(rank, size, dtype):
    for dim in DIMS:
        tensor = _alltoall_input(rank, size, dim, dtype)
        collected = hvd.alltoall(tensor)
        assert isinstance(collected, torch.Tensor)
        as_float = collected.to(torch.float64)
        assert as_float.min() == rank and as_float.max() == rank
        assert collected.numel() == size * (size + 1) // 2 * 2 ** (dim - 1)


def test_alltoall_splits_as_a_list_and_async_handle(rank, size):
    tensor = torch.arange(size * 2, dtype=torch.float32).reshape(size * 2, 1) + 100 * rank
    collected, received = hvd.alltoall(tensor, splits=[2] * size, name="alltoall.list.splits")
    expected = torch.cat([torch.arange(rank * 2, rank * 2 + 2, dtype=torch.float32).reshape(2, 1) + 100 * r
                          for r in range(size)])
    assert torch.equal(collected, expected)
    assert received.tolist() == [2] * size and received.dtype == torch.int32
    handle = hvd.alltoall_async(tensor, splits=[2] * size, name="alltoall.async")
    output, received = hvd.synchronize(handle)
    assert torch.equal(output, expected) and received.tolist() == [2] * size


def test_alltoall_zero_splits(rank, size):
    # rank r sends j+1 rows to every other rank j and nothing to itself
    splits = [0 if j == rank else j + 1 for j in range(size)]
    tensor = torch.cat([torch.full((count, 2), float(rank * 10 + j)) for j, count in enumerate(splits)])
    collected, received = hvd.alltoall(tensor, splits=splits, name="alltoall.zero.splits")
    assert received.tolist() == [0 if i == rank else rank + 1 for i in range(size)]
    expected = torch.cat([torch.full((0 if i == rank else rank + 1, 2), float(i * 10 + rank)) for i in range(size)])
    assert torch.equal(collected, expected)


def test_alltoall_with_a_rank_that_sends_nothing(rank, size):
    splits = [0] * size if rank == 0 else [1] * size
    tensor = torch.full((sum(splits), 3), float(rank))
    collected, received = hvd.alltoall(tensor, splits=splits, name="alltoall.empty.sender")
    assert received.tolist() == [0] + [1] * (size - 1)
    assert torch.equal(collected, torch.cat([torch.full((1, 3), float(r)) for r in range(1, size)]))


def test_alltoall_errors(rank, size):
    with pytest.raises(RuntimeError):
        hvd.alltoall(torch.empty(size, dtype=torch.int32 if rank % 2 else torch.float32),
                     name="alltoall.mismatch.dtype")
    with pytest.raises(ValueError):
        hvd.alltoall(torch.empty(size + 1))  # first dimension not divisible by the number of ranks
    with pytest.raises(ValueError):
        hvd.alltoall(torch.empty(size - 1), torch.ones(size, dtype=torch.int32))  # splits add up to too much
    with pytest.raises(ValueError):
        hvd.alltoall(torch.empty(size), torch.empty(size, dtype=torch.float32))  # splits not integers
    shape = [2 * size] * 3
    shape[1] = 10 * (rank + 1)
    with pytest.raises(RuntimeError):
        hvd.alltoall(torch.ones(shape), name="alltoall.mismatch.shape")
    assert_allreduce_still_works(size, "alltoall.errors.after")


@pytest.mark.parametrize("dtype", GRAD_TYPES, ids=str)
def test_alltoall_grad(rank, size, dtype):
    for dim, with_splits in itertools.product(DIMS, (True, False)):
        tensor = _alltoall_input(rank, size, dim, dtype).requires_grad_()
        if with_splits:
            collected, _ = hvd.alltoall(tensor, torch.tensor([rank + 1] * size, dtype=torch.int32))
        else:
            collected = hvd.alltoall(tensor)
        collected.backward(torch.ones(collected.shape, dtype=dtype))
        assert torch.allclose(tensor.grad, torch.ones(tensor.shape, dtype=dtype))


# ---- reducescatter -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_reducescatter_sum_and_average(rank, size, dtype):
    for dim in DIMS:
        tensor = seeded([size * 4] + [17] * (dim - 1), dtype=dtype)
        part = tensor[rank * 4:(rank + 1) * 4]
        summed = hvd.reducescatter(tensor, op=hvd.Sum)
        assert_values(summed, part.to(torch.float64) * size, dtype)
        averaged = hvd.reducescatter(tensor, op=hvd.Average)
        assert_values(averaged, part, dtype)
        assert_values(hvd.reducescatter(tensor), part, dtype)  # Average is the default


def test_reducescatter_uneven_first_dimension_gives_earlier_ranks_more(rank, size):
    rows = 2 * size + 1
    tensor = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    result = hvd.reducescatter(tensor, op=hvd.Sum, name="reducescatter.uneven")
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    assert torch.equal(result, tensor[start:start + counts[rank]] * size)


@pytest.mark.parametrize("dtype", REDUCE_TYPES, ids=str)
def test_reducescatter_prescale_and_postscale(rank, size, dtype):
    tensor = seeded([size * 4, 5], dtype=dtype)
    part = tensor[rank * 4:(rank + 1) * 4]
    pre = hvd.reducescatter(tensor, op=hvd.Sum, prescale_factor=SCALE_FACTOR, name=f"rs.pre.{dtype}")
    assert_values(pre, horovod_scale(part, SCALE_FACTOR).to(torch.float64) * size, dtype)
    post = hvd.reducescatter(tensor, op=hvd.Sum, postscale_factor=SCALE_FACTOR, name=f"rs.post.{dtype}")
    expected = horovod_scale((part.to(torch.float64) * size).to(dtype), SCALE_FACTOR)
    assert_values(post, expected.to(torch.float64), dtype)


def test_reducescatter_async(rank, size):
    tensor = torch.ones(size * 3, 2) * (rank + 1)
    handle = hvd.reducescatter_async(tensor, name="reducescatter.async", op=hvd.Sum)
    assert isinstance(handle, int)
    assert torch.equal(hvd.synchronize(handle), torch.full((3, 2), float(sum(range(1, size + 1)))))


def test_reducescatter_errors(rank, size):
    with pytest.raises(RuntimeError):
        hvd.reducescatter(torch.ones([size * (rank + 1), 4]), name="reducescatter.mismatch.shape")
    with pytest.raises(RuntimeError):
        hvd.reducescatter(torch.ones([size, 4], dtype=torch.int32 if rank % 2 == 0 else torch.float32),
                          name="reducescatter.mismatch.dtype")
    with pytest.raises((ValueError, RuntimeError)):
        hvd.reducescatter(torch.tensor(1.0), name="reducescatter.scalar")
    assert_allreduce_still_works(size, "reducescatter.errors.after")


def _reducescatter_grad_output(rank: int, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A gradient that differs per rank and per element, so that misplaced rows show."""
    return (seeded(shape, seed=7, dtype=dtype) + 1000 * rank).to(dtype)


@pytest.mark.parametrize("dtype", GRAD_TYPES, ids=str)
def test_reducescatter_grad(rank, size, dtype):
    # Horovod: the incoming gradient times size (Sum) or 1 (Average), times both scale factors, allgathered
    cases = itertools.product(DIMS, (hvd.Sum, hvd.Average), ((1.0, 1.0), (SCALE_FACTOR, 3.0)))
    for dim, op, (prescale, postscale) in cases:
        tensor = seeded([size * 4] + [17] * (dim - 1), dtype=dtype).requires_grad_()
        result = hvd.reducescatter(tensor, op=op, prescale_factor=prescale, postscale_factor=postscale)
        grad_output = _reducescatter_grad_output(rank, list(result.shape), dtype)
        result.backward(grad_output)
        factor = (size if op == hvd.Sum else 1) * prescale * postscale
        expected = torch.cat([_reducescatter_grad_output(r, list(result.shape), dtype) for r in range(size)]) * factor
        assert torch.allclose(tensor.grad, expected), (op, prescale, postscale)


@pytest.mark.parametrize("dtype", GRAD_TYPES, ids=str)
def test_grouped_allgather_grad_matches_allgather_for_every_tensor(rank, size, dtype):
    for dim in DIMS:
        shapes = [[rank + 1 + i] + [5] * (dim - 1) for i in range(3)]
        grouped = [seeded(shape, seed=i, dtype=dtype).requires_grad_() for i, shape in enumerate(shapes)]
        single = [t.detach().clone().requires_grad_() for t in grouped]
        results = hvd.grouped_allgather(grouped, name=f"grad.grouped_allgather.{dtype}.{dim}")
        for i, result in enumerate(results):
            grad_output = seeded(list(result.shape), seed=100 + i, dtype=dtype) * (rank + 1)
            result.backward(grad_output)
            hvd.allgather(single[i], name=f"grad.allgather.single.{dtype}.{dim}.{i}").backward(grad_output)
        for grouped_tensor, single_tensor in zip(grouped, single, strict=True):
            assert grouped_tensor.grad is not None
            assert torch.allclose(grouped_tensor.grad, single_tensor.grad)


@pytest.mark.parametrize("dtype", GRAD_TYPES, ids=str)
def test_grouped_reducescatter_grad_matches_reducescatter_for_every_tensor(rank, size, dtype):
    cases = itertools.product(DIMS, (hvd.Sum, hvd.Average), ((1.0, 1.0), (SCALE_FACTOR, 3.0)))
    for dim, op, (prescale, postscale) in cases:
        grouped = [seeded([size * (2 + i)] + [5] * (dim - 1), seed=i, dtype=dtype).requires_grad_()
                   for i in range(3)]
        single = [t.detach().clone().requires_grad_() for t in grouped]
        results = hvd.grouped_reducescatter(grouped, op=op, prescale_factor=prescale, postscale_factor=postscale)
        for i, result in enumerate(results):
            grad_output = _reducescatter_grad_output(rank, list(result.shape), dtype)
            result.backward(grad_output)
            hvd.reducescatter(single[i], op=op, prescale_factor=prescale,
                              postscale_factor=postscale).backward(grad_output)
        for grouped_tensor, single_tensor in zip(grouped, single, strict=True):
            assert grouped_tensor.grad is not None
            assert torch.allclose(grouped_tensor.grad, single_tensor.grad)


# ---- join ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("first_join_rank", [0, 1])
def test_join_allreduce(rank, size, first_join_rank, caching):
    last_joined = []
    for dtype, dim in itertools.product([torch.int32, torch.int64, torch.float32, torch.float64], DIMS):
        tensor_a = seeded([5] * dim, low=0, high=100, seed=1, dtype=dtype)
        tensor_b = seeded([17] * dim, low=0, high=100, seed=2, dtype=dtype)
        if caching:
            hvd.synchronize(hvd.allreduce_async(tensor_a, name="tensor_a", average=True))
            hvd.synchronize(hvd.allreduce_async(tensor_b, name="tensor_b", average=True))
        if rank == first_join_rank:
            last_joined.append(hvd.join())
            continue
        handle_a = hvd.allreduce_async(tensor_a, name="tensor_a", average=True)
        handle_b = hvd.allreduce_async(tensor_b, name="tensor_b", average=True)
        averaged_a, averaged_b = hvd.synchronize(handle_a), hvd.synchronize(handle_b)
        last_joined.append(hvd.join(hvd.local_rank()))
        # the joined rank contributed zeros; the average still divides by the full size
        for averaged, tensor in ((averaged_a, tensor_a), (averaged_b, tensor_b)):
            if dtype.is_floating_point:
                assert torch.allclose(averaged, tensor * (size - 1) / size)
            else:
                assert torch.equal(averaged, tensor * (size - 1) // size)
    assert all(type(value) is int for value in last_joined)
    everyone = hvd.allgather(torch.tensor(last_joined), name="join.last.ranks").reshape(size, -1)
    assert all(torch.equal(row, everyone[0]) for row in everyone)
    assert first_join_rank not in last_joined


def test_join_returns_the_same_rank_everywhere(rank, size):
    last = hvd.join()
    assert type(last) is int and 0 <= last < size
    everyone = hvd.allgather(torch.tensor([last]), name="join.alone.last")
    assert everyone.tolist() == [last] * size


#: Collectives a joined member refuses (every other member gets HorovodInternalError), and the ones it
#: takes part in with zeros.
JOIN_REFUSED = ["allgather", "broadcast", "alltoall", "reducescatter", "grouped_allgather", "grouped_reducescatter"]
JOIN_ACCEPTED = ["allreduce", "grouped_allreduce"]


def _collective_beside_join(kind: str, process_set, name: str) -> None:
    """Run collective ``kind`` on ``process_set`` (sized for it), discarding the result."""
    n = process_set.size()
    if kind == "allgather":
        hvd.allgather(torch.ones(17, 3), name=name, process_set=process_set)
    elif kind == "broadcast":
        hvd.broadcast(torch.ones(17, 3), process_set.ranks[-1], name=name, process_set=process_set)
    elif kind == "alltoall":
        hvd.alltoall(torch.ones(n, 3), name=name, process_set=process_set)
    elif kind == "reducescatter":
        hvd.reducescatter(torch.ones(n, 3), name=name, process_set=process_set)
    elif kind == "grouped_allgather":
        hvd.grouped_allgather([torch.ones(2, 3), torch.ones(1)], name=name, process_set=process_set)
    elif kind == "grouped_reducescatter":
        hvd.grouped_reducescatter([torch.ones(n, 3), torch.ones(n)], name=name, process_set=process_set)
    elif kind == "allreduce":
        hvd.allreduce(torch.ones(2, 3), name=name, process_set=process_set)
    else:
        hvd.grouped_allreduce([torch.ones(2, 3), torch.ones(1)], name=name, process_set=process_set)


def _join_scenarios(rank: int, size: int, process_set, tag: str | None) -> None:
    """For each rank joining first and each collective: the members still running run it, get an error
    exactly when a joined rank is a member and the collective refuses joined ranks, then join; every
    rank must get the same return value from join(). Without ``tag`` the collectives are unnamed: the
    joined ranks' automatic names must stay in step (the final allgather is unnamed too)."""
    outcomes, expected, lasts = [], [], []
    for first, kind in itertools.product(range(size), JOIN_REFUSED + JOIN_ACCEPTED):
        if rank != first and process_set.included():
            refused = kind in JOIN_REFUSED and first in process_set.ranks
            expected.append(f"{kind}/{first}: {'error' if refused else 'ran'}")
            try:
                _collective_beside_join(kind, process_set, tag and f"{tag}.{kind}.{first}")
                outcomes.append(f"{kind}/{first}: ran")
            except hvd.HorovodInternalError:
                outcomes.append(f"{kind}/{first}: error")
        lasts.append(hvd.join())
        if process_set.included():  # after each join the members' numbering in the set is in step
            gathered = hvd.allgather(torch.ones(1), name=tag and f"{tag}.set.{kind}.{first}", process_set=process_set)
            assert gathered.shape == (process_set.size(),)
    everyone = hvd.allgather(torch.tensor([lasts]), name=tag and f"{tag}.last").reshape(size, -1)
    assert all(torch.equal(row, everyone[0]) for row in everyone), everyone
    assert outcomes == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tag", ["join.others", None], ids=["named", "unnamed"])
def test_join_with_other_collectives_raises_on_the_ranks_still_running(rank, size, tag):
    _join_scenarios(rank, size, hvd.global_process_set, tag)
    assert_allreduce_still_works(size, "join.others.after")


@pytest.mark.timeout(60)
def test_join_with_unnamed_collectives_on_a_process_set(rank, size):
    subset = hvd.ProcessSet(list(range(size - 1)))  # the last rank is outside it
    with reinitialized(process_sets=[subset]):
        _join_scenarios(rank, size, subset, None)
        assert_allreduce_still_works(size, "join.set.after")


# ---- barrier, poll and synchronize ---------------------------------------------------------------


def test_barrier():
    for _ in range(3):
        assert hvd.barrier() is None
    assert hvd.barrier(process_set=hvd.global_process_set) is None


def test_poll_and_synchronize_semantics(size):
    handle = hvd.allreduce_async(torch.ones(8), op=hvd.Sum, name="poll.semantics")
    while not hvd.poll(handle):
        time.sleep(0.001)
    assert hvd.poll(handle) is True  # still pollable until synchronized
    assert torch.equal(hvd.synchronize(handle), torch.full((8,), float(size)))
    assert hvd.synchronize(handle) is None  # a synchronized handle is gone: nothing to return
    with pytest.raises(ValueError):
        hvd.poll(handle)  # "Handle ... was not created or has been cleared."


def test_synchronize_of_a_failed_operation_raises_horovod_internal_error(rank, size):
    handle = hvd.allreduce_async(torch.ones(2 + rank), name="failed.async")
    with pytest.raises(hvd.HorovodInternalError):
        hvd.synchronize(handle)
    assert_allreduce_still_works(size, "failed.async.after")


# ---- process sets --------------------------------------------------------------------------------


def _exercise_process_set(rank: int, process_set, members: list[int], tag: str) -> None:
    assert process_set.included() is True
    assert process_set.size() == len(members)
    assert process_set.rank() == members.index(rank)
    value = torch.full((4,), float(rank))
    summed = hvd.allreduce(value, op=hvd.Sum, process_set=process_set, name=f"{tag}.allreduce")
    assert torch.equal(summed, torch.full((4,), float(sum(members))))
    averaged = hvd.allreduce(value, process_set=process_set, name=f"{tag}.average")
    assert torch.allclose(averaged, torch.full((4,), sum(members) / len(members)))
    grouped = hvd.grouped_allreduce([value, value * 2], op=hvd.Sum, process_set=process_set,
                                    name=f"{tag}.grouped")
    assert torch.equal(grouped[1], torch.full((4,), 2.0 * sum(members)))
    gathered = hvd.allgather(torch.tensor([[rank, rank]]), process_set=process_set, name=f"{tag}.allgather")
    assert gathered.tolist() == [[r, r] for r in members]
    for root in members:  # broadcast roots are global ranks
        result = hvd.broadcast(value, root_rank=root, process_set=process_set, name=f"{tag}.broadcast.{root}")
        assert torch.equal(result, torch.full((4,), float(root)))
    sent = torch.tensor([[rank * 10 + j] for j in range(len(members))], dtype=torch.float32)
    received = hvd.alltoall(sent, process_set=process_set, name=f"{tag}.alltoall")
    me = members.index(rank)
    assert received.reshape(-1).tolist() == [float(r * 10 + me) for r in members]
    scattered = hvd.reducescatter(torch.ones(len(members) * 2, 3), op=hvd.Sum, process_set=process_set,
                                  name=f"{tag}.reducescatter")
    assert torch.equal(scattered, torch.full((2, 3), float(len(members))))
    hvd.barrier(process_set=process_set)


def test_process_set_ranks_are_kept_sorted():
    assert hvd.ProcessSet([2, 0, 1]).ranks == [0, 1, 2]
    assert hvd.global_process_set.process_set_id == 0


def test_dynamic_process_sets(rank, size):
    even, odd = even_odd_ranks(size)
    with reinitialized(process_sets="dynamic"):
        even_set = hvd.add_process_set(even)
        odd_set = hvd.add_process_set(hvd.ProcessSet(odd))
        assert isinstance(even_set, hvd.ProcessSet) and even_set.ranks == even
        assert even_set.process_set_id != odd_set.process_set_id
        assert 0 not in (even_set.process_set_id, odd_set.process_set_id)
        mine, members, other = (even_set, even, odd_set) if rank in even else (odd_set, odd, even_set)
        assert other.included() is False
        assert hvd.global_process_set.size() == size and hvd.global_process_set.rank() == rank
        _exercise_process_set(rank, mine, members, "dynamic")
        # a collective on a set this rank is not part of is refused at once
        with pytest.raises(ValueError):
            hvd.allreduce(torch.ones(1), process_set=other, name="dynamic.foreign")
        # the same set twice is refused
        with pytest.raises(ValueError):
            hvd.add_process_set(list(even))
        # the global set cannot be removed
        assert hvd.remove_process_set(hvd.global_process_set) is False
        assert hvd.remove_process_set(odd_set) is True
        assert odd_set.process_set_id is None
        assert hvd.remove_process_set(even_set) is True
        # after removal the same ranks can form a set again
        again = hvd.add_process_set(even)
        if rank in even:
            _exercise_process_set(rank, again, even, "dynamic.again")
        assert hvd.remove_process_set(again) is True
        assert_allreduce_still_works(size, "dynamic.after")


def test_static_process_sets_given_to_init(rank, size):
    even, odd = even_odd_ranks(size)
    even_set, odd_set = hvd.ProcessSet(even), hvd.ProcessSet(odd)
    with reinitialized(process_sets=[even_set, odd_set]):
        assert even_set.process_set_id is not None and odd_set.process_set_id is not None
        mine, members = (even_set, even) if rank in even else (odd_set, odd)
        _exercise_process_set(rank, mine, members, "static")
        with pytest.raises(ValueError):
            hvd.add_process_set([0])  # without dynamic process sets
        assert_allreduce_still_works(size, "static.after")


def test_dynamic_process_sets_enabled_by_environment(rank, size):
    with reinitialized(HOROVOD_DYNAMIC_PROCESS_SETS="1"):
        first = hvd.add_process_set([0])
        if rank == 0:
            assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=first, name="env.ps"),
                               torch.ones(2))
        assert hvd.remove_process_set(first) is True


# ---- helpers: broadcast_parameters, broadcast_optimizer_state, objects, compression ---------------


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.bn = nn.BatchNorm1d(5)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        return self.out(F.relu(self.bn(self.fc(x))))


def _rank_model(rank: int) -> _Net:
    torch.manual_seed(500 + rank)
    model = _Net()
    model.train()
    model(torch.randn(8, 6))  # move the BatchNorm buffers away from their defaults
    return model


def test_broadcast_parameters_state_dict_including_buffers(rank):
    model = _rank_model(rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    reference = _rank_model(0)
    for (name, mine), (_, expected) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(mine, expected), name


def test_broadcast_parameters_lists(rank, size):
    model = _rank_model(rank)
    root = size - 1
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=root)
    reference = _rank_model(root)
    for mine, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, expected)
    model = _rank_model(rank)
    hvd.broadcast_parameters(list(model.parameters()), root_rank=0)
    for mine, expected in zip(model.parameters(), _rank_model(0).parameters(), strict=True):
        assert torch.equal(mine, expected)


def _filtered_options(cls, options: dict) -> dict:
    accepted = inspect.signature(cls.__init__).parameters
    return {key: value for key, value in options.items() if key in accepted}


def _optimizer_values(optimizer) -> list:
    results = []
    state_dict = optimizer.state_dict()
    for group in state_dict["param_groups"]:
        for param_id in group["params"]:
            if param_id not in state_dict["state"]:
                continue
            for key, value in sorted(state_dict["state"][param_id].items()):
                results.append((key, value.clone() if torch.is_tensor(value) else value))
    return results


def _regression_model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 6), nn.ReLU(), nn.Linear(6, 4))


@pytest.mark.parametrize("options", [dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True), dict(lr=0.2)],
                         ids=["many-options", "lr-only"])
@pytest.mark.parametrize("opt_class", OPTIMIZER_CLASSES, ids=lambda c: c.__name__)
def test_broadcast_optimizer_state_from_a_checkpoint_on_rank_0(rank, tmp_path, opt_class, options):
    torch.manual_seed(7)
    x, y = torch.randn(16, 10), torch.randn(16, 4)

    def create():
        model = _regression_model()
        optimizer = opt_class(model.parameters(), **_filtered_options(opt_class, options))
        return model, hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    model, optimizer = create()
    optimizer.zero_grad()
    F.mse_loss(model(x), y, reduction="sum").backward()
    optimizer.step()
    model_values = [(k, v.clone()) for k, v in sorted(model.state_dict().items())]
    for index, (_, value) in enumerate(model_values):
        hvd.broadcast_(value, root_rank=0, name=f"bstate.model.{index}")
    opt_values = []
    for index, (key, value) in enumerate(_optimizer_values(optimizer)):
        if torch.is_tensor(value):
            hvd.broadcast_(value, root_rank=0, name=f"bstate.opt.{index}")
        else:
            value = hvd.broadcast_object(value, name=f"bstate.opt.{index}")
        opt_values.append((key, value))

    checkpoint = tmp_path / "checkpoint.pt"
    if rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
    model, optimizer = create()
    if rank == 0:
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for (name, before), (name_after, after) in zip(model_values, sorted(model.state_dict().items()), strict=True):
        assert name == name_after and torch.equal(before, after), name
    expected_entries = hvd.broadcast_object(len(optimizer.state_dict()["state"]), name="bstate.entries")
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert len(optimizer.state_dict()["state"]) == expected_entries
    after_values = _optimizer_values(optimizer)
    assert len(after_values) == len(opt_values)
    for (key, before), (key_after, after) in zip(opt_values, after_values, strict=True):
        assert key == key_after
        assert type(before) is type(after), key
        if torch.is_tensor(before):
            assert torch.equal(before, after), key
        else:
            assert before == after, key


@pytest.mark.parametrize("opt_class", OPTIMIZER_CLASSES, ids=lambda c: c.__name__)
def test_broadcast_optimizer_state_keeps_option_types(rank, opt_class):
    torch.manual_seed(11)
    x, y = torch.randn(16, 10), torch.randn(16, 4)
    params_0 = dict(lr=0.1, momentum=0.8, weight_decay=0.2, nesterov=True, betas=(0.9, 0.999),
                    etas=(0.8, 2.4), step_sizes=(1e-5, 100))
    params_1 = dict(lr=0.2, momentum=0.9, weight_decay=0.1, nesterov=False, betas=(0.8, 0.9),
                    etas=(0.25, 1.75), step_sizes=(1e-7, 5))
    model = _regression_model()
    chosen = _filtered_options(opt_class, params_0 if rank == 0 else params_1)
    optimizer = hvd.DistributedOptimizer(opt_class(model.parameters(), **chosen),
                                         named_parameters=model.named_parameters())
    optimizer.zero_grad()
    F.mse_loss(model(x), y, reduction="sum").backward()
    optimizer.step()

    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for key, expected in _filtered_options(opt_class, params_0).items():
        actual = optimizer.param_groups[0][key]
        assert type(actual) is type(expected), key
        pairs = zip(actual, expected, strict=True) if isinstance(expected, tuple) else [(actual, expected)]
        for got, want in pairs:
            assert type(got) is type(want), key
            assert got == pytest.approx(want, abs=1e-5), key
    # the options still work with the optimizer
    optimizer.zero_grad()
    F.mse_loss(model(x), y, reduction="sum").backward()
    optimizer.step()


def test_broadcast_optimizer_state_initialises_state_and_leaves_zero_gradients(rank):
    """Horovod creates the state of a fresh optimizer with a step on zero gradients and leaves those
    zero gradients in place (functions.py broadcast_optimizer_state; test_broadcast_state_no_grad)."""

    class ModelNoGrad(nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.a = nn.Parameter(a.int(), requires_grad=False)
            self.b = nn.Parameter(b)

        def forward(self, x):
            return torch.index_select(self.b, 0, self.a.long()) * x

    model = ModelNoGrad(torch.tensor([1.0, 3.0]), torch.rand(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert optimizer.param_groups[0]["params"][0].grad is None
    grad = optimizer.param_groups[0]["params"][1].grad
    assert isinstance(grad, torch.Tensor)
    broadcast_grad = hvd.broadcast(grad, root_rank=0, name="no_grad.broadcast")
    assert torch.equal(grad, broadcast_grad)


def test_broadcast_optimizer_state_refuses_lbfgs():
    model = _regression_model()
    with pytest.raises(ValueError):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)


def test_broadcast_object(rank, size):
    expected = {"hello": 123, 0: [1, 2]}
    assert hvd.broadcast_object(expected if rank == 0 else {}, root_rank=0) == expected
    last = size - 1
    payload = {"tensor": torch.arange(4) * last, "tuple": (last, "x")}
    received = hvd.broadcast_object(payload if rank == last else None, root_rank=last, name="bcast.object.last")
    assert torch.equal(received["tensor"], torch.arange(4) * last) and received["tuple"] == (last, "x")


def test_broadcast_object_with_a_process_set(rank, size):
    """``broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set)``."""
    obj = hvd.broadcast_object({"root": rank}, root_rank=0, name="bcast.object.ps",
                               process_set=hvd.global_process_set)
    assert obj == {"root": 0}


def test_allgather_object(rank, size):
    data = {"metric_val_1": rank}
    if rank == 1:
        data["metric_val_2"] = 42
    results = hvd.allgather_object(data)
    expected = [{"metric_val_1": r} for r in range(size)]
    expected[1] = {"metric_val_1": 1, "metric_val_2": 42}
    assert results == expected


def test_compression_fp16():
    compression = hvd.Compression.fp16
    for dtype in (torch.float32, torch.float64):
        tensor = torch.ones([5] * 3, dtype=dtype)
        compressed, ctx = compression.compress(tensor)
        assert compressed.dtype == torch.float16
        decompressed = compression.decompress(compressed, ctx)
        assert decompressed.dtype == dtype and torch.equal(decompressed, tensor)
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        tensor = torch.ones([5] * 3, dtype=dtype)
        compressed, ctx = compression.compress(tensor)
        assert compressed.dtype == dtype
        decompressed = compression.decompress(compressed, ctx)
        assert decompressed.dtype == dtype and torch.equal(decompressed, tensor)
    tensor = torch.rand(4)
    compressed, ctx = hvd.Compression.none.compress(tensor)
    assert compressed is tensor and hvd.Compression.none.decompress(compressed, ctx) is tensor


# ---- DistributedOptimizer ------------------------------------------------------------------------


def _batch(seed: int, n: int = 6):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def _small_model(seed: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _local_gradients(model: nn.Module, batches) -> list[torch.Tensor]:
    """The gradients a plain copy of ``model`` accumulates over ``batches`` on this rank."""
    twin = _small_model()
    twin.load_state_dict(model.state_dict())
    for data, target in batches:
        F.cross_entropy(twin(data), target).backward()
    return [p.grad.clone() for p in twin.parameters()]


def test_distributed_optimizer_subclasses_the_wrapped_optimizer():
    model = _small_model()
    for cls in (torch.optim.SGD, torch.optim.Adam):
        optimizer = hvd.DistributedOptimizer(cls(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
        assert isinstance(optimizer, cls)
        assert type(optimizer).__name__ == cls.__name__


def test_named_parameters_validation():
    net1, net2 = nn.Conv2d(1, 1, 1), nn.Conv2d(1, 1, 1)
    optimizer = torch.optim.SGD(itertools.chain(net1.parameters(), net2.parameters()), lr=0.1)
    with pytest.raises(ValueError):  # both nets name their parameters 'weight' and 'bias'
        hvd.DistributedOptimizer(optimizer, named_parameters=itertools.chain(net1.named_parameters(),
                                                                             net2.named_parameters()))
    model = _small_model()
    with pytest.raises(ValueError):  # only some parameters named
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=list(model.named_parameters())[0:1])
    with pytest.raises(ValueError):  # not (name, parameter) tuples
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.parameters())


def test_no_named_parameters_trains(rank):
    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(2):
        data, target = _batch(rank * 100 + step)
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    assert_same_on_all_ranks(torch.cat([p.reshape(-1) for p in model.parameters()]), "no.names.params")


def test_step_applies_the_gradient_averaged_over_ranks(rank, size):
    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    batch = _batch(rank)
    local = _local_gradients(model, [batch])
    expected = [hvd.allreduce(g, name=f"avg.expected.{i}") for i, g in enumerate(local)]
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    optimizer.step()
    for p, b, g in zip(model.parameters(), before, expected, strict=True):
        assert torch.allclose(p.grad, g, atol=1e-6)
        assert torch.allclose(p, b - 0.1 * g, atol=1e-6)


def test_op_sum_and_gradient_predivide_factor(rank, size):
    batch = _batch(rank + 20)
    model = _small_model()
    local = _local_gradients(model, [batch])
    summed = [hvd.allreduce(g, op=hvd.Sum, name=f"sum.expected.{i}") for i, g in enumerate(local)]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    optimizer.synchronize()
    for p, g in zip(model.parameters(), summed, strict=True):
        assert torch.allclose(p.grad, g, atol=1e-5)
    with optimizer.skip_synchronize():
        optimizer.step()

    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), gradient_predivide_factor=2.0)
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    optimizer.synchronize()
    for p, g in zip(model.parameters(), summed, strict=True):
        assert torch.allclose(p.grad, g / size, atol=1e-5)
    with optimizer.skip_synchronize():
        optimizer.step()
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)


def _check_accumulated_step(model: nn.Module, optimizer: torch.optim.Optimizer, batches, name: str) -> None:
    """Backward over every batch, then synchronize: the gradients are the averages of the accumulated
    local gradients; then step."""
    local = _local_gradients(model, batches)
    expected = [hvd.allreduce(g, name=f"{name}.{i}") for i, g in enumerate(local)]
    optimizer.zero_grad()
    for data, target in batches:
        F.cross_entropy(model(data), target).backward()
    optimizer.synchronize()
    for p, g in zip(model.parameters(), expected, strict=True):
        assert torch.allclose(p.grad, g, atol=1e-6)
    with optimizer.skip_synchronize():
        optimizer.step()


def test_backward_passes_per_step(rank, size):
    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), backward_passes_per_step=2)
    batches = [_batch(rank * 10 + i) for i in range(2)]
    _check_accumulated_step(model, optimizer, batches, "bpps.expected")
    # and once more, after the counters were reset by the step
    optimizer.zero_grad()
    for data, target in batches:
        F.cross_entropy(model(data), target).backward()
    optimizer.step()
    assert_same_on_all_ranks(torch.cat([p.reshape(-1) for p in model.parameters()]), "bpps.params")


def test_more_backward_passes_than_declared_is_an_error(rank):
    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    data, target = _batch(rank)
    F.cross_entropy(model(data), target).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        F.cross_entropy(model(data), target).backward()
    optimizer.synchronize()


def test_gradient_clipping_with_synchronize_and_skip_synchronize(size):
    x, y = torch.ones(1, 1).requires_grad_(), torch.ones(1, 1).requires_grad_()
    model = nn.Linear(1, 1)
    model.weight = nn.Parameter(torch.zeros(1, 1) + 0.5)
    model.bias = nn.Parameter(torch.zeros(1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.synchronize()
    prior_grad = model.weight.grad.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    clipped_grad = model.weight.grad.item()
    assert abs(prior_grad) > abs(clipped_grad)
    with optimizer.skip_synchronize():
        optimizer.step()
    assert model.weight.item() == pytest.approx(0.5 - 0.1 * clipped_grad)


def test_step_after_synchronize_without_skip_synchronize_warns_once():
    x, y = torch.zeros(1, 1).requires_grad_(), torch.ones(1, 1).requires_grad_()
    model = nn.Linear(1, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "optimizer.step() called without optimizer.skip_synchronize()" in str(caught[0].message)


def test_zero_grad_between_backward_and_step_is_an_error(rank):
    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    data, target = _batch(rank)
    F.cross_entropy(model(data), target).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        optimizer.zero_grad()
    optimizer.step()
    optimizer.zero_grad()  # allowed again after step()


@pytest.mark.parametrize("options", [dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True), dict(lr=0.2)],
                         ids=["many-options", "lr-only"])
@pytest.mark.parametrize("opt_class", OPTIMIZER_CLASSES, ids=lambda c: c.__name__)
def test_force_allreduce_of_parameters_without_gradients(rank, opt_class, options):
    """Rank 0 never uses ``fc3``; the other ranks do. No rank may wait forever, and every rank
    applies the same update."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(10, 6), nn.Linear(6, 4), nn.Linear(4, 4)

        def forward(self, x):
            hidden = F.relu(self.fc1(x))
            first = self.fc2(hidden)
            return first, self.fc3(F.relu(first))

    torch.manual_seed(rank)
    model = Net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(opt_class(model.parameters(), **_filtered_options(opt_class, options)),
                                         named_parameters=model.named_parameters())
    x, y = torch.randn(16, 10), torch.randn(16, 4)
    for _ in range(2):
        first, second = model(x)
        loss = F.mse_loss(first if rank == 0 else second, y, reduction="sum")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert_same_on_all_ranks(torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                             f"force.allreduce.{opt_class.__name__}.{len(options)}")


def test_dynamic_requires_grad(rank):
    torch.manual_seed(5)
    gen, disc = nn.Conv2d(1, 10, 1), nn.Conv2d(10, 1, 1)
    hvd.broadcast_parameters(gen.state_dict(), root_rank=0)
    hvd.broadcast_parameters(disc.state_dict(), root_rank=0)
    inp = torch.rand([1, 1, 20, 20]) + rank
    gen_opt = hvd.DistributedOptimizer(torch.optim.SGD(gen.parameters(), lr=0.1),
                                       named_parameters=gen.named_parameters())
    disc_opt = hvd.DistributedOptimizer(torch.optim.SGD(disc.parameters(), lr=0.1),
                                        named_parameters=disc.named_parameters())

    def train_step(train_generator=False, train_discriminator=False):
        for p in gen.parameters():
            p.requires_grad_(train_generator)
        for p in disc.parameters():
            p.requires_grad_(train_discriminator)
        gen_opt.zero_grad()
        disc_opt.zero_grad()
        disc(gen(inp)).sum().backward()
        for p in gen.parameters():
            assert (p.grad is not None and bool(p.grad.abs().max() > 0)) == train_generator
        for p in disc.parameters():
            assert (p.grad is not None and bool(p.grad.abs().max() > 0)) == train_discriminator
        if train_generator:
            gen_opt.step()
        if train_discriminator:
            disc_opt.step()

    for _ in range(3):
        train_step(train_generator=True)
        train_step(train_discriminator=True)
    for p in itertools.chain(gen.parameters(), disc.parameters()):
        p.requires_grad_(True)
    assert_same_on_all_ranks(torch.cat([p.detach().reshape(-1) for p in gen.parameters()]), "gan.gen")
    assert_same_on_all_ranks(torch.cat([p.detach().reshape(-1) for p in disc.parameters()]), "gan.disc")


def _train_copy(rank: int, **optimizer_kwargs) -> list[torch.Tensor]:
    model = _small_model()
    groups = optimizer_kwargs.pop("groups", None)
    if callable(groups):
        groups = groups(list(model.parameters()))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                         named_parameters=model.named_parameters(), groups=groups,
                                         **optimizer_kwargs)
    for step in range(3):
        data, target = _batch(rank * 7 + step)
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_groups_give_the_same_result_as_no_groups(rank):
    plain = _train_copy(rank)
    for groups in (2, lambda params: [params[:2], params[2:3]]):
        grouped = _train_copy(rank, groups=groups)
        for a, b in zip(plain, grouped, strict=True):
            assert torch.allclose(a, b, atol=1e-6)


def test_num_groups_is_deprecated_in_favour_of_groups(rank):
    model = _small_model()
    with pytest.warns(DeprecationWarning):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), num_groups=2)


def test_groups_validation():
    model = _small_model()
    params = list(model.parameters())
    with pytest.raises(ValueError):  # a parameter in two groups
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=model.named_parameters(),
                                 groups=[[params[0], params[1]], [params[1], params[2]]])
    with pytest.raises(ValueError):  # not tensors
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=model.named_parameters(),
                                 groups=[["fc.weight"]])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=model.named_parameters(),
                                 groups=-1)


def test_fp16_compression_in_the_optimizer(rank):
    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)
    batch = _batch(rank + 40)
    local = _local_gradients(model, [batch])
    expected = [hvd.allreduce(g, name=f"fp16.expected.{i}") for i, g in enumerate(local)]
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    optimizer.synchronize()
    for p, g in zip(model.parameters(), expected, strict=True):
        assert p.grad.dtype == torch.float32
        assert torch.allclose(p.grad, g, atol=1e-2, rtol=1e-2)
    with optimizer.skip_synchronize():
        optimizer.step()
    assert_same_on_all_ranks(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), "fp16.params")


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_gradients(rank, size, sparse_as_dense):
    torch.manual_seed(9)
    embedding = nn.Embedding(12, 4, sparse=True)
    initial = embedding.weight.detach().clone()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=0.5),
                                         named_parameters=embedding.named_parameters(),
                                         sparse_as_dense=sparse_as_dense)
    indices = torch.tensor([rank, rank + 1, 7, rank])
    optimizer.zero_grad()
    embedding(indices).sum().backward()
    optimizer.step()
    dense = torch.zeros(12, 4)
    dense.index_add_(0, indices, torch.ones(4, 4))
    expected = initial - 0.5 * hvd.allreduce(dense, name=f"sparse.expected.{sparse_as_dense}")
    assert torch.allclose(embedding.weight, expected, atol=1e-6)


def test_frozen_parameters_are_left_alone(rank):
    model = _small_model()
    for p in model[0].parameters():
        p.requires_grad_(False)
    frozen = [p.detach().clone() for p in model[0].parameters()]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    for step in range(2):
        data, target = _batch(rank * 3 + step)
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    for p, before in zip(model[0].parameters(), frozen, strict=True):
        assert p.grad is None and torch.equal(p, before)
    assert_same_on_all_ranks(torch.cat([p.detach().reshape(-1) for p in model[2].parameters()]), "frozen.trained")


def test_set_backward_passes_per_step(rank, size):
    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    optimizer.set_backward_passes_per_step(3)
    assert optimizer.backward_passes_per_step == 3
    _check_accumulated_step(model, optimizer, [_batch(rank * 5 + i) for i in range(3)], "set.bpps.expected")


def test_load_state_dict_discards_pending_gradient_reductions(rank, size):
    """``DistributedOptimizer.load_state_dict`` forgets the reductions of the interrupted step
    (torch/optimizer.py _DistributedOptimizer.load_state_dict), as an elastic restore needs."""
    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters())
    saved = optimizer.state_dict()
    data, target = _batch(rank + 80)
    F.cross_entropy(model(data), target).backward()
    time.sleep(0.5)  # let the reductions started by backward finish on every rank
    hvd.barrier()
    optimizer.load_state_dict(saved)
    optimizer.zero_grad()
    F.cross_entropy(model(data), target).backward()
    optimizer.step()
    assert_same_on_all_ranks(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), "reload.params")


def test_distributed_optimizer_with_a_process_set(rank, size):
    """``DistributedOptimizer(..., process_set=...)`` reduces gradients within the set only."""
    model = _small_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         process_set=hvd.global_process_set)
    batch = _batch(rank + 60)
    local = _local_gradients(model, [batch])
    expected = [hvd.allreduce(g, name=f"ps.opt.expected.{i}") for i, g in enumerate(local)]
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    optimizer.step()
    for p, g in zip(model.parameters(), expected, strict=True):
        assert torch.allclose(p.grad, g, atol=1e-6)


# ---- SyncBatchNorm -------------------------------------------------------------------------------


def test_sync_batch_norm_matches_batch_norm_over_all_ranks_batches(rank, size):
    ts_list = [
        torch.stack([torch.tensor([[r, r + 1], [r * 2, r * 2 + 1], [r * 3, r * 3 + 1], [r * 4, r * 4 + 1]])
                     for r in range(size)]),
        torch.stack([torch.tensor([[r + 1], [r * 2 + 1], [r * 3 + 1], [r * 4 + 1]]) for r in range(size)]),
    ]
    for index, ts in enumerate(ts_list):
        sync_bn = hvd.SyncBatchNorm(num_features=4)
        bn = nn.BatchNorm1d(num_features=4)
        ts = ts.float()
        ts1, ts2 = ts.clone().requires_grad_(), ts.clone().requires_grad_()
        sync_out = sync_bn(ts1[rank].unsqueeze(0))
        bn_out = bn(ts2)
        assert torch.allclose(sync_out, bn_out[rank].unsqueeze(0), atol=1e-5)
        assert torch.allclose(sync_bn.running_mean, bn.running_mean, atol=1e-5)
        assert torch.allclose(sync_bn.running_var, bn.running_var, atol=1e-5)
        sync_out.sum().backward()
        bn_out.mean(dim=0).sum().backward()
        assert torch.allclose(hvd.allreduce(sync_bn.weight.grad, name=f"sbn.weight.{index}"), bn.weight.grad,
                              atol=1e-5)
        assert torch.allclose(hvd.allreduce(sync_bn.bias.grad, name=f"sbn.bias.{index}"), bn.bias.grad, atol=1e-5)
        assert torch.allclose(hvd.allreduce(ts1.grad, name=f"sbn.input.{index}"), ts2.grad, atol=1e-5)


def test_sync_batch_norm_with_batches_of_different_sizes(rank, size):
    generator = torch.Generator().manual_seed(17)
    batches = [torch.randn(r + 1, 3, 5, generator=generator) * (r + 1) + r for r in range(size)]
    sync_bn, bn = hvd.SyncBatchNorm(3), nn.BatchNorm1d(3)
    local = batches[rank].clone().requires_grad_()
    full = torch.cat(batches).requires_grad_()
    sync_out, bn_out = sync_bn(local), bn(full)
    offset = sum(r + 1 for r in range(rank))
    assert torch.allclose(sync_out, bn_out[offset:offset + rank + 1], atol=1e-5)
    assert torch.allclose(sync_bn.running_mean, bn.running_mean, atol=1e-5)
    assert torch.allclose(sync_bn.running_var, bn.running_var, atol=1e-5)
    sync_out.sum().backward()
    bn_out.sum().backward()
    assert torch.allclose(local.grad, full.grad[offset:offset + rank + 1], atol=1e-4)
    total_weight_grad = hvd.allreduce(sync_bn.weight.grad, op=hvd.Sum, name="sbn.uneven.weight")
    assert torch.allclose(total_weight_grad, bn.weight.grad, atol=1e-4)


def test_sync_batch_norm_in_eval_mode_uses_running_statistics(rank):
    sync_bn = hvd.SyncBatchNorm(3)
    bn = nn.BatchNorm1d(3)
    bn.load_state_dict(sync_bn.state_dict())
    sync_bn.eval()
    bn.eval()
    data = torch.randn(4, 3) + rank
    assert torch.allclose(sync_bn(data), bn(data))


# ---- elastic -------------------------------------------------------------------------------------


def test_elastic_torch_state_sync_commit_restore(rank, size):
    v = 1.0 if rank == 0 else 2.0
    model1 = nn.Sequential(nn.Linear(2, 2))
    model1.load_state_dict({"0.weight": torch.tensor([[v, v], [v, v]]), "0.bias": torch.tensor([v, v])})
    model2 = nn.Sequential(nn.Linear(2, 2))
    model2.load_state_dict({"0.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "0.bias": torch.tensor([0.0, 0.0])})
    optimizer = torch.optim.SGD(model1.parameters(), lr=0.001 * size)

    state = hvd.elastic.TorchState(model1, optimizer, batch=20 + rank, epoch=10 + rank)
    state.sync()
    for w in state.model.state_dict().values():
        assert torch.equal(w, torch.ones_like(w))
    assert state.batch == 20 and state.epoch == 10
    synced = [w.clone() for w in model1.state_dict().values()]

    # modify, then restore
    model1.load_state_dict(model2.state_dict())
    state.batch, state.epoch = 21, 11
    state.restore()
    for w1, w2 in zip(model1.state_dict().values(), synced, strict=True):
        assert torch.equal(w1, w2)
    assert state.batch == 20 and state.epoch == 10

    # modify, commit, then restore
    model1.load_state_dict(model2.state_dict())
    state.batch, state.epoch = 21, 11
    state.commit()
    state.restore()
    for w1, w2 in zip(model1.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(w1, w2)
    assert state.batch == 21 and state.epoch == 11
    assert state.model is model1 and state.optimizer is optimizer


def test_elastic_run_syncs_then_calls_and_resets_on_hosts_updated(rank, size):
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(float(rank))
    state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=rank)
    resets, calls = [], []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state, offset, scale=1):
        calls.append((state.epoch, float(state.model.weight.detach()[0, 0])))
        if len(calls) == 1:
            state.epoch = 5
            state.commit()
            raise hvd.HostsUpdatedInterrupt(False)
        return (state.epoch + offset) * scale

    assert train(state, 10, scale=2) == 30
    assert calls == [(0, 0.0), (5, 0.0)]
    assert resets == [size]
    assert hvd.is_initialized() and hvd.rank() == rank
    assert_allreduce_still_works(size, "elastic.run.after")


def test_elastic_sampler_partitions_the_dataset(rank, size):
    samples_per_worker, batch_size = 8, 2
    dataset = list(range(samples_per_worker * size))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    state = hvd.elastic.TorchState(sampler=sampler)
    state.sync()
    assert state.sampler is sampler and sampler.epoch == 0
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert len(sampler) == samples_per_worker
        mine = [int(i) for batch in loader for i in batch]
        assert len(mine) == samples_per_worker
        everyone = hvd.allgather_object(mine, name=f"sampler.partition.{epoch}")
        assert sorted(itertools.chain.from_iterable(everyone)) == dataset
    unshuffled = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    assert len(unshuffled) == samples_per_worker
    assert list(unshuffled) == list(range(rank, samples_per_worker * size, size))
    everyone = hvd.allgather_object(list(unshuffled), name="sampler.unshuffled")
    assert sorted(itertools.chain.from_iterable(everyone)) == dataset


def test_elastic_sampler_progress_commit_restore_and_sync(rank, size):
    """Horovod 0.28.1's sampler counts processed samples globally: ``record_batch`` adds
    ``batch_size * num_replicas`` to ``processed_num`` (torch/elastic/sampler.py), and a restore or
    sync re-partitions the samples after them (test/single/test_torch_elastic.py)."""
    samples_per_worker, batch_size = 8, 2
    dataset = list(range(samples_per_worker * size))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(sampler=sampler)
    state.sync()

    sampler.set_epoch(2)
    sampler.record_batch(0, batch_size)
    sampler.record_batch(1, batch_size)
    state.commit()
    sampler.record_batch(2, batch_size)
    sampler.record_batch(3, batch_size)
    state.restore()
    # back at the commit: two batches of every rank are done
    assert len(sampler) == samples_per_worker - 2 * batch_size

    sampler.record_batch(2, batch_size)
    state.commit()
    state.sync()
    assert len(sampler) == batch_size
    assert sum(1 for _ in loader) == 1
    sampler.set_epoch(3)
    assert len(sampler) == samples_per_worker
    assert sum(1 for _ in loader) == samples_per_worker // batch_size

    # the counter itself, as Horovod exposes it
    sampler.set_epoch(4)
    assert sampler.processed_num == 0
    sampler.record_batch(0, batch_size)
    assert sampler.processed_num == batch_size * size
    assert sampler.state_dict() == {"epoch": 4, "processed_num": batch_size * size}


# ---- timeline and HOROVOD_* settings -------------------------------------------------------------


def _read_timeline(path: str) -> tuple[str, list]:
    with open(path) as file:
        text = file.read()
    return text, json.loads(text)


def test_dynamic_timeline_start_and_stop(rank, tmp_path_factory):
    first = shared_path(tmp_path_factory, "dynamic_timeline_1.json")
    second = shared_path(tmp_path_factory, "dynamic_timeline_2.json")
    hvd.start_timeline(first, mark_cycles=True)
    hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce")
    time.sleep(0.2)
    hvd.stop_timeline()
    hvd.start_timeline(second, mark_cycles=False)
    time.sleep(0.1)
    hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce")
    hvd.stop_timeline()
    hvd.barrier()
    if rank == 0:
        for path, cycles in ((first, True), (second, False)):
            text, events = _read_timeline(path)
            assert isinstance(events, list) and events
            assert "test_allreduce" in text and "NEGOTIATE_ALLREDUCE" in text and "ALLREDUCE" in text
            assert ("CYCLE_START" in text) == cycles


def test_timeline_from_the_environment_names_operations_like_horovod(rank, size, tmp_path_factory):
    """``HOROVOD_TIMELINE`` at init: rank 0 writes a timeline whose rows are named after the
    operation and the tensor, e.g. ``allreduce.test_allreduce`` (test/parallel/test_timeline.py)."""
    path = shared_path(tmp_path_factory, "env_timeline.json")
    with reinitialized(HOROVOD_TIMELINE=path, HOROVOD_TIMELINE_MARK_CYCLES="1"):
        hvd.allreduce(torch.tensor([1, 2, 3], dtype=torch.float32), name="test_allreduce")
        time.sleep(0.1)
        hvd.barrier()
        if rank == 0:
            text, events = _read_timeline(path)
            assert isinstance(events, list)
            assert "NEGOTIATE_ALLREDUCE" in text and "ALLREDUCE" in text and "CYCLE_START" in text
            assert "allreduce.test_allreduce" in text, text[:2000]


def test_fusion_and_cycle_settings_from_the_environment(rank, size):
    for env in ({"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "5"},
                {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024), "HOROVOD_CACHE_CAPACITY": "0"}):
        with reinitialized(**env):
            handles = [hvd.allreduce_async(torch.full((100,), float(i + rank)), op=hvd.Sum) for i in range(20)]
            for i, handle in enumerate(handles):
                expected = float(sum(i + r for r in range(size)))
                assert torch.equal(hvd.synchronize(handle), torch.full((100,), expected))
