"""Grouped collectives: several tensors negotiated and executed as one unit (one handle)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .collectives import (
    allgather_meta,
    allgather_source,
    allreduce_meta,
    reducescatter_buffer,
    reducescatter_meta,
)
from .compression import Compression, Compressor
from .handles import auto_name, check_tensor, make_request, request_name, submit_group, synchronize
from .process_sets import ProcessSet, global_process_set, resolve
from .reduction import ReduceOp, resolve_op
from .runtime.requests import Request, RequestMeta

__all__ = [
    "grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async",
]


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


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce ``tensors`` as one unit and return the results (differentiable, like ``allreduce``)."""
    compressed = [compression.compress(t) for t in tensors]
    inputs = [c for c, _ in compressed]
    if any(differentiable.needs_autograd(t) for t in inputs):
        results = list(differentiable.GroupedAllreduceFunction.apply(
            resolve_op(op, average), name, prescale_factor, postscale_factor, process_set, *inputs))
    else:
        results = synchronize(grouped_allreduce_async(inputs, average, name, op, prescale_factor, postscale_factor,
                                                      process_set))
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed, strict=True)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce ``tensors`` in place as one unit and return them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start allgathering ``tensors`` as one unit."""
    set_id = resolve(process_set)
    sources = [allgather_source(t) for t in tensors]

    def meta_for(source: torch.Tensor, group: str, count: int) -> Callable[[str, int], RequestMeta]:
        return allgather_meta(source, set_id, group=group, group_size=count)

    return submit_group(_group_requests("grouped_allgather", name, sources, meta_for, set_id),
                        lambda results: results)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allgather ``tensors`` as one unit."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


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


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: int = ReduceOp.AVERAGE,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reduce-scatter ``tensors`` as one unit."""
    compressed = [compression.compress(t) for t in tensors]
    results = synchronize(grouped_reducescatter_async([c for c, _ in compressed], name, op, process_set,
                                                      prescale_factor, postscale_factor))
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed, strict=True)]


from . import differentiable  # noqa: E402 - autograd wrappers build on the functions above
