"""Waking idle engines on every rank through the rendezvous store.

An engine with nothing to do stops cycling and blocks. When any rank then gets work, it sets a key
that the listener thread of every rank waits on, and all engines resume their collective cycles
together. Idle ranks therefore use no CPU, yet the first request after a pause is seen everywhere
after one store round trip.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from ..startup import discard_store_client, store_client

_LISTEN_TIMEOUT = timedelta(hours=1)


class Waker:
    """Interface: ``listen`` for a wake-up of an idle epoch, ``wake`` every rank's engine for it."""

    #: The last epoch ``forget_through`` released.
    _forgotten_through = -1

    def listen(self, epoch: int, on_wake: Callable[[int], None]) -> None:
        """Call ``on_wake(epoch)`` (from another thread) once any rank wakes ``epoch``."""

    def wake(self, epoch: int) -> None:
        """Wake every rank's engine that is idle in ``epoch``."""

    def forget(self, epoch: int) -> None:
        """Release what ``epoch`` used (called by one rank once every rank has left it)."""

    def forget_through(self, finished: int) -> None:
        """``forget`` every epoch up to ``finished`` not forgotten yet (rank 0, after each cycle)."""
        for epoch in range(self._forgotten_through + 1, finished + 1):
            self.forget(epoch)
        self._forgotten_through = max(self._forgotten_through, finished)

    def close(self) -> None:
        """Stop listening."""


class LocalWaker(Waker):
    """For a job of one rank: its own submissions already wake its engine."""


class StoreWaker(Waker):
    """Wake-ups through keys ``<epoch>`` in a store; one client listens, another sets (both kept for the
    process and used again by the next initialisation, see ``runtime.startup``)."""

    _SETTER, _LISTENER = "wake-setter", "wake-listener"

    @classmethod
    def connect(cls, host: str, port: int, timeout: timedelta) -> None:
        """Open this process's two clients now (``init()`` calls it before the rendezvous, while the ranks
        still arrive one by one): opened later, after a collective, every rank would connect at the same
        moment, and a burst of connections to one store server can stall for seconds (measured: 16
        processes connecting at once waited 5-10 s on the 2-core test machines)."""
        store_client(host, port, timeout, cls._SETTER)
        store_client(host, port, timeout, cls._LISTENER)

    def __init__(self, host: str, port: int, prefix: str, timeout: timedelta) -> None:
        self._address = (host, port)
        self._setter = dist.PrefixStore(prefix, store_client(host, port, timeout, self._SETTER))
        self._listening_store = dist.PrefixStore(prefix, store_client(host, port, timeout, self._LISTENER))
        self._epochs: queue.SimpleQueue[tuple[int, Callable[[int], None]] | None] = queue.SimpleQueue()
        self._forgotten: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._listen_loop, name="torchring-waker", daemon=True)
        self._thread.start()

    def listen(self, epoch: int, on_wake: Callable[[int], None]) -> None:
        self._epochs.put((epoch, on_wake))

    def wake(self, epoch: int) -> None:
        self._setter.set(str(epoch), "1")

    def forget(self, epoch: int) -> None:
        """Queue the key's deletion; the listener thread does it, off the engine's path."""
        self._forgotten.put(epoch)

    def close(self) -> None:
        """Stop the listener and wait for it, so that no thread is inside the store at interpreter exit."""
        self._closed = True
        self._epochs.put(None)
        self._thread.join(timeout=10)
        if self._thread.is_alive():  # still waiting inside the listening client: never hand it out again
            discard_store_client(*self._address, self._LISTENER)

    def _listen_loop(self) -> None:
        while True:
            item = self._epochs.get()
            if item is None:
                return
            epoch, on_wake = item
            self._delete_forgotten()
            while not self._closed:
                try:
                    self._listening_store.wait([str(epoch)], _LISTEN_TIMEOUT)
                    break
                except dist.DistStoreError as error:
                    if "timeout" not in str(error).lower():
                        break  # the store is gone: let the engine cycle, and fail, on its own I/O
            on_wake(epoch)

    def _delete_forgotten(self) -> None:
        while True:
            try:
                epoch = self._forgotten.get_nowait()
            except queue.Empty:
                return
            try:
                self._listening_store.delete_key(str(epoch))
            except Exception:  # noqa: BLE001 - a store that is gone keeps its keys; nothing to clean
                return
