"""Grouped collectives: several tensors negotiated and executed as one unit (one handle)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import autograd_functions as autograd
from .compression import Compression, Compressor
from .operations import (
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
)
from .process_sets import ProcessSet, global_process_set
from .reduction import ReduceOp, resolve_op
from .runtime.submit import synchronize

__all__ = [
    "grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async",
]


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce ``tensors`` as one unit and return the results (differentiable, like ``allreduce``)."""
    compressed = [compression.compress(t) for t in tensors]
    results = autograd.grouped_allreduce([c for c, _ in compressed], resolve_op(op, average), name, prescale_factor,
                                         postscale_factor, process_set)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed, strict=True)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce ``tensors`` in place as one unit and return them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allgather ``tensors`` as one unit (differentiable, like ``allgather``)."""
    return autograd.grouped_allgather(list(tensors), name, process_set)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: int = ReduceOp.AVERAGE,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reduce-scatter ``tensors`` as one unit (differentiable, like ``reducescatter``)."""
    compressed = [compression.compress(t) for t in tensors]
    results = autograd.grouped_reducescatter([c for c, _ in compressed], resolve_op(op, None), name, prescale_factor,
                                             postscale_factor, process_set)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed, strict=True)]

