"""Stall warnings for CUDA collectives, from a thread of their own.

A CPU bucket's allreduce is waited for in slices, and a long wait warns (``lane._wait_watched``). A CUDA
one must not be: its ``wait()`` only orders the training stream after the collective, so that the host
can queue the optimizer's step meanwhile, and a timed wait would abort the communicator. So the lane
hands each CUDA collective to a ``CudaStallWatch``, whose thread polls ``is_completed()`` (a query of the
collective's CUDA event: it never blocks) and warns, with the same text as for CPU buckets, every
``warn_s`` seconds one is still running. Stopping a job that stalls is NCCL's timeout's job
(``TORCHRING_NCCL_TIMEOUT_SECONDS``), which raises ``HorovodInternalError`` on the rank.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CudaStallWatch"]

#: How often the thread looks at the collectives in flight.
POLL_S = 0.5


class CudaStallWatch:
    """Warns through ``warn(name, waited_s)`` about collectives still running ``warn_s`` seconds after they
    were handed over, and again every ``warn_s`` seconds."""

    def __init__(self, warn_s: float, warn: Callable[[str, float], None], poll_s: float = POLL_S) -> None:
        self._warn_s = warn_s
        self._warn = warn
        self._poll_s = poll_s
        self._lock = threading.Lock()
        #: [work, name, when it was handed over, when the next warning is due]
        self._watched: list[list[Any]] = []
        self._thread: threading.Thread | None = None

    def watch(self, work: Any, name: str) -> None:
        """Watch ``work`` (a collective's ``Work``) until it completes."""
        if self._warn_s <= 0:
            return
        now = time.monotonic()
        with self._lock:
            self._watched.append([work, name, now, now + self._warn_s])
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="torchring-cuda-stall-watch", daemon=True)
                self._thread.start()

    def pending(self) -> int:
        """Collectives handed over and not seen completed yet."""
        with self._lock:
            return len(self._watched)

    def _run(self) -> None:
        """Until nothing is watched (then it ends, and the next ``watch`` starts another: no thread holds a
        lane that is gone)."""
        while True:
            time.sleep(self._poll_s)
            now = time.monotonic()
            due = []
            with self._lock:
                self._watched = [entry for entry in self._watched if not _completed(entry[0])]
                if not self._watched:
                    self._thread = None
                    return
                for entry in self._watched:
                    if now >= entry[3]:
                        due.append((entry[1], now - entry[2]))
                        entry[3] = now + self._warn_s
            for name, waited in due:
                self._warn(name, waited)


def _completed(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:  # noqa: BLE001 - a failed collective: its wait() raises where it is waited for
        return True
