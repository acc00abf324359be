"""What the engine (``runtime.engine``) is configured with, and what each rank contributes to a cycle."""

from __future__ import annotations

from dataclasses import dataclass

from .requests import RequestMeta


@dataclass(frozen=True)
class Announcement:
    """One rank's contribution to a cycle."""

    metas: tuple[RequestMeta, ...]
    shutting_down: bool
    #: The last idle epoch this rank's wake-up listener has finished with (its key may then go).
    listened_epoch: int = -1
    #: Set by rank 0 when requests stalled past the shutdown time: every rank stops with this text.
    stall_abort: str = ""
    #: Requests found in the response cache, one bit per cache slot (see ``response_cache``).
    cached: bytes = b""


@dataclass(frozen=True)
class EngineSettings:
    """Timing knobs of the cycle and of the stall inspector."""

    cycle_time_s: float = 0.001
    stall_check_enabled: bool = True
    stall_warning_s: float = 60.0
    #: 0: never; otherwise requests stalled this long stop the job on every rank with an error.
    stall_shutdown_s: float = 0.0
    #: Bytes of allreduces packed into one collective (0: no fusion).
    fusion_threshold: int = 128 * 1024 * 1024
    #: Negotiated requests remembered so that repeating them costs one bit (0: no cache).
    cache_capacity: int = 1024
    #: 1: engines block until woken as soon as nothing is pending; more: only after that many consecutive
    #: empty cycles. Every rank must use the same number (they go idle together).
    idle_cycles: int = 1
