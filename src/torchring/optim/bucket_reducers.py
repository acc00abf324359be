"""How ``DistributedOptimizer`` reduces its gradients: one interface, three implementations.

Every gradient travels in a ``Bucket`` (the planned flat buckets, or one per ``groups=`` group) and every
bucket is handed to a ``BucketReducer``:

- ``EngineBucketReducer`` submits each bucket to the engine as one named allreduce of its flat buffer,
  negotiated and checked across ranks (the first step, and every step where a lane is not possible);
- ``GradientLane`` (``runtime.dataplane.lane``) reduces them on a group of its own once the ranks have
  agreed to it (``optim.lane_vote``);
- ``PerGradientReducer`` submits each gradient of a bucket as a request of its own under the
  parameter's name: ``groups=`` (reduced together, as in Horovod) and sparse gradients (allgathered).

All compress with the optimizer's compressor and scale through the same
``runtime.dataplane.reduce.start_allreduce``, so a step gives bitwise the same gradients on every path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..collectives import allreduce_async_, sparse_allreduce_async
from ..collectives import synchronize as wait_handle
from ..compression import Compressor
from ..process_sets import ProcessSet
from ..reduction import ReduceOp
from ..runtime.dataplane.buckets import Bucket, pack_bucket, unpack_bucket
from ..runtime.dataplane.reduce import Scaling
from .sparse_gradients import SparseGradients

__all__ = ["BucketReducer", "EngineBucketReducer", "PerGradientReducer", "ReductionSpec"]

#: The ops a sparse gradient can be reduced with (its entries are allgathered and summed).
_SPARSE_OPS = (ReduceOp.AVERAGE, ReduceOp.SUM)


class BucketReducer(Protocol):
    """Reduces the buckets of one optimizer step across ranks and writes the results into the gradients."""

    def bucket_ready(self, bucket: Bucket) -> None:
        """Every gradient of ``bucket`` is in place (zeros where this rank computed none): start it."""

    def finish_step(self) -> None:
        """Start the buckets not started yet (their gradients are in place), wait for all, write back."""

    def abandon(self) -> None:
        """Forget a step that will not be finished."""


@dataclass(frozen=True)
class ReductionSpec:
    """What an optimizer's reduction is: the same for every bucket and on every path."""

    scaling: Scaling
    compression: type[Compressor]
    process_set: ProcessSet


class EngineBucketReducer:
    """Each bucket is one negotiated in-place allreduce through the engine (fused with others there)."""

    def __init__(self, spec: ReductionSpec, name_of: Callable[[Bucket], str]) -> None:
        self._spec = spec
        self._name_of = name_of
        self._pending: dict[int, tuple[Bucket, int, Any]] = {}

    def bucket_ready(self, bucket: Bucket) -> None:
        compressed, ctx = self._spec.compression.compress(pack_bucket(bucket))
        scaling = self._spec.scaling
        handle = allreduce_async_(compressed, name=self._name_of(bucket), op=scaling.op,
                                  prescale_factor=scaling.prescale, postscale_factor=scaling.postscale,
                                  process_set=self._spec.process_set)
        self._pending[bucket.index] = (bucket, handle, ctx)

    def finish_step(self) -> None:
        """Wait for the submitted buckets (the optimizer submits the rest first) and write them back."""
        try:
            for bucket, handle, ctx in self._pending.values():
                unpack_bucket(bucket, self._spec.compression.decompress(wait_handle(handle), ctx))
        finally:
            self._pending.clear()

    def abandon(self) -> None:
        self._pending.clear()


@dataclass(frozen=True)
class _SparseReduction:
    """The allgather of one sparse gradient (values compressed), and what decompressing them needs."""

    handle: int
    compression_ctx: Any


class PerGradientReducer:
    """Each gradient of a bucket is a named request of its own: dense ones an in-place allreduce, sparse
    ones an allgather of every rank's indices and values, summed (and averaged) into a sparse tensor."""

    def __init__(self, spec: ReductionSpec, name_of: Callable[[torch.Tensor], str],
                 sparse: SparseGradients) -> None:
        self._spec = spec
        self._name_of = name_of
        self._sparse = sparse
        self._pending: list[tuple[torch.Tensor, int | _SparseReduction, Any]] = []

    def bucket_ready(self, bucket: Bucket) -> None:
        for param in bucket.params:
            self._pending.append(self._start(param))

    def finish_step(self) -> None:
        """Wait for every submitted gradient and put the result in its place."""
        compression = self._spec.compression
        try:
            for param, handle, ctx in self._pending:
                if isinstance(handle, _SparseReduction):
                    param.grad = self._sparse_result(handle)
                    continue
                output = compression.decompress(wait_handle(handle), ctx)
                if output is not param.grad:
                    param.grad.copy_(output)
        finally:
            self._pending.clear()

    def abandon(self) -> None:
        self._pending.clear()

    def _start(self, param: torch.Tensor) -> tuple[torch.Tensor, int | _SparseReduction, Any]:
        if param.grad.is_sparse:
            return param, self._start_sparse(param), None
        compressed, ctx = self._spec.compression.compress(param.grad)
        scaling = self._spec.scaling
        handle = allreduce_async_(compressed, name=self._name_of(param), op=scaling.op,
                                  prescale_factor=scaling.prescale, postscale_factor=scaling.postscale,
                                  process_set=self._spec.process_set)
        return param, handle, ctx

    def _start_sparse(self, param: torch.Tensor) -> _SparseReduction:
        """Start allgathering the indices and values of ``param``'s sparse gradient from every rank."""
        name = self._name_of(param)
        op = self._spec.scaling.op
        if op not in _SPARSE_OPS:
            raise ValueError(f"op={op.name.capitalize()} is not defined for sparse gradients (parameter "
                             f"'{name}'); use op=Average or op=Sum, or sparse_as_dense=True to reduce them as "
                             "dense tensors.")
        grad = param.grad.coalesce()
        self._sparse.note_reduced_sparse(param, grad.sparse_dim())
        values, ctx = self._spec.compression.compress(grad.values())
        compressed = torch.sparse_coo_tensor(grad.indices(), values, grad.shape, check_invariants=True,
                                             is_coalesced=True)
        # Summed here; averaging happens after decompression, in the gradient's own dtype.
        handle = sparse_allreduce_async(compressed, name=name, op=ReduceOp.SUM, process_set=self._spec.process_set)
        return _SparseReduction(handle=handle, compression_ctx=ctx)

    def _sparse_result(self, reduction: _SparseReduction) -> torch.Tensor:
        """The sum (``op=Sum``) or average of all ranks' sparse gradients, as a coalesced COO tensor."""
        gathered = wait_handle(reduction.handle)  # every rank's entries, not yet coalesced
        values = self._spec.compression.decompress(gathered._values(), reduction.compression_ctx)
        total = torch.sparse_coo_tensor(gathered._indices(), values, gathered.shape, check_invariants=True).coalesce()
        average = self._spec.scaling.op is ReduceOp.AVERAGE
        return total / self._spec.process_set.size() if average else total
