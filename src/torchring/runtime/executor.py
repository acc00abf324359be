"""The data plane: runs a negotiated response on this rank's tensors with torch.distributed groups.

CPU tensors go through a Gloo group, CUDA tensors through an NCCL group; both are created at init.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..reduction import ReduceOp
from .negotiation import Response
from .requests import OpType, Request

_C10D_REDUCE_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


@dataclass
class DataGroups:
    """The process groups that move tensor data, one per device kind."""

    cpu: dist.ProcessGroup | None
    cuda: dist.ProcessGroup | None = None

    def for_device(self, device: str, size: int) -> dist.ProcessGroup | None:
        """The group for tensors on ``device``; None only in a job of one rank without such a group."""
        group = self.cuda if device == "cuda" else self.cpu
        if group is None and size > 1:
            raise RuntimeError(
                f"no process group for {device} tensors: NCCL is unavailable in this torch build; "
                "move the tensor to the CPU or install a CUDA build of torch"
            )
        return group


def _scale(tensor: torch.Tensor, factor: float) -> None:
    if factor == 1.0:
        return
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        tensor.mul_(factor)
    else:
        tensor.copy_((tensor.double() * factor).to(tensor.dtype))


def _wire_view(tensor: torch.Tensor) -> torch.Tensor:
    """Gloo moves no bool tensors; send their bytes instead."""
    return tensor.view(torch.uint8) if tensor.dtype == torch.bool else tensor


class Executor:
    """Carries out responses on this rank; every rank calls ``execute`` with the same responses in order."""

    def __init__(self, groups: DataGroups, rank: int, size: int) -> None:
        self.groups = groups
        self.rank = rank
        self.size = size

    def execute(self, response: Response, request: Request) -> Any:
        """Run ``response`` on ``request``'s buffer and return the operation's result."""
        op_type = response.op_type
        if op_type is OpType.BARRIER:
            return None
        buffer = request.buffer
        assert buffer is not None
        if buffer.is_cuda:
            with torch.cuda.device(buffer.device):
                if request.ready_event is not None:
                    torch.cuda.current_stream().wait_event(request.ready_event)
                result = self._run(op_type, response, buffer)
                torch.cuda.current_stream().synchronize()
                return result
        return self._run(op_type, response, buffer)

    def _run(self, op_type: OpType, response: Response, buffer: torch.Tensor) -> torch.Tensor:
        if op_type is OpType.ALLREDUCE:
            return self._allreduce(response, buffer)
        if op_type is OpType.BROADCAST:
            return self._broadcast(response, buffer)
        if op_type is OpType.ALLGATHER:
            return self._allgather(response, buffer)
        raise AssertionError(f"unknown operation {op_type}")

    def _allreduce(self, response: Response, buffer: torch.Tensor) -> torch.Tensor:
        meta = response.metas[self.rank]
        op = ReduceOp(meta.reduce_op)
        _scale(buffer, meta.prescale_factor)
        group = self.groups.for_device(meta.device, self.size)
        if group is not None:
            options = dist.AllreduceOptions()
            options.reduceOp = _C10D_REDUCE_OPS[op]
            group.allreduce([buffer], options).wait()
        if op is ReduceOp.AVERAGE:
            if buffer.dtype.is_floating_point or buffer.dtype.is_complex:
                buffer.div_(self.size)
            else:
                buffer.floor_divide_(self.size)
        _scale(buffer, meta.postscale_factor)
        return buffer

    def _broadcast(self, response: Response, buffer: torch.Tensor) -> torch.Tensor:
        meta = response.metas[self.rank]
        group = self.groups.for_device(meta.device, self.size)
        if group is not None:
            options = dist.BroadcastOptions()
            options.rootRank = meta.root_rank
            group.broadcast([_wire_view(buffer)], options).wait()
        return buffer

    def _allgather(self, response: Response, buffer: torch.Tensor) -> torch.Tensor:
        meta = response.metas[self.rank]
        first_dims = [m.shape[0] for m in response.metas]
        rest = tuple(buffer.shape[1:])
        output = buffer.new_empty((sum(first_dims), *rest))
        group = self.groups.for_device(meta.device, self.size)
        if group is None:
            output.copy_(buffer)
            return output
        if len(set(first_dims)) == 1:
            group._allgather_base(_wire_view(output), _wire_view(buffer)).wait()
            return output
        width = max(first_dims)
        padded = buffer.new_zeros((width, *rest))
        padded[: buffer.shape[0]].copy_(buffer)
        gathered = buffer.new_empty((self.size * width, *rest))
        group._allgather_base(_wire_view(gathered), _wire_view(padded)).wait()
        offset = 0
        for rank, rows in enumerate(first_dims):
            output[offset:offset + rows].copy_(gathered[rank * width:rank * width + rows])
            offset += rows
        return output
