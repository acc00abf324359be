"""The hosts an elastic job may use right now: what discovery lists, minus the blacklist, each remote host
having passed preflight.

A remote host is preflighted (SSH, versions, the store reachable) the first time it is listed, again
when its blacklist cool-down ends, and again when discovery lists it after having dropped it. A host
that discovery drops and lists again also comes off the blacklist: the discovery script is the
operator's (or the autoscaler's) word that the host is back, typically a replaced machine under the
same name. A host that stays listed while blacklisted stays out (for good, or for its cool-down).
"""

from __future__ import annotations

from collections.abc import Callable

from ..hosts import is_local_host
from .discovery import Blacklist, Discovery


class HostPool:
    """Discovery's answer, filtered: ``refresh()`` asks discovery, ``usable()`` applies the blacklist."""

    def __init__(self, discovery: Discovery, blacklist: Blacklist, preflight: Callable[[str], list[str]],
                 log: Callable[[str], None]) -> None:
        """``preflight(host)``: the problems that make ``host`` unusable (empty when it passed)."""
        self.discovery = discovery
        self.blacklist = blacklist
        self.preflight = preflight
        self.log = log
        #: Every host discovery listed last time, in its order, and their slots.
        self.order: list[str] = []
        self.slots: dict[str, int] = {}
        self._checked: set[str] = set()
        self._available: dict[str, int] = {}

    def refresh(self) -> None:
        """Ask discovery again (a failing script keeps its last good answer, with a warning)."""
        found = self.discovery.find()
        if self.discovery.last_error:
            self.log(f"warning: {self.discovery.last_error}; using the last hosts found")
        for host in found:
            if host not in self.slots and self.blacklist.remove(host):
                self.log(f"host {host} is listed again after discovery dropped it: off the blacklist, checked "
                         "afresh")
        for host in [h for h in self.slots if h not in found]:
            self._checked.discard(host)
            self.log(f"host {host} left the pool (discovery no longer lists it)")
        available = {}
        for host, slots in found.items():
            if self.blacklist.blocks(host):
                self._checked.discard(host)  # checked again once its cool-down ends
                continue
            if not is_local_host(host) and not self._passes_preflight(host):
                continue
            available[host] = slots
        self.order, self.slots, self._available = list(found), dict(found), available

    def usable(self) -> dict[str, int]:
        """The hosts of the last refresh not blacklisted since, with their slots."""
        return {host: slots for host, slots in self._available.items() if not self.blacklist.blocks(host)}

    def _passes_preflight(self, host: str) -> bool:
        if host in self._checked:
            return True
        problems = self.preflight(host)
        if problems:
            cooldown = self.blacklist.add(host)
            self.log(f"host {host} is unusable: {'; '.join(problems)}; blacklisted "
                     f"{'for good' if cooldown is None else f'for {cooldown:.0f} s'}")
            return False
        self._checked.add(host)
        return True
