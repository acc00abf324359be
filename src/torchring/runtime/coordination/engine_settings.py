"""What the engine (``runtime.engine``) is configured with: the cycle's timing, fusion, the response
cache, the stall inspector and the deadlock check. ``runtime.context`` builds it from ``Settings`` (with
rank 0's values where every rank must agree)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineSettings"]

#: Empty cycles (nothing new from any rank, nothing decided) before a rank with no request of its own
#: starts spacing its cycles out.
QUIET_AFTER_CYCLES = 20


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
    #: Seconds every rank must stay blocked on requests that cannot complete before rank 0 declares the
    #: job deadlocked (``TORCHRING_DEADLOCK_TIMEOUT``; 0: never).
    deadlock_confirm_s: float = 5.0
    #: Settle steady-state cycles with the probe instead of the all-gather (``cycles``; rank 0's value).
    control_probe: bool = True
    #: Merge a repeated small allreduce's probe and data into one collective (``express``; rank 0's value).
    control_express: bool = True
    #: From this many ranks on, all-gathers go through rank 0 instead (``cycles``; 0: never; rank 0's value).
    control_gather_ranks: int = 0
    #: The longest a rank with no request of its own spaces its cycles while the others wait for it.
    quiet_pace_max_s: float = 0.01

    def pace(self, empty_cycles: int, own_requests: bool) -> float:
        """Seconds from one cycle's start to the next. A rank with requests of its own cycles every
        ``cycle_time_s``. A rank with none, after ``QUIET_AFTER_CYCLES`` empty cycles (the others wait for
        it: a straggler still computing, a rank still loading data), doubles the gap each empty cycle up to
        ``quiet_pace_max_s``: the waiting ranks then block in the control collective instead of cycling a
        thousand times a second, and its own next request still starts a cycle at once. The engine also
        passes ``own_requests=False`` when every rank's threads are blocked on requests no cycle moves
        (ranks that diverged, until the deadlock verdict): nobody can progress, so nobody spins."""
        if own_requests or empty_cycles < QUIET_AFTER_CYCLES:
            return self.cycle_time_s
        spaced = self.cycle_time_s * 2 ** min(empty_cycles - QUIET_AFTER_CYCLES + 1, 20)
        return min(spaced, max(self.quiet_pace_max_s, self.cycle_time_s))
