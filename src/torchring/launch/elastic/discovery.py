"""Which hosts an elastic job may use right now: a fixed pool or a discovery script, minus blacklisted hosts."""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..hosts import HostSlots, HostSpecError, parse_hosts


class Discovery(Protocol):
    """What the elastic driver asks for hosts: :class:`HostDiscovery`, or Ray's nodes
    (``torchring.ray.elastic.RayHostDiscovery``)."""

    #: Why the last look failed ("" when it worked); the last good answer is kept meanwhile.
    last_error: str

    def find(self) -> dict[str, int]:
        """Host -> slots, in a stable order."""
        ...


class HostDiscovery:
    """The hosts and slots available: ``--host-discovery-script`` (run each time) or a fixed ``-H`` pool."""

    def __init__(self, fixed: list[HostSlots] | None = None, script: str | None = None,
                 slots_per_host: int | None = None, timeout_s: float = 10.0) -> None:
        if (fixed is None) == (script is None):
            raise ValueError("give either a fixed host list or a discovery script")
        self._fixed = fixed
        self._script = script
        self._slots_per_host = slots_per_host
        self._timeout_s = timeout_s
        self._last: dict[str, int] = {}
        #: Why the last run of the script failed ("" when it worked), for the launcher's log.
        self.last_error = ""

    def find(self) -> dict[str, int]:
        """Host -> slots, in the order given. A failing script keeps the last good answer."""
        if self._fixed is not None:
            return {h.hostname: self._slots_per_host or h.slots for h in self._fixed}
        assert self._script is not None
        try:
            result = subprocess.run(self._script, shell=True, capture_output=True, text=True, timeout=self._timeout_s)
        except subprocess.TimeoutExpired:
            self.last_error = f"the host discovery script took more than {self._timeout_s:g} s"
            return dict(self._last)
        if result.returncode != 0:
            self.last_error = (f"the host discovery script exited with {result.returncode}: "
                               f"{result.stderr.strip()[-200:] or 'no message'}")
            return dict(self._last)
        try:
            found = parse_discovery_output(result.stdout, self._slots_per_host)
        except HostSpecError as error:
            self.last_error = f"the host discovery script printed something unexpected: {error}"
            return dict(self._last)
        self.last_error = ""
        self._last = found
        return dict(found)


def parse_discovery_output(text: str, slots_per_host: int | None) -> dict[str, int]:
    """``host[:slots]`` lines (blank lines ignored); slots default to ``--slots-per-host`` or 1."""
    hosts: dict[str, int] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        (entry,) = parse_hosts(line)
        has_slots = ":" in line.rstrip("]").rsplit("]", 1)[-1]
        hosts[entry.hostname] = entry.slots if has_slots else (slots_per_host or 1)
    return hosts


@dataclass
class Blacklist:
    """Hosts where a worker failed: out for good, or for a random cool-down in ``cooldown_range_s``."""

    cooldown_range_s: tuple[float, float] | None = None
    clock: Callable[[], float] = time.monotonic
    _until: dict[str, float] = field(default_factory=dict)

    def add(self, host: str) -> float | None:
        """Blacklist ``host``; the seconds until it may come back (None: never)."""
        if self.cooldown_range_s is None:
            self._until[host] = float("inf")
            return None
        low, high = self.cooldown_range_s
        seconds = random.uniform(low, high)
        self._until[host] = self.clock() + seconds
        return seconds

    def remove(self, host: str) -> bool:
        """Take ``host`` off the blacklist; whether it was on it."""
        return self._until.pop(host, None) is not None

    def blocks(self, host: str) -> bool:
        until = self._until.get(host)
        if until is None:
            return False
        if self.clock() >= until:
            del self._until[host]
            return False
        return True
