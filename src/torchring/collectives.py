"""The Horovod collective operations and their in-place and asynchronous forms.

Every operation is a named request to the background engine. ``*_async`` forms return an integer
handle for ``poll`` and ``synchronize``; the plain forms submit and wait. Functions ending in ``_``
work in place on the tensor given. ``process_set`` restricts an operation to the members of a set;
``broadcast`` roots are global ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .compression import Compression, Compressor
from .handles import CallableHandle, auto_name, check_tensor, combine, poll, submit, synchronize
from .process_sets import ProcessSet, global_process_set, resolve
from .reduction import ReduceOp, resolve_op
from .runtime import context
from .runtime.requests import OpType, RequestMeta, tensor_meta

__all__ = [
    "allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "join", "poll", "reducescatter", "reducescatter_async", "synchronize",
]


def _reduction_meta(op_type: OpType, buffer: torch.Tensor, op: ReduceOp, prescale_factor: float,
                    postscale_factor: float, process_set: int, **extra: Any) -> Callable[[str, int], RequestMeta]:
    if op is ReduceOp.AVERAGE and buffer.dtype == torch.bool:
        raise ValueError("op=Average is not defined for bool tensors; use Sum, Min or Max")

    def meta(name: str, seq: int) -> RequestMeta:
        return tensor_meta(name, op_type, buffer, seq, reduce_op=int(op), prescale_factor=float(prescale_factor),
                           postscale_factor=float(postscale_factor), process_set=process_set, **extra)

    return meta


def allreduce_meta(buffer: torch.Tensor, op: ReduceOp, prescale_factor: float, postscale_factor: float,
                   process_set: int, **extra: Any) -> Callable[[str, int], RequestMeta]:
    """The metadata factory of an allreduce of ``buffer`` (shared with grouped allreduce)."""
    return _reduction_meta(OpType.ALLREDUCE, buffer, op, prescale_factor, postscale_factor, process_set, **extra)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start reducing ``tensor`` across ranks into a new tensor; return a handle for ``synchronize``."""
    check_tensor(tensor, in_place=False)
    output = tensor.detach().clone(memory_format=torch.contiguous_format)
    set_id = resolve(process_set)
    meta = allreduce_meta(output, resolve_op(op, average), prescale_factor, postscale_factor, set_id)
    return submit(meta, "allreduce", name, output, process_set=set_id)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start reducing ``tensor`` across ranks in place; return a handle for ``synchronize``."""
    check_tensor(tensor, in_place=True)
    buffer = tensor.detach()
    set_id = resolve(process_set)
    meta = allreduce_meta(buffer, resolve_op(op, average), prescale_factor, postscale_factor, set_id)
    return submit(meta, "allreduce", name, buffer, finish=lambda _: tensor, process_set=set_id)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` across ranks (``op``: Average by default, Sum, Min, Max, Product); differentiable.

    ``compression`` shrinks the tensor on the wire (``Compression.fp16``); the result has the input's dtype.
    """
    compressed, ctx = compression.compress(tensor)
    resolved = resolve_op(op, average)
    if differentiable.needs_autograd(compressed):
        reduced = differentiable.AllreduceFunction.apply(compressed, resolved, name, prescale_factor,
                                                         postscale_factor, process_set)
    else:
        reduced = synchronize(allreduce_async(compressed, None, name, resolved, prescale_factor, postscale_factor,
                                              process_set))
    return compression.decompress(reduced, ctx)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` across ranks in place and return it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allgather_source(tensor: torch.Tensor) -> torch.Tensor:
    """The contiguous, at least one-dimensional tensor an allgather sends."""
    check_tensor(tensor, in_place=False)
    source = tensor.detach()
    return (source.reshape(1) if source.dim() == 0 else source).contiguous()


def allgather_meta(source: torch.Tensor, process_set: int, **extra: Any) -> Callable[[str, int], RequestMeta]:
    def meta(name: str, seq: int) -> RequestMeta:
        return tensor_meta(name, OpType.ALLGATHER, source, seq, process_set=process_set, **extra)

    return meta


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (whose size may differ per rank)."""
    source, set_id = allgather_source(tensor), resolve(process_set)
    return submit(allgather_meta(source, set_id), "allgather", name, source, process_set=set_id)


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0, in rank order (differentiable)."""
    if differentiable.needs_autograd(tensor):
        return differentiable.AllgatherFunction.apply(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp | None = None,
                           process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a sparse COO tensor: every rank's indices and values are allgathered.

    Calling the handle (``handle()``), or ``synchronize`` on it, returns the sparse sum (``op=Sum``) or
    average (``op=Average``, the default) over the process set; indices held by several ranks are summed
    when coalesced.
    """
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor; use allreduce_async for dense ones")
    reduce_op = resolve_op(op, None)
    if reduce_op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"op={reduce_op.name.capitalize()} is not defined for sparse tensors; use Average or Sum")
    set_id = resolve(process_set)
    name = name or auto_name("sparse_allreduce", set_id)
    coalesced = tensor.coalesce()
    indices = allgather_async(coalesced.indices().t().contiguous(), f"{name}.indices", process_set)
    values = allgather_async(coalesced.values(), f"{name}.values", process_set)
    members = len(context.current().process_sets.members(set_id) or ())

    def finish(outputs: list[torch.Tensor]) -> torch.Tensor:
        gathered_indices, gathered_values = outputs
        if reduce_op is ReduceOp.AVERAGE:
            gathered_values = gathered_values / members
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, tensor.shape, check_invariants=True)

    return CallableHandle(combine([indices, values], finish))


def _broadcast_submit(buffer: torch.Tensor, root_rank: int, name: str | None, process_set: ProcessSet,
                      finish: Callable[[Any], Any] = lambda result: result) -> int:
    set_id = resolve(process_set)
    members = context.current().process_sets.members(set_id) or ()
    if int(root_rank) not in members:
        raise ValueError(f"root_rank {root_rank} is not a rank of the process set (ranks {list(members)})")

    def meta(n: str, seq: int) -> RequestMeta:
        return tensor_meta(n, OpType.BROADCAST, buffer, seq, root_rank=int(root_rank), process_set=set_id)

    return submit(meta, "broadcast", name, buffer, finish, process_set=set_id)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start copying ``root_rank``'s ``tensor`` to every rank, into a new tensor."""
    check_tensor(tensor, in_place=False)
    return _broadcast_submit(tensor.detach().clone(memory_format=torch.contiguous_format), root_rank, name,
                             process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start overwriting ``tensor`` on every rank with ``root_rank``'s value."""
    check_tensor(tensor, in_place=True)
    return _broadcast_submit(tensor.detach(), root_rank, name, process_set, finish=lambda _: tensor)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """A copy of ``root_rank``'s ``tensor`` on every rank (differentiable)."""
    if differentiable.needs_autograd(tensor):
        return differentiable.BroadcastFunction.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s value, in place, and return it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _splits_list(splits: Sequence[int] | torch.Tensor | None, rows: int, size: int) -> list[int]:
    if splits is None:
        if rows % size:
            raise ValueError(f"alltoall without splits needs the first dimension ({rows}) to be divisible by "
                             f"the number of ranks ({size}); pass splits=")
        return [rows // size] * size
    if isinstance(splits, torch.Tensor) and splits.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"splits must hold 32-bit (or 64-bit) integers, got a tensor of {splits.dtype}")
    raw = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in raw):
        raise ValueError(f"splits must be integers, got {raw}")
    values = [int(v) for v in raw]
    if len(values) != size:
        raise ValueError(f"splits has {len(values)} entries; it needs one per rank of the process set ({size})")
    if any(v < 0 for v in values) or sum(values) != rows:
        raise ValueError(f"splits {values} must be non-negative and add up to the first dimension ({rows})")
    return values


def alltoall_async(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None,
                   name: str | None = None, process_set: ProcessSet = global_process_set) -> int:
    """Start sending ``splits[i]`` rows of ``tensor`` to rank i (equal parts without ``splits``).

    ``synchronize`` returns ``(output, received_splits)``.
    """
    check_tensor(tensor, in_place=False)
    set_id = resolve(process_set)
    source = allgather_source(tensor)
    size = len(context.current().process_sets.members(set_id) or ())
    send = tuple(_splits_list(splits, source.shape[0], size))

    def meta(n: str, seq: int) -> RequestMeta:
        return tensor_meta(n, OpType.ALLTOALL, source, seq, splits=send, process_set=set_id)

    return submit(meta, "alltoall", name, source, process_set=set_id)


def alltoall(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Exchange rows between ranks: ``output``, or ``(output, received_splits)`` when ``splits`` is given."""
    if differentiable.needs_autograd(tensor):
        output, received = differentiable.AlltoallFunction.apply(tensor, splits, name, process_set)
    else:
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return (output, received) if splits is not None else output


def reducescatter_buffer(tensor: torch.Tensor) -> torch.Tensor:
    """The private copy a reducescatter reduces (at least one dimension is needed to scatter)."""
    check_tensor(tensor, in_place=False)
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension")
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def reducescatter_meta(buffer: torch.Tensor, op: ReduceOp, prescale_factor: float, postscale_factor: float,
                       process_set: int, **extra: Any) -> Callable[[str, int], RequestMeta]:
    """The metadata factory of a reducescatter of ``buffer`` (shared with grouped reducescatter)."""
    return _reduction_meta(OpType.REDUCESCATTER, buffer, op, prescale_factor, postscale_factor, process_set, **extra)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int = ReduceOp.AVERAGE,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start reducing ``tensor`` across ranks and keep this rank's part of dimension 0."""
    buffer, set_id = reducescatter_buffer(tensor), resolve(process_set)
    meta = reducescatter_meta(buffer, resolve_op(op, None), prescale_factor, postscale_factor, set_id)
    return submit(meta, "reducescatter", name, buffer, process_set=set_id)


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: type[Compressor] = Compression.none,
                  op: int = ReduceOp.AVERAGE, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` across ranks; rank i keeps the i-th part of dimension 0 (earlier ranks get
    one extra row when it does not divide evenly). Differentiable."""
    compressed, ctx = compression.compress(tensor)
    if differentiable.needs_autograd(compressed):
        reduced = differentiable.ReducescatterFunction.apply(compressed, name, resolve_op(op, None), process_set,
                                                             prescale_factor, postscale_factor)
    else:
        reduced = synchronize(reducescatter_async(compressed, name, op, process_set, prescale_factor,
                                                  postscale_factor))
    return compression.decompress(reduced, ctx)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of ``process_set`` has called ``barrier()``."""
    set_id = resolve(process_set)

    def meta(n: str, seq: int) -> RequestMeta:
        return RequestMeta(name=n, op_type=OpType.BARRIER, seq=seq, process_set=set_id)

    synchronize(submit(meta, "barrier", None, None, process_set=set_id))


def join(device: int = -1) -> int:
    """Declare that this rank has no more data: until every rank has joined, it takes part in the
    others' allreduces with zeros. Returns the last rank to join (the same on every rank)."""

    def meta(n: str, seq: int) -> RequestMeta:
        return RequestMeta(name=n, op_type=OpType.JOIN, seq=seq)

    handle = submit(meta, "join", None, None)
    context.current().lanes.shadow_all()
    return synchronize(handle)


from . import differentiable  # noqa: E402 - autograd wrappers build on the functions above
