"""Finishing launched collectives off the engine thread.

The engine launches each collective asynchronously on its process group and hands the pending work to
a ``Completer``. The completer waits for the works in launch order (``Work.wait`` releases the GIL),
runs their post-processing (averaging, scaling, copies out of the fusion buffer) and completes the
handles. Meanwhile the engine negotiates the next requests, so negotiation overlaps data transfer.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ...metrics.counters import METRICS
from ..group_reaper import retire


@dataclass
class Launched:
    """A collective in flight: wait for ``work`` (None when nothing is pending), then call ``finish``."""

    work: dist.Work | None
    finish: Callable[[], Any]
    #: Set when the collective could not even start: only its own requests fail.
    error: BaseException | None = None

    @classmethod
    def done(cls, result: Any) -> Launched:
        """A result that needs no waiting (single-rank sets, barriers)."""
        return cls(None, lambda: result)

    @classmethod
    def failed(cls, error: BaseException) -> Launched:
        """A collective that could not start (e.g. a dtype the backend cannot move)."""
        return cls(None, lambda: None, error)


OnDone = Callable[[Any, BaseException | None], None]


class Completer:
    """A thread that finishes launched collectives in the order they were launched."""

    def __init__(self, name: str, on_failure: Callable[[BaseException], None]) -> None:
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[Launched, OnDone]] = collections.deque()
        self._busy = False
        self._closed = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def add(self, launched: Launched, on_done: OnDone) -> None:
        """Finish ``launched`` after everything added before it; ``on_done(result, error)`` reports it."""
        with self._cond:
            inline = launched.work is None and not self._queue and not self._busy
            if not inline:
                self._queue.append((launched, on_done))
                self._cond.notify_all()
        if inline:  # nothing to wait for and nothing ahead of it (only the engine thread adds)
            self._complete(launched, on_done)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every work added so far has been finished (or ``timeout`` seconds passed: False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the queued works; gives up waiting after ``timeout`` (a stuck peer)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                launched, on_done = self._queue.popleft()
                self._busy = True
            try:
                self._complete(launched, on_done)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _complete(self, launched: Launched, on_done: OnDone) -> None:
        if launched.error is not None:
            on_done(None, launched.error)
            return
        try:
            if launched.work is not None:
                waited_from = time.perf_counter()
                launched.work.wait()
                METRICS.phase("backend", time.perf_counter() - waited_from)
            result = launched.finish()
        except BaseException as error:  # noqa: BLE001 - a failed collective fails the engine, not this thread
            if launched.work is not None:
                retire(launched.work)  # the traceback refers to it (``group_reaper``)
            on_done(None, error)
            self._on_failure(error)
            return
        on_done(result, None)
