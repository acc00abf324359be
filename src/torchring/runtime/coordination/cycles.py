"""How the ranks exchange one cycle's announcements: the steady state settled by one small allreduce,
everything else by the all-gather of every rank's announcement.

In a training loop's steady state every rank announces the same cached requests cycle after cycle. Then
the all-gather (``4 KB × N`` through every rank, ``N`` decodes) carries nothing the ranks do not already
share: the response cache is identical on every rank. So after a cycle in which every rank announced
nothing but cache bits, the next cycle starts with a **probe**: one bitwise-AND allreduce of a few 64-bit
words per rank, whose size depends on the number of cache slots in use, not on ``N`` (from
``TORCHRING_CONTROL_GATHER_RANKS`` ranks on, rank 0 gathers the words and broadcasts their AND: two steps,
where a ring allreduce of a few words takes ``2 (N - 1)`` steps one after another):

- a status word: 1 where this rank may settle (only cache bits: no new request, no shutdown, no stall
  abort, nothing blocked for the deadlock check, no joined rank, no timeline on rank 0);
- the cache bits, and their complement (the AND of the complements tells which bits *any* rank set).

When every status bit is set, the cycle is settled from the bits alone, on every rank alike: the bits
every rank set are released exactly as the all-gather would have released them, and a rank whose bits
not every rank set yet keeps them and announces them again next cycle (as Horovod's cache bits do), so
ranks that submit a cached request a little apart cost a probe per cycle, not an all-gather. While some
rank keeps bits, no engine goes idle. Bits kept longer than ``CARRY_LIMIT_S`` (or by a rank whose thread
waits on them long enough for the deadlock check) go out in an all-gather, so the negotiation table, the
stall inspector and the deadlock check see them as they do today. When a status bit is missing, the
same announcement goes out in the all-gather in the same cycle. Whether the next cycle probes is
decided from what every rank saw, so all ranks call the same collectives. A cycle with new requests
costs the all-gather only (the probe is skipped after a cycle that had some), so a loop of uncached
blocking operations pays no extra round trip. A loop that repeats one small cached allreduce has its
probe and data collective merged into one, and so does a loop of the same burst of them (``express``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..observe.timeline import NullTimeline, TimelineWriter
from .control import ControlChannel
from .cycle import (
    decode_announcements,
    encode_announcement,
    expand_announcements,
    negotiate_common,
    negotiate_cycle,
    summarize_announcements,
)
from .express import ExpressPlan, ExpressReduce
from .messages import Announcement
from .negotiation import Negotiator, Response
from .response_cache import ResponseCache, mask_to_bytes

__all__ = ["CycleExchange", "CycleOutcome"]

_WORD_BITS = 64
_FULL = (1 << _WORD_BITS) - 1
#: Seconds a rank keeps cache bits not every rank announced before it sends them in an all-gather.
CARRY_LIMIT_S = 0.5


@dataclass(frozen=True)
class CycleOutcome:
    """What one cycle brought: every rank's announcement (a single stand-in for all of them when the probe
    settled it) and the responses released, the same on every rank."""

    announcements: list[Announcement]
    responses: list[Response]
    settled: bool


def _signed(word: int) -> int:
    return word - (1 << _WORD_BITS) if word >= 1 << (_WORD_BITS - 1) else word


def _unsigned(word: int) -> int:
    return word & _FULL


class CycleExchange:
    """One engine's side of the cycle exchange; its state (``probing``) is the same on every rank because it
    is derived only from what every rank received."""

    def __init__(self, channel: ControlChannel, negotiator: Negotiator, cache: ResponseCache,
                 probe: bool = True, gather_ranks: int = 0, express: ExpressReduce | None = None) -> None:
        self._channel = channel
        #: Whether steady-state cycles may be settled by the probe at all (``TORCHRING_CONTROL_PROBE``).
        self._probe_enabled = probe
        #: Whether announcements and the probe go through rank 0 (``TORCHRING_CONTROL_GATHER_RANKS``).
        self.gathered = 0 < gather_ranks <= channel.size
        self._negotiator = negotiator
        self._cache = cache
        #: Whether this cycle starts with the probe (the last one carried nothing but cache bits).
        self.probing = False
        #: Cycles settled by the probe, probes that fell back to the all-gather, all-gathers.
        self.settled_cycles = 0
        self.failed_probes = 0
        self.exchanges = 0
        #: The engine's data side of express cycles (None: the probe settles every steady-state cycle).
        self._express_reduce = express
        self._plan = ExpressPlan(cache, negotiator, channel.size)
        #: Express cycles that settled, and those of them that released their allreduce already reduced.
        self.express_cycles = 0
        self.express_hits = 0
        #: This rank's cache bits that not every rank announced yet (announced again each cycle), and since when.
        self._kept = 0
        self._kept_since = 0.0
        #: Some rank keeps bits (the same on every rank): engines must not go idle.
        self.bits_kept = False

    def with_settle(self, announcement: Announcement, timeline: TimelineWriter | NullTimeline) -> Announcement:
        """``announcement`` with the bits this rank keeps, saying whether it could settle the cycle from
        cache bits alone."""
        kept_too_long = bool(self._kept) and time.monotonic() - self._kept_since > CARRY_LIMIT_S
        settle = (not announcement.metas and not announcement.shutting_down and not announcement.stall_abort
                  and not announcement.blocked and not announcement.launch_failures and not timeline.enabled
                  and not self._negotiator.joined and not kept_too_long)
        if self._kept:
            mask = int.from_bytes(announcement.cached, "little") | self._kept
            return replace(announcement, settle=settle, cached=mask_to_bytes(mask))
        return replace(announcement, settle=settle)

    def run(self, announcement: Announcement, timeline: TimelineWriter | NullTimeline) -> CycleOutcome:
        """Exchange ``announcement`` with every rank and negotiate the cycle. Collective."""
        announcement = self.with_settle(announcement, timeline)
        if self.probing:
            predicted = self._plan.predicted() if self._express_reduce is not None else None
            outcome = (self._express(announcement, *predicted, timeline) if predicted is not None
                       else self._probe(announcement, timeline))
            if outcome is not None:
                self.settled_cycles += 1
                return outcome
            self.failed_probes += 1
        self._plan.after_exchange()
        self.exchanges += 1
        self._kept, self.bits_kept = 0, False  # the all-gather carries them
        payload = encode_announcement(announcement)
        if self.gathered:
            announcements = expand_announcements(self._channel.gather_and_broadcast(payload, summarize_announcements))
        else:
            announcements = decode_announcements(self._channel.allgather_bytes(payload))
        responses = negotiate_cycle(announcements, self._negotiator, self._cache, timeline)
        # A request left in the table waits for ranks that announce it in an all-gather; a probe would
        # keep their bits away from the table until ``CARRY_LIMIT_S``, so the next cycle probes only
        # when the table is empty.
        self.probing = (self._probe_enabled and all(a.settle for a in announcements)
                        and not self._negotiator.pending)
        return CycleOutcome(announcements, responses, settled=False)

    def _probe(self, announcement: Announcement, timeline: TimelineWriter | NullTimeline) -> CycleOutcome | None:
        words = -(-self._cache.slot_span // _WORD_BITS)
        mask = int.from_bytes(announcement.cached, "little")
        agreed = mask | self._cache.foreign_mask  # another process set's bits: its members decide
        chunks = [(mask >> (_WORD_BITS * i)) & _FULL for i in range(words)]
        agreeing = [(agreed >> (_WORD_BITS * i)) & _FULL for i in range(words)]
        vector = [int(announcement.settle), *map(_signed, agreeing), *(_signed(~chunk & _FULL) for chunk in chunks)]
        result = self._channel.allreduce_and(vector, through_root=self.gathered)
        status, every, nobody = result[0], result[1:1 + words], result[1 + words:]
        common = sum(_unsigned(w) << (_WORD_BITS * i) for i, w in enumerate(every))
        anyone = sum((~_unsigned(w) & _FULL) << (_WORD_BITS * i) for i, w in enumerate(nobody))
        if status != 1:
            return None
        return self._settle(mask, common, anyone, timeline, None)

    def _express(self, announcement: Announcement, slots: tuple[int, ...], responses: list[Response],
                 timeline: TimelineWriter | NullTimeline) -> CycleOutcome | None:
        """The probe carried by the allreduce of ``responses`` (``express``); None: the all-gather follows."""
        mask = int.from_bytes(announcement.cached, "little")
        vote = self._express_reduce(responses, slots, announcement.settle, mask,  # type: ignore[misc]
                                    self._cache.slot_span, self._cache.foreign_mask)
        if not vote.settle:
            return None
        hit = all(vote.common >> slot & 1 for slot in slots)
        self.express_cycles += 1
        self.express_hits += hit
        return self._settle(mask, vote.common, vote.anyone, timeline, hit)

    def _settle(self, mask: int, common: int, anyone: int, timeline: TimelineWriter | NullTimeline,
                express_hit: bool | None) -> CycleOutcome:
        """Settle the cycle from cache bits alone: release those every rank set (``common``); this rank keeps
        the rest of ``mask`` to announce again; ``anyone``: the bits any rank set."""
        kept = mask & ~common
        if kept and not self._kept:
            self._kept_since = time.monotonic()
        self._kept, self.bits_kept = kept, anyone != common
        responses = negotiate_common(mask_to_bytes(common), self._negotiator, self._cache, timeline)
        if self._express_reduce is not None:
            self._plan.after_settled(responses, common, anyone, express_hit)
        stand_in = Announcement((), False, "", mask_to_bytes(anyone), (), True)
        return CycleOutcome([stand_in], responses, settled=True)
