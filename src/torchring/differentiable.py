"""Autograd for the out-of-place collectives, with the gradients Horovod defines.

* allreduce: the gradient is allreduced with the same op and scale factors;
* allgather: the gradient is averaged over ranks and this rank's rows are returned;
* broadcast: the gradient is averaged over ranks and kept on the root only (zeros elsewhere).
"""

from __future__ import annotations

from typing import Any

import torch

from . import collectives
from .reduction import ReduceOp
from .runtime import context


class AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, name: str | None, prescale_factor: float,
                postscale_factor: float) -> torch.Tensor:
        ctx.op, ctx.prescale_factor, ctx.postscale_factor = op, prescale_factor, postscale_factor
        handle = collectives.allreduce_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                             postscale_factor=postscale_factor)
        return collectives.synchronize(handle)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad = collectives.allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale_factor,
                                     postscale_factor=ctx.postscale_factor)
        return grad, None, None, None, None


class AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None) -> torch.Tensor:
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.input_shape = tensor.shape
        return collectives.synchronize(collectives.allgather_async(tensor, name))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        averaged = collectives.allreduce(grad_output, op=ReduceOp.AVERAGE)
        rows = collectives.allgather(torch.tensor([ctx.rows], dtype=torch.int64))
        offset = int(rows[: context.current().topology.rank].sum().item())
        return averaged.narrow(0, offset, ctx.rows).reshape(ctx.input_shape), None


class BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None) -> torch.Tensor:
        ctx.root_rank = root_rank
        return collectives.synchronize(collectives.broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        averaged = collectives.allreduce(grad_output, op=ReduceOp.AVERAGE)
        if context.current().topology.rank != ctx.root_rank:
            averaged = torch.zeros_like(averaged)
        return averaged, None, None


def needs_autograd(tensor: torch.Tensor) -> bool:
    """True when the result must carry a gradient function."""
    return torch.is_grad_enabled() and tensor.requires_grad
