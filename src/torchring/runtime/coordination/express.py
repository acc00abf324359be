"""Express cycles: the probe carried by the allreduce a loop repeats, one collective instead of two.

In the steady state a cycle costs the probe (``cycles``: a small AND collective of every rank's cache
bits) and then the data collective of what it released. A loop of blocking small allreduces (a loss or
a metric averaged every step, a validation loop, a barrier and an allreduce in turn) releases the same
cached allreduce ``R`` cycle after cycle, so the probe's answer is foreseeable. Once settled cycles have
released ``R`` after the same allreduce ``STREAK`` times in a row (``ExpressPlan``), the steady-state cycles
after that one are **express** cycles: instead of the probe, every rank calls one allreduce of ``R``'s data
(its own tensor when it announces ``R``'s cache bit, zeros otherwise) with the probe's words appended as
flags, on the data group ``R`` uses, with ``R``'s reduction and scaling (the flags are reduced but never
scaled). Each flag is
combined as a logical AND whatever ``R``'s operation is (``vote_flags``): the probe's status bit, each
cache bit, and each bit's complement (whose AND says which bits *any* rank set).

Every rank then reads the same answer the probe would have given and settles the cycle exactly as after
the probe (or sends the same announcement in the all-gather when a status bit is missing); when every
rank set ``R``'s bit, ``R`` is released already reduced, with no second collective. The prediction is
derived only from what every rank saw, so all ranks call the same collectives; a wrong one (a barrier
between two ``R``, a rank that has not submitted ``R`` yet) costs ``R``'s bytes for nothing, so cycles
go express only for allreduces of the global process set on CPU tensors up to ``MAX_BYTES`` whose
dtype counts the flags exactly, with at most ``MAX_SLOTS`` cache bits; after ``MISSES_MAX`` express
cycles in a row that released nothing, probes settle until an allreduce is released again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ...reduction import ReduceOp
from ..requests import OpType
from .negotiation import Negotiator, Response
from .response_cache import ResponseCache, bits_of

__all__ = ["ExpressPlan", "ExpressReduce", "ExpressVote", "expressible", "read_vote", "vote_flags"]

#: Times in a row the same allreduce followed the last one released before cycles go express (``ExpressPlan``).
STREAK = 2
#: Express cycles in a row that released nothing (some rank had not submitted yet) before probes take over
#: until an allreduce is released again.
MISSES_MAX = 2
#: The largest tensor (bytes) an express cycle carries: a miss sends it for nothing.
MAX_BYTES = 64 * 1024
#: The most cache bits an express cycle carries (two flags each).
MAX_SLOTS = 256
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


#: The engine's side of an express cycle: ``(R, R's slot, settle, this rank's cache bits, slot span)`` → the
#: vote. Collective: every rank calls it with the same ``R``; when every rank set ``R``'s bit it keeps ``R``'s
#: reduced result for the engine.
ExpressReduce = Callable[[Response, int, bool, int, int], ExpressVote]


def expressible(response: Response, size: int) -> bool:
    """Whether ``response`` may carry express cycles in a job of ``size`` ranks."""
    meta = response.template
    if (response.op_type is not OpType.ALLREDUCE or response.process_set != 0 or meta.group or meta.device != "cpu"
            or len(response.members) != size or len(response.metas) != size or size < 2):
        return False
    if meta.reduce_op not in _OPS or size > _EXACT_COUNTS.get(meta.dtype, 0):
        return False
    return math.prod(meta.shape) * _ITEM_BYTES[meta.dtype] <= MAX_BYTES


def vote_flags(reduce_op: int, settle: bool, mask: int, span: int) -> list[int]:
    """This rank's flags: its status bit, its ``span`` cache bits and their complements, encoded so that
    ``reduce_op`` combines each as an AND (for Max, as ``1 - b``: the max is 0 only when every b is 1)."""
    bits = [mask >> slot & 1 for slot in range(span)]
    truths = [int(settle), *bits, *(1 - bit for bit in bits)]
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
    """Which cached allreduce, if any, carries the next steady-state cycle (state every rank shares).

    It follows the allreduces settled cycles release one at a time (other requests between them do not
    count): when the one released after the last, ``X``, has been the same ``Y`` ``STREAK`` times in a row,
    the cycles after ``X`` go express with ``Y`` (a loop of ``Y``; or ``X`` and ``Y`` in turn)."""

    def __init__(self, cache: ResponseCache, negotiator: Negotiator, size: int) -> None:
        self._cache = cache
        self._negotiator = negotiator
        self._size = size
        #: The slot of the last allreduce released alone (-1: none, or several at once).
        self._last = -1
        #: slot → (the slot released alone after it, how many times in a row).
        self._successor: dict[int, tuple[int, int]] = {}
        self._misses = 0

    def predicted(self) -> tuple[int, Response] | None:
        """The cache slot and response that carry the next cycle, or None (the probe runs)."""
        slot, streak = self._successor.get(self._last, (-1, 0))
        if (streak < STREAK or self._misses >= MISSES_MAX
                or self._cache.slot_span > MAX_SLOTS):
            return None
        response = self._cache.whole(slot)
        if response is None or response.key in self._negotiator.pending or not expressible(response, self._size):
            return None
        return slot, response

    def after_settled(self, released: list[Response], common: int, express: bool | None) -> None:
        """Note a cycle settled by the probe (``express`` None) or by an express cycle (whether it released the
        allreduce that carried it); ``common``: the cache bits every rank announced."""
        if express is not None:
            self._misses = 0 if released else self._misses + 1  # a miss: a cycle that waited for some rank
        if not released:
            return
        slot = self._single_expressible(released, common)
        if slot == -2:  # several at once (an async burst): none of them alone is what the loop waits on
            self._last = -1
        elif slot >= 0:
            if self._last >= 0:
                successor, streak = self._successor.get(self._last, (-1, 0))
                self._successor[self._last] = (slot, streak + 1 if successor == slot else 1)
            self._last = slot
            self._misses = 0

    def _single_expressible(self, released: list[Response], common: int) -> int:
        """The slot of the one expressible allreduce among ``released`` (-1: none; -2: more than one)."""
        ids = {id(response) for response in released}
        found = -1
        for slot in bits_of(common):
            response = self._cache.whole(slot)
            if response is None or id(response) not in ids or not expressible(response, self._size):
                continue
            if found >= 0:
                return -2
            found = slot
        return found

    def after_exchange(self) -> None:
        """A cycle went out in the all-gather: follow the releases again from the next settled cycle on."""
        self._last = -1
        self._misses = 0
