"""Express cycles: the probe carried by the allreduce a loop repeats, one collective instead of two.

In the steady state a cycle costs the probe (``cycles``: a small AND collective of every rank's cache
bits) and then the data collective of what it released. A loop of blocking small allreduces (a loss or
a metric averaged every step, a validation loop, a barrier and an allreduce in turn) releases the same
cached allreduce ``R`` cycle after cycle, and a loop of asynchronous bursts (the same allreduces started
together, then waited for) the same set of them; so the probe's answer is foreseeable. Once settled cycles
have released the same **carrier** ``R`` (one allreduce, or the allreduces a cycle released together) after
the same carrier ``STREAK`` times in a row (``ExpressPlan``), the steady-state cycles after that one are
**express** cycles: instead of the probe, every rank calls one allreduce of ``R``'s data (for each of its
allreduces, its own tensor when it announces that cache bit, zeros otherwise, one after another) with the
probe's words appended as flags, on the global set's CPU group, with ``R``'s reduction and scaling (the flags
are reduced but never scaled). Each flag is combined as a logical AND whatever ``R``'s operation is
(``vote_flags``): the probe's status bit, each cache bit, and each bit's complement (whose AND says which
bits *any* rank set).

Every rank then reads the same answer the probe would have given and settles the cycle exactly as after
the probe (or sends the same announcement in the all-gather when a status bit is missing); each of ``R``'s
allreduces whose bit every rank set is released already reduced, with no second collective. The prediction
is derived only from what every rank saw, so all ranks call the same collectives; a wrong one (a barrier
between two ``R``, a rank that has not submitted ``R`` yet) costs ``R``'s bytes for nothing, so cycles go
express only for allreduces of the global process set on CPU tensors up to ``MAX_BYTES`` (a carrier of
several: one dtype, reduction and scaling, up to ``MAX_BYTES`` together) whose dtype counts the flags
exactly, with at most ``MAX_SLOTS`` cache bits; after ``MISSES_MAX`` express cycles in a row that released
nothing, probes settle until an allreduce is released again. A streak grows only while every rank's bits
arrive in the first cycle (``ExpressPlan``), so ranks that seldom arrive together keep the probe.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ...reduction import ReduceOp
from ..requests import OpType
from .negotiation import Negotiator, Response
from .response_cache import ResponseCache, bits_of

__all__ = ["ExpressPlan", "ExpressReduce", "ExpressVote", "carries_together", "expressible", "read_vote", "vote_flags"]

#: Times in a row the same release followed the last one before cycles go express (``ExpressPlan``).
STREAK = 2
#: The most a streak counts: as many other successors in a row as this, less one, keep the prediction.
_STREAK_MOST = 4
#: Express cycles in a row that released nothing (some rank had not submitted yet) before probes take over
#: until an allreduce is released again.
MISSES_MAX = 2
#: The most bytes an express cycle carries (one allreduce, or several together: 200 × 4 KB, a burst, is 800 KB):
#: a miss sends them for nothing. A lone 800 KB allreduce between barriers took 1.4-2.1 ms express against
#: 2.1-2.9 ms probed and reduced in place (8 alternating pairs at 2 ranks), copies in and out included.
MAX_BYTES = 1024 * 1024
#: The most cache bits an express cycle carries (two flags each).
MAX_SLOTS = 256
#: The most releases ``ExpressPlan`` remembers (it forgets them all beyond: a loop learns its own again).
_REMEMBERED = 1024
#: The largest count of ranks each dtype's flags can sum exactly (dtypes not listed never go express).
_EXACT_COUNTS = {"float16": 2048, "bfloat16": 256, "float32": 2 ** 24, "float64": 2 ** 53,
                 "int32": 2 ** 31 - 1, "int64": 2 ** 63 - 1}
_ITEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}
_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT})


@dataclass(frozen=True)
class ExpressVote:
    """The probe's answer, read from an express cycle's flags (the same on every rank)."""

    #: Every rank could settle the cycle from cache bits alone.
    settle: bool
    #: The cache bits every rank set, and those any rank set.
    common: int
    anyone: int


#: The engine's side of an express cycle: ``(R's allreduces, their slots, settle, this rank's cache bits, slot
#: span)`` → the vote. Collective: every rank calls it with the same ``R``; it keeps the reduced result of
#: each of ``R``'s allreduces whose bit every rank set for the engine.
ExpressReduce = Callable[[list[Response], tuple[int, ...], bool, int, int, int], ExpressVote]


def expressible(response: Response, size: int) -> bool:
    """Whether ``response`` may carry express cycles in a job of ``size`` ranks."""
    meta = response.template
    if (response.op_type is not OpType.ALLREDUCE or response.process_set != 0 or meta.group or meta.device != "cpu"
            or len(response.members) != size or len(response.metas) != size or size < 2):
        return False
    if meta.reduce_op not in _OPS or size > _EXACT_COUNTS.get(meta.dtype, 0):
        return False
    return _nbytes(response) <= MAX_BYTES


def _nbytes(response: Response) -> int:
    meta = response.template
    return math.prod(meta.shape) * _ITEM_BYTES[meta.dtype]


def carries_together(responses: list[Response], size: int) -> bool:
    """Whether these allreduces may carry express cycles together: each is ``expressible`` and they share
    one dtype, reduction and scaling (one allreduce reduces them all), up to ``MAX_BYTES`` together."""
    if not responses or not all(expressible(response, size) for response in responses):
        return False
    first = responses[0].template
    kind = (first.dtype, first.reduce_op, first.prescale_factor, first.postscale_factor)
    return (all((m.dtype, m.reduce_op, m.prescale_factor, m.postscale_factor) == kind
                for m in (response.template for response in responses[1:]))
            and sum(map(_nbytes, responses)) <= MAX_BYTES)


def vote_flags(reduce_op: int, settle: bool, mask: int, span: int, foreign: int = 0) -> list[int]:
    """This rank's flags: its status bit, its ``span`` cache bits (with the ``foreign`` ones set: the slots
    of process sets it is not in, which their members decide) and the complements of its own bits, encoded
    so that ``reduce_op`` combines each as an AND (for Max, as ``1 - b``: the max is 0 only when every b is 1)."""
    bits = [mask >> slot & 1 for slot in range(span)]
    agreed = [(mask | foreign) >> slot & 1 for slot in range(span)]
    truths = [int(settle), *agreed, *(1 - bit for bit in bits)]
    return [1 - truth for truth in truths] if ReduceOp(reduce_op) is ReduceOp.MAX else truths


def read_vote(reduce_op: int, size: int, flags: list[float], span: int) -> ExpressVote:
    """The vote from the reduced ``flags`` (see ``vote_flags``)."""
    op = ReduceOp(reduce_op)
    every = size if op in (ReduceOp.SUM, ReduceOp.AVERAGE) else 0 if op is ReduceOp.MAX else 1
    truths = [round(flag) == every for flag in flags]
    common = sum(1 << slot for slot in range(span) if truths[1 + slot])
    nobody = sum(1 << slot for slot in range(span) if truths[1 + span + slot])
    return ExpressVote(truths[0], common, ((1 << span) - 1) & ~nobody)


class ExpressPlan:
    """Which cached allreduces, if any, carry the next steady-state cycle (state every rank shares).

    It follows what settled cycles release, as the cache bits every rank set (cycles that release nothing do
    not count): when the release after the last one, ``X``, has been the same ``Y`` ``STREAK`` times in a
    row, each time with every rank's bits in the first cycle, the cycle after ``X`` goes express with ``Y``'s
    allreduces when they may carry it (a loop of one allreduce or of one burst; two in turn; a barrier and a
    burst in turn, where the barrier's cycles take the probe). Each streak counts down on another successor
    instead of starting again, so that a loop's exception (ten allreduces, then a barrier) does not cost the
    next pass through the loop its streak. ``Y`` after an express cycle that missed it (some rank had not
    submitted yet) counts the streak down too, and ``Y`` after a probe that waited for some rank leaves it as
    it is, so that ranks that seldom arrive together leave the cycles to the probe."""

    def __init__(self, cache: ResponseCache, negotiator: Negotiator, size: int) -> None:
        self._cache = cache
        self._negotiator = negotiator
        self._size = size
        #: The cache bits of the last settled cycle that released something (0: none).
        self._last = 0
        #: release → (the release after it, how many times in a row); at most ``_REMEMBERED`` of them.
        self._successor: dict[int, tuple[int, int]] = {}
        #: release → its carrier (None: none), while no cache entry was evicted (``_evictions``).
        self._carriers: dict[int, tuple[tuple[int, ...], list[Response]] | None] = {}
        self._evictions = cache.evictions
        self._misses = 0
        #: Since the last release, a settled cycle in which some rank announced bits not every rank had.
        self._waited = False

    def predicted(self) -> tuple[tuple[int, ...], list[Response]] | None:
        """The cache slots and responses that carry the next cycle, or None (the probe runs)."""
        release, streak = self._successor.get(self._last, (0, 0))
        if streak < STREAK or self._misses >= MISSES_MAX or self._cache.slot_span > MAX_SLOTS:
            return None
        carrier = self._carrier(release)
        pending = self._negotiator.pending
        if carrier is None or (pending and any(response.key in pending for response in carrier[1])):
            return None
        return carrier

    def after_settled(self, released: list[Response], common: int, anyone: int, express: bool | None) -> None:
        """Note a cycle settled by the probe (``express`` None) or by an express cycle (whether it released
        every allreduce that carried it); ``common``: the cache bits every rank announced, ``anyone``: those
        any rank announced (more: some rank was ahead of the others)."""
        self._waited = self._waited or anyone != common
        if not released:
            if express is not None:
                self._misses += 1  # a miss: a cycle that waited for some rank
            return
        missed, waited = self._misses > 0, self._waited  # since the last release
        self._misses, self._waited = 0, False
        if self._last:
            if len(self._successor) >= _REMEMBERED and self._last not in self._successor:
                self._successor.clear()
            successor, streak = self._successor.get(self._last, (0, 0))
            if successor == common and missed:
                # the same release, but an express cycle missed it (some rank had not submitted yet): ranks
                # that seldom arrive together (many on few cores, stragglers) leave their cycles to the probe
                streak = max(streak - 1, 0)
            elif successor == common:
                # after a probe that waited for some rank the streak stays: an express cycle would have missed
                streak = streak if waited else min(streak + 1, _STREAK_MOST)
            elif streak > 1:  # an exception to the pattern (a loop's last allreduce, then a barrier) keeps it
                streak -= 1
            else:
                successor, streak = common, int(not waited)
            self._successor[self._last] = (successor, streak)
        self._last = common

    def _carrier(self, release: int) -> tuple[tuple[int, ...], list[Response]] | None:
        """The expressible allreduces among the cached responses of ``release``'s bits when they may carry a
        cycle together, with their slots (worked out once per release while no entry is evicted)."""
        if self._cache.evictions != self._evictions or len(self._carriers) >= _REMEMBERED:
            self._carriers.clear()
            self._evictions = self._cache.evictions
        if release in self._carriers:
            return self._carriers[release]
        slots, responses = [], []
        for slot in bits_of(release):
            response = self._cache.whole(slot)
            if response is not None and expressible(response, self._size):
                slots.append(slot)
                responses.append(response)
        carrier = (tuple(slots), responses) if carries_together(responses, self._size) else None
        self._carriers[release] = carrier
        return carrier

    def after_exchange(self) -> None:
        """A cycle went out in the all-gather: follow the releases again from the next settled cycle on."""
        self._last = 0
        self._misses = 0
        self._waited = False
