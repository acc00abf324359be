"""Summarize a timeline written by torchring (Horovod's Chrome-trace format).

The trace is a JSON array of events (see :mod:`torchring.runtime.observe.timeline`). Every tensor is a
"process": a ``process_name`` metadata event names its pid. On a tensor's pid the engine writes a
``NEGOTIATE_<OP>`` span holding one instant per rank (named ``"0"``, ``"1"``, ...) at the moment that
rank became ready, then the operation span (``ALLREDUCE``, ``BROADCAST``, ...) holding activity spans
(``MEMCPY_IN_FUSION_BUFFER``, ``GLOO_ALLREDUCE``/``NCCL_ALLREDUCE``, ``MEMCPY_OUT_FUSION_BUFFER``); the
operation's end event carries ``{"dtype", "shape"}``. The gradient lane writes operation spans with no
negotiation before them, and a ``LANE_WAIT`` instant with ``{"waits_ms": [w0, w1, ...]}``: how long each
rank waited for the step's first bucket. ``CYCLE_START`` instants on pid 0 mark engine cycles.

What :func:`summarize` works out, and the rules it follows:

* **Tensors.** Per tensor: completed operations, their total and mean duration (the operation span),
  the backend time (activities named ``GLOO_*``, ``NCCL_*`` or ``MPI_*``), the negotiation time (the
  ``NEGOTIATE_*`` spans) and the bytes moved (from dtype and shape).
* **Fusion batches.** The executor starts ``MEMCPY_IN_FUSION_BUFFER`` on every tensor of a fused batch
  in one go, before anything else happens on those tensors (their backend activity comes next). So a
  fused buffer is a maximal run of ``MEMCPY_IN_FUSION_BUFFER`` begin events, in file order, that no other
  event on the pids already in the run interrupts. Events of other tensors (another thread's, such as
  the gradient lane's) may fall in between without splitting the batch. A buffer's bytes are the sum of
  its tensors' bytes. Allreduces without that activity ran unfused.
* **Negotiation waits.** In a completed negotiation with ranks ready at different times, the rank(s)
  ready last are the laggards and ``last ready - first ready`` is the wait they caused. When the trace
  has ``CYCLE_START`` markers, a rank's ready time is the start of the engine cycle it was seen in, so
  ranks seen in the same cycle are tied; without markers, ready times less than :data:`TIE_US` apart
  count as a tie (the engine records ranks one after the other within a cycle). A negotiation whose
  wait is a tie has no laggard. For a ``LANE_WAIT`` event the rank that waited least arrived last: it is
  the laggard and caused ``max wait - its wait`` (waits within :data:`TIE_US` of the least also count as
  last). Both sources add up per rank: how often it was last, the summed wait it caused, and the wall
  time during which it kept some other rank waiting (overlapping waits, e.g. of tensors negotiated
  together, counted once). The **slowest rank** is the one with the most wall wait caused.
* **Steps.** Operations are taken in order of their start; a new step begins when a tensor already
  reduced in the current step comes again (a training loop reduces the same gradients or buckets every
  step). The step starts at that operation's negotiation if it had one; the first step starts at the
  first event that is not a cycle marker. When that finds fewer than :data:`MIN_REPEAT_STEPS` steps
  (tensor names do not repeat), the trace is cut into up to :data:`MAX_WINDOWS` equal time windows
  instead. Per step: operations started in it, communication time (wall time with at least one
  operation in flight), negotiation time (likewise), bytes of those operations, engine cycles.
  ``CYCLE_START`` times are kept as marks for the plot's time axis. The text report lists the longest
  steps (or, for windows, the busiest).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .trace import TraceOp, TraceReader, load_trace

__all__ = [
    "FusionStats",
    "RankWait",
    "Step",
    "TensorStats",
    "TimelineSummary",
    "load_trace",
    "summarize",
]

#: Ready times (µs) closer than this are a tie when the trace has no cycle markers; also for LANE_WAIT.
TIE_US = 1000.0
#: Fewer steps than this from repeated tensor names: fall back to equal time windows.
MIN_REPEAT_STEPS = 3
#: The most equal time windows the fallback cuts the trace into.
MAX_WINDOWS = 20


# ---- loading --------------------------------------------------------------------------------------


@dataclass
class TensorStats:
    """Communication of one tensor (request name)."""

    name: str
    ops: int
    total_s: float
    mean_s: float
    backend_s: float
    negotiation_s: float
    total_bytes: int | None


@dataclass
class FusionStats:
    """Fused buffers: how many, and how many tensors and bytes each held."""

    buffers: int
    fused_tensors: int
    mean_tensors: float
    max_tensors: int
    mean_bytes: float | None
    max_bytes: int | None
    unfused_allreduces: int


@dataclass
class RankWait:
    """How often one rank was the last to be ready, and how long it made the others wait."""

    rank: int
    negotiations: int  # negotiations (with 2+ ranks) this rank took part in
    last_in_negotiations: int
    lane_steps: int  # LANE_WAIT events this rank is in
    last_in_lane_steps: int
    wait_caused_s: float  # wall time with some rank waiting for this one (overlaps counted once)
    wait_caused_sum_s: float  # the waits of every negotiation / lane step it was last in, added up

    @property
    def times_last(self) -> int:
        return self.last_in_negotiations + self.last_in_lane_steps

    @property
    def mean_wait_s(self) -> float:
        """Mean wait caused per negotiation or lane step this rank was last in."""
        return self.wait_caused_sum_s / self.times_last if self.times_last else 0.0


@dataclass
class Step:
    """One window of the trace (see the module docstring for how steps are cut); times from the trace start."""

    index: int
    start_s: float
    end_s: float
    ops: int
    comm_s: float
    negotiation_s: float
    total_bytes: int
    cycles: int

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def comm_fraction(self) -> float:
        return self.comm_s / self.duration_s if self.duration_s > 0 else 0.0


@dataclass
class TimelineSummary:
    """Everything :func:`summarize` found in a trace; tensors are sorted by total operation time."""

    source: str | None
    events: int
    duration_s: float
    ops: int
    open_spans: int  # spans never ended (a truncated trace, or a job stopped mid-operation)
    tensors: list[TensorStats]
    fusion: FusionStats
    negotiations: int  # completed negotiations with 2+ ranks ready
    lane_steps: int
    ranks: list[RankWait]
    slowest_rank: RankWait | None
    step_rule: str
    steps: list[Step]
    steps_are_windows: bool  # True: equal time windows; False: steps cut at repeated tensor names
    cycle_marks_s: list[float] = field(default_factory=list)


# ---- reading the events ---------------------------------------------------------------------------


def summarize(events: Sequence[dict[str, Any]], source: str | None = None) -> TimelineSummary:
    """Analyse the events of a trace (from :func:`load_trace`); ``source`` names it in the report."""
    reader = TraceReader()
    reader.read(events)
    origin = reader.first_ts if reader.first_ts != math.inf else 0.0
    end = reader.last_ts if reader.last_ts != -math.inf else origin
    ranks, negotiations = _rank_waits(reader)
    waited = [rank for rank in ranks if rank.wait_caused_s > 0]
    slowest = max(waited, key=lambda r: (r.wait_caused_s, r.times_last, -r.rank)) if waited else None
    step_rule, steps = _steps(reader, origin, min(reader.first_tensor_ts, end), end)
    return TimelineSummary(
        source=source,
        events=len(events),
        duration_s=(end - origin) / 1e6,
        ops=len(reader.ops),
        open_spans=reader.open_spans(),
        tensors=_tensor_stats(reader),
        fusion=_fusion_stats(reader),
        negotiations=negotiations,
        lane_steps=len(reader.lane_waits),
        ranks=ranks,
        slowest_rank=slowest,
        step_rule=step_rule,
        steps=steps,
        steps_are_windows=step_rule == _WINDOWS_RULE,
        cycle_marks_s=[(ts - origin) / 1e6 for ts in reader.cycles],
    )


def _tensor_stats(reader: TraceReader) -> list[TensorStats]:
    ops: dict[str, list[TraceOp]] = {}
    for op in reader.ops:
        ops.setdefault(op.tensor, []).append(op)
    negotiation_us: dict[str, float] = {}
    for negotiation in reader.negotiations:
        assert negotiation.end is not None
        negotiation_us[negotiation.tensor] = negotiation_us.get(negotiation.tensor, 0.0) + \
            negotiation.end - negotiation.start
    stats = []
    for name in ops.keys() | negotiation_us.keys():
        mine = ops.get(name, [])
        total = sum(op.end - op.start for op in mine if op.end is not None) / 1e6
        sizes = [op.nbytes for op in mine]
        stats.append(TensorStats(
            name=name, ops=len(mine), total_s=total, mean_s=total / len(mine) if mine else 0.0,
            backend_s=sum(op.backend_us for op in mine) / 1e6, negotiation_s=negotiation_us.get(name, 0.0) / 1e6,
            total_bytes=None if not mine or None in sizes else sum(size for size in sizes if size is not None)))
    stats.sort(key=lambda s: (-s.total_s, -s.negotiation_s, s.name))
    return stats


def _fusion_stats(reader: TraceReader) -> FusionStats:
    counts = [len(batch) for batch in reader.batches]
    sizes = [[op.nbytes for op in batch] for batch in reader.batches]
    known = [sum(size for size in batch if size is not None) for batch in sizes if None not in batch]
    unfused = sum(1 for op in reader.ops if op.op == "ALLREDUCE" and not op.fused)
    return FusionStats(
        buffers=len(counts), fused_tensors=sum(counts), mean_tensors=statistics.fmean(counts) if counts else 0.0,
        max_tensors=max(counts, default=0), mean_bytes=statistics.fmean(known) if known else None,
        max_bytes=max(known) if known else None, unfused_allreduces=unfused)


@dataclass
class _RankTally:
    negotiations: int = 0
    last_in_negotiations: int = 0
    lane_steps: int = 0
    last_in_lane_steps: int = 0
    wait_sum_us: float = 0.0
    intervals: list[tuple[float, float]] = field(default_factory=list)


def _rank_waits(reader: TraceReader) -> tuple[list[RankWait], int]:
    """Per rank: how often it was last to be ready and the waits it caused; also the negotiations counted."""
    tallies: dict[int, _RankTally] = {}
    tie = 0.0 if reader.cycles else TIE_US
    counted = 0
    for negotiation in reader.negotiations:
        ready = negotiation.ready
        if len(ready) < 2:
            continue
        counted += 1
        for rank in ready:
            tallies.setdefault(rank, _RankTally()).negotiations += 1
        first, last = min(ready.values()), max(ready.values())
        if last - first <= tie:
            continue
        for rank, ts in ready.items():
            if last - ts <= tie:
                tally = tallies[rank]
                tally.last_in_negotiations += 1
                tally.wait_sum_us += last - first
                tally.intervals.append((first, last))
    for lane in reader.lane_waits:
        waits_us = [wait * 1000.0 for wait in lane.waits_ms]
        for rank in range(len(waits_us)):
            tallies.setdefault(rank, _RankTally()).lane_steps += 1
        least, most = min(waits_us), max(waits_us)
        if most - least <= TIE_US:
            continue
        for rank, wait in enumerate(waits_us):
            if wait - least <= TIE_US:
                tally = tallies[rank]
                tally.last_in_lane_steps += 1
                tally.wait_sum_us += most - wait
                tally.intervals.append((lane.ts - (most - wait), lane.ts))
    ranks = [RankWait(rank=rank, negotiations=t.negotiations, last_in_negotiations=t.last_in_negotiations,
                      lane_steps=t.lane_steps, last_in_lane_steps=t.last_in_lane_steps,
                      wait_caused_s=_Union(t.intervals).length() / 1e6, wait_caused_sum_s=t.wait_sum_us / 1e6)
             for rank, t in sorted(tallies.items())]
    return ranks, counted


class _Union:
    """The union of intervals, as sorted disjoint pieces, for measuring how much of a window they cover."""

    def __init__(self, intervals: Iterable[tuple[float, float]]) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        for start, end in sorted(i for i in intervals if i[1] > i[0]):
            if self.ends and start <= self.ends[-1]:
                self.ends[-1] = max(self.ends[-1], end)
            else:
                self.starts.append(start)
                self.ends.append(end)

    def length(self, low: float = -math.inf, high: float = math.inf) -> float:
        """How much of ``[low, high]`` the union covers."""
        total = 0.0
        index = bisect.bisect_right(self.ends, low)
        while index < len(self.starts) and self.starts[index] < high:
            total += max(0.0, min(self.ends[index], high) - max(self.starts[index], low))
            index += 1
        return total


_WINDOWS_RULE = "equal time windows, as tensor names do not repeat"


def _steps(reader: TraceReader, origin: float, begin: float, end: float) -> tuple[str, list[Step]]:
    """Cut ``[begin, end]`` into steps (see the module docstring) and measure each; times from ``origin``."""
    ops = sorted((op for op in reader.ops if op.end is not None), key=lambda op: op.start)
    if not ops:
        return "no operations", []
    rule = "a new step where a tensor of the current step comes again"
    boundaries = _repeat_boundaries(ops)
    if len(boundaries) + 1 < MIN_REPEAT_STEPS:
        count = min(MAX_WINDOWS, len(ops))
        rule = _WINDOWS_RULE
        width = (end - begin) / count
        boundaries = [begin + width * index for index in range(1, count)] if width > 0 else []
    edges = [begin, *boundaries, end]
    comm = _Union((op.start, op.end) for op in ops if op.end is not None)
    negotiation = _Union((n.start, n.end) for n in reader.negotiations if n.end is not None)
    starts = [op.start for op in ops]
    cycles = sorted(reader.cycles)
    steps = []
    for index, (low, high) in enumerate(zip(edges, edges[1:], strict=False)):
        last = index == len(edges) - 2
        first_op = bisect.bisect_left(starts, low)
        end_op = bisect.bisect_right(starts, high) if last else bisect.bisect_left(starts, high)
        end_cycle = bisect.bisect_right(cycles, high) if last else bisect.bisect_left(cycles, high)
        steps.append(Step(
            index=index, start_s=(low - origin) / 1e6, end_s=(high - origin) / 1e6, ops=end_op - first_op,
            comm_s=comm.length(low, high) / 1e6, negotiation_s=negotiation.length(low, high) / 1e6,
            total_bytes=sum(op.nbytes or 0 for op in ops[first_op:end_op]),
            cycles=end_cycle - bisect.bisect_left(cycles, low)))
    return rule, steps


def _repeat_boundaries(ops: list[TraceOp]) -> list[float]:
    """Step starts: each operation whose tensor already ran in the current step opens a new step."""
    boundaries: list[float] = []
    seen: set[str] = set()
    for op in ops:
        if op.tensor in seen:
            start = min(op.start, op.negotiation_start if op.negotiation_start is not None else op.start)
            boundaries.append(max(start, boundaries[-1]) if boundaries else start)
            seen = set()
        seen.add(op.tensor)
    return boundaries
