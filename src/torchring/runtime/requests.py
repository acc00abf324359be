"""What a rank submits to the engine: a named request, its metadata, and the handle that completes it."""

from __future__ import annotations

import _thread
import time
from enum import Enum
from typing import Any, NamedTuple

import torch

from .devices import device_name


class OpType(str, Enum):
    """The kinds of collective the engine negotiates."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    BARRIER = "barrier"
    JOIN = "join"
    ADD_PROCESS_SET = "add_process_set"
    REMOVE_PROCESS_SET = "remove_process_set"


#: Operations that move tensor data (the others only synchronise or change the engine's state).
DATA_OPS = frozenset({OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST, OpType.ALLTOALL, OpType.REDUCESCATTER})


class RequestMeta(NamedTuple):
    """The part of a request every rank sees during negotiation (a small tuple: cheap to build and pickle)."""

    name: str
    op_type: OpType
    dtype: str = ""
    shape: tuple[int, ...] = ()
    device: str = "cpu"
    reduce_op: int = -1
    root_rank: int = -1
    prescale_factor: float = 1.0
    postscale_factor: float = 1.0
    #: The process set the request runs in (0: every rank).
    process_set: int = 0
    #: Alltoall: rows sent to each rank of the process set. Process set changes: the member ranks.
    splits: tuple[int, ...] = ()
    #: Grouped operations: the group's name and number of requests; the group runs as one unit.
    group: str = ""
    group_size: int = 0
    #: This rank's submission counter; it orders requests that become ready together. Must stay last.
    seq: int = 0

    @property
    def key(self) -> tuple[int, str]:
        """Requests are identified by process set and name."""
        return (self.process_set, self.name)

    @property
    def identity(self) -> tuple[Any, ...]:
        """Every field but ``seq``: equal for the same request submitted again."""
        return self[:-1]


class Handle:
    """Completion of one request: set once, with a result or an error."""

    __slots__ = ("_done", "_lock", "error", "result")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()  # released when the request completes
        self._done = False
        self.result: Any = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        """True once the request finished, successfully or not."""
        return self._done

    def complete(self, result: Any = None, error: BaseException | None = None) -> None:
        """Record the outcome and wake whoever waits; the first outcome wins."""
        if self._done:
            return
        self.result = result
        self.error = error
        self._done = True
        try:
            self._lock.release()
        except RuntimeError:  # completed concurrently by another thread: its outcome stands
            pass

    def spin_until_done(self, deadline: float) -> bool:
        """Poll until done or ``time.perf_counter()`` reaches ``deadline``, giving up the GIL between polls;
        whether it is done. A result that comes within a millisecond is seen sooner than by sleeping: waking a
        thread that sleeps costs tens of microseconds where idle CPUs halt (virtual machines)."""
        while not self._done and time.perf_counter() < deadline:
            time.sleep(0)
        return self._done

    def wait_done(self, timeout: float | None) -> bool:
        """Block until done or for ``timeout`` seconds (None: no limit); whether it is done."""
        if self._done:
            return True
        if self._lock.acquire(timeout=-1 if timeout is None else timeout):
            self._lock.release()
            return True
        return self._done

    def wait(self) -> Any:
        """Block until done; return the result or raise the error."""
        if not self._done:
            self._lock.acquire()
            self._lock.release()
        if self.error is not None:
            raise self.error
        return self.result


class Request(Handle):
    """A rank's own request: metadata plus the local tensors the engine works on. It is also the handle
    that completes it (one object per operation instead of two)."""

    __slots__ = ("buffer", "key", "meta", "ready_event", "stream")

    def __init__(self, meta: RequestMeta, buffer: torch.Tensor | None = None, ready_event: Any = None,
                 stream: Any = None) -> None:
        Handle.__init__(self)
        self.meta = meta
        #: ``meta.key``, computed once: the engine looks requests up by it several times.
        self.key: tuple[int, str] = (meta.process_set, meta.name)
        #: The tensor the collective reads from and (for allreduce/broadcast) writes into.
        self.buffer = buffer
        #: A CUDA event recorded on the submitting stream; the engine waits on it before reading ``buffer``.
        self.ready_event = ready_event
        #: The submitting CUDA stream, which uses the results the engine hands back.
        self.stream = stream

    def __repr__(self) -> str:
        return f"Request({self.meta!r})"


def tensor_meta(
    name: str, op_type: OpType, tensor: torch.Tensor, seq: int, reduce_op: int = -1, root_rank: int = -1,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: int = 0,
    splits: tuple[int, ...] = (), group: str = "", group_size: int = 0,
) -> RequestMeta:
    """The negotiation metadata of ``tensor`` for an operation of ``op_type`` (built positionally: this
    runs for every request)."""
    return _new_meta(RequestMeta, (name, op_type, _dtype_name(tensor.dtype), tuple(tensor.shape),
                                   "cpu" if tensor.is_cpu else device_name(tensor), reduce_op, root_rank,
                                   prescale_factor, postscale_factor, process_set, splits, group, group_size, seq))


#: ``RequestMeta(*fields)`` without the Python-level ``__new__`` a named tuple has (fields in order).
_new_meta = tuple.__new__


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    """``float32`` for ``torch.float32`` (remembered: this runs for every request)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name
