"""Submitting requests to the engine and the integer handles users ``poll`` and ``synchronize``."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from . import context
from .coordination.deadlock import BLOCKED_AFTER_S, call_site
from .devices import note_cuda_device
from .names import auto_name
from .requests import Handle, Request, RequestMeta
from .wake_probe import auto_spin_seconds

SUPPORTED_DTYPES = frozenset({
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
})

#: A blocking wait polls for its result first (``TORCHRING_WAIT_SPIN_US``) only for tensors up to this size.
SPIN_MAX_BYTES = 64 * 1024
#: ... and only while the engine has at most this many requests in flight: with more (a burst of ``*_async``
#: calls), it has negotiating and fusing to do, and a polling thread would take the CPU and the GIL from it.
SPIN_MAX_INFLIGHT = 8


class Completion(Protocol):
    def done(self) -> bool: ...

    def wait(self) -> Any: ...


class GroupHandle:
    """The completion of several requests submitted as one group: done when all are."""

    def __init__(self, handles: Sequence[Handle]) -> None:
        self.handles = list(handles)

    def done(self) -> bool:
        return all(handle.done() for handle in self.handles)

    def wait(self) -> list[Any]:
        return [handle.wait() for handle in self.handles]


class _HandleTable:
    """Integer handles of in-flight operations, and what to do with each result."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._entries: dict[int, tuple[Completion, Callable[[Any], Any]]] = {}
        self._seq = itertools.count()

    # add, get and pop run once per operation: each is one step the interpreter does atomically
    # (``next`` on a counter, one dict operation), so they need no lock.

    def add(self, completion: Completion, finish: Callable[[Any], Any]) -> int:
        number = next(self._counter)
        self._entries[number] = (completion, finish)
        return number

    def get(self, number: int) -> tuple[Completion, Callable[[Any], Any]] | None:
        return self._entries.get(number)

    def pop(self, number: int) -> tuple[Completion, Callable[[Any], Any]] | None:
        return self._entries.pop(number, None)

    def next_seq(self) -> int:
        return next(self._seq)


_table = _HandleTable()


def check_tensor(tensor: torch.Tensor, in_place: bool) -> None:
    """Refuse what the collectives cannot carry, with a message saying what to do."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"tensors of dtype {tensor.dtype} are not supported by torchring collectives")
    if tensor.is_sparse:
        raise ValueError("sparse tensors are not supported here; convert with tensor.to_dense()")
    if in_place and not tensor.is_contiguous():
        raise ValueError("in-place operations need a contiguous tensor; call tensor.contiguous() first")


def _ready_event(tensor: torch.Tensor | None) -> tuple[Any, Any]:
    """For a CUDA tensor: an event recorded on the submitting stream, and that stream (else None, None)."""
    if tensor is None or tensor.is_cpu or not tensor.is_cuda:
        return None, None
    stream = torch.cuda.current_stream(tensor.device)
    event = torch.cuda.Event()
    event.record(stream)
    note_cuda_device(tensor.device.index)
    return event, stream


MetaFactory = Callable[[str, int], RequestMeta]


def request_name(kind: str, name: str | None, process_set: int = 0) -> str:
    """The name a request is negotiated under: ``<kind>.<name>`` as in Horovod (so the same user name may
    be used by different kinds of operation at once), or ``<kind>.noname.<n>`` without a name."""
    return f"{kind}.{name}" if name else auto_name(kind, process_set)


def make_request(meta_for: MetaFactory, kind: str, name: str | None, buffer: torch.Tensor | None,
                 process_set: int = 0, full_name: str | None = None) -> Request:
    """A request named after ``kind`` and ``name`` (or ``full_name`` exactly) with this rank's next
    submission number."""
    negotiated = full_name or request_name(kind, name, process_set)
    return Request(meta_for(negotiated, _table.next_seq()), buffer, *_ready_event(buffer))


_batch = threading.local()


@contextlib.contextmanager
def submission_batch() -> Iterator[None]:
    """Hand the requests submitted inside the block to the engine together, so they are negotiated in
    one cycle (and fused when they can be). Nested blocks join the outer one."""
    if getattr(_batch, "requests", None) is not None:
        yield
        return
    _batch.requests = []
    try:
        yield
    finally:
        requests, _batch.requests = _batch.requests, None
        if requests:
            context.current().engine.submit_many(requests)


def submit(meta_for: MetaFactory, kind: str, name: str | None, buffer: torch.Tensor | None,
           finish: Callable[[Any], Any] = lambda result: result, process_set: int = 0,
           full_name: str | None = None, announced: threading.Event | None = None) -> int:
    """Queue one request to the engine (or to the open ``submission_batch``) and return its handle;
    ``full_name`` is the negotiated name as it is (see ``make_request``); ``announced``: see ``Engine.submit``
    (not within a batch)."""
    request = make_request(meta_for, kind, name, buffer, process_set, full_name)
    pending = getattr(_batch, "requests", None)
    if pending is not None and announced is None:
        pending.append(request)
    else:
        context.current().engine.submit(request, announced)
    return _table.add(request, finish)


def submit_group(requests: Sequence[Request], finish: Callable[[list[Any]], Any]) -> int:
    """Queue requests that run as one unit and return one handle for all of them."""
    engine = context.current().engine
    engine.submit_many(list(requests))
    return _table.add(GroupHandle(requests), finish)


class _CombinedCompletion:
    """Done when every one of several handles is; waiting synchronizes each of them in turn."""

    def __init__(self, numbers: Sequence[int]) -> None:
        self.numbers = list(numbers)

    def done(self) -> bool:
        return all(poll(number) for number in self.numbers)

    def wait(self) -> list[Any]:
        return [synchronize(number) for number in self.numbers]


class CallableHandle(int):
    """A handle that can also be called to wait for its result (Horovod's sparse allreduce handles)."""

    def __call__(self) -> Any:
        return synchronize(self)


def combine(handles: Sequence[int], finish: Callable[[list[Any]], Any]) -> int:
    """One handle for several: ``synchronize`` on it returns ``finish`` of their outputs."""
    return _table.add(_CombinedCompletion(handles), finish)


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (``synchronize`` will not block)."""
    entry = _table.get(handle)
    if entry is None:
        raise ValueError(f"handle {handle} was not created or has already been synchronized")
    return entry[0].done()


def synchronize(handle: int) -> Any:
    """Wait for the operation behind ``handle`` and return its output (raises if it failed)."""
    entry = _table.pop(handle)  # gone from the table whatever the outcome, as Horovod's handles are
    if entry is None:
        return None
    completion, finish = entry
    if not completion.done():
        _wait_announced(completion)
    return finish(completion.wait())


def _wait_announced(completion: Completion) -> None:
    """Wait for ``completion``. The engine first stops waiting for more of this thread's submissions (a
    burst of ``*_async`` calls followed by ``synchronize`` is over); the wait polls for the result for
    ``TORCHRING_WAIT_SPIN_US`` before it sleeps when its tensors are small (``wake_probe.wait_spin_seconds``: a
    larger one takes longer than that, and polling takes the CPU its transfer needs); a request still not done
    after ``BLOCKED_AFTER_S`` is announced as blocked at its call site, for the deadlock watch (``deadlock``),
    and has the engine cycle once per ``BLOCKED_AFTER_S`` while it waits (``Engine.probe``)."""
    runtime = context.current_or_none()
    if runtime is None:
        return
    runtime.engine.hurry()
    requests = [completion] if isinstance(completion, Request) else \
        [h for h in completion.handles if isinstance(h, Request)] if isinstance(completion, GroupHandle) else []
    spin_s = runtime.wait_spin_s if runtime.wait_spin_s is not None else auto_spin_seconds()
    spin = spin_s if spin_s and runtime.engine.inflight_count <= SPIN_MAX_INFLIGHT and all(
        request.buffer is None or request.buffer.nbytes <= SPIN_MAX_BYTES for request in requests) else 0.0
    spin_deadline = time.perf_counter() + spin
    for request in requests:
        if request.spin_until_done(spin_deadline) or request.wait_done(BLOCKED_AFTER_S):
            continue
        watch = runtime.engine.deadlocks
        watch.note_blocked(request.key, call_site())
        try:
            # each slice, an idle engine cycles: a launched collective may wait on a pair to a dead peer that
            # never connected (five times Gloo's timeout), while the cycle fails on that peer at once
            while not request.wait_done(BLOCKED_AFTER_S):
                watch.probe()
        finally:
            watch.note_unblocked(request.key)
