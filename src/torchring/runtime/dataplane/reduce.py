"""The one reduction path: start an allreduce of a (possibly fused, possibly compressed) buffer, with
Horovod's scaling, and finish it.

Both callers go through ``start_allreduce``: the engine's executor for negotiated requests (single or
fused through a fusion buffer), and ``DistributedOptimizer``'s bucket lane for its steady-state steps.
Scaling follows Horovod at every step: the buffer that travels (the compressed one, when the optimizer
compresses) is multiplied by ``prescale``, summed (or min/max/product) across ranks, divided by the
set's size for ``Average`` and multiplied by ``postscale``, all in the buffer's own dtype. Integer
buffers are scaled once, in float64, truncated toward zero, as Horovod does. ``Adasum`` runs its
point-to-point rounds (``adasum``) when started, so its ``Launched`` is already done.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...metrics.counters import METRICS
from ...reduction import ReduceOp
from ..requests import RequestMeta
from .adasum import Segments, adasum_allreduce
from .completion import Launched

_C10D_REDUCE_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}

#: Gloo cannot reduce these; they are reduced in a wider type and converted back.
_REDUCE_AS = {torch.int16: torch.int32}


@dataclass(frozen=True)
class Scaling:
    """How an allreduce combines and scales: ``op``, then ``prescale`` before and ``postscale`` after."""

    op: ReduceOp = ReduceOp.AVERAGE
    prescale: float = 1.0
    postscale: float = 1.0

    @classmethod
    def of(cls, meta: RequestMeta) -> Scaling:
        """The scaling a negotiated request asks for: its op, prescale and postscale factors."""
        return cls(ReduceOp(meta.reduce_op), meta.prescale_factor, meta.postscale_factor)


def scale_in_place(tensor: torch.Tensor, factor: float) -> None:
    """Multiply ``tensor`` by ``factor`` in its own dtype (integers through float64, truncated)."""
    if factor == 1.0:
        return
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        tensor.mul_(factor)
    else:
        tensor.copy_((tensor.double() * factor).to(tensor.dtype))


def start_allreduce(buffer: torch.Tensor, scaling: Scaling, group: dist.ProcessGroup | None, size: int,
                    scaled_numel: int | None = None, segments: Segments | None = None) -> Launched:
    """Prescale ``buffer`` and start its allreduce on ``group`` (None: a set of one rank, nothing to send).

    Finishing the returned ``Launched`` (after its work completes) averages and postscales ``buffer`` in
    place and returns it. Only the first ``scaled_numel`` elements are scaled (all when None): the
    bucket lane appends bookkeeping elements that are summed but never scaled.
    """
    METRICS.reduced(buffer.numel() * buffer.element_size())
    payload = buffer if scaled_numel is None else buffer[:scaled_numel]
    scale_in_place(payload, scaling.prescale)
    wide_dtype = _REDUCE_AS.get(buffer.dtype) if group is not None else None
    wire = buffer.to(wide_dtype) if wide_dtype is not None else buffer

    def finish() -> torch.Tensor:
        if wire is not buffer:
            buffer.copy_(wire)
        if payload.dtype.is_floating_point or payload.dtype.is_complex:
            if scaling.op is ReduceOp.AVERAGE:
                payload.div_(size)
            scale_in_place(payload, scaling.postscale)
        else:
            average = scaling.op is ReduceOp.AVERAGE
            scale_in_place(payload, scaling.postscale / size if average else scaling.postscale)
        return buffer

    if group is None:
        return Launched(None, finish)
    if scaling.op is ReduceOp.ADASUM:  # point-to-point rounds, done here (segments: the tensors of a fused buffer)
        adasum_allreduce(wire, group, segments)
        return Launched(None, finish)
    options = dist.AllreduceOptions()
    options.reduceOp = _C10D_REDUCE_OPS[scaling.op]
    return Launched(group.allreduce([wire], options), finish)
