"""What the elastic driver does with a failed worker: start another one on its slot, or blacklist its host.

A lost worker is not a lost host. The rule, in this order:

1. its host cannot be reached (the worker's ssh client exited with 255, or its link to the remote
   supervisor was cut off): **blacklist** the host;
2. the worker never arrived in any generation (it failed at start-up, before ``hvd.init()`` announced
   it): workers cannot start there, **blacklist** the host;
3. this is the ``max_failures``-th failure on that host within ``window_s`` seconds: **blacklist** it;
4. otherwise (killed by a signal, a non-zero exit, ended by the hang detector, with its host still
   answering): **replace** it; the slot is free again and the driver starts a new worker there.

A blacklisted host is out for good, or for a random cool-down in ``--blacklist-cooldown-range``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .discovery import Blacklist


@dataclass(frozen=True)
class Decision:
    """The driver's answer to one failed worker, and why, in words for the log."""

    blacklisted: bool
    #: ``h2 blacklisted for good (it never joined a generation)`` or ``replacing it on h2 (h2 still answers)``.
    text: str


@dataclass
class FailurePolicy:
    """Replace failed workers while their host answers; blacklist the host when it does not, when workers
    fail to start there, or after ``max_failures`` failures there within ``window_s`` seconds."""

    blacklist: Blacklist
    max_failures: int = 3
    window_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, list[float]] = field(default_factory=dict)

    def decide(self, host: str, unreachable: str | None, joined: bool) -> Decision:
        """Record a failure on ``host`` and decide. ``unreachable``: why the host cannot be reached (None
        when it still answers); ``joined``: whether the worker ever arrived in a generation."""
        now = self.clock()
        recent = [t for t in self._failures.get(host, []) if now - t < self.window_s] + [now]
        self._failures[host] = recent
        if unreachable is not None:
            return self._blacklist(host, "unreachable")
        if not joined:
            return self._blacklist(host, "its worker never joined a generation: workers fail to start there")
        if len(recent) >= self.max_failures:
            return self._blacklist(host, f"{len(recent)} failures there within {self.window_s:g} s")
        return Decision(False, f"replacing it on {host} ({host} still answers; {len(recent)} failure(s) there "
                               f"within {self.window_s:g} s, blacklisted at {self.max_failures})")

    def _blacklist(self, host: str, reason: str) -> Decision:
        cooldown = self.blacklist.add(host)
        self._failures.pop(host, None)  # after a cool-down the host starts afresh
        until = "for good" if cooldown is None else f"for {cooldown:.0f} s"
        return Decision(True, f"{host} blacklisted {until} ({reason})")
