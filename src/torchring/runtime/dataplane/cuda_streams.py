"""The engine's CUDA work, on a stream of its own per device.

A collective on CUDA tensors that the engine runs (the first optimizer step, ``groups=``, Min/Max/Product,
the direct API) must not share the stream the training thread's forward and backward run on: it would
wait behind them, and they behind it. So each device gets one engine stream, which waits only for the
submitting streams' ready events (recorded at submission). The engine thread queues the fusion copy and
starts the collective there and moves on; the completion thread then orders the engine stream after the
collective (NCCL: a stream wait, the host does not block; Gloo's CUDA work blocks that thread, never the
engine's), queues the finishing (scaling, the copy back), records an event and waits for it, and only then
completes the handles: a completed handle means the data is there, and a collective that failed or timed
out (NCCL's watchdog aborts its communicator, see ``cuda_groups``) raises there instead of handing back
what an aborted kernel left.

The caching allocator must know which streams use which memory: the request's tensors are marked as used
on the engine stream (the caller may free them before the engine stream is done), and tensors the engine
allocated and hands back (allgather's output, say) as used on each submitting stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..requests import Request
from .completion import Launched

__all__ = ["EngineStreams"]


def _tensors(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        return [tensor for item in result for tensor in _tensors(item)]
    return []


class _OnStream:
    """The completion thread's part of a CUDA collective (``wait()`` as a ``Work``), and its result."""

    def __init__(self, device: torch.device, stream: Any, launched: Launched, requests: Sequence[Request]) -> None:
        self._device, self._stream, self._launched = device, stream, launched
        self._requests = requests
        self.result: Any = None

    def wait(self) -> bool:
        work = self._launched.work
        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            if work is not None:
                work.wait()  # NCCL: the engine stream waits for the collective; Gloo: this thread does
            self.result = self._launched.finish()
            self._mark_handed_back(self.result)
            done = torch.cuda.Event(blocking=True)  # waited for by sleeping, not by spinning a core
            done.record(self._stream)
        done.synchronize()
        error = work.exception() if work is not None and hasattr(work, "exception") else None
        if error is not None:  # NCCL's watchdog aborted it (a timeout, a peer gone): no result
            raise error if isinstance(error, BaseException) else RuntimeError(str(error))
        return True

    def _mark_handed_back(self, result: Any) -> None:
        """Tensors the engine allocated are used next on the submitting streams (once each, not per request)."""
        own = {id(request.buffer) for request in self._requests}
        streams = {id(request.stream): request.stream for request in self._requests if request.stream is not None}
        for tensor in _tensors(result):
            if tensor.is_cuda and id(tensor) not in own:
                for stream in streams.values():
                    tensor.record_stream(stream)


class EngineStreams:
    """One engine stream per CUDA device, made on first use."""

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}

    def stream(self, device: torch.device) -> Any:
        """The engine's stream on ``device``."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = torch.cuda.Stream(device=index)
        return stream

    def launch(self, device: torch.device, requests: Sequence[Request], run: Callable[[], Launched]) -> Launched:
        """Queue ``run`` (the fusion copy and the collective's start) on the engine stream of ``device`` after
        the requests' ready events; the completion thread finishes it (``_OnStream``)."""
        stream = self.stream(device)
        with torch.cuda.device(device), torch.cuda.stream(stream):
            for request in requests:
                if request.ready_event is not None:
                    stream.wait_event(request.ready_event)
                if request.buffer is not None and request.buffer.is_cuda:
                    request.buffer.record_stream(stream)
            launched = run()
        if launched.error is not None:
            return launched
        on_stream = _OnStream(device, stream, launched, requests)
        return Launched(on_stream, lambda: on_stream.result)  # type: ignore[arg-type]
