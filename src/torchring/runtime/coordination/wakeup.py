"""Waking idle engines on every rank through the rendezvous store.

An engine with nothing to do stops cycling and blocks. When any rank then gets work, its engine may have
to wake the others: it sets the key of the idle epoch, which the listener thread of every idle rank waits
on, and all engines resume their collective cycles together. Idle ranks therefore use no CPU, yet the
first request after a pause is seen everywhere after one store round trip.

Most wake-ups are not needed: in a loop of collectives every rank submits the next one itself, within a
fraction of a millisecond of the others, and each store round trip (the key set, every listener thread
woken and listening again) costs CPU that the collective itself needs (measured: a blocking 4 KB allreduce
at 2 ranks on 2 cores took 1.5-1.9 ms with a wake-up per operation, 1.2-1.3 ms without). So:

- an engine that just went idle waits ``QUIET_S`` before its listener waits on the store at all (an engine
  back at work within that time costs the store nothing);
- an engine that leaves an idle epoch on its own only *owes* its peers the wake-up (``DeferredWake``): it
  starts the cycle's first collective and pays (sets the key) only when that collective has not completed
  after ``WAKE_GRACE_S``; a collective that completed means every rank is in the cycle already.

A listener left waiting on an epoch nobody woke is released by its own engine (it sets that key) the next
time the engine listens; a listener that gets to an epoch only after its engine listened again does not
wait on it at all. So a peer idle for longer than ``QUIET_S`` is woken ``WAKE_GRACE_S`` after the first rank
submits, one that went idle less than ``QUIET_S`` ago within ``QUIET_S + WAKE_GRACE_S``.

Keys are shared by every rank, and a listener thread may reach its wait long after its engine moved on
(seen on a loaded machine: several epochs late). A key deleted as soon as its epoch is over could therefore
be gone before a late listener waits on it, which then never returns (and holds its engine's shutdown). So
each rank deletes the keys it set only ``KEY_HISTORY`` idle epochs later: the store keeps at most that many
keys per job generation.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from ..startup import discard_store_client, store_client
from .failure_alarm import FailureAlarm, wait_unless_alarmed

_LISTEN_TIMEOUT = timedelta(hours=1)
#: How long a cycle's first collective after an idle epoch may take before the engine wakes its peers.
WAKE_GRACE_S = 0.0005
#: How long an engine stays idle before its listener waits on the store.
QUIET_S = 0.002
#: How often ``DeferredWake`` looks at the collective during the grace period.
_POLL_S = 0.00005
#: How many idle epochs a rank keeps the keys it set before it deletes them.
KEY_HISTORY = 256


class Waker:
    """Interface: ``listen`` for a wake-up of an idle epoch, ``wake`` every rank's engine for it."""

    def listen(self, epoch: int, on_wake: Callable[[int], None]) -> None:
        """Call ``on_wake(epoch)`` (from another thread) once another rank wakes ``epoch``."""

    def wake(self, epoch: int) -> None:
        """Wake every rank's engine that is idle in ``epoch``."""

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

    def __init__(self, host: str, port: int, prefix: str, timeout: timedelta, key_history: int = KEY_HISTORY) -> None:
        self._address = (host, port)
        self._key_history = key_history
        self._setter = dist.PrefixStore(prefix, store_client(host, port, timeout, self._SETTER))
        self._listening_store = dist.PrefixStore(prefix, store_client(host, port, timeout, self._LISTENER))
        self._epochs: queue.SimpleQueue[tuple[int, Callable[[int], None]] | None] = queue.SimpleQueue()
        #: The epochs whose keys this rank set, oldest first (deleted ``key_history`` epochs later).
        self._set_keys: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()
        #: The epoch the listener waits on (or will, once it gets to it) until its key shows up.
        self._outstanding: int | None = None
        #: Epochs whose keys this rank set only to release its own listener.
        self._released: set[int] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._listen_loop, name="torchring-waker", daemon=True)
        self._thread.start()

    def listen(self, epoch: int, on_wake: Callable[[int], None]) -> None:
        """Listen for ``epoch``; a listener still waiting on an earlier epoch that nobody woke (every rank
        left it on its own) is released first."""
        self._release_outstanding(epoch)
        self._epochs.put((epoch, on_wake))

    def wake(self, epoch: int) -> None:
        self._set_key(epoch)

    def _set_key(self, epoch: int) -> None:
        with self._lock:
            self._set_keys.append(epoch)
        self._setter.set(str(epoch), "1")

    def close(self) -> None:
        """Stop the listener and wait for it, so that no thread is inside the store at interpreter exit."""
        self._closed = True
        try:
            self._release_outstanding(None)
        except Exception:  # noqa: BLE001 - the store is gone: the wait below gives up on the listener
            pass
        self._epochs.put(None)
        self._thread.join(timeout=10)
        if self._thread.is_alive():  # still waiting inside the listening client: never hand it out again
            discard_store_client(*self._address, self._LISTENER)

    def _release_outstanding(self, next_epoch: int | None) -> None:
        """Set the key of the epoch the listener still waits on (it returns, and deletes that key), and note
        ``next_epoch`` as the one it waits on next."""
        with self._lock:
            stale, self._outstanding = self._outstanding, next_epoch
            if stale is not None:
                self._released.add(stale)
        if stale is not None:
            self._set_key(stale)

    def _listen_loop(self) -> None:
        while True:
            item = self._epochs.get()
            if item is None:
                return
            epoch, on_wake = item
            self._delete_old_keys(epoch)
            # Released already (the engine listened again, or closed, before this thread got here): no wait
            while not self._closed and not self._superseded(epoch):
                try:
                    self._listening_store.wait([str(epoch)], _LISTEN_TIMEOUT)
                    break
                except dist.DistStoreError as error:
                    if "timeout" not in str(error).lower():
                        break  # the store is gone: let the engine cycle, and fail, on its own I/O
            with self._lock:
                released = epoch in self._released
                self._released.discard(epoch)
                if self._outstanding == epoch:
                    self._outstanding = None
            if not released:  # a release is this rank's own doing, not a wake-up
                on_wake(epoch)

    def _superseded(self, epoch: int) -> bool:
        with self._lock:
            return epoch in self._released

    def _delete_old_keys(self, epoch: int) -> None:
        """Delete the keys this rank set ``key_history`` or more epochs before ``epoch``."""
        while True:
            with self._lock:
                if not self._set_keys or self._set_keys[0] > epoch - self._key_history:
                    return
                old = self._set_keys.popleft()
            try:
                self._listening_store.delete_key(str(old))
            except Exception:  # noqa: BLE001 - a store that is gone keeps its keys; nothing to clean
                return


class DeferredWake:
    """The wake-up an engine owes its peers after it left an idle epoch on its own (see this module's text):
    paid only when the cycle's first collective has not completed within ``grace_s``."""

    def __init__(self, waker: Waker, grace_s: float = WAKE_GRACE_S, alarm: FailureAlarm | None = None) -> None:
        self.waker = waker
        self._grace_s = grace_s
        self._owed: int | None = None
        #: Another rank's engine failure, looked at while a collective waits long (``failure_alarm``).
        self.alarm = alarm

    def owe(self, epoch: int) -> None:
        """This engine left idle ``epoch`` on its own: its next collective pays the wake-up if it must."""
        self._owed = epoch

    def await_work(self, work: dist.Work, longer_s: float = 0.0) -> None:
        """Wait for ``work``, a collective every rank calls; first, while a wake-up is owed, poll it for
        ``grace_s`` (plus ``longer_s``: a collective that moves data takes that long with every rank in it)
        and wake the peers if it has not completed by then. A wait that lasts ends early once another
        rank's engine posted its failure (``failure_alarm``)."""
        epoch, self._owed = self._owed, None
        if epoch is not None and not self._completes_within(work, self._grace_s + longer_s):
            self.waker.wake(epoch)
        wait_unless_alarmed(work, self.alarm)

    @staticmethod
    def _completes_within(work: dist.Work, grace_s: float) -> bool:
        deadline = time.monotonic() + grace_s
        while not work.is_completed():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True
