"""Divergence detection: every rank is blocked waiting for a collective that can never complete.

Ranks diverge when they submit different collectives (rank 1 alone calls an extra ``allreduce``;
ranks 0 and 2 reach a ``barrier`` while rank 1 is still in a ``reducescatter``). Each then waits for a
request that some members never submitted, and never will: they are waiting too. The engine knows it
for certain, without a timeout:

- a user thread that has waited ``BLOCKED_AFTER_S`` for an engine request tells its engine, with the
  call site it waits at (``note_blocked``), and so does a ``DistributedOptimizer`` step waiting in its
  gradient lane; every cycle's announcement carries what the rank is blocked on (usually nothing: one
  empty tuple);
- every rank holds the same negotiation table, so after each cycle each engine sees whether *every*
  rank is blocked, at least one on an engine request and all of those on requests still pending (not
  submitted by some member), while the cycle brought nothing new and released nothing. A rank waiting
  in its lane then waits for a peer that can never take part: that peer is blocked in negotiation;
- rank 0 confirms that this state held, unchanged, for ``confirm_s`` (``TORCHRING_DEADLOCK_TIMEOUT``,
  default 5 s; 0 turns detection off), then publishes the verdict through the announcement the stall
  shutdown uses: every rank fails its pending operations with the same ``HorovodInternalError`` text,
  and under ``torchring run`` rank 0 also records it for the launcher, which blames the odd ranks.

Blame: the smallest group of ranks blocked alike; between groups of one size, those waiting for a
request that was never completed before (an extra operation) rather than one the job repeats; else
every group. A rank that waits in anything else (its own computation, ``time.sleep``, a gradient
lane's reduction while every other rank does too) gives no verdict: the launcher's hang detector
covers that.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...rank_failure import is_library_file
from .negotiation import Negotiator, RequestKey, Response

if TYPE_CHECKING:
    from .messages import Announcement

__all__ = ["BLOCKED_AFTER_S", "LANE_SET", "Blocked", "DeadlockWatch", "Verdict", "call_site"]

#: How long a user thread waits for a request before it counts as blocked.
BLOCKED_AFTER_S = 1.0
#: The "process set" of the keys a gradient lane's wait is announced under: no negotiated request.
LANE_SET = -1
#: How many released request names are remembered (to tell an extra operation from a repeated one).
REMEMBERED_NAMES = 4096

#: ``(request key, call site)`` of each request one rank's threads are blocked on.
Blocked = tuple[tuple[RequestKey, str], ...]


def call_site() -> str:
    """``train.py:88``: the innermost frame of the calling thread in the script's own code."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not is_library_file(path):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


@dataclass(frozen=True)
class Verdict:
    """A confirmed deadlock: the ranks blamed, the report's lines (one per group of ranks blocked alike,
    then the last collective they all took part in) and the text every rank raises."""

    blamed: tuple[int, ...]
    lines: tuple[str, ...]
    text: str


class DeadlockWatch:
    """One rank's part: what its threads are blocked on (announced every cycle) and, on rank 0, the
    check of every cycle's blocked states, with a verdict once one held for ``confirm_s``."""

    def __init__(self, negotiator: Negotiator, confirm_s: float, decides: bool,
                 report: Callable[[Verdict], None] | None = None) -> None:
        self._negotiator = negotiator
        self.confirm_s = confirm_s
        #: Only rank 0 decides (its clock), and only with a confirmation time.
        self.decides = decides and confirm_s > 0
        #: Hands a verdict to the launcher (under ``torchring run``).
        self._report = report
        #: Requests this rank's threads have waited on for ``BLOCKED_AFTER_S`` or more: key -> call site.
        self._blocked: dict[RequestKey, str] = {}
        #: The text every rank's engine stopped with (a deadlock's verdict, a stall shutdown), once it did:
        #: a wait outside the engine (a gradient lane's) raises it too.
        self.aborted = ""
        #: Makes this rank's idle engine run one cycle (the engine's ``probe``): called by a wait outside the
        #: engine that has been blocked for a while, so that a dead peer fails a cycle and sets ``aborted``.
        self.probe: Callable[[], None] = _nothing
        self._suspect: tuple[Blocked, ...] | None = None
        self._since = 0.0
        #: Keys of recently released requests (forgotten all at once past ``REMEMBERED_NAMES``).
        self._released: dict[RequestKey, bool] = {}
        #: The last response every rank was released for.
        self._last_released: Response | None = None

    # ---- this rank (user threads, then the engine thread) ----------------------------------------

    def note_blocked(self, key: RequestKey, where: str) -> None:
        """A user thread has waited a while for request ``key``, at ``where`` (its call site)."""
        self._blocked[key] = where

    def note_unblocked(self, key: RequestKey) -> None:
        """The wait for ``key`` ended."""
        self._blocked.pop(key, None)

    def announced(self) -> Blocked:
        """What this rank's next announcement says it is blocked on (one copy, atomic under the GIL)."""
        return tuple(self._blocked.copy().items()) if self._blocked else ()

    # ---- rank 0: the verdict ---------------------------------------------------------------------

    def after_cycle(self, announcements: Sequence[Announcement], responses: Sequence[Response]) -> Verdict | None:
        """Look at one cycle (rank 0): the verdict, handed to the launcher too, once a deadlock held."""
        if not self.decides:
            return None
        self.released(responses)
        quiet = not responses and not any(a.metas or a.cached for a in announcements)
        verdict = self.observe([a.blocked for a in announcements], quiet)
        if verdict is not None and self._report is not None:
            try:
                self._report(verdict)
            except Exception:  # noqa: BLE001 - the launcher may be gone; every rank still raises the verdict
                pass
        return verdict

    def released(self, responses: Sequence[Response]) -> None:
        """Remember the requests a cycle released (rank 0 only: a dict store per response)."""
        if not self.decides or not responses:
            return
        seen = self._released
        for response in responses:
            seen[response.key] = True
        self._last_released = responses[-1]
        if len(seen) > REMEMBERED_NAMES:
            seen.clear()

    def observe(self, blocked: Sequence[Blocked], quiet: bool) -> Verdict | None:
        """One cycle's blocked states of every rank; ``quiet``: the cycle brought and released nothing."""
        if not self.decides:
            return None
        pending = self._negotiator.pending
        keys = [key for states in blocked for key, _ in states]
        negotiated = [key for key in keys if key[0] != LANE_SET]
        # a lane's wait is stuck only beside a rank stuck in negotiation (all in lanes: the data plane's matter)
        stuck = quiet and all(blocked) and bool(negotiated) and all(key in pending for key in negotiated)
        state = tuple(blocked) if stuck else None
        now = time.monotonic()
        if state != self._suspect:
            self._suspect, self._since = state, now
            return None
        if state is None or now - self._since < self.confirm_s:
            return None
        self._suspect = None  # one verdict per deadlock
        return self._verdict(state)

    def _verdict(self, blocked: tuple[Blocked, ...]) -> Verdict:
        groups: dict[Blocked, list[int]] = {}
        for rank, states in enumerate(blocked):
            groups.setdefault(tuple(sorted(states)), []).append(rank)
        ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
        blamed = self._blame(ordered)
        lines = []
        for states, ranks in ordered:
            waits = [self._describe(key, where, ranks) for key, where in states]
            lines.append(f"{_ranks(ranks)}: waiting in " + " and ".join(waits))
        last = self._last_released
        if last is not None:
            op = last.op_type.value
            lines.append(f"last collective every rank took part in: {op} '{_short(op, last.name)}'")
        else:
            lines.append("no collective was released to every rank before")
        text = (f"torchring: the ranks diverged and can never complete their pending collectives (deadlock, "
                f"unchanged for {self.confirm_s:g} s): " + "; ".join(lines)
                + f". Blamed: {_ranks(list(blamed))}. Check that every rank calls the same collectives in the "
                "same order (TORCHRING_DEADLOCK_TIMEOUT=0 turns this check off).")
        return Verdict(blamed, tuple(lines), text)

    def _blame(self, ordered: list[tuple[Blocked, list[int]]]) -> tuple[int, ...]:
        if len(ordered) == 1:
            return tuple(ordered[0][1])
        smallest = len(ordered[-1][1])
        candidates = [(states, ranks) for states, ranks in ordered if len(ranks) == smallest]
        if len(candidates) < len(ordered):  # a minority exists
            return tuple(sorted(r for _, ranks in candidates for r in ranks))
        new = [(states, ranks) for states, ranks in candidates  # a lane's bucket is reduced every step
               if any(key[0] != LANE_SET and key not in self._released for key, _ in states)]
        if new and len(new) < len(candidates):
            candidates = new
        return tuple(sorted(r for _, ranks in candidates for r in ranks))

    def _describe(self, key: RequestKey, where: str, ranks: list[int]) -> str:
        if key[0] == LANE_SET:
            return f"DistributedOptimizer's allreduce of {key[1]}" + (f" ({where})" if where else "")
        entry = self._negotiator.pending.get(key)
        op = "operation"
        if entry is not None and entry.metas:
            op = entry.metas[min(entry.metas)].op_type.value
        short = _short(op, key[1])
        text = (op if short == op else f"{op} '{short}'") + (f" in process set {key[0]}" if key[0] else "")
        if where:
            text += f" ({where})"
        if entry is not None:
            missing = [r for r in self._negotiator.missing_ranks(key, entry) if r not in ranks]
            if missing:
                text += f", which {_ranks(missing)} never submitted"
        return text


def _short(op: str, name: str) -> str:
    return name.removeprefix(op + ".")


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))


def _nothing() -> None:
    """``DeadlockWatch.probe`` before an engine sets it."""
