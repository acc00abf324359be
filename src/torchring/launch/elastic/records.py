"""The elastic driver's records: its settings and one membership change (a started worker is
``launch.spawn.worker.Worker``, as in a fixed job)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ElasticSettings:
    """The elastic flags."""

    min_np: int
    max_np: int
    reset_limit: int | None = None
    elastic_timeout_s: float = 600.0
    cooldown_range_s: tuple[float, float] | None = None
    discovery_interval_s: float = 1.0
    #: ``-np``: how many workers the first generation waits for (default: ``min_np``).
    initial_np: int | None = None
    #: ``--spares``: hot spares kept started on slots beyond ``max_np``.
    spares: int = 0


@dataclass
class MembershipChange:
    """What changed in one pass of the driver's loop, in words for the log; ``removed_only`` when nothing
    joined (the running workers may then skip ``sync()``)."""

    reasons: list[str] = field(default_factory=list)
    removed_only: bool = True

    def add(self, reason: str, removal: bool) -> None:
        self.reasons.append(reason)
        self.removed_only = self.removed_only and removal
