"""Where torchring's retired process groups are destroyed: on a thread of their own, never on the thread
that happens to drop the last reference.

Destroying a Gloo group waits for its worker threads, and a worker thread that is connecting a pair to a
peer that died (torchring's groups connect their pairs on first use) only gives up after five times the
group's timeout: 150 s with the default 30 s collective timeout (measured with torch 2.13: a 2 s group
timeout gave up after 10 s, 5 s after 25 s; ``abort()`` and ``shutdown()`` do not end the wait). Whoever
drops the last reference waits that long: an elastic reset, a training step in which a garbage collection
frees a reference cycle that held the group (an exception's traceback), or the interpreter's last garbage
collection at exit, where a job that had recovered from a lost worker hung after training.

So :func:`retire` hands a group to the reaper thread, which keeps it until nobody else refers to it and
then drops it there (torch releases the interpreter lock while a group is destroyed, so the wait blocks
nothing else). A group still referred to elsewhere when the process exits stays with the reaper, whose
references the interpreter never drops: it is never destroyed, and the process exits without waiting
for its threads. :func:`settle` waits, within a bound, until the reaper destroyed every group it was given.

At exit the process waits up to ``EXIT_SETTLE_S`` for that too: a worker thread that gives up on its
peer while the interpreter finalizes ends the process with ``terminate called without an active
exception`` (seen when the connection attempts to a dead peer, refused at once, ran out right at the
exit), and the attempts that are refused at once run out within that time. One still waiting then (the
wait of five times the timeout) is left waiting, which exits cleanly.

A collective's ``Work`` that failed goes to the reaper too (:func:`retire_on_failure`): the error's
traceback refers to it, and it can hold the last reference to its group's transport, whose destruction
waits the same way. A rank 0 whose control gather had failed on a peer lost in an elastic job trained
on with the survivors and then hung at exit, in the garbage collection that freed that traceback.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["retire", "retire_on_failure", "settle"]

#: How often the reaper looks again at groups that others still refer to (while :func:`settle` waits).
RECHECK_S = 0.5
SETTLING_RECHECK_S = 0.01
#: How long the exiting process waits for the reaper (only while it holds groups).
EXIT_SETTLE_S = 5.0

_lock = threading.Lock()
#: The reaper's inbox and the process that started its thread (a forked child starts one of its own).
_inbox: queue.SimpleQueue[Any] | None = None
_owner_pid = 0


class _Marker:
    """Put in the inbox by :func:`settle`: set once the reaper holds no group."""

    def __init__(self) -> None:
        self.done = threading.Event()
        #: The caller stopped waiting: the reaper forgets the marker (and rechecks at its slow pace again).
        self.abandoned = False


def _inbox_of_this_process() -> queue.SimpleQueue[Any]:
    global _inbox, _owner_pid
    with _lock:
        if _inbox is None or _owner_pid != os.getpid():
            _inbox, _owner_pid = queue.SimpleQueue(), os.getpid()
            threading.Thread(target=_reap, args=(_inbox,), name="torchring-group-reaper", daemon=True).start()
        return _inbox


def retire(group: object) -> None:
    """Destroy ``group`` on the reaper thread once nothing else refers to it. The caller drops its own
    references right after (a reference it keeps only delays the destruction)."""
    _inbox_of_this_process().put(group)


@contextmanager
def retire_on_failure(work: object | None) -> Iterator[None]:
    """Around a wait for ``work`` (a c10d ``Work``): when the wait raises, hand ``work`` to the reaper, so
    that whoever drops the error's traceback last only drops a reference (see the module's text)."""
    try:
        yield
    except BaseException:
        if work is not None:
            retire(work)
        raise


def settle(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until the reaper has destroyed every group retired so far; whether it
    did (False: a group is still referred to elsewhere, or its threads still wait for a peer, and stays
    with the reaper). True at once where this process retired no group."""
    with _lock:
        if _inbox is None or _owner_pid != os.getpid():
            return True
    marker = _Marker()
    _inbox_of_this_process().put(marker)
    settled = marker.done.wait(timeout)
    marker.abandoned = not settled
    return settled


# at interpreter exit: registered when this module is imported, so it runs after ``shutdown()`` (registered later)
atexit.register(settle, EXIT_SETTLE_S)


def _only_held_here(held: list[Any], index: int) -> bool:
    # the list's reference and getrefcount's own argument
    return sys.getrefcount(held[index]) <= 2


def _reap(inbox: queue.SimpleQueue[Any]) -> None:
    """The reaper thread: ``held`` lives only in this frame, so the interpreter never drops it at exit."""
    held: list[Any] = []
    waiting: list[_Marker] = []
    while True:
        try:
            item = inbox.get(timeout=SETTLING_RECHECK_S if waiting else RECHECK_S) if held else inbox.get()
        except queue.Empty:
            item = None
        if isinstance(item, _Marker):
            waiting.append(item)
        elif item is not None:
            held.append(item)
        item = None
        for index in reversed(range(len(held))):
            if _only_held_here(held, index):
                group = held.pop(index)
                del group  # destroyed here: waits for the group's threads, without the interpreter lock
        if not held:
            for marker in waiting:
                marker.done.set()
            waiting.clear()
        waiting = [marker for marker in waiting if not marker.abandoned]
