"""The engine's CUDA work, on a stream of its own per device.

A collective on CUDA tensors that the engine runs (the first optimizer step, ``groups=``, Min/Max/Product,
the direct API) must not share the stream the training thread's forward and backward run on: it would
wait behind them, and they behind it. So each device gets one engine stream, which waits only for the
submitting streams' ready events (recorded at submission). Everything the engine does with the request
(the fusion copies, scaling, the collective, the copy-back) is queued on that stream; the host does not
wait: an event recorded after it is what the completion thread waits for before it completes the
handles, so a completed handle still means the data is there, and only that thread blocks.

The caching allocator must know which streams use which memory: the request's tensors are marked as used
on the engine stream (the caller may free them before the engine stream is done), and the tensors handed
back (outputs the engine allocated on its stream) as used on the submitting stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..requests import Request
from .completion import Launched

__all__ = ["EngineStreams"]


class _EventWork:
    """What the completion thread waits for: an event recorded on the engine stream after the work; then
    the collective's own ``wait()`` once more, which raises what NCCL's watchdog recorded (a timeout, a
    peer that went away) instead of handing back a result from an aborted communicator."""

    def __init__(self, event: Any, work: Any, stream: Any) -> None:
        self._event, self._work, self._stream = event, work, stream

    def wait(self) -> bool:
        self._event.synchronize()
        if self._work is not None:
            with torch.cuda.stream(self._stream):
                self._work.wait()
        return True


def _tensors(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        return [tensor for item in result for tensor in _tensors(item)]
    return []


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
        """Queue ``run`` (which starts a collective and says how to finish it) and its finishing on the engine
        stream of ``device`` after the requests' ready events; the result completes once that work is done."""
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
            if launched.work is not None:
                launched.work.wait()  # NCCL: the engine stream waits for the collective, the host does not
            result = launched.finish()
            for request in requests:
                if request.stream is not None:
                    for tensor in _tensors(result):
                        if tensor.is_cuda and tensor.device == device:
                            tensor.record_stream(request.stream)
            done = torch.cuda.Event()
            done.record(stream)
        return Launched(_EventWork(done, launched.work, stream), lambda: result)  # type: ignore[arg-type]
