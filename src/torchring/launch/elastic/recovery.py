"""How long an elastic job stops training when its membership changes, measured by its launcher.

The clock starts when the driver *sees* the change: a worker's exit reaped, a host gone from the pool
or blacklisted, a host found by discovery. It stops when rank 0 of the generation published for that
change completes its first training step there (an optimizer step or a ``commit()``; rank 0 sets
``contract.elastic_first_step_key``). Changes that follow one another before training resumes count as
one recovery, timed from the first. Each recovery is logged and kept for the launcher's metrics page
(``--metrics-port``) as ``torchring_elastic_recovery_seconds`` (count and sum, and the last one, by
cause) beside the job's generation, members, hot spares and resets.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...contract import elastic_first_step_key
from ...store_auth import AuthenticatedStore

#: Why training stopped, from the most to the least severe (a recovery from several takes the first).
CAUSES = ("host_lost", "worker_lost", "host_added")
#: How long starting new hot spares waits for a recovery to end (their start-up competes for the CPU).
QUIET_WINDOW_S = 10.0


@dataclass
class _Pending:
    cause: str
    seen_at: float
    generation: int | None = None
    published_at: float = 0.0


@dataclass
class RecoveryClock:
    """Times each recovery and keeps the job's elastic figures for the metrics page."""

    clock: Callable[[], float] = time.monotonic
    #: Per cause: how many recoveries, their seconds summed, the last one.
    count: dict[str, int] = field(default_factory=dict)
    total_s: dict[str, float] = field(default_factory=dict)
    last_s: dict[str, float] = field(default_factory=dict)
    generation: int = -1
    members: int = 0
    spares: int = 0
    resets: int = 0
    _pending: _Pending | None = None

    def seen(self, cause: str) -> None:
        """The driver saw a change that stops training (``cause`` one of :data:`CAUSES`)."""
        if cause not in CAUSES:
            raise ValueError(f"unknown cause {cause!r}")
        now = self.clock()
        if self._pending is None:
            self._pending = _Pending(cause, now)
        elif CAUSES.index(cause) < CAUSES.index(self._pending.cause):
            self._pending.cause = cause

    def published(self, generation: int, members: int) -> None:
        """A generation was published; the pending recovery (if any) ends at its first step."""
        self.generation, self.members = generation, members
        if self._pending is not None:
            self._pending.generation = generation
            self._pending.published_at = self.clock()

    @property
    def waiting(self) -> bool:
        """A recovery is being timed."""
        return self._pending is not None and self._pending.generation is not None

    def quiet(self) -> bool:
        """No recovery under way (or one running for longer than :data:`QUIET_WINDOW_S` since its
        generation was published): background work such as starting spares may go ahead."""
        pending = self._pending
        return pending is None or (pending.generation is not None
                                   and self.clock() - pending.published_at > QUIET_WINDOW_S)

    def poll(self, store: AuthenticatedStore) -> str | None:
        """Whether the timed generation completed its first step: the log line when it did, else None."""
        pending = self._pending
        if pending is None or pending.generation is None:
            return None
        if store.get(elastic_first_step_key(pending.generation), max_bytes=16) is None:
            return None
        seconds = self.clock() - pending.seen_at
        self._pending = None
        self.count[pending.cause] = self.count.get(pending.cause, 0) + 1
        self.total_s[pending.cause] = self.total_s.get(pending.cause, 0.0) + seconds
        self.last_s[pending.cause] = seconds
        return (f"generation {pending.generation} trained its first step {seconds:.1f} s after the "
                f"{pending.cause.replace('_', ' ')} was seen")

    def families(self) -> Iterator[Any]:
        """Prometheus metric families of the job's elastic figures."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        recoveries = SummaryMetricFamily("torchring_elastic_recovery_seconds",
                                         "seconds from a membership change seen by the launcher to the first "
                                         "step completed in the new generation", labels=["cause"])
        last = GaugeMetricFamily("torchring_elastic_last_recovery_seconds",
                                 "the last recovery's seconds, by cause", labels=["cause"])
        for cause in CAUSES:
            recoveries.add_metric([cause], self.count.get(cause, 0), self.total_s.get(cause, 0.0))
            if cause in self.last_s:
                last.add_metric([cause], self.last_s[cause])
        yield recoveries
        yield last
        for name, help_text, value in (
                ("torchring_elastic_generation", "the elastic job's current generation", self.generation),
                ("torchring_elastic_members", "workers holding a place in the current generation", self.members),
                ("torchring_elastic_spares", "hot spares standing by (--spares)", self.spares)):
            gauge = GaugeMetricFamily(name, help_text)
            gauge.add_metric([], value)
            yield gauge
        resets = CounterMetricFamily("torchring_elastic_resets", "membership changes after the first generation")
        resets.add_metric([], self.resets)
        yield resets
