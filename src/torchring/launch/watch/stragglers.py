"""Straggler detection in the launcher, from the ranks' optimizer step times (their flight-recorder files).

Each rank's ``DistributedOptimizer`` records, per step, ``wait`` (seconds ``synchronize()`` blocked on
the gradient reductions) and ``interval`` (seconds since the previous step ended). The reductions end
at about the same time on every rank, so the rank that arrives last waits least: in each step present
on every rank, the rank with the smallest wait (unique) is *last*, and its lag is the median of the
other ranks' waits minus its own. ``interval - wait`` is a rank's own work in the step (forward,
backward, optimizer). A rank is a straggler when it is last in at least ``last_fraction`` of the
aligned steps (and there are at least ``min_steps`` of them) and its median work per step is at least
``slow_ratio`` times the median over the other ranks of theirs. Each straggler is named once per job.

Pure: no processes, no torch; the launcher reads the files and calls ``update``.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["StragglerWatch", "parse_steps"]

#: Steps read from one file at most (a file holds the last 100).
MAX_STEPS = 1000


def _seconds(value: Any) -> float | None:
    """A non-negative finite number of seconds, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def parse_steps(steps: Any) -> dict[int, tuple[float, float | None]]:
    """A file's ``steps`` (``{"first": int, "wait": [...], "interval": [...]}``) as step index -> (wait,
    interval); malformed input gives what can be trusted of it (often nothing), never an error."""
    if not isinstance(steps, dict):
        return {}
    first, waits, intervals = steps.get("first"), steps.get("wait"), steps.get("interval")
    if isinstance(first, bool) or not isinstance(first, int) or not isinstance(waits, list):
        return {}
    if not isinstance(intervals, list):
        intervals = []
    parsed: dict[int, tuple[float, float | None]] = {}
    start = max(0, len(waits) - MAX_STEPS)
    for offset in range(start, len(waits)):
        wait = _seconds(waits[offset])
        if wait is None:
            continue
        parsed[first + offset] = (wait, _seconds(intervals[offset]) if offset < len(intervals) else None)
    return parsed


class StragglerWatch:
    """Names ranks that are consistently the last to reach the gradient reductions.

    ``log`` receives one warning per straggling rank per job. ``gauges()`` may be called from another
    thread (the metrics endpoint) while ``update`` runs.
    """

    def __init__(self, log: Callable[[str], None], window: int = 100, last_fraction: float = 0.8,
                 slow_ratio: float = 1.2, min_steps: int = 20) -> None:
        self._log = log
        self.window = window
        self.last_fraction = last_fraction
        self.slow_ratio = slow_ratio
        self.min_steps = min_steps
        self._lock = threading.Lock()
        self._gauges: dict[int, tuple[float, float]] = {}
        self._warned: set[int] = set()

    def gauges(self) -> dict[int, tuple[float, float]]:
        """For every rank seen: (median lag in seconds in the steps it was last, 0 when never; fraction of
        the aligned steps it was last in), as of the last ``update``."""
        with self._lock:
            return dict(self._gauges)

    def expect(self, ranks: Iterable[int]) -> None:
        """Serve these ranks' gauges (at 0) from the start, before the first sample updates them."""
        with self._lock:
            for rank in ranks:
                self._gauges.setdefault(rank, (0.0, 0.0))

    @property
    def warned(self) -> set[int]:
        """The ranks named as stragglers so far."""
        return set(self._warned)

    def update(self, steps_by_rank: Mapping[int, Any]) -> None:
        """Look at each rank's ``steps`` from its file (None or malformed: that rank has no steps)."""
        parsed = {rank: parse_steps(steps) for rank, steps in steps_by_rank.items()
                  if isinstance(rank, int) and not isinstance(rank, bool)}
        ranks = sorted(parsed)
        with self._lock:
            for rank in ranks:
                self._gauges.setdefault(rank, (0.0, 0.0))
        if len(ranks) < 2:
            return
        common = set.intersection(*(set(steps) for steps in parsed.values()))
        aligned = sorted(common)[-self.window:]
        if not aligned:
            return
        last_in = {rank: 0 for rank in ranks}
        lags: dict[int, list[float]] = {rank: [] for rank in ranks}
        for index in aligned:
            waits = {rank: parsed[rank][index][0] for rank in ranks}
            smallest = min(waits.values())
            last = [rank for rank, wait in waits.items() if wait == smallest]
            if len(last) != 1:
                continue  # a tie: nobody was clearly last
            others = [wait for rank, wait in waits.items() if rank != last[0]]
            last_in[last[0]] += 1
            lags[last[0]].append(statistics.median(others) - smallest)
        work = {rank: self._median_work(parsed[rank], aligned) for rank in ranks}
        gauges = {rank: (statistics.median(lags[rank]) if lags[rank] else 0.0, last_in[rank] / len(aligned))
                  for rank in ranks}
        with self._lock:
            self._gauges.update(gauges)
        if len(aligned) < self.min_steps:
            return
        for rank in ranks:
            if rank in self._warned or last_in[rank] < self.last_fraction * len(aligned):
                continue
            others = [value for other, value in work.items() if other != rank and value is not None]
            mine = work[rank]
            if mine is None or not others:
                continue
            typical = statistics.median(others)
            if typical <= 0 or mine < self.slow_ratio * typical:
                continue
            self._warned.add(rank)
            self._log(f"rank {rank} is a straggler: the last to reach the gradient reductions in {last_in[rank]} "
                      f"of the last {len(aligned)} steps, {gauges[rank][0] * 1000:.0f} ms behind the others per "
                      f"step (its steps take {(mine / typical - 1) * 100:.0f}% longer than the median rank's)")

    @staticmethod
    def _median_work(steps: dict[int, tuple[float, float | None]], aligned: list[int]) -> float | None:
        """The median of ``interval - wait`` over the aligned steps that have an interval."""
        work = [interval - wait for wait, interval in (steps[index] for index in aligned) if interval is not None]
        return statistics.median(work) if work else None
