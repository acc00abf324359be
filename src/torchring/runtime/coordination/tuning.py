"""Engine settings changed while the job runs (the autotuner, ``optim.autotune``), the same on every rank.

The fusion threshold decides how the engine packs released allreduces into buffers; two ranks packing
the same responses differently would exchange buffers of different sizes. So a change never takes effect
when a rank's own thread sets it: every rank submits a **tuning barrier**, a barrier whose metadata
carries the new values, and each engine applies them when it performs that barrier, at the same place
in the response order on every rank. A rank that has joined has no request of its own for it, and still
applies the values the others announced (a barrier's template is an announcing rank's metadata).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..requests import OpType, RequestMeta
from .engine_settings import EngineSettings

__all__ = ["TUNING_BARRIER", "EngineTuning", "tuning_from"]

#: The name every rank's tuning barrier has.
TUNING_BARRIER = "torchring.autotune.apply"


@dataclass(frozen=True)
class EngineTuning:
    """The engine settings the autotuner changes."""

    fusion_threshold: int
    cycle_time_s: float

    def applied_to(self, settings: EngineSettings) -> EngineSettings:
        """``settings`` with these values."""
        return replace(settings, fusion_threshold=self.fusion_threshold, cycle_time_s=self.cycle_time_s)

    def barrier_meta(self, seq: int, process_set: int = 0) -> RequestMeta:
        """The tuning barrier's metadata: the values travel in ``splits`` (bytes, microseconds)."""
        splits = (int(self.fusion_threshold), round(self.cycle_time_s * 1e6))
        return RequestMeta(name=TUNING_BARRIER, op_type=OpType.BARRIER, splits=splits, seq=seq,
                           process_set=process_set)


def tuning_from(meta: RequestMeta) -> EngineTuning | None:
    """The settings a performed barrier carries, or None for any other barrier."""
    if meta.op_type is not OpType.BARRIER or meta.name != TUNING_BARRIER or len(meta.splits) != 2:
        return None
    threshold, cycle_us = meta.splits
    return EngineTuning(int(threshold), cycle_us / 1e6)
