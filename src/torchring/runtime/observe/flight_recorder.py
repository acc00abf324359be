"""The flight recorder: what this rank's collectives and optimizer steps were doing, in a file the
launcher reads.

When ``TORCHRING_FLIGHT_RECORD`` names a file (``torchring run`` sets it), ``init()`` opens a
``FlightRecorder``: the engine notes the requests this rank submits and finishes and the collectives it
starts and ends, ``DistributedOptimizer``'s gradient lane its bucket allreduces, the optimizer how long
each step waited for its gradients. Recording is a dict update or a deque append, atomic under the GIL:
no lock, no I/O, no formatting. One daemon thread wakes every ``WRITE_INTERVAL_S``, copies what was
recorded and, when the content changed since its last write, rewrites the file atomically
(``<path>.partial``, then ``os.replace``), so a reader sees a whole version or the previous one. The
launcher's hang report shows the last collectives and the ranks a pending request waits for; its
straggler watch compares the ranks' step times.

File format, version 1::

    {"version": 1, "pid": int, "rank": int, "size": int, "written_at": time.time(),
     "recent": [{"op": str, "name": str, "started_at": wall, "ended_at": wall | null}, ...],  # last 8, oldest first
     "pending": [{"op": str, "name": str, "since": wall, "missing_ranks": [int, ...] | null}, ...],  # at most 16
     "steps": {"first": int, "wait": [s, ...], "interval": [s | null, ...]} | null}  # last 100 optimizer steps

``pending`` lists the requests this rank submitted that have not finished, oldest first. For engine
requests still being negotiated, ``missing_ranks`` are the members that have not submitted them (every
rank holds the same negotiation table); it is null for gradient-lane buckets and for requests already on
the wire. ``steps`` holds the steps of the first ``DistributedOptimizer`` that steps: ``wait[i]`` is how
long step ``first + i`` waited for its reductions, ``interval[i]`` the time since the end of the step
before (null for the first one recorded). Names drop the operation prefix (``allreduce.loss`` is ``loss``).

Without the variable, ``open_recorder`` returns ``NULL_RECORDER``, whose calls do nothing.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ...contract import FLIGHT_RECORD_FILE
from ..requests import OpType

if TYPE_CHECKING:
    from ..requests import Request

__all__ = ["FORMAT_VERSION", "MAX_PENDING", "MAX_STEPS", "NULL_RECORDER", "RECENT_OPS", "WRITE_INTERVAL_S",
           "FlightRecorder", "OpRecord", "Recorder", "open_recorder"]

logger = logging.getLogger("torchring")

_Copyable = TypeVar("_Copyable", collections.deque, dict)

FORMAT_VERSION = 1
#: ``op_type.value`` of each kind, looked up per request (an enum's ``.value`` is a slow property).
_OP_NAMES = {op_type: op_type.value for op_type in OpType}
#: Collectives kept in ``recent``.
RECENT_OPS = 8
#: Pending requests written (the oldest ones).
MAX_PENDING = 16
#: Optimizer steps kept in ``steps``.
MAX_STEPS = 100
#: How often the writer thread looks for changes.
WRITE_INTERVAL_S = 1.0
#: How long the writer waits for the engine to say which ranks its pending requests wait for.
MISSING_WAIT_S = 0.05

#: The path this process claimed at its first ``init()``: a re-initialisation (elastic reset) keeps
#: writing there although the variable is gone from the environment.
_claimed_path: str | None = None


class OpRecord:
    """One collective as the recorder saw it: started (wall clock), ended (None while running)."""

    __slots__ = ("ended_at", "name", "op", "started_at")

    def __init__(self, op: str, name: str, started_at: float) -> None:
        self.op = op
        self.name = name
        self.started_at = started_at
        self.ended_at: float | None = None


class Recorder:
    """What the runtime tells the flight recorder. This base records nothing (``NULL_RECORDER``: recording
    is off); ``FlightRecorder`` records."""

    #: Never asks the engine for the ranks its pending requests wait for.
    wants_missing = False

    def submitted(self, requests: Iterable[Request]) -> None:
        """Requests this rank queued to the engine (they are pending until ``finished``)."""

    def submitted_one(self, request: Request) -> None:
        """``submitted`` for one request (the engine's path per request)."""

    def finished(self, key: Hashable) -> None:
        """The engine request ``key`` completed (or failed)."""

    def started(self, op: str, name: str, pending: bool = False) -> OpRecord | None:
        """A collective started; ``pending``: it is pending until ``ended`` (the gradient lane's buckets)."""
        return None

    def ended(self, record: OpRecord | None) -> None:
        """The collective ``started`` returned finished."""

    def forget(self, record: OpRecord | None) -> None:
        """A pending collective that will never be waited for (an abandoned step)."""

    def step(self, owner: object, index: int, wait_s: float, interval_s: float | None) -> None:
        """Optimizer ``owner`` finished step ``index``: it waited ``wait_s`` for its reductions, and
        ``interval_s`` passed since its previous step ended (None for its first)."""

    def pending_keys(self) -> list[Hashable]:
        """The engine requests whose missing ranks the file should show."""
        return []

    def set_missing(self, missing: Mapping[Hashable, list[int]]) -> None:
        """From the engine thread: which ranks have not submitted each of ``pending_keys()``."""

    def close(self) -> None:
        """Stop recording (``shutdown()``)."""


NULL_RECORDER = Recorder()


class FlightRecorder(Recorder):
    """Records this rank's collectives and steps, and rewrites ``path`` once a second when they change."""

    def __init__(self, path: str, rank: int, size: int, interval_s: float = WRITE_INTERVAL_S) -> None:
        self.path = path
        self.rank = rank
        self.size = size
        self.wants_missing = False
        self._interval_s = interval_s
        self._recent: collections.deque[OpRecord] = collections.deque(maxlen=RECENT_OPS)
        #: engine requests by key: (op, name, since); lane buckets by their record: the record itself.
        self._pending: dict[Hashable, tuple[str, str, float] | OpRecord] = {}
        self._missing: Mapping[Hashable, list[int]] = {}
        self._answered = threading.Event()
        self._steps: collections.deque[tuple[int, float, float | None]] = collections.deque(maxlen=MAX_STEPS)
        self._step_owner: int | None = None
        #: The content last written, without its time: the writer writes only when the content differs.
        self._written: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"torchring-flight-recorder-{rank}", daemon=True)
        self._thread.start()

    # ---- recording (any thread; each call a few atomic container operations) ---------------------

    def submitted(self, requests: Iterable[Request]) -> None:
        now = time.time()
        pending = self._pending
        for request in requests:
            meta = request.meta
            pending[request.key] = (_OP_NAMES[meta.op_type], meta.name, now)

    def submitted_one(self, request: Request) -> None:
        meta = request.meta
        self._pending[request.key] = (_OP_NAMES[meta.op_type], meta.name, time.time())

    def finished(self, key: Hashable) -> None:
        self._pending.pop(key, None)

    def started(self, op: str, name: str, pending: bool = False) -> OpRecord:
        record = OpRecord(op, name, time.time())
        self._recent.append(record)
        if pending:
            self._pending[record] = record
        return record

    def ended(self, record: OpRecord | None) -> None:
        if record is not None:
            record.ended_at = time.time()
            self._pending.pop(record, None)

    def forget(self, record: OpRecord | None) -> None:
        self._pending.pop(record, None)

    def step(self, owner: object, index: int, wait_s: float, interval_s: float | None) -> None:
        if self._step_owner is None:
            self._step_owner = id(owner)
        elif self._step_owner != id(owner):
            return
        steps = self._steps
        if steps and steps[-1][0] != index - 1:
            steps.clear()  # keep the indices consecutive: ``first`` then says where each one is
        steps.append((index, wait_s, interval_s))

    def pending_keys(self) -> list[Hashable]:
        keys = itertools.islice(_copy(self._pending), MAX_PENDING)
        return [key for key in keys if isinstance(key, tuple)]

    def set_missing(self, missing: Mapping[Hashable, list[int]]) -> None:
        self.wants_missing = False
        self._missing = missing
        self._answered.set()

    # ---- the writer thread ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the writer after one last write of what changed."""
        self._stop.set()
        self._thread.join(timeout=10)

    def snapshot(self) -> dict[str, Any]:
        """The file's content now (format version 1)."""
        return {**self._content(), "written_at": time.time()}

    def _content(self) -> dict[str, Any]:
        """What was recorded, as the file holds it (without ``written_at``)."""
        recent = [(r.op, r.name, r.started_at, r.ended_at) for r in _copy(self._recent)]
        pending = list(itertools.islice(_copy(self._pending).items(), MAX_PENDING))
        steps = _copy(self._steps)
        missing = self._missing
        content: dict[str, Any] = {
            "version": FORMAT_VERSION, "pid": os.getpid(), "rank": self.rank, "size": self.size,
            "recent": [{"op": op, "name": _short(op, name), "started_at": started, "ended_at": ended}
                       for op, name, started, ended in recent],
            "pending": [],
            "steps": None,
        }
        for key, value in pending:
            op, name, since = (value.op, value.name, value.started_at) if isinstance(value, OpRecord) else value
            ranks = missing.get(key) if isinstance(key, tuple) else None
            content["pending"].append({"op": op, "name": _short(op, name), "since": since,
                                       "missing_ranks": list(ranks) if ranks is not None else None})
        if steps:
            content["steps"] = {"first": steps[0][0], "wait": [s[1] for s in steps], "interval": [s[2] for s in steps]}
        return content

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._refresh_missing()
            self._write_if_changed()
        self._write_if_changed()

    def _refresh_missing(self) -> None:
        """Ask the engine thread (which owns the negotiation table) for the ranks the pending requests
        wait for; it answers in its next cycle, usually within a millisecond."""
        if not self.pending_keys():
            if self._missing:
                self.set_missing({})
            return
        self._answered.clear()
        self.wants_missing = True
        self._answered.wait(MISSING_WAIT_S)

    def _write_if_changed(self) -> None:
        content = self._content()
        if content == self._written:
            return
        partial = self.path + ".partial"
        try:
            with open(partial, "w", encoding="utf-8") as file:
                json.dump({**content, "written_at": time.time()}, file, separators=(",", ":"))
            os.replace(partial, self.path)
        except OSError as error:  # e.g. the launcher removed its directory at the end of the job
            logger.debug("flight recorder cannot write %s: %s", self.path, error)
            return
        self._written = content


def _copy(container: _Copyable) -> _Copyable:
    """A copy of a deque or dict that other threads change: ``copy()`` is one C call that runs no Python
    code, so no other thread changes the container meanwhile; should one do so anyway (a build without
    the GIL), the copy raises ``RuntimeError`` and is taken again."""
    for _ in range(100):
        try:
            return container.copy()
        except RuntimeError:
            continue
    return container.copy()


def _short(op: str, name: str) -> str:
    """A request's name without its operation prefix: ``loss`` for ``allreduce.loss``."""
    return name.removeprefix(op + ".")


def open_recorder(path: str | None, rank: int, size: int) -> Recorder:
    """At ``init()``: a recorder writing to ``path`` (``Settings.flight_record``), else to the path an earlier
    ``init()`` of this process claimed, else ``NULL_RECORDER``. ``TORCHRING_FLIGHT_RECORD`` leaves the
    environment, so processes this rank starts do not write over its file."""
    global _claimed_path
    os.environ.pop(FLIGHT_RECORD_FILE, None)
    if path:
        _claimed_path = path
    path = path or _claimed_path
    return FlightRecorder(path, rank, size) if path else NULL_RECORDER
