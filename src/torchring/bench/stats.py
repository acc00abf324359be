"""Summaries of repeated measurements, 95% intervals, and the bandwidth of collectives."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

# Two-sided 95% quantiles of Student's t distribution by degrees of freedom (standard table values);
# beyond 30 degrees of freedom the normal quantile 1.96 is close enough.
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
          2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
          2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z_975 = 1.96


def t_quantile_975(degrees_of_freedom: int) -> float:
    """The 97.5% quantile of Student's t with ``degrees_of_freedom`` (≥ 1)."""
    if degrees_of_freedom < 1:
        raise ValueError("degrees of freedom must be at least 1")
    return _T_975[degrees_of_freedom - 1] if degrees_of_freedom <= len(_T_975) else _Z_975


def ci95_half_width(values: Sequence[float]) -> float | None:
    """Half-width of the t-based 95% interval of the mean of ``values``; None for fewer than two."""
    if len(values) < 2:
        return None
    return t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


@dataclass(frozen=True)
class Summary:
    """Count, centre and spread of a list of measurements."""

    count: int
    mean: float
    median: float
    minimum: float
    maximum: float
    stdev: float
    #: Half-width of the 95% interval of the mean (None with fewer than two values).
    ci95: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("cannot summarise an empty list of measurements")
        values = [float(v) for v in values]
        stdev = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(len(values), statistics.fmean(values), statistics.median(values), min(values), max(values),
                   stdev, ci95_half_width(values))

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


#: The collectives ``torchring bench collectives`` measures.
OPS = ("allreduce", "allgather", "broadcast")


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; choose from {', '.join(OPS)}")


def algorithm_bytes(op: str, size: int, world_size: int) -> int:
    """Bytes an operation delivers per rank: the whole gathered tensor for allgather, else ``size``."""
    _check_op(op)
    return size * world_size if op == "allgather" else size


def bus_factor(op: str, world_size: int) -> float:
    """How much of the algorithm bandwidth each link carries with a ring: allreduce 2(n-1)/n,
    allgather (n-1)/n, broadcast 1."""
    _check_op(op)
    n = world_size
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op == "allgather":
        return (n - 1) / n
    return 1.0


def algbw(op: str, size: int, world_size: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes per second: ``algorithm_bytes`` / time."""
    return algorithm_bytes(op, size, world_size) / seconds


def busbw(op: str, size: int, world_size: int, seconds: float) -> float:
    """Bus bandwidth in bytes per second: ``algbw`` × ``bus_factor``."""
    return algbw(op, size, world_size, seconds) * bus_factor(op, world_size)
