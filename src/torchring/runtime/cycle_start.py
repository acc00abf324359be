"""When the engine's next cycle starts: the engine thread's waiting between cycles.

While requests keep coming, cycles start one cycle time apart (more requests share a negotiation and a
fused buffer), at once for a request after a quiet cycle, and a burst of submissions gets a moment to
settle first. When every rank went idle the engine blocks: first ``QUIET_S`` without listening to the
store, then until a request of its own or a peer's wake-up (``coordination.wakeup``). ``CycleStart`` is a
part of ``Engine`` (which owns the state used here); it is kept apart so that each file has one job.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from .coordination.wakeup import QUIET_S, DeferredWake
from .requests import Request

if TYPE_CHECKING:
    from .coordination.engine_settings import EngineSettings
    from .coordination.stall_inspector import StallInspector

#: A burst of submissions counts as over once no request came for this long.
BURST_SETTLE_S = 0.0002


class CycleStart:
    """The engine's waits for its next cycle (see the module text); the attributes are ``Engine``'s."""

    _cond: threading.Condition
    _queue: list[Request]
    _inflight: dict
    _settings: EngineSettings
    _stalls: StallInspector
    _wake: DeferredWake
    _failure: BaseException | None
    _shutdown_requested: bool
    _stall_abort: str
    _launch_failures: list
    _woken_epoch: int
    _wants_notify: bool
    _hurried: bool
    _probe_requested: bool
    _settling: bool
    _pacing: bool
    _everyone_blocked: bool
    _empty_cycles: int
    _cycle_started: float

    def _inspect_stalls(self) -> None:
        raise NotImplementedError

    def _wait_for_cycle(self) -> tuple[list[Request], bool]:
        """Wait for the next cycle, at most one cycle time after the last one started: at once for a request after a
        quiet cycle; while requests keep coming, one cycle time apart (more share a negotiation and fused buffer)."""
        # a rank with nothing of its own (the others wait for it), or every rank blocked, spaces its cycles
        own_requests = bool(self._inflight or self._queue) and not self._everyone_blocked
        deadline = self._cycle_started + self._settings.pace(self._empty_cycles, own_requests)
        with self._cond:
            self._wants_notify = not self._pacing
            while not self._shutdown_requested and self._failure is None:
                if self._queue and (not self._pacing or self._hurried):
                    self._wants_notify = False
                    self._let_burst_settle()
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._wants_notify = False
            self._hurried = False
            drained = self._drain()
        self._pacing = bool(drained[0])
        self._cycle_started = time.monotonic()
        return drained

    def _wait_while_idle(self, epoch: int) -> tuple[list[Request], bool]:
        """Block until this rank has something to do or another rank wakes ``epoch``: first ``QUIET_S`` without
        listening to the store (the next request of a loop usually comes sooner), then listening."""
        if self._stays_idle(epoch, QUIET_S):
            self._wake.waker.listen(epoch, self._on_remote_wake)  # may release the listener first: not under the lock
            self._stays_idle(epoch, None)
        if self._woken_epoch < epoch:  # left on its own
            self._wake.owe(epoch)  # paid by the next collective, only if the peers do not join it soon enough
        with self._cond:
            if self._queue:
                self._let_burst_settle()
            drained = self._drain()
        self._pacing = False
        self._cycle_started = time.monotonic()
        return drained

    def _stays_idle(self, epoch: int, limit_s: float | None) -> bool:
        """Wait while this rank has nothing to do in idle ``epoch``, at most ``limit_s`` (``None``: no limit);
        whether it still has nothing to do."""
        deadline = None if limit_s is None else time.monotonic() + limit_s
        with self._cond:
            self._wants_notify = True
            while (not self._queue and not self._shutdown_requested and not self._stall_abort
                   and not self._launch_failures and self._woken_epoch < epoch and self._failure is None
                   and not self._probe_requested):
                left = self._stalls.check_interval() if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    return True
                self._cond.wait(left)
                self._inspect_stalls()
            self._wants_notify = False
            return False

    def _let_burst_settle(self) -> None:
        """With the lock held and a request queued after a quiet spell: while the user keeps submitting
        (the queue grew within the last ``BURST_SETTLE_S``), wait a little longer, at most one cycle
        time, so that one negotiation and one fused buffer carry the whole burst."""
        deadline = time.monotonic() + self._settings.cycle_time_s
        seen = len(self._queue)
        self._settling = True
        while not self._shutdown_requested and not self._hurried and time.monotonic() < deadline:
            self._cond.wait(BURST_SETTLE_S)
            if len(self._queue) == seen:
                break
            seen = len(self._queue)
        self._settling = False
        self._hurried = False

    def _on_remote_wake(self, epoch: int) -> None:
        with self._cond:
            self._woken_epoch = max(self._woken_epoch, epoch)
            self._cond.notify()

    def _drain(self) -> tuple[list[Request], bool]:
        self._probe_requested = False  # the cycle about to start is the one a probe asked for
        drained, self._queue = self._queue, []
        return drained, self._shutdown_requested
