"""Reading a torchring timeline (Chrome trace events, Horovod's layout; see ``runtime/observe/timeline.py``):
``load_trace`` parses a file, also a truncated one, and ``TraceReader`` turns the events into the
operations, negotiations, activities and lane waits that ``timeline_summary`` analyses."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
#: How many cuts at a "}" a truncated trace is tried with before giving up.
_REPAIR_TRIES = 8


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
class TraceOp:
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
    op: TraceOp


@dataclass
class _LaneWait:
    ts: float
    waits_ms: list[float]


class TraceReader:
    """One pass over the events in file order, rebuilding spans per pid."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.stacks: dict[int, list[TraceOp | _Negotiation | _Activity]] = {}
        self.ops: list[TraceOp] = []
        self.negotiations: list[_Negotiation] = []
        self.lane_waits: list[_LaneWait] = []
        self.cycles: list[float] = []
        self.batches: list[list[TraceOp]] = []
        self.first_ts = math.inf
        self.last_ts = -math.inf
        self.first_tensor_ts = math.inf  # of an event other than a cycle marker
        self._run: list[TraceOp] = []
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
        if phase == "B" and name == FUSION_ACTIVITY and stack and isinstance(stack[-1], TraceOp):
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

    def _begin(self, pid: int, stack: list[TraceOp | _Negotiation | _Activity], name: str, ts: float) -> None:
        if name.startswith(NEGOTIATE_PREFIX):
            stack.append(_Negotiation(self._tensor(pid), ts))
        elif stack and isinstance(stack[-1], TraceOp | _Activity):
            op = stack[-1] if isinstance(stack[-1], TraceOp) else stack[-1].op
            stack.append(_Activity(name, ts, op))
        else:
            negotiation = self._last_negotiation.pop(pid, None)
            stack.append(TraceOp(self._tensor(pid), name, ts,
                             negotiation_start=negotiation.start if negotiation is not None else None))

    def _end(self, pid: int, stack: list[TraceOp | _Negotiation | _Activity], ts: float, args: object) -> None:
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

    def _instant(self, stack: list[TraceOp | _Negotiation | _Activity], name: object, ts: float, args: object) -> None:
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


