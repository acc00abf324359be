"""What ``init()`` reuses and measures: store clients kept for the process, Gloo groups that connect on
first use, and the time of each step.

A re-initialisation (``shutdown()`` then ``init()``, an elastic reset) meets the same rendezvous store
again, so the clients of a process are kept by address and role and handed out again while the server
still answers: a re-init opens no connection, and a connection's one-time costs (TCP set-up, and in
torch's client the reverse look-up of the local address, which stalls up to 10 s where DNS does not
answer) are paid once per process. Each role has its own client because one of them (the wake-up
listener's) blocks in ``wait`` while the others are used.

A Gloo group normally connects every pair of its ranks when it is created: ``N - 1`` connections per
rank and group, set up through the store while every rank waits. torchring's groups are created with
torch's lazy connection instead (``TORCH_GLOO_LAZY_INIT``, set only while they are created, so the
program's own groups keep torch's default): a pair connects when it first communicates, so creating a
group costs nothing and a rank keeps only the connections its collectives use (its ring neighbours, and
rank 0 those of the control plane's exchanges through it). A torch without the setting connects the
full mesh as before. ``TORCHRING_LAZY_CONNECT=0`` restores the full mesh.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["StepClock", "discard_store_client", "freeze_long_lived_objects", "gloo_group",
           "lazy_connection_available", "one_start_up", "store_client"]

#: Role of the client ``init()`` itself uses (rendezvous, signed values, group set-up).
MAIN = "main"

_lock = threading.Lock()
_clients: dict[tuple[str, int, str], dist.Store] = {}
#: The clients known to reach their server during the current ``one_start_up()`` (opened or checked);
#: None outside one.
_confirmed: set[tuple[str, int, str]] | None = None


def _answers(client: dist.Store) -> bool:
    """Whether the server behind ``client`` still answers (a restarted or lost server refuses)."""
    try:
        client.check(["torchring/alive"])
        return True
    except Exception:  # noqa: BLE001 - any failure means: connect again
        return False


def store_client(host: str, port: int, timeout: timedelta, role: str = MAIN) -> dist.Store:
    """This process's client of the store at ``host:port`` for ``role``, connected on first use; its
    timeout is set to ``timeout`` each time it is handed out."""
    key = (host, port, role)
    with _lock:
        client = _clients.get(key)
        if client is None or not ((_confirmed is not None and key in _confirmed) or _answers(client)):
            client = dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
            _clients[key] = client
        if _confirmed is not None:
            _confirmed.add(key)
        client.set_timeout(timeout)
        return client


def discard_store_client(host: str, port: int, role: str) -> None:
    """Never hand out this client again (a thread may still be inside it)."""
    with _lock:
        _clients.pop((host, port, role), None)
        if _confirmed is not None:
            _confirmed.discard((host, port, role))


@contextmanager
def one_start_up() -> Iterator[None]:
    """Within it (one ``init()``), a client is asked whether its server answers only the first time it is
    handed out: ``init()`` hands out the clients it opened a moment before, and a round trip per client
    while every rank starts at once cost 30-60 ms of start-up at 32 ranks here."""
    global _confirmed
    with _lock:
        _confirmed = set()
    try:
        yield
    finally:
        with _lock:
            _confirmed = None


#: Whether an ``init()`` of this process froze the collector's objects already.
_gc_frozen = False


def freeze_long_lived_objects(enabled: bool) -> None:
    """``gc.freeze()`` (``TORCHRING_GC_FREEZE``, default on): the objects alive when ``init()`` starts (the
    program's imports, its model and data) move to the collector's permanent generation, which its full
    collections no longer walk.

    With torch imported a process tracks 150-200 thousand objects, and a full collection walks them all:
    ~90 ms of CPU on the 2-core test machines, at whatever allocation tips the collector's counters. When
    that landed inside ``init()`` (which allocates more than a bare process group does), 32 ranks on 2 cores
    spent 1.3 s of start-up in it; in training the same walk is a pause of one rank that every other rank
    waits for at the next collective. Freezing costs nothing (the objects are moved, not visited), and what
    it gives up is reclaiming cycles of objects that were already garbage when ``init()`` was called. Only
    the first ``init()`` of a process freezes: a re-initialisation (an elastic reset) would also freeze the
    previous runtime's uncollected garbage (a failed engine's cycle holds its buffers) for good."""
    global _gc_frozen
    if enabled and not _gc_frozen:
        gc.freeze()
        _gc_frozen = True


_LAZY_VARIABLE = "TORCH_GLOO_LAZY_INIT"
_lazy_lock = threading.Lock()


def lazy_connection_available() -> bool:
    """Whether torchring's Gloo groups connect on first use: this torch reads ``TORCH_GLOO_LAZY_INIT``
    (torch 2.8 is the oldest checked to, 2.4 does not) and the program did not turn it off."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    turned_off = os.environ.get(_LAZY_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off")
    return (major, minor) >= (2, 8) and not turned_off


def gloo_group(store: dist.Store, rank: int, size: int, timeout: timedelta, lazy: bool) -> dist.ProcessGroup:
    """A Gloo group over ``store`` with torch's default options; ``lazy``: its pairs connect on first use
    (unless the program set ``TORCH_GLOO_LAZY_INIT`` itself, which then stands).

    Only this constructor reads torch's lazy setting: a group built from ``ProcessGroupGloo._Options``
    (to choose its worker threads, say) connects the full mesh whatever the setting, which cost 150-200 ms
    of every ``init()`` at 32 ranks here."""
    with _lazy_lock:
        scoped = lazy and _LAZY_VARIABLE not in os.environ
        if scoped:
            os.environ[_LAZY_VARIABLE] = "1"
        try:
            return dist.ProcessGroupGloo(store, rank, size, timeout)
        finally:
            if scoped:
                os.environ.pop(_LAZY_VARIABLE, None)


class StepClock:
    """Seconds spent in each named step of ``init()``, in the order they ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, step: str) -> None:
        """The time since the previous lap (or the start) was spent in ``step``."""
        now = time.perf_counter()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self._last
        self._last = now

    def summary(self) -> str:
        """One line: every step's milliseconds and the total."""
        steps = ", ".join(f"{step} {seconds * 1e3:.0f} ms" for step, seconds in self.seconds.items())
        return f"{steps}; total {sum(self.seconds.values()) * 1e3:.0f} ms"
