"""The data plane: runs a negotiated response on this rank's tensors with torch.distributed groups.

CPU tensors go through a Gloo group, CUDA tensors through an NCCL group, each per process set.
A member that has joined (``hvd.join()``) has no request of its own: it takes part with zeros
shaped like the other ranks' tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..reduction import ReduceOp
from .negotiation import Response
from .requests import OpType, Request, RequestMeta

if TYPE_CHECKING:
    from .process_set_table import ProcessSetTable

_C10D_REDUCE_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


@dataclass
class DataGroups:
    """The process groups that move tensor data for one process set, one per device kind."""

    cpu: dist.ProcessGroup | None
    cuda: dist.ProcessGroup | None = None

    def for_device(self, device: str, size: int) -> dist.ProcessGroup | None:
        """The group for tensors on ``device``; None only in a set of one rank without such a group."""
        group = self.cuda if device == "cuda" else self.cpu
        if group is None and size > 1:
            raise RuntimeError(
                f"no process group for {device} tensors: NCCL is unavailable in this torch build; "
                "move the tensor to the CPU or install a CUDA build of torch"
            )
        return group

    def shutdown(self) -> None:
        """Release the groups (a group whose peer is gone may refuse; that is fine here)."""
        for group in (self.cpu, self.cuda):
            if group is not None and hasattr(group, "shutdown"):
                try:
                    group.shutdown()
                except Exception:  # noqa: BLE001
                    pass


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


def _zeros_like_meta(meta: RequestMeta, first_dim: int | None = None) -> torch.Tensor:
    shape = meta.shape if first_dim is None else (first_dim, *meta.shape[1:])
    device = "cuda" if meta.device == "cuda" else "cpu"
    if device == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    return torch.zeros(shape, dtype=getattr(torch, meta.dtype), device=device)


@contextlib.contextmanager
def _device_scope(device: str, buffer: torch.Tensor | None, requests: list[Request]) -> Iterator[None]:
    """For CUDA work: run on the buffer's device after the submitting streams' events, and wait for the
    result before returning (so that a completed handle means the data is there)."""
    if device != "cuda":
        yield
        return
    with torch.cuda.device(buffer.device if buffer is not None else torch.cuda.current_device()):
        for request in requests:
            if request.ready_event is not None:
                torch.cuda.current_stream().wait_event(request.ready_event)
        yield
        torch.cuda.current_stream().synchronize()


def scatter_rows(rows: int, size: int) -> list[int]:
    """How reducescatter splits ``rows`` over ``size`` ranks: as evenly as possible, extras first."""
    return [rows // size + (1 if r < rows % size else 0) for r in range(size)]


class Executor:
    """Carries out responses on this rank; every member calls ``execute`` with the same responses in order."""

    def __init__(self, process_sets: ProcessSetTable, rank: int) -> None:
        self.process_sets = process_sets
        self.rank = rank
        self._fusion_buffers: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def execute_fused(self, batch: list[Response], requests: list[Request], timeline: Any,
                      backend_activity: str) -> list[torch.Tensor]:
        """Reduce several allreduce requests of one kind (see ``fusion``) through one shared buffer."""
        first = batch[0]
        buffers = [request.buffer for request in requests]
        assert all(buffer is not None for buffer in buffers)
        sizes = [buffer.numel() for buffer in buffers]
        fused = self._fusion_buffer(buffers[0], sum(sizes))[: sum(sizes)]
        names = [response.name for response in batch]
        with _device_scope(first.template.device, buffers[0], requests):
            self._activity(timeline, names, "MEMCPY_IN_FUSION_BUFFER")
            torch.cat([buffer.reshape(-1) for buffer in buffers], out=fused)
            self._activity(timeline, names, backend_activity)
            size = len(first.members)
            group = self.process_sets.groups(first.process_set).for_device(first.template.device, size)
            self._reduce(fused, first.template, group, size)
            self._activity(timeline, names, "MEMCPY_OUT_FUSION_BUFFER")
            for buffer, part in zip(buffers, fused.split(sizes), strict=True):
                buffer.reshape(-1).copy_(part)
        for name in names:
            timeline.activity_end(name)
        return buffers

    @staticmethod
    def _activity(timeline: Any, names: list[str], activity: str) -> None:
        for name in names:
            timeline.activity_start(name, activity)

    def _fusion_buffer(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        """A flat buffer of ``like``'s dtype and device with room for ``numel`` elements, reused across steps."""
        key = (like.device, like.dtype)
        buffer = self._fusion_buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._fusion_buffers[key] = buffer
        return buffer

    def execute(self, response: Response, request: Request | None) -> Any:
        """Run ``response`` (``request`` is None when this rank joined) and return the result."""
        op_type = response.op_type
        if op_type is OpType.BARRIER:
            return None
        buffer = request.buffer if request is not None else None
        with _device_scope(response.template.device, buffer, [request] if request is not None else []):
            return self._run(op_type, response, buffer)

    def _run(self, op_type: OpType, response: Response, buffer: torch.Tensor | None) -> Any:
        size = len(response.members)
        group = self.process_sets.groups(response.process_set).for_device(response.template.device, size)
        if op_type is OpType.ALLREDUCE:
            return self._allreduce(response, buffer, group, size)
        if op_type is OpType.BROADCAST:
            return self._broadcast(response, buffer, group)
        if op_type is OpType.ALLGATHER:
            return self._allgather(response, buffer, group, size)
        if op_type is OpType.ALLTOALL:
            return self._alltoall(response, buffer, group)
        if op_type is OpType.REDUCESCATTER:
            return self._reducescatter(response, buffer, group, size)
        raise AssertionError(f"unknown operation {op_type}")

    @staticmethod
    def _reduce(buffer: torch.Tensor, meta: RequestMeta, group: dist.ProcessGroup | None, size: int) -> None:
        op = ReduceOp(meta.reduce_op)
        _scale(buffer, meta.prescale_factor)
        if group is not None:
            options = dist.AllreduceOptions()
            options.reduceOp = _C10D_REDUCE_OPS[op]
            group.allreduce([buffer], options).wait()
        if op is ReduceOp.AVERAGE:
            if buffer.dtype.is_floating_point or buffer.dtype.is_complex:
                buffer.div_(size)
            else:
                buffer.floor_divide_(size)
        _scale(buffer, meta.postscale_factor)

    def _allreduce(self, response: Response, buffer: torch.Tensor | None, group: dist.ProcessGroup | None,
                   size: int) -> torch.Tensor:
        if buffer is None:
            buffer = _zeros_like_meta(response.template)
        self._reduce(buffer, response.template, group, size)
        return buffer

    def _broadcast(self, response: Response, buffer: torch.Tensor | None,
                   group: dist.ProcessGroup | None) -> torch.Tensor:
        meta = response.template
        if buffer is None:
            buffer = _zeros_like_meta(meta)
        if group is not None:
            options = dist.BroadcastOptions()
            options.rootRank = self.process_sets.set_rank(response.process_set, meta.root_rank)
            group.broadcast([_wire_view(buffer)], options).wait()
        return buffer

    def _allgather(self, response: Response, buffer: torch.Tensor | None, group: dist.ProcessGroup | None,
                   size: int) -> torch.Tensor:
        meta = response.template
        if buffer is None:
            buffer = _zeros_like_meta(meta, first_dim=0)
        first_dims = [response.metas[r].shape[0] if r in response.metas else 0 for r in response.members]
        rest = tuple(buffer.shape[1:])
        output = buffer.new_empty((sum(first_dims), *rest))
        if group is None:
            output.copy_(buffer)
            return output
        if len(set(first_dims)) == 1:
            group._allgather_base(_wire_view(output), _wire_view(buffer)).wait()
            return output
        width = max(first_dims)
        padded = buffer.new_zeros((width, *rest))
        padded[: buffer.shape[0]].copy_(buffer)
        gathered = buffer.new_empty((size * width, *rest))
        group._allgather_base(_wire_view(gathered), _wire_view(padded)).wait()
        offset = 0
        for index, rows in enumerate(first_dims):
            output[offset:offset + rows].copy_(gathered[index * width:index * width + rows])
            offset += rows
        return output

    def _alltoall(self, response: Response, buffer: torch.Tensor | None,
                  group: dist.ProcessGroup | None) -> tuple[torch.Tensor, torch.Tensor]:
        assert buffer is not None
        me = self.process_sets.set_rank(response.process_set)
        send = list(response.metas[self.rank].splits)
        received = [response.metas[r].splits[me] for r in response.members]
        output = buffer.new_empty((sum(received), *buffer.shape[1:]))
        if group is None:
            output.copy_(buffer)
        else:
            group.alltoall_base(_wire_view(output), _wire_view(buffer), received, send,
                                dist.AllToAllOptions()).wait()
        return output, torch.tensor(received, dtype=torch.int32)

    def _reducescatter(self, response: Response, buffer: torch.Tensor | None, group: dist.ProcessGroup | None,
                       size: int) -> torch.Tensor:
        assert buffer is not None
        meta = response.template
        rows = scatter_rows(buffer.shape[0], size)
        me = self.process_sets.set_rank(response.process_set)
        offset = sum(rows[:me])
        self._reduce(buffer, meta, group, size)
        return buffer[offset:offset + rows[me]].clone()
