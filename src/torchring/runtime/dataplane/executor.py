"""The data plane: runs a negotiated response on this rank's tensors with torch.distributed groups.

CPU tensors go through a Gloo group, CUDA tensors through an NCCL group, each per process set.
A member that has joined (``hvd.join()``) has no request of its own: it takes part with zeros
shaped like the other ranks' tensors.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ...metrics.counters import METRICS
from ..coordination.negotiation import Response
from ..devices import is_cuda, last_cuda_device
from ..requests import OpType, Request, RequestMeta
from .completion import Launched
from .cuda_streams import EngineStreams
from .reduce import Scaling, start_allreduce

if TYPE_CHECKING:
    from .process_set_table import ProcessSetTable


def copy_all(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    """``target.copy_(source)`` for each pair, in one call where torch has ``_foreach_copy_``."""
    foreach_copy = getattr(torch, "_foreach_copy_", None)
    if foreach_copy is not None and len(targets) > 1:
        foreach_copy(list(targets), list(sources))
        return
    for target, source in zip(targets, sources, strict=True):
        target.copy_(source)


def _wire_view(tensor: torch.Tensor) -> torch.Tensor:
    """What Gloo can move: bool and int16 tensors travel as bytes (dimension 0 is kept, for splits)."""
    if tensor.dtype == torch.bool:
        return tensor.view(torch.uint8)
    if tensor.dtype == torch.int16:
        rows = tensor.shape[0] if tensor.dim() else 1
        per_row = math.prod(tensor.shape[1:]) if tensor.dim() else 1
        return tensor.view(rows, per_row).view(torch.uint8)
    return tensor


def joined_device(meta: RequestMeta, join_device: int) -> torch.device:
    """Where a joined rank makes its zeros for a response of ``meta`` (another rank's metadata): the CPU for
    CPU tensors; for CUDA ones this rank's own GPU: ``join(device)``'s, else the one its own requests used."""
    if not is_cuda(meta.device):
        return torch.device("cpu")
    index = join_device if join_device >= 0 else last_cuda_device()
    if index is None:
        raise RuntimeError(f"this rank has joined and has no CUDA device to take part in '{meta.name}' with: "
                           "call hvd.join(device=<its GPU index>)")
    return torch.device("cuda", index)


def scatter_rows(rows: int, size: int) -> list[int]:
    """How reducescatter splits ``rows`` over ``size`` ranks: as evenly as possible, extras first."""
    return [rows // size + (1 if r < rows % size else 0) for r in range(size)]


def _launch(group: dist.ProcessGroup | None, start: Callable[[dist.ProcessGroup], dist.Work],
            finish: Callable[[], Any]) -> Launched:
    """Start a collective on ``group`` (none in a set of one rank) and say how to finish it."""
    return Launched(start(group) if group is not None else None, finish)


class Executor:
    """Launches responses on this rank; every member launches the same responses in the same order.

    Collectives are started asynchronously and returned as ``Launched`` works that a ``Completer``
    finishes; CUDA ones are queued on the engine's own stream for their device (``cuda_streams``).
    """

    def __init__(self, process_sets: ProcessSetTable, rank: int) -> None:
        self.process_sets = process_sets
        self.rank = rank
        self.fusion_buffers = FusionBufferPool()
        self.streams = EngineStreams()
        #: The GPU this rank makes zeros on once it has joined (``join(device)``; -1: the one it last used).
        self.join_device = -1

    def _zeros(self, meta: RequestMeta, first_dim: int | None = None) -> torch.Tensor:
        """A joined rank's part: zeros shaped like ``meta`` (another rank's), on this rank's device."""
        shape = meta.shape if first_dim is None else (first_dim, *meta.shape[1:])
        return torch.zeros(shape, dtype=getattr(torch, meta.dtype), device=joined_device(meta, self.join_device))

    def launch_fused(self, batch: list[Response], requests: list[Request], timeline: Any,
                     backend_activity: str) -> Launched:
        """Reduce several allreduce requests of one kind (see ``fusion``) through one shared buffer."""
        buffers = [request.buffer for request in requests]
        assert all(buffer is not None for buffer in buffers)
        if buffers[0].is_cuda:
            return self.streams.launch(buffers[0].device, requests,
                                       lambda: self._launch_fused(batch, buffers, timeline, backend_activity))
        return self._launch_fused(batch, buffers, timeline, backend_activity)

    def _launch_fused(self, batch: list[Response], buffers: list[torch.Tensor], timeline: Any,
                      backend_activity: str) -> Launched:
        first = batch[0]
        flat = [buffer if buffer.dim() == 1 else buffer.view(-1) for buffer in buffers]  # contiguous: checked
        sizes = [buffer.numel() for buffer in flat]
        storage = self.fusion_buffers.acquire(buffers[0], sum(sizes))
        fused = storage[: sum(sizes)]
        names = [response.name for response in batch]
        try:
            self._activity(timeline, names, "MEMCPY_IN_FUSION_BUFFER")
            copy_started = time.perf_counter()
            torch.cat(flat, out=fused)
            METRICS.phase("fusion_copy", time.perf_counter() - copy_started)
            METRICS.fused_buffers += 1
            self._activity(timeline, names, backend_activity)
            size = len(first.members)
            group = self.process_sets.groups(first.process_set).for_device(first.template.device, size)
            ends = list(itertools.accumulate(sizes))
            segments = list(zip([0, *ends[:-1]], ends, strict=True))  # Adasum's coefficients are per tensor
            reduction = self._start_reduce(fused, first.template, group, size, segments)
        except BaseException:
            self.fusion_buffers.release(storage)
            raise

        def finish() -> list[torch.Tensor]:
            try:
                reduction.finish()
                self._activity(timeline, names, "MEMCPY_OUT_FUSION_BUFFER")
                copy_started = time.perf_counter()
                copy_all(flat, fused.split(sizes))
                METRICS.phase("fusion_copy", time.perf_counter() - copy_started)
                if timeline.enabled:
                    for name in names:
                        timeline.activity_end(name)
            finally:
                self.fusion_buffers.release(storage)
            return buffers

        return Launched(reduction.work, finish)

    @staticmethod
    def _activity(timeline: Any, names: list[str], activity: str) -> None:
        if not timeline.enabled:
            return
        for name in names:
            timeline.activity_start(name, activity)

    def launch(self, response: Response, request: Request | None) -> Launched:
        """Start ``response`` (``request`` is None when this rank joined); the result comes from finishing it."""
        op_type = response.op_type
        if op_type is OpType.BARRIER:
            return Launched.done(None)
        buffer = request.buffer if request is not None else None
        if is_cuda(response.template.device):
            device = buffer.device if buffer is not None else joined_device(response.template, self.join_device)
            return self.streams.launch(device, [request] if request is not None else [],
                                       lambda: self._start(op_type, response, buffer))
        return self._start(op_type, response, buffer)

    def _start(self, op_type: OpType, response: Response, buffer: torch.Tensor | None) -> Launched:
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
    def _start_reduce(buffer: torch.Tensor, meta: RequestMeta, group: dist.ProcessGroup | None,
                      size: int, segments: list[tuple[int, int]] | None = None) -> Launched:
        """Start the allreduce of ``buffer`` with ``meta``'s op and scaling (see ``runtime.dataplane.reduce``);
        ``segments``: where each tensor of a fused buffer lies (Adasum's coefficients are per tensor)."""
        return start_allreduce(buffer, Scaling.of(meta), group, size, segments=segments)

    def _allreduce(self, response: Response, buffer: torch.Tensor | None, group: dist.ProcessGroup | None,
                   size: int) -> Launched:
        if buffer is None:
            buffer = self._zeros(response.template)
        return self._start_reduce(buffer, response.template, group, size)

    def _broadcast(self, response: Response, buffer: torch.Tensor | None,
                   group: dist.ProcessGroup | None) -> Launched:
        meta = response.template
        target = self._zeros(meta) if buffer is None else buffer
        options = dist.BroadcastOptions()
        options.rootRank = self.process_sets.set_rank(response.process_set, meta.root_rank)
        return _launch(group, lambda g: g.broadcast([_wire_view(target)], options), lambda: target)

    def _allgather(self, response: Response, buffer: torch.Tensor | None, group: dist.ProcessGroup | None,
                   size: int) -> Launched:
        meta = response.template
        source = self._zeros(meta, first_dim=0) if buffer is None else buffer
        first_dims = [response.metas[r].shape[0] if r in response.metas else 0 for r in response.members]
        rest = tuple(source.shape[1:])
        output = source.new_empty((sum(first_dims), *rest))
        if group is None:
            output.copy_(source)
            return Launched.done(output)
        if len(set(first_dims)) == 1:
            return Launched(group._allgather_base(_wire_view(output), _wire_view(source)), lambda: output)
        width = max(first_dims)
        padded = source.new_zeros((width, *rest))
        padded[: source.shape[0]].copy_(source)
        gathered = source.new_empty((size * width, *rest))

        def finish() -> torch.Tensor:
            offset = 0
            for index, rows in enumerate(first_dims):
                output[offset:offset + rows].copy_(gathered[index * width:index * width + rows])
                offset += rows
            return output

        return Launched(group._allgather_base(_wire_view(gathered), _wire_view(padded)), finish)

    def _alltoall(self, response: Response, buffer: torch.Tensor | None,
                  group: dist.ProcessGroup | None) -> Launched:
        assert buffer is not None
        me = self.process_sets.set_rank(response.process_set)
        send = list(response.metas[self.rank].splits)
        received = [response.metas[r].splits[me] for r in response.members]
        output = buffer.new_empty((sum(received), *buffer.shape[1:]))
        result = (output, torch.tensor(received, dtype=torch.int32))
        if group is None:
            output.copy_(buffer)
            return Launched.done(result)
        work = group.alltoall_base(_wire_view(output), _wire_view(buffer), received, send, dist.AllToAllOptions())
        return Launched(work, lambda: result)

    def _reducescatter(self, response: Response, buffer: torch.Tensor | None, group: dist.ProcessGroup | None,
                       size: int) -> Launched:
        assert buffer is not None
        rows = scatter_rows(buffer.shape[0], size)
        me = self.process_sets.set_rank(response.process_set)
        offset = sum(rows[:me])
        reduction = self._start_reduce(buffer, response.template, group, size)
        return Launched(reduction.work, lambda: reduction.finish()[offset:offset + rows[me]].clone())


class FusionBufferPool:
    """Flat buffers per (device, dtype), reused across steps; one per fused collective in flight.

    At most ``limit`` buffers of a kind are in use at once: ``acquire`` then waits for a release, which
    bounds the memory of fused collectives that are still on the wire.
    """

    def __init__(self, limit: int = 4) -> None:
        self.limit = limit
        self._cond = threading.Condition()
        self._free: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        self._in_use: dict[tuple[torch.device, torch.dtype], int] = {}

    def acquire(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        """A flat buffer of ``like``'s dtype and device with room for ``numel`` elements."""
        key = (like.device, like.dtype)
        with self._cond:
            while self._in_use.get(key, 0) >= self.limit:
                self._cond.wait()
            free = self._free.setdefault(key, [])  # tensors compare by value: work with positions
            fitting = [i for i, buffer in enumerate(free) if buffer.numel() >= numel]
            if fitting:
                buffer = free.pop(min(fitting, key=lambda i: free[i].numel()))
            else:
                if free:  # replace the largest too-small buffer rather than keep it
                    free.pop(max(range(len(free)), key=lambda i: free[i].numel()))
                buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._in_use[key] = self._in_use.get(key, 0) + 1
        return buffer

    def release(self, buffer: torch.Tensor) -> None:
        """Return a buffer from ``acquire`` for reuse."""
        key = (buffer.device, buffer.dtype)
        with self._cond:
            self._free.setdefault(key, []).append(buffer)
            self._in_use[key] -= 1
            self._cond.notify_all()
