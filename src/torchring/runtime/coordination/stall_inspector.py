"""The stall inspector: rank 0 reports requests that some ranks submitted and others did not.

After ``warning_s`` it logs which requests wait and for which ranks; with ``shutdown_s`` set, it
returns the text every rank stops with once a request has waited that long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from ...metrics.counters import METRICS
from .negotiation import Negotiator, PendingEntry, RequestKey

logger = logging.getLogger("torchring")


class StallInspector:
    """Looks at the negotiator's pending requests at most once a second."""

    def __init__(self, negotiator: Negotiator, enabled: bool, warning_s: float, shutdown_s: float) -> None:
        self._negotiator = negotiator
        self.enabled = enabled
        self.warning_s = warning_s
        #: 0: never; otherwise requests stalled this long stop the job on every rank with an error.
        self.shutdown_s = shutdown_s
        self._last_check = 0.0

    def check_interval(self) -> float:
        """How long an idle engine may block between two inspections."""
        if not self.enabled:
            return 3600.0
        limits = [self.warning_s, self.shutdown_s or float("inf")]
        return max(1.0, min(min(limits) / 4, 30.0))

    def inspect(self) -> str:
        """Warn about stalled requests; return the stop text when some waited past the shutdown time."""
        if not self.enabled:
            return ""
        now = time.monotonic()
        if now - self._last_check < 1.0:
            return ""
        self._last_check = now
        pending = self._negotiator.pending.items()
        abort = ""
        if self.shutdown_s > 0:
            expired = [(key, entry) for key, entry in pending if now - entry.first_seen > self.shutdown_s]
            if expired:
                abort = (f"torchring stopped: operations waited more than {self.shutdown_s:.0f}s for other ranks "
                         f"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS):\n" + "\n".join(self._lines(expired)))
        threshold = self.warning_s
        stalled = [(key, entry) for key, entry in pending
                   if now - entry.first_seen > threshold and now - entry.stall_reported_at > threshold]
        if stalled:
            for _, entry in stalled:
                entry.stall_reported_at = now
            METRICS.stalls += 1
            logger.warning(
                "One or more tensors were submitted to be reduced, gathered or broadcasted by a subset of "
                "ranks and have been waiting for more than %.0f seconds. This may indicate that different "
                "ranks are trying to submit different tensors, or that only a subset of ranks is submitting "
                "tensors, which will cause a deadlock.\nStalled operations:\n%s",
                threshold,
                "\n".join(self._lines(stalled)),
            )
        return abort

    def missing_ranks(self, keys: Iterable[RequestKey]) -> dict[RequestKey, list[int]]:
        """For each of ``keys`` still being negotiated: the members that have not submitted it (nor joined).
        Every rank can answer: the negotiation table is the same on all of them."""
        pending = self._negotiator.pending
        return {key: self._negotiator.missing_ranks(key, pending[key]) for key in keys if key in pending}

    def _lines(self, entries: list[tuple[RequestKey, PendingEntry]]) -> list[str]:
        lines = []
        for key, entry in entries:
            missing = self._negotiator.missing_ranks(key, entry)
            where = f" (process set {key[0]})" if key[0] else ""
            lines.append(f"  {key[1]}{where}: waiting for ranks {missing} (ready on {sorted(entry.metas)})"
                         + self._negotiator.same_name_hint(key, missing))
        return lines
