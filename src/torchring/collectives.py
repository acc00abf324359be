"""The Horovod collective operations: allreduce, allgather, broadcast, barrier, and their handles.

Every operation is a named request to the background engine. ``*_async`` forms return an integer
handle for ``poll`` and ``synchronize``; the plain forms submit and wait. Functions ending in ``_``
work in place on the tensor given.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import torch

from .compression import Compression, Compressor
from .reduction import ReduceOp, resolve_op
from .runtime import context
from .runtime.requests import Handle, OpType, Request, RequestMeta, tensor_meta

_SUPPORTED_DTYPES = {
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
}


class _Handles:
    """Integer handles of in-flight operations, and what to do with each result."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._entries: dict[int, tuple[Handle, Callable[[Any], Any]]] = {}
        self._names: dict[str, itertools.count] = {}
        self._seq = itertools.count()

    def add(self, handle: Handle, finish: Callable[[Any], Any]) -> int:
        with self._lock:
            number = next(self._counter)
            self._entries[number] = (handle, finish)
        return number

    def get(self, number: int) -> tuple[Handle, Callable[[Any], Any]] | None:
        with self._lock:
            return self._entries.get(number)

    def pop(self, number: int) -> tuple[Handle, Callable[[Any], Any]] | None:
        with self._lock:
            return self._entries.pop(number, None)

    def auto_name(self, kind: str) -> str:
        """``<kind>.noname.<n>``: the same sequence on every rank that submits the same unnamed ops."""
        with self._lock:
            counter = self._names.setdefault(kind, itertools.count())
            return f"{kind}.noname.{next(counter)}"

    def next_seq(self) -> int:
        return next(self._seq)

    def reset_names(self) -> None:
        """Restart automatic names, so that every rank numbers a fresh initialisation alike."""
        with self._lock:
            self._names.clear()


_handles = _Handles()
reset_auto_names = _handles.reset_names
auto_name = _handles.auto_name


def _check_tensor(tensor: torch.Tensor, in_place: bool) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _SUPPORTED_DTYPES:
        raise ValueError(f"tensors of dtype {tensor.dtype} are not supported by torchring collectives")
    if tensor.is_sparse:
        raise ValueError("sparse tensors are not supported here; convert with tensor.to_dense()")
    if in_place and not tensor.is_contiguous():
        raise ValueError("in-place operations need a contiguous tensor; call tensor.contiguous() first")


def _ready_event(tensor: torch.Tensor) -> Any:
    if not tensor.is_cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    return event


def _submit(meta_for: Callable[[str, int], RequestMeta], kind: str, name: str | None,
            buffer: torch.Tensor | None, finish: Callable[[Any], Any] = lambda result: result) -> int:
    engine = context.current().engine
    request = Request(meta_for(name or _handles.auto_name(kind), _handles.next_seq()), buffer,
                      _ready_event(buffer) if buffer is not None else None)
    engine.submit(request)
    return _handles.add(request.handle, finish)


def _allreduce_submit(buffer: torch.Tensor, name: str | None, op: int | None, average: bool | None,
                      prescale_factor: float, postscale_factor: float,
                      finish: Callable[[Any], Any] = lambda result: result) -> int:
    resolved = resolve_op(op, average)
    if resolved is ReduceOp.AVERAGE and buffer.dtype == torch.bool:
        raise ValueError("op=Average is not defined for bool tensors; use Sum, Min or Max")

    def meta(n: str, seq: int) -> RequestMeta:
        return tensor_meta(n, OpType.ALLREDUCE, buffer, seq, reduce_op=int(resolved),
                           prescale_factor=float(prescale_factor), postscale_factor=float(postscale_factor))

    return _submit(meta, "allreduce", name, buffer, finish)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start reducing ``tensor`` across ranks into a new tensor; return a handle for ``synchronize``."""
    _check_tensor(tensor, in_place=False)
    output = tensor.detach().clone(memory_format=torch.contiguous_format)
    return _allreduce_submit(output, name, op, average, prescale_factor, postscale_factor)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start reducing ``tensor`` across ranks in place; return a handle for ``synchronize``."""
    _check_tensor(tensor, in_place=True)
    return _allreduce_submit(tensor.detach(), name, op, average, prescale_factor, postscale_factor,
                             finish=lambda _: tensor)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` across ranks (``op``: Average by default, Sum, Min, Max, Product).

    ``compression`` shrinks the tensor on the wire (``Compression.fp16``); the result has the input's dtype.
    """
    compressed, ctx = compression.compress(tensor)
    if differentiable.needs_autograd(compressed):
        reduced = differentiable.AllreduceFunction.apply(compressed, resolve_op(op, average), name,
                                                         prescale_factor, postscale_factor)
    else:
        reduced = synchronize(allreduce_async(compressed, average, name, op, prescale_factor, postscale_factor))
    return compression.decompress(reduced, ctx)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` across ranks in place and return it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor))


def allgather_async(tensor: torch.Tensor, name: str | None = None) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (whose size may differ per rank)."""
    _check_tensor(tensor, in_place=False)
    source = tensor.detach()
    if source.dim() == 0:
        source = source.reshape(1)
    source = source.contiguous()

    def meta(n: str, seq: int) -> RequestMeta:
        return tensor_meta(n, OpType.ALLGATHER, source, seq)

    return _submit(meta, "allgather", name, source)


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0, in rank order (differentiable)."""
    if differentiable.needs_autograd(tensor):
        return differentiable.AllgatherFunction.apply(tensor, name)
    return synchronize(allgather_async(tensor, name))


def _broadcast_submit(buffer: torch.Tensor, root_rank: int, name: str | None,
                      finish: Callable[[Any], Any] = lambda result: result) -> int:
    size = context.current().topology.size
    if not 0 <= int(root_rank) < size:
        raise ValueError(f"root_rank {root_rank} is not a rank of this job (size {size})")

    def meta(n: str, seq: int) -> RequestMeta:
        return tensor_meta(n, OpType.BROADCAST, buffer, seq, root_rank=int(root_rank))

    return _submit(meta, "broadcast", name, buffer, finish)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> int:
    """Start copying ``root_rank``'s ``tensor`` to every rank, into a new tensor."""
    _check_tensor(tensor, in_place=False)
    return _broadcast_submit(tensor.detach().clone(memory_format=torch.contiguous_format), root_rank, name)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> int:
    """Start overwriting ``tensor`` on every rank with ``root_rank``'s value."""
    _check_tensor(tensor, in_place=True)
    return _broadcast_submit(tensor.detach(), root_rank, name, finish=lambda _: tensor)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """A copy of ``root_rank``'s ``tensor`` on every rank (differentiable)."""
    if differentiable.needs_autograd(tensor):
        return differentiable.BroadcastFunction.apply(tensor, root_rank, name)
    return synchronize(broadcast_async(tensor, root_rank, name))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s value, in place, and return it."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def barrier() -> None:
    """Block until every rank has called ``barrier()``."""

    def meta(n: str, seq: int) -> RequestMeta:
        return RequestMeta(name=n, op_type=OpType.BARRIER, seq=seq)

    synchronize(_submit(meta, "barrier", None, None))


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (``synchronize`` will not block)."""
    entry = _handles.get(handle)
    if entry is None:
        raise ValueError(f"handle {handle} was not created or has already been synchronized")
    return entry[0].done()


def synchronize(handle: int) -> Any:
    """Wait for the operation behind ``handle`` and return its output (raises if it failed)."""
    entry = _handles.get(handle)
    if entry is None:
        return None
    done, finish = entry
    try:
        return finish(done.wait())
    finally:
        _handles.pop(handle)


from . import differentiable  # noqa: E402 - autograd wrappers build on the functions above
