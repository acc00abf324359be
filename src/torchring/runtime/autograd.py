"""Autograd for the out-of-place collectives, with the gradients Horovod defines.

The functions at the bottom (``allreduce``, ``allgather``, ...) wait for an operation and record it
for autograd when their input requires a gradient; the public modules call them, and so do the
backward passes (so a gradient of a gradient works too).

* allreduce: the gradient is allreduced with the same op and scale factors;
* allgather: the gradient is averaged over ranks and this rank's rows are returned;
* broadcast: the gradient is averaged over ranks and kept on the root only (zeros elsewhere);
* alltoall: the gradient travels back with the received splits;
* reducescatter: the gradients of all ranks are gathered (divided by the size for Average).
"""

from __future__ import annotations

from typing import Any

import torch

from ..process_sets import ProcessSet
from ..reduction import ReduceOp
from . import ops
from .handles import synchronize


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


class AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.input_shape = tensor.shape
        ctx.process_set = process_set
        return synchronize(ops.allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        averaged = allreduce(grad_output, ReduceOp.AVERAGE, None, 1.0, 1.0, ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), None, ctx.process_set)
        offset = int(rows[: ctx.process_set.rank()].sum().item())
        return averaged.narrow(0, offset, ctx.rows).reshape(ctx.input_shape), None, None


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
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return synchronize(ops.reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gathered = allgather(grad_output.contiguous(), None, ctx.process_set)
        if ctx.op is ReduceOp.AVERAGE:
            gathered = gathered / ctx.process_set.size()
        if ctx.scale != 1.0:
            gathered = gathered * ctx.scale
        return gathered, None, None, None, None, None


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
