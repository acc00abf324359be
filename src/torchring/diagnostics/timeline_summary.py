"""Summarize a timeline written by torchring (Horovod's Chrome-trace format).

The trace is a JSON array of events (see :mod:`torchring.runtime.timeline`). Every tensor is a
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
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FusionStats",
    "RankWait",
    "Step",
    "TensorStats",
    "TimelineSummary",
    "format_summary",
    "load_trace",
    "plot",
    "slowest_rank_line",
    "summarize",
    "summary_to_dict",
]

#: Bytes per element of the dtypes a timeline names.
ELEMENT_SIZES: dict[str, int] = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8, "complex128": 16,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
}
#: Activity prefixes that are the backend's collective itself.
BACKEND_PREFIXES = ("GLOO_", "NCCL_", "MPI_")
FUSION_ACTIVITY = "MEMCPY_IN_FUSION_BUFFER"
NEGOTIATE_PREFIX = "NEGOTIATE_"
CYCLE_START = "CYCLE_START"
LANE_WAIT = "LANE_WAIT"
#: Ready times (µs) closer than this are a tie when the trace has no cycle markers; also for LANE_WAIT.
TIE_US = 1000.0
#: Fewer steps than this from repeated tensor names: fall back to equal time windows.
MIN_REPEAT_STEPS = 3
#: The most equal time windows the fallback cuts the trace into.
MAX_WINDOWS = 20
#: How many cuts at a "}" a truncated trace is tried with before giving up.
_REPAIR_TRIES = 8


# ---- loading --------------------------------------------------------------------------------------


def load_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of the trace file at ``path``.

    Accepts a JSON array of events, Chrome's ``{"traceEvents": [...]}`` object, and a truncated array
    (no closing bracket, a trailing comma, or a half-written last event, as a killed job may leave).
    Raises :class:`OSError` when the file cannot be read and :class:`ValueError` naming the file when it
    is not a trace.
    """
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{name} is not a timeline: not UTF-8 text ({error.reason})") from None
    data = _parse_lenient(name, text)
    if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        data = data["traceEvents"]
    if not isinstance(data, list):
        raise ValueError(f"{name} is not a timeline: expected a JSON array of trace events, "
                         f"found a JSON {type(data).__name__}")
    for index, event in enumerate(data):
        if not isinstance(event, dict):
            raise ValueError(f"{name} is not a timeline: event {index} is a JSON {type(event).__name__}, "
                             "not an object")
    return data


def _parse_lenient(name: str, text: str) -> Any:
    """``json.loads(text)``, or the array closed after its last complete event when it was cut short."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        first_error = error
    body = text.rstrip()
    if body.startswith("["):
        candidates = [body]
        cut = len(body)
        for _ in range(_REPAIR_TRIES):
            cut = body.rfind("}", 0, cut)
            if cut < 0:
                break
            candidates.append(body[: cut + 1])
        for candidate in candidates:
            try:
                return json.loads(candidate.rstrip().rstrip(",") + "\n]")
            except json.JSONDecodeError:
                continue
    raise ValueError(f"{name} is not a timeline: invalid JSON at line {first_error.lineno} column "
                     f"{first_error.colno} ({first_error.msg})") from None


# ---- the summary ----------------------------------------------------------------------------------


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


@dataclass
class _Op:
    tensor: str
    op: str
    start: float
    end: float | None = None
    nbytes: int | None = None
    backend_us: float = 0.0
    negotiation_start: float | None = None
    fused: bool = False


@dataclass
class _Negotiation:
    tensor: str
    start: float
    end: float | None = None
    ready: dict[int, float] = field(default_factory=dict)


@dataclass
class _Activity:
    name: str
    start: float
    op: _Op


@dataclass
class _LaneWait:
    ts: float
    waits_ms: list[float]


class _Reader:
    """One pass over the events in file order, rebuilding spans per pid."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.stacks: dict[int, list[_Op | _Negotiation | _Activity]] = {}
        self.ops: list[_Op] = []
        self.negotiations: list[_Negotiation] = []
        self.lane_waits: list[_LaneWait] = []
        self.cycles: list[float] = []
        self.batches: list[list[_Op]] = []
        self.first_ts = math.inf
        self.last_ts = -math.inf
        self.first_tensor_ts = math.inf  # of an event other than a cycle marker
        self._run: list[_Op] = []
        self._run_pids: set[int] = set()
        self._last_negotiation: dict[int, _Negotiation] = {}

    def read(self, events: Iterable[dict[str, Any]]) -> None:
        for event in events:
            self._event(event)
        self._close_run()

    def open_spans(self) -> int:
        return sum(len(stack) for stack in self.stacks.values())

    def _tensor(self, pid: int) -> str:
        return self.names.get(pid, f"pid {pid}")

    def _ready_time(self, ts: float) -> float:
        """A rank-ready instant's time: the start of its engine cycle when the trace marks cycles."""
        return self.cycles[-1] if self.cycles else ts

    def _event(self, event: dict[str, Any]) -> None:
        phase = event.get("ph")
        pid = event.get("pid")
        name = event.get("name")
        if phase == "M":
            args = event.get("args")
            if name == "process_name" and isinstance(pid, int) and isinstance(args, dict):
                self.names[pid] = str(args.get("name"))
            return
        ts = event.get("ts")
        if not isinstance(pid, int) or isinstance(ts, bool) or not isinstance(ts, int | float):
            return
        ts = float(ts)
        self.first_ts = min(self.first_ts, ts)
        self.last_ts = max(self.last_ts, ts)
        if name != CYCLE_START:
            self.first_tensor_ts = min(self.first_tensor_ts, ts)
        stack = self.stacks.setdefault(pid, [])
        if phase == "B" and name == FUSION_ACTIVITY and stack and isinstance(stack[-1], _Op):
            if pid in self._run_pids:
                self._close_run()
            self._run.append(stack[-1])
            self._run_pids.add(pid)
        elif pid in self._run_pids:
            self._close_run()
        if phase == "B":
            self._begin(pid, stack, str(name), ts)
        elif phase == "E":
            self._end(pid, stack, ts, event.get("args"))
        elif phase in ("i", "I"):
            self._instant(stack, name, ts, event.get("args"))

    def _begin(self, pid: int, stack: list[_Op | _Negotiation | _Activity], name: str, ts: float) -> None:
        if name.startswith(NEGOTIATE_PREFIX):
            stack.append(_Negotiation(self._tensor(pid), ts))
        elif stack and isinstance(stack[-1], _Op | _Activity):
            op = stack[-1] if isinstance(stack[-1], _Op) else stack[-1].op
            stack.append(_Activity(name, ts, op))
        else:
            negotiation = self._last_negotiation.pop(pid, None)
            stack.append(_Op(self._tensor(pid), name, ts,
                             negotiation_start=negotiation.start if negotiation is not None else None))

    def _end(self, pid: int, stack: list[_Op | _Negotiation | _Activity], ts: float, args: object) -> None:
        if not stack:
            return
        span = stack.pop()
        if isinstance(span, _Negotiation):
            span.end = ts
            self.negotiations.append(span)
            self._last_negotiation[pid] = span
        elif isinstance(span, _Activity):
            if span.name.startswith(BACKEND_PREFIXES):
                span.op.backend_us += ts - span.start
        else:
            span.end = ts
            if isinstance(args, dict):
                span.nbytes = _nbytes(args.get("dtype"), args.get("shape"))
            self.ops.append(span)

    def _instant(self, stack: list[_Op | _Negotiation | _Activity], name: object, ts: float, args: object) -> None:
        if name == CYCLE_START:
            self.cycles.append(ts)
        elif name == LANE_WAIT:
            waits = args.get("waits_ms") if isinstance(args, dict) else None
            if isinstance(waits, list) and waits and all(_is_number(w) for w in waits):
                self.lane_waits.append(_LaneWait(ts, [float(w) for w in waits]))
        elif isinstance(name, str) and name.isdigit() and stack and isinstance(stack[-1], _Negotiation):
            stack[-1].ready.setdefault(int(name), self._ready_time(ts))

    def _close_run(self) -> None:
        if self._run:
            for op in self._run:
                op.fused = True
            self.batches.append(self._run)
        self._run = []
        self._run_pids = set()


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _nbytes(dtype: object, shape: object) -> int | None:
    """Bytes of a tensor from the end event's ``dtype`` (``"float32"``) and ``shape`` (``"[2, 3]"``)."""
    if not isinstance(dtype, str):
        return None
    size = ELEMENT_SIZES.get(dtype.removeprefix("torch."))
    if size is None:
        return None
    if isinstance(shape, str):
        inner = shape.strip().removeprefix("[").removesuffix("]").strip()
        try:
            dims = [int(part) for part in inner.split(",")] if inner else []
        except ValueError:
            return None
    elif isinstance(shape, list) and all(isinstance(dim, int) for dim in shape):
        dims = shape
    else:
        return None
    return size * math.prod(dims)


# ---- analysis -------------------------------------------------------------------------------------


def summarize(events: Sequence[dict[str, Any]], source: str | None = None) -> TimelineSummary:
    """Analyse the events of a trace (from :func:`load_trace`); ``source`` names it in the report."""
    reader = _Reader()
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


def _tensor_stats(reader: _Reader) -> list[TensorStats]:
    ops: dict[str, list[_Op]] = {}
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


def _fusion_stats(reader: _Reader) -> FusionStats:
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


def _rank_waits(reader: _Reader) -> tuple[list[RankWait], int]:
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


def _steps(reader: _Reader, origin: float, begin: float, end: float) -> tuple[str, list[Step]]:
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


def _repeat_boundaries(ops: list[_Op]) -> list[float]:
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


# ---- output ---------------------------------------------------------------------------------------


def summary_to_dict(summary: TimelineSummary, top: int | None = None) -> dict[str, Any]:
    """The summary as plain JSON-ready data; ``top`` keeps only that many tensors."""
    data = asdict(summary)
    if top is not None:
        data["tensors"] = data["tensors"][:top]
    for rank_data, rank in zip(data["ranks"], summary.ranks, strict=True):
        rank_data["times_last"] = rank.times_last
        rank_data["mean_wait_s"] = rank.mean_wait_s
    if summary.slowest_rank is not None:
        data["slowest_rank"].update(times_last=summary.slowest_rank.times_last,
                                    mean_wait_s=summary.slowest_rank.mean_wait_s)
    for step_data, step in zip(data["steps"], summary.steps, strict=True):
        step_data["duration_s"] = step.duration_s
        step_data["comm_fraction"] = step.comm_fraction
    return data


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows aligned under their headers: the first column to the left, the others to the right."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = []
    for row in [headers, *rows]:
        cells = [f"{cell:<{widths[0]}}" if index == 0 else f"{cell:>{widths[index]}}"
                 for index, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return lines


def _bytes(count: float | None) -> str:
    if count is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def slowest_rank_line(summary: TimelineSummary) -> str:
    """``slowest rank: 1 (last to be ready in 18 of 20 negotiations, made the others wait 0.95 s in all)``."""
    rank = summary.slowest_rank
    if rank is None:
        if summary.negotiations or summary.lane_steps:
            return f"slowest rank: none (no rank made the others wait more than {TIE_US / 1000:g} ms)"
        return "slowest rank: unknown (the trace records no rank becoming ready)"
    parts = []
    if rank.negotiations:
        parts.append(f"{rank.last_in_negotiations} of {_plural(rank.negotiations, 'negotiation')}")
    if rank.lane_steps:
        parts.append(f"{rank.last_in_lane_steps} of {_plural(rank.lane_steps, 'lane step')}")
    return (f"slowest rank: {rank.rank} (last to be ready in {' and '.join(parts)}, "
            f"made the others wait {rank.wait_caused_s:.2f} s in all)")


def format_summary(summary: TimelineSummary, top: int = 10) -> str:
    """A readable report: top ``top`` tensors, fusion, waits per rank and the slowest rank, steps."""
    title = f"Timeline {summary.source}" if summary.source else "Timeline"
    lines = [f"{title}: {summary.events} events over {summary.duration_s:.3f} s, "
             f"{_plural(summary.ops, 'operation')} on {_plural(len(summary.tensors), 'tensor')}"]
    if summary.open_spans:
        lines.append(f"({_plural(summary.open_spans, 'span')} never ended: the trace was cut short or the job "
                     "stopped mid-operation)")
    lines += ["", f"Top {min(top, len(summary.tensors))} tensors by communication time"]
    rows = [[t.name, str(t.ops), _ms(t.total_s), _ms(t.mean_s), _ms(t.backend_s), _ms(t.negotiation_s),
             _bytes(t.total_bytes / t.ops if t.total_bytes is not None and t.ops else None)]
            for t in summary.tensors[:top]]
    lines += _table(["tensor", "ops", "total ms", "mean ms", "backend ms", "negotiation ms", "size"], rows)
    fusion = summary.fusion
    lines += ["", "Fusion"]
    if fusion.buffers:
        lines.append(f"{_plural(fusion.buffers, 'fused buffer')} holding {fusion.fused_tensors} tensors: "
                     f"{fusion.mean_tensors:.1f} tensors per buffer on average (max {fusion.max_tensors}), "
                     f"{_bytes(fusion.mean_bytes)} per buffer on average (max {_bytes(fusion.max_bytes)})")
    else:
        lines.append("no fused buffers")
    lines.append(f"{_plural(fusion.unfused_allreduces, 'allreduce')} ran unfused")
    lines += ["", f"Waits per rank ({_plural(summary.negotiations, 'negotiation')} with 2+ ranks, "
                  f"{_plural(summary.lane_steps, 'lane step')})"]
    if summary.ranks:
        rows = [[str(r.rank), f"{r.last_in_negotiations}/{r.negotiations}", f"{r.last_in_lane_steps}/{r.lane_steps}",
                 f"{r.wait_caused_s:.3f}", f"{r.wait_caused_sum_s:.3f}", _ms(r.mean_wait_s)] for r in summary.ranks]
        lines += _table(["rank", "last/negotiations", "last/lane steps", "wait caused s", "summed s", "mean ms"],
                        rows)
    lines.append(slowest_rank_line(summary))
    lines += ["", _steps_text(summary, top)]
    return "\n".join(lines).rstrip() + "\n"


def _steps_text(summary: TimelineSummary, top: int) -> str:
    steps = summary.steps
    if not steps:
        return "Steps: none (no completed operations)"
    durations = [step.duration_s for step in steps]
    busy = sum(step.comm_s for step in steps)
    total = sum(durations)
    lines = [f"Steps: {len(steps)} ({summary.step_rule}); median {_ms(statistics.median(durations))} ms, "
             f"communication {100 * busy / total if total > 0 else 0:.0f}% of the time"]
    if summary.cycle_marks_s:
        lines[0] += f", {_plural(len(summary.cycle_marks_s), 'engine cycle')}"
    if summary.steps_are_windows:
        ranked = sorted(steps, key=lambda s: (-(s.comm_s + s.negotiation_s), s.index))
        label = "busiest (most communication and negotiation time)"
    else:
        ranked = sorted(steps, key=lambda s: (-s.duration_s, s.index))
        label = "longest"
    shown = sorted(ranked[:top], key=lambda s: s.index)
    if len(shown) < len(steps):
        lines.append(f"the {len(shown)} {label}:")
    rows = [[str(s.index), f"{s.start_s:.3f}", _ms(s.duration_s), str(s.ops), _ms(s.comm_s), _ms(s.negotiation_s),
             f"{100 * s.comm_fraction:.0f}", _bytes(s.total_bytes)] for s in shown]
    lines += _table(["step", "start s", "duration ms", "ops", "comm ms", "negotiation ms", "comm %", "bytes"], rows)
    return "\n".join(lines)


def plot(summary_or_events: TimelineSummary | Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> str:
    """Draw communication against time, per step, into the PNG file ``path``; return the path written.

    Top: each step's duration, communication and negotiation time (ms, symmetric log scale) at the step's
    middle. Bottom: the share of each step spent communicating, as a bar spanning the step, with the engine
    cycle marks (``CYCLE_START``) below it when the trace has them.
    """
    summary = summary_or_events if isinstance(summary_or_events, TimelineSummary) else summarize(summary_or_events)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise RuntimeError(f"plotting needs matplotlib ({error}); install it with pip install matplotlib") from None
    target = os.fspath(path)
    figure, (top_axes, bottom_axes) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True,
                                                   gridspec_kw={"height_ratios": [3, 2]})
    try:
        steps = summary.steps
        starts = [step.start_s for step in steps]
        middles = [(step.start_s + step.end_s) / 2 for step in steps]
        series = [("step duration", "0.55", "s", [step.duration_s for step in steps]),
                  ("communication", "tab:blue", "o", [step.comm_s for step in steps]),
                  ("negotiation", "tab:orange", "^", [step.negotiation_s for step in steps])]
        for label, color, marker, values in series:
            top_axes.plot(middles, [value * 1000 for value in values], marker, color=color, label=label,
                          markersize=5, linestyle="none")
        if any(step.duration_s > 0 for step in steps):
            top_axes.set_yscale("symlog", linthresh=1.0)
            top_axes.set_xlim(steps[0].start_s, steps[-1].end_s)
        top_axes.set_ylabel("ms per step")
        top_axes.grid(alpha=0.3)
        if steps:
            top_axes.legend(loc="upper right", fontsize="small")
        else:
            top_axes.text(0.5, 0.5, "no completed operations", ha="center", va="center", transform=top_axes.transAxes)
        name = os.path.basename(summary.source) if summary.source else "timeline"
        top_axes.set_title(f"{name}: communication per step — {slowest_rank_line(summary)}", fontsize="medium")
        bottom_axes.bar(starts, [100 * step.comm_fraction for step in steps],
                        width=[step.duration_s for step in steps], align="edge", color="tab:blue", alpha=0.6,
                        edgecolor="white", linewidth=0.5)
        bottom_axes.set_ylim(-12, 105)
        bottom_axes.set_ylabel("communication %")
        bottom_axes.set_xlabel("time since the trace started (s)")
        bottom_axes.grid(alpha=0.3, axis="y")
        if summary.cycle_marks_s:
            bottom_axes.eventplot([summary.cycle_marks_s], lineoffsets=-6, linelengths=8, colors="0.4",
                                  linewidths=0.4)
            bottom_axes.text(0.0, -6, " engine cycles", va="center", fontsize="x-small",
                             transform=bottom_axes.get_yaxis_transform())
        figure.tight_layout()
        figure.savefig(target, format="png", dpi=100)
    finally:
        plt.close(figure)
    return target
