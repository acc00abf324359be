"""Autograd for the out-of-place collectives, with the gradients Horovod defines.

The functions at the bottom (``allreduce``, ``allgather``, ...) wait for an operation and record it
for autograd when their input requires a gradient; the public modules call them, and so do the
backward passes (so a gradient of a gradient works too).

* allreduce: the gradient is allreduced with the same op and scale factors;
* allgather: the gradient is averaged over ranks and this rank's rows are returned;
* broadcast: the gradient is averaged over ranks and kept on the root only (zeros elsewhere);
* alltoall: the gradient travels back with the received splits;
* reducescatter: the gradient is multiplied by the set's size for Sum (unchanged for Average) and by
  the pre- and postscale factors, then gathered from all ranks.

The grouped forms have the same gradients for every tensor of the group, computed as one group.
"""

from __future__ import annotations

from typing import Any

import torch

from . import operations as ops
from .process_sets import ProcessSet
from .reduction import ReduceOp
from .runtime.submit import synchronize


class AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, name: str | None, prescale_factor: float,
                postscale_factor: float, process_set: ProcessSet) -> torch.Tensor:
        ctx.op, ctx.prescale_factor, ctx.postscale_factor = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        handle = ops.allreduce_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor, process_set=process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad = allreduce(grad_output, ctx.op, None, ctx.prescale_factor, ctx.postscale_factor, ctx.process_set)
        return grad, None, None, None, None, None


def _rows(tensor: torch.Tensor) -> int:
    """The rows ``tensor`` adds to an allgather (a scalar travels as one row)."""
    return tensor.shape[0] if tensor.dim() else 1


def _own_rows(averaged: list[torch.Tensor], rows: list[int], shapes: list[torch.Size],
              process_set: ProcessSet) -> list[torch.Tensor]:
    """This rank's rows of each averaged allgather gradient, shaped like the inputs: one allgather of
    every rank's row counts finds where they start."""
    counts = torch.tensor(rows, dtype=torch.int64).reshape(1, -1)
    everyone = allgather(counts, None, process_set)
    offsets = everyone[: process_set.rank()].sum(dim=0).tolist()
    return [grad.narrow(0, int(offset), count).reshape(shape)
            for grad, offset, count, shape in zip(averaged, offsets, rows, shapes, strict=True)]


def _reducescatter_grad_factor(op: ReduceOp, process_set: ProcessSet, prescale_factor: float,
                               postscale_factor: float) -> float:
    """What Horovod multiplies a reducescatter's incoming gradient by before gathering it."""
    size = process_set.size() if op is ReduceOp.SUM else 1
    return size * prescale_factor * postscale_factor


class AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        ctx.rows, ctx.input_shape, ctx.process_set = _rows(tensor), tensor.shape, process_set
        return synchronize(ops.allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        averaged = allreduce(grad_output, ReduceOp.AVERAGE, None, 1.0, 1.0, ctx.process_set)
        grad, = _own_rows([averaged], [ctx.rows], [ctx.input_shape], ctx.process_set)
        return grad, None, None


class BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(ops.broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        averaged = allreduce(grad_output, ReduceOp.AVERAGE, None, 1.0, 1.0, ctx.process_set)
        if ctx.process_set.ranks[ctx.process_set.rank()] != ctx.root_rank:
            averaged = torch.zeros_like(averaged)
        return averaged, None, None, None


class AlltoallFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: ProcessSet) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.process_set = process_set
        output, received = synchronize(ops.alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, _grad_received: Any) -> tuple[torch.Tensor | None, ...]:
        grad, _ = alltoall(grad_output.contiguous(), ctx.received, None, ctx.process_set)
        return grad, None, None, None


class ReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp, process_set: ProcessSet,
                prescale_factor: float, postscale_factor: float) -> torch.Tensor:
        ctx.process_set = process_set
        ctx.factor = _reducescatter_grad_factor(op, process_set, prescale_factor, postscale_factor)
        return synchronize(ops.reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad = allgather((grad_output * ctx.factor).contiguous(), None, ctx.process_set)
        return grad, None, None, None, None, None


class GroupedAllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: ReduceOp, name: str | None, prescale_factor: float, postscale_factor: float,
                process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.op, ctx.prescale_factor, ctx.postscale_factor = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        handle = ops.grouped_allreduce_async(list(tensors), name=name, op=op, prescale_factor=prescale_factor,
                                             postscale_factor=postscale_factor, process_set=process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads = grouped_allreduce([g.contiguous() for g in grad_outputs], ctx.op, None, ctx.prescale_factor,
                                  ctx.postscale_factor, ctx.process_set)
        return (None, None, None, None, None, *grads)


class GroupedAllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, process_set: ProcessSet,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rows = [_rows(t) for t in tensors]
        ctx.shapes = [t.shape for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(ops.grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        averaged = grouped_allreduce([g.contiguous() for g in grad_outputs], ReduceOp.AVERAGE, None, 1.0, 1.0,
                                     ctx.process_set)
        return (None, None, *_own_rows(averaged, ctx.rows, ctx.shapes, ctx.process_set))


class GroupedReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: ReduceOp, name: str | None, prescale_factor: float, postscale_factor: float,
                process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.process_set = process_set
        ctx.factor = _reducescatter_grad_factor(op, process_set, prescale_factor, postscale_factor)
        handle = ops.grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                                 postscale_factor)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads = grouped_allgather([(g * ctx.factor).contiguous() for g in grad_outputs], None, ctx.process_set)
        return (None, None, None, None, None, *grads)


def needs_autograd(tensor: torch.Tensor) -> bool:
    """True when the result must carry a gradient function."""
    return torch.is_grad_enabled() and tensor.requires_grad


def allreduce(tensor: torch.Tensor, op: ReduceOp, name: str | None, prescale_factor: float,
              postscale_factor: float, process_set: ProcessSet) -> torch.Tensor:
    """The reduced tensor (``op`` already resolved), recorded for autograd when needed."""
    if needs_autograd(tensor):
        return AllreduceFunction.apply(tensor, op, name, prescale_factor, postscale_factor, process_set)
    return synchronize(ops.allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor, process_set))


def allgather(tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0, recorded for autograd when needed."""
    if needs_autograd(tensor):
        return AllgatherFunction.apply(tensor, name, process_set)
    return synchronize(ops.allgather_async(tensor, name, process_set))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None, process_set: ProcessSet) -> torch.Tensor:
    """``root_rank``'s ``tensor``, recorded for autograd when needed."""
    if needs_autograd(tensor):
        return BroadcastFunction.apply(tensor, root_rank, name, process_set)
    return synchronize(ops.broadcast_async(tensor, root_rank, name, process_set))


def alltoall(tensor: torch.Tensor, splits: Any, name: str | None,
             process_set: ProcessSet) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, received_splits)`` of an alltoall, recorded for autograd when needed."""
    if needs_autograd(tensor):
        return AlltoallFunction.apply(tensor, splits, name, process_set)
    return synchronize(ops.alltoall_async(tensor, splits, name, process_set))


def reducescatter(tensor: torch.Tensor, name: str | None, op: ReduceOp, process_set: ProcessSet,
                  prescale_factor: float, postscale_factor: float) -> torch.Tensor:
    """This rank's part of the reduced tensor, recorded for autograd when needed."""
    if needs_autograd(tensor):
        return ReducescatterFunction.apply(tensor, name, op, process_set, prescale_factor, postscale_factor)
    return synchronize(ops.reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))


def grouped_allreduce(tensors: list[torch.Tensor], op: ReduceOp, name: str | None, prescale_factor: float,
                      postscale_factor: float, process_set: ProcessSet) -> list[torch.Tensor]:
    """The reduced ``tensors`` as one unit, recorded for autograd when any of them needs it."""
    if any(needs_autograd(t) for t in tensors):
        return list(GroupedAllreduceFunction.apply(op, name, prescale_factor, postscale_factor, process_set,
                                                   *tensors))
    return synchronize(ops.grouped_allreduce_async(tensors, None, name, op, prescale_factor, postscale_factor,
                                                   process_set))


def grouped_allgather(tensors: list[torch.Tensor], name: str | None,
                      process_set: ProcessSet) -> list[torch.Tensor]:
    """Each of ``tensors`` allgathered, as one unit, recorded for autograd when any of them needs it."""
    if any(needs_autograd(t) for t in tensors):
        return list(GroupedAllgatherFunction.apply(name, process_set, *tensors))
    return synchronize(ops.grouped_allgather_async(tensors, name, process_set))


def grouped_reducescatter(tensors: list[torch.Tensor], op: ReduceOp, name: str | None, prescale_factor: float,
                          postscale_factor: float, process_set: ProcessSet) -> list[torch.Tensor]:
    """This rank's part of each reduced tensor, as one unit, recorded for autograd when any needs it."""
    if any(needs_autograd(t) for t in tensors):
        return list(GroupedReducescatterFunction.apply(op, name, prescale_factor, postscale_factor, process_set,
                                                       *tensors))
    return synchronize(ops.grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                                       postscale_factor))
