"""The Horovod collective operations and their in-place and asynchronous forms.

Every operation is a named request to the background engine. ``*_async`` forms return an integer
handle for ``poll`` and ``synchronize``; the plain forms submit and wait. Functions ending in ``_``
work in place on the tensor given. ``process_set`` restricts an operation to the members of a set;
``broadcast`` roots are global ranks.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from . import autograd_functions as autograd
from .compression import Compression, Compressor
from .operations import (
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_async,
    broadcast_async_,
    reducescatter_async,
    sparse_allreduce_async,
)
from .process_sets import ProcessSet, global_process_set, resolve
from .reduction import ReduceOp, resolve_op
from .runtime import context
from .runtime.devices import last_cuda_device
from .runtime.requests import OpType, RequestMeta
from .runtime.submit import poll, submit, synchronize

__all__ = [
    "allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "join", "poll", "reducescatter", "reducescatter_async", "sparse_allreduce_async", "synchronize",
]


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` across ranks (``op``: Average by default, Sum, Min, Max, Product); differentiable.

    ``compression`` shrinks the tensor on the wire (``Compression.fp16``); the result has the input's dtype.
    """
    compressed, ctx = compression.compress(tensor)
    reduced = autograd.allreduce(compressed, resolve_op(op, average), name, prescale_factor, postscale_factor,
                                 process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` across ranks in place and return it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0, in rank order (differentiable)."""
    return autograd.allgather(tensor, name, process_set)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """A copy of ``root_rank``'s ``tensor`` on every rank (differentiable)."""
    return autograd.broadcast(tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s value, in place, and return it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def alltoall(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Exchange rows between ranks: ``output``, or ``(output, received_splits)`` when ``splits`` is given."""
    output, received = autograd.alltoall(tensor, splits, name, process_set)
    return (output, received) if splits is not None else output


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: type[Compressor] = Compression.none,
                  op: int = ReduceOp.AVERAGE, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` across ranks; rank i keeps the i-th part of dimension 0 (earlier ranks get
    one extra row when it does not divide evenly). Differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = autograd.reducescatter(compressed, name, resolve_op(op, None), process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(reduced, ctx)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of ``process_set`` has called ``barrier()``."""
    set_id = resolve(process_set)

    def meta(n: str, seq: int) -> RequestMeta:
        return RequestMeta(name=n, op_type=OpType.BARRIER, seq=seq, process_set=set_id)

    # One name for every barrier of a set: barriers block, so the k-th of each rank still meet, and a
    # repeated barrier is a response-cache bit that keeps a loop of barriers and operations in the
    # steady state (an automatic name per call made each one new).
    synchronize(submit(meta, "barrier", None, None, process_set=set_id, full_name="barrier"))


#: How often ``join()`` looks whether its own request failed while it waits for the cycle that carries it.
ANNOUNCED_CHECK_S = 0.1


def join(device: int = -1) -> int:
    """Declare that this rank has no more data: until every rank has joined, it takes part in the
    others' allreduces with zeros. Returns the last rank to join (the same on every rank).

    ``device``: the CUDA device index its zeros for CUDA tensors are made on; -1 (the default): the GPU of
    this rank's last CUDA operation, else the calling thread's current CUDA device."""
    runtime = context.current()
    if device < 0 and torch.cuda.is_available() and last_cuda_device() is None:
        device = torch.cuda.current_device()
    runtime.engine.executor.join_device = device

    def meta(n: str, seq: int) -> RequestMeta:
        return RequestMeta(name=n, op_type=OpType.JOIN, seq=seq)

    # The order of joins is the order of the cycles that carry them, so this rank's zeros on a gradient lane
    # wait for its join's cycle: a rank whose last lane step needed them joins in a later cycle, after it.
    announced = threading.Event()
    handle = submit(meta, "join", None, None, announced=announced)
    if runtime.lanes.any_open():
        while not announced.wait(ANNOUNCED_CHECK_S) and not poll(handle):
            pass
    runtime.lanes.shadow_all()
    last = synchronize(handle)
    runtime.joins += 1
    return last
