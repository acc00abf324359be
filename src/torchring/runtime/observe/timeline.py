"""Horovod's timeline: a Chrome trace-event file of what the engine did with every tensor.

The file is a JSON array of trace events that ``chrome://tracing`` and Perfetto open. As in
Horovod 0.28, each tensor (request name) is shown as its own "process": the first event of a
name registers a ``process_name`` (and ``process_sort_index``) metadata event for a new pid.
Per operation the writer records::

    B NEGOTIATE_ALLREDUCE         when the first rank reports the request
      i "0", "1", ...             as each rank becomes ready
    E                             when negotiation finishes
    B ALLREDUCE                   the operation itself
      B QUEUE / E                 activities (any string the caller gives)
      B NCCL_ALLREDUCE / E
    E {"dtype": ..., "shape": ...}

``CYCLE_START`` instants (global scope, pid 0) mark engine cycles when ``mark_cycles`` is on.

The file is valid JSON after every write, so a job killed at any moment leaves a readable trace:
it always ends with ``"\\n]"``, and appending overwrites that closing bracket with
``",\\n" + events + "\\n]"`` in a single write at a known offset. Events are built with one small
``json.dumps`` each and reach the file once per public call (or once per :meth:`TimelineWriter.batch`),
without reopening it. A lock makes the writer safe to share between the engine thread and user threads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence

logger = logging.getLogger("torchring")

__all__ = ["NullTimeline", "TimelineWriter"]

#: The thread id of every per-tensor event; cycle markers use tid 0 on pid 0.
_TENSOR_TID = 1
_MARKER_PID = 0
#: Pending bytes above which a long :meth:`TimelineWriter.batch` is written out early.
_FLUSH_THRESHOLD = 1 << 16

# The state of one tensor's spans (Horovod's TimelineState).
_IDLE, _NEGOTIATING, _TOP_LEVEL, _ACTIVITY = range(4)


def backend_activity(device: str, op: str) -> str:
    """The timeline name of a collective's backend step on ``device``, e.g. ``GLOO_ALLREDUCE``."""
    return f"{'NCCL' if device.startswith('cuda') else 'GLOO'}_{op.upper()}"  # this module imports nothing of ours


def _shape_string(shape: Sequence[int]) -> str:
    """``(2, 3)`` → ``"[2, 3]"``, the way Horovod prints a tensor shape."""
    return "[" + ", ".join(str(int(dim)) for dim in shape) + "]"


def _dtype_string(dtype: object) -> str:
    """``torch.float32`` or ``"float32"`` → ``"float32"``."""
    return str(dtype).removeprefix("torch.")


class TimelineWriter:
    """Writes Horovod's timeline to ``path`` (overwritten), keeping it valid JSON after every write.

    Calls made out of order do not break the trace: starting a new span closes the spans still open
    on that tensor (an activity, an operation, a negotiation), and ends or instants with nothing open
    to attach to are ignored. After :meth:`close` every call is a no-op. An error while writing after
    construction is logged once and turns the writer off, leaving the file as last written, so that a
    full disk never fails the training job.
    """

    enabled = True

    def __init__(self, path: str | os.PathLike[str], mark_cycles: bool = False) -> None:
        """Create (or truncate) the timeline file.

        Raises an :class:`OSError` subclass naming ``path`` when the file cannot be written.
        """
        self.path = os.fspath(path)
        self.mark_cycles = mark_cycles
        self._lock = threading.Lock()
        try:
            self._file = open(self.path, "wb", buffering=0)  # kept open until close()
            self._file.write(b"[\n]")
        except OSError as error:
            if getattr(self, "_file", None) is not None:
                self._file.close()
            reason = error.strerror or str(error)
            raise OSError(error.errno, f"cannot write the timeline file: {reason}", self.path) from error
        self._fd = self._file.fileno()
        #: Offset of the closing "\n]" that the next write replaces.
        self._end = 1
        self._empty = True
        self._pending: list[str] = []
        self._pending_size = 0
        self._batch_depth = 0
        self._closed = False
        self._start_ns = time.perf_counter_ns()
        self._pids: dict[str, int] = {}
        self._states: dict[str, int] = {}
        if mark_cycles:
            self._emit({"name": "process_name", "ph": "M", "pid": _MARKER_PID, "tid": 0,
                        "args": {"name": "Cycle markers"}})
            self._write_pending()

    # ---- negotiation ------------------------------------------------------------------------------

    def negotiate_start(self, name: str, op: str) -> None:
        """The first rank reported a request for ``name``: begin ``NEGOTIATE_<OP>``."""
        self._begin_top_level(name, "NEGOTIATE_" + op.upper(), _NEGOTIATING)

    def negotiating(self, name: str) -> bool:
        """Whether this file has ``name``'s negotiation open."""
        return self._states.get(name) == _NEGOTIATING

    def negotiate_rank_ready(self, name: str, rank: int) -> None:
        """``rank`` reported its request for ``name``: an instant event named after the rank."""
        with self._lock:
            if self._closed or self._states.get(name) != _NEGOTIATING:
                return
            self._tensor_event(name, "i", str(rank), scope="p")
            self._done()

    def negotiate_end(self, name: str) -> None:
        """Negotiation of ``name`` finished (every rank is ready, or it failed)."""
        with self._lock:
            if self._closed or self._states.get(name) != _NEGOTIATING:
                return
            self._tensor_event(name, "E")
            self._states[name] = _IDLE
            self._done()

    def lane_waits(self, name: str, waits_ms: Sequence[float]) -> None:
        """How long each rank waited for the previous step's first bucket on a gradient lane: a
        ``LANE_WAIT`` instant with ``waits_ms`` (index = rank); the rank that waited least is the one
        the others waited for."""
        with self._lock:
            if self._closed:
                return
            self._tensor_event(name, "i", "LANE_WAIT", scope="p",
                               args={"waits_ms": [round(float(w), 3) for w in waits_ms]})
            self._done()

    # ---- execution --------------------------------------------------------------------------------

    def op_start(self, name: str, op: str) -> None:
        """Begin the ``<OP>`` span of ``name`` (closing its negotiation if still open)."""
        self._begin_top_level(name, op.upper(), _TOP_LEVEL)

    def _begin_top_level(self, name: str, label: str, state: int) -> None:
        """Close whatever ``name`` had open and begin its top-level span ``label``."""
        with self._lock:
            if self._closed:
                return
            self._close_spans(name)
            self._tensor_event(name, "B", label)
            self._states[name] = state
            self._done()

    def activity_start(self, name: str, activity: str) -> None:
        """Begin an activity (``QUEUE``, ``NCCL_ALLREDUCE``, ...) inside the operation on ``name``.

        An activity still open on ``name`` ends first; without an open operation this is ignored.
        """
        with self._lock:
            state = self._states.get(name)
            if self._closed or state not in (_TOP_LEVEL, _ACTIVITY):
                return
            if state == _ACTIVITY:
                self._tensor_event(name, "E")
            self._tensor_event(name, "B", activity)
            self._states[name] = _ACTIVITY
            self._done()

    def activity_end(self, name: str) -> None:
        """End the activity open on ``name``, if any."""
        with self._lock:
            if self._closed or self._states.get(name) != _ACTIVITY:
                return
            self._tensor_event(name, "E")
            self._states[name] = _TOP_LEVEL
            self._done()

    def op_end(self, name: str, dtype: object, shape: Sequence[int]) -> None:
        """End the operation on ``name`` (and its open activity); the end event carries dtype and shape.

        ``dtype`` may be a string or a ``torch.dtype``; ``shape`` any sequence of ints (``torch.Size``).
        """
        with self._lock:
            state = self._states.get(name)
            if self._closed or state not in (_TOP_LEVEL, _ACTIVITY):
                return
            if state == _ACTIVITY:
                self._tensor_event(name, "E")
            self._tensor_event(name, "E", args={"dtype": _dtype_string(dtype), "shape": _shape_string(shape)})
            self._states[name] = _IDLE
            self._done()

    def mark_cycle(self) -> None:
        """Record a global ``CYCLE_START`` instant; a no-op unless the writer marks cycles."""
        if not self.mark_cycles:
            return
        with self._lock:
            if self._closed:
                return
            self._emit({"name": "CYCLE_START", "ph": "i", "s": "g", "ts": self._now(),
                        "pid": _MARKER_PID, "tid": 0})
            self._done()

    # ---- writing ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group the calls made inside the ``with`` block into one write (the file is written on exit).

        Other threads' events made meanwhile join the same write. Batches may nest.
        """
        with self._lock:
            self._batch_depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._batch_depth -= 1
                if self._batch_depth == 0 and not self._closed:
                    self._write_pending()

    def flush(self) -> None:
        """Write every pending event now."""
        with self._lock:
            if not self._closed:
                self._write_pending()

    def close(self) -> None:
        """Write pending events and close the file, which stays valid JSON. Idempotent.

        Spans still open stay open in the trace (viewers show them as unfinished).
        """
        with self._lock:
            if self._closed:
                return
            self._write_pending()
            self._closed = True
            self._pending.clear()
            try:
                self._file.close()
            except OSError as error:
                logger.warning("torchring: could not close the timeline file %s: %s", self.path, error)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> TimelineWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- internals (called with the lock held) -----------------------------------------------------------

    def _now(self) -> int:
        return (time.perf_counter_ns() - self._start_ns) // 1000

    def _pid(self, name: str) -> int:
        pid = self._pids.get(name)
        if pid is None:
            pid = self._pids[name] = len(self._pids) + 1
            self._emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
            self._emit({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                        "args": {"sort_index": pid}})
        return pid

    def _tensor_event(self, name: str, phase: str, label: str | None = None, scope: str | None = None,
                      args: dict[str, object] | None = None) -> None:
        event: dict[str, object] = {} if label is None else {"name": label}
        event["ph"] = phase
        if scope is not None:
            event["s"] = scope
        event["ts"] = self._now()
        event["pid"] = self._pid(name)
        event["tid"] = _TENSOR_TID
        if args is not None:
            event["args"] = args
        self._emit(event)

    def _close_spans(self, name: str) -> None:
        """End whatever is open on ``name`` before a new top-level span begins."""
        state = self._states.get(name, _IDLE)
        if state == _ACTIVITY:
            self._tensor_event(name, "E")
            state = _TOP_LEVEL
        if state in (_TOP_LEVEL, _NEGOTIATING):
            self._tensor_event(name, "E")
        self._states[name] = _IDLE

    def _emit(self, event: dict[str, object]) -> None:
        text = json.dumps(event)
        self._pending.append(text)
        self._pending_size += len(text)

    def _done(self) -> None:
        """End of one public call: write unless inside a batch that is still small."""
        if self._batch_depth == 0 or self._pending_size >= _FLUSH_THRESHOLD:
            self._write_pending()

    def _write_pending(self) -> None:
        if not self._pending:
            return
        body = ",\n".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        data = (("\n" if self._empty else ",\n") + body + "\n]").encode("utf-8")
        try:
            self._write_at(data, self._end)
        except OSError as error:
            logger.warning("torchring: writing the timeline file %s failed (%s); the timeline is off",
                           self.path, error)
            self._closed = True
            with contextlib.suppress(OSError):
                self._file.close()
            return
        self._empty = False
        self._end += len(data) - 2

    def _write_at(self, data: bytes, offset: int) -> None:
        """One write syscall in the usual case, so that the file never holds half an append."""
        view = memoryview(data)
        if hasattr(os, "pwrite"):
            while view:
                written = os.pwrite(self._fd, view, offset)
                view, offset = view[written:], offset + written
        else:  # pragma: no cover - Windows
            self._file.seek(offset)
            while view:
                written = self._file.write(view) or 0
                view = view[written:]


class NullTimeline:
    """A timeline that records nothing, so that the engine can always call a timeline object."""

    enabled = False
    closed = False

    def negotiate_start(self, name: str, op: str) -> None:
        """Do nothing."""

    def negotiating(self, name: str) -> bool:
        """Never."""
        return False

    def negotiate_rank_ready(self, name: str, rank: int) -> None:
        """Do nothing."""

    def negotiate_end(self, name: str) -> None:
        """Do nothing."""

    def lane_waits(self, name: str, waits_ms: Sequence[float]) -> None:
        """Do nothing."""

    def op_start(self, name: str, op: str) -> None:
        """Do nothing."""

    def activity_start(self, name: str, activity: str) -> None:
        """Do nothing."""

    def activity_end(self, name: str) -> None:
        """Do nothing."""

    def op_end(self, name: str, dtype: object, shape: Sequence[int]) -> None:
        """Do nothing."""

    def mark_cycle(self) -> None:
        """Do nothing."""

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """A context that groups nothing."""
        return contextlib.nullcontext()

    def flush(self) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing."""
