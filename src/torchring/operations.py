"""The asynchronous collective operations: each builds its requests and submits them to the engine.

The public modules (``collectives``, ``grouped``) re-export these and add the blocking forms; the
autograd functions (``autograd_functions``) build on them too, so neither depends on the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .process_sets import ProcessSet, global_process_set, resolve
from .reduction import Average, ReduceOp, resolve_op
from .runtime import context
from .runtime.requests import OpType, Request, RequestMeta, tensor_meta
from .runtime.submit import (
    CallableHandle,
    auto_name,
    check_tensor,
    combine,
    make_request,
    request_name,
    submit,
    submit_group,
)

#: ``int(op)`` of each reduction, looked up per request (converting an enum member costs more).
_OP_NUMBERS = {op: int(op) for op in ReduceOp}
_ALLREDUCE = OpType.ALLREDUCE


def _reduction_meta(op_type: OpType, buffer: torch.Tensor, op: ReduceOp, prescale_factor: float,
                    postscale_factor: float, process_set: int, group: str = "",
                    group_size: int = 0) -> Callable[[str, int], RequestMeta]:
    if op is Average and buffer.dtype is torch.bool:
        raise ValueError("op=Average is not defined for bool tensors; use Sum, Min or Max")
    if op is ReduceOp.ADASUM and (op_type is not OpType.ALLREDUCE or not buffer.dtype.is_floating_point):
        what = "floating-point allreduces" if op_type is OpType.ALLREDUCE else "allreduce, not reducescatter"
        raise ValueError(f"op=Adasum is defined for {what}; use Average or Sum here")
    reduce_op, prescale, postscale = _OP_NUMBERS[op], float(prescale_factor), float(postscale_factor)

    def meta(name: str, seq: int) -> RequestMeta:
        return tensor_meta(name, op_type, buffer, seq, reduce_op, -1, prescale, postscale, process_set, (), group,
                           group_size)

    return meta


def allreduce_meta(buffer: torch.Tensor, op: ReduceOp, prescale_factor: float, postscale_factor: float,
                   process_set: int, group: str = "", group_size: int = 0) -> Callable[[str, int], RequestMeta]:
    """The metadata factory of an allreduce of ``buffer`` (shared with grouped allreduce)."""
    return _reduction_meta(_ALLREDUCE, buffer, op, prescale_factor, postscale_factor, process_set, group,
                           group_size)


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
    buffer = tensor.detach() if tensor.requires_grad else tensor  # the same storage either way
    set_id = resolve(process_set)
    meta = allreduce_meta(buffer, resolve_op(op, average), prescale_factor, postscale_factor, set_id)
    return submit(meta, "allreduce", name, buffer, finish=lambda _: tensor, process_set=set_id)


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


# ---- grouped: several tensors negotiated and executed as one unit (one handle) ---------------------


def _group_requests(kind: str, name: str | None, buffers: Sequence[torch.Tensor],
                    meta_for: Callable[[torch.Tensor, str, int], Callable[[str, int], RequestMeta]],
                    process_set: int) -> list[Request]:
    if not buffers:
        raise ValueError(f"{kind} needs at least one tensor")
    group = request_name(kind.removeprefix("grouped_"), name, process_set) if name \
        else auto_name(kind, process_set)
    count = len(buffers)
    return [make_request(meta_for(buffer, group, count), kind, None, buffer, process_set,
                         full_name=f"{group}_{index + 1}of{count}")
            for index, buffer in enumerate(buffers)]


def _allreduce_group(tensors: Sequence[torch.Tensor], in_place: bool, average: bool | None, name: str | None,
                     op: int | None, prescale_factor: float, postscale_factor: float,
                     process_set: ProcessSet) -> int:
    resolved, set_id = resolve_op(op, average), resolve(process_set)
    for tensor in tensors:
        check_tensor(tensor, in_place=in_place)
    buffers = [t.detach() if in_place else t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]

    def meta_for(buffer: torch.Tensor, group: str, count: int) -> Callable[[str, int], RequestMeta]:
        return allreduce_meta(buffer, resolved, prescale_factor, postscale_factor, set_id, group=group,
                              group_size=count)

    requests = _group_requests("grouped_allreduce", name, buffers, meta_for, set_id)
    finish: Callable[[list[Any]], Any] = (lambda _: list(tensors)) if in_place else (lambda results: results)
    return submit_group(requests, finish)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start allreducing ``tensors`` as one unit; ``synchronize`` returns the list of results."""
    return _allreduce_group(tensors, False, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: int | None = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> int:
    """Start allreducing ``tensors`` in place as one unit."""
    return _allreduce_group(tensors, True, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start allgathering ``tensors`` as one unit."""
    set_id = resolve(process_set)
    sources = [allgather_source(t) for t in tensors]

    def meta_for(source: torch.Tensor, group: str, count: int) -> Callable[[str, int], RequestMeta]:
        return allgather_meta(source, set_id, group=group, group_size=count)

    return submit_group(_group_requests("grouped_allgather", name, sources, meta_for, set_id),
                        lambda results: results)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: int = ReduceOp.AVERAGE, process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start reduce-scattering ``tensors`` as one unit."""
    resolved, set_id = resolve_op(op, None), resolve(process_set)
    buffers = [reducescatter_buffer(tensor) for tensor in tensors]

    def meta_for(buffer: torch.Tensor, group: str, count: int) -> Callable[[str, int], RequestMeta]:
        return reducescatter_meta(buffer, resolved, prescale_factor, postscale_factor, set_id, group=group,
                                  group_size=count)

    return submit_group(_group_requests("grouped_reducescatter", name, buffers, meta_for, set_id),
                        lambda results: results)
