"""How late this host runs a thread that was asleep on a lock once the lock is released: what decides
whether a blocking wait polls for its result before it sleeps (``TORCHRING_WAIT_SPIN_US`` left unset).

Where an idle CPU halts (some virtual machines), waking a sleeping thread costs 50-80 µs, and polling for a
small collective's result (which usually comes within a millisecond) saves that on every blocking
operation. Where a wake-up costs a few microseconds, polling saves nothing and its thread competes with the
engine's for the interpreter lock: on such a machine a blocking 4 KB allreduce took 1.0-1.4 ms with the poll
and 0.8-1.0 ms without. The probe takes about 15 ms, once per process, on a thread of its own that
``init()`` starts; until it is done, waits do not poll.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..settings import Settings

#: A wake-up at least this late (the probe's lower quartile) makes blocking waits poll first.
SLOW_WAKEUP_S = 30e-6
#: How long a blocking wait polls where wake-ups are slow.
AUTO_SPIN_S = 1500e-6
_SAMPLES = 12
#: The pause before each release: about what a small blocking collective takes, long enough for the
#: sleeping thread's CPU to go idle (and halt, where idle CPUs do).
_PAUSE_S = 0.001


def thread_wakeup_seconds() -> float:
    """The lower quartile of the delays between releasing a lock and the thread blocked on it running (a
    low quantile: the cost every wake-up pays, not the noise of a busy host)."""
    ring, back = threading.Lock(), threading.Lock()
    ring.acquire()
    back.acquire()
    released_at = [0.0]
    delays: list[float] = []

    def sleeper() -> None:
        for _ in range(_SAMPLES):
            ring.acquire()
            delays.append(time.perf_counter() - released_at[0])
            back.release()

    thread = threading.Thread(target=sleeper, name="torchring-wake-probe", daemon=True)
    thread.start()
    for _ in range(_SAMPLES):
        time.sleep(_PAUSE_S)
        released_at[0] = time.perf_counter()
        ring.release()
        back.acquire()
    thread.join()
    return sorted(delays)[len(delays) // 4]


def spin_for(wakeup_s: float) -> float:
    """How long blocking waits poll on a host that wakes a sleeping thread ``wakeup_s`` late."""
    return AUTO_SPIN_S if wakeup_s >= SLOW_WAKEUP_S else 0.0


_auto_spin_s = 0.0
_wakeup_s: float | None = None
_start_lock = threading.Lock()
_started = False


def start() -> None:
    """Measure in a thread of its own, once per process, so that ``init()`` does not wait for it."""
    global _started
    with _start_lock:
        if _started:
            return
        _started = True
    threading.Thread(target=_measure, name="torchring-wake-probe", daemon=True).start()


def _measure() -> None:
    global _auto_spin_s, _wakeup_s
    _wakeup_s = thread_wakeup_seconds()
    _auto_spin_s = spin_for(_wakeup_s)


def measured_wakeup_seconds() -> float | None:
    """What ``start``'s measurement found (None until it is done)."""
    return _wakeup_s


def auto_spin_seconds() -> float:
    """How long blocking waits poll when ``TORCHRING_WAIT_SPIN_US`` is not set: 0 until ``start``'s
    measurement is done, then ``spin_for`` its result."""
    return _auto_spin_s


def wait_spin_seconds(settings: Settings, local_size: int) -> float | None:
    """How long a blocking wait polls for its result: ``TORCHRING_WAIT_SPIN_US`` when set; None (left unset)
    for ``wake_probe.auto_spin_seconds``, 1.5 ms where this host wakes sleeping threads slowly, else 0 (the
    probe is started here); 0 while this host has fewer CPUs than ranks (polling would take the CPU from a
    rank that works)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if local_size > cpus:
        return 0.0
    if settings.wait_spin_us is not None:
        return settings.wait_spin_us * 1e-6
    start()
    return None
