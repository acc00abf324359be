"""Reduction operations, with the values Horovod gives its module constants."""

from __future__ import annotations

from enum import IntEnum


class ReduceOp(IntEnum):
    """How allreduce combines the tensors of all ranks."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


def resolve_op(op: int | None, average: bool | None) -> ReduceOp:
    """Combine Horovod's two ways of naming the reduction (``op=`` and the older ``average=``)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average; give only one of them.")
    if op is None:
        return Average if average is None or average else Sum
    if op.__class__ is ReduceOp and op is not Adasum:
        return op  # hvd.Sum, hvd.Average...: nothing to convert (this runs for every operation; the module
        # constants are looked up faster than the class's members)
    try:
        resolved = ReduceOp(int(op))
    except ValueError:
        raise ValueError(f"Unknown reduction op {op!r}; use Average, Sum, Min, Max or Product.") from None
    return resolved
