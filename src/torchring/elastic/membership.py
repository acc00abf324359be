"""What a worker learns about the job's membership from an elastic launcher.

An elastic ``torchring run`` sets ``TORCHRING_ELASTIC=1`` and publishes, under
``contract.HOSTS_VERSION_KEY``, a counter it bumps whenever hosts are added or removed. Workers
compare it with the version they last saw at each ``commit()``/``check_host_updates()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract import HOSTS_VERSION_KEY
from ..runtime import context, settings


@dataclass(frozen=True)
class HostsVersion:
    """The host set's version and whether its last change only removed hosts."""

    version: int = 0
    removed_only: bool = False


def elastic_mode() -> bool:
    """True when an elastic launcher started this worker (``TORCHRING_ELASTIC=1``)."""
    return settings.read("ELASTIC")


def reset_limit() -> int | None:
    """How many resets the job allows (``TORCHRING_RESET_LIMIT``), None for no limit."""
    return settings.read("RESET_LIMIT")


def current_hosts_version() -> HostsVersion:
    """The version published by the launcher; version 0 outside elastic mode or before any change."""
    if not elastic_mode() or not context.is_initialized():
        return HostsVersion()
    store = context.current().store
    if not store.check([HOSTS_VERSION_KEY]):
        return HostsVersion()
    return parse_hosts_version(store.get(HOSTS_VERSION_KEY).decode())


def parse_hosts_version(text: str) -> HostsVersion:
    """``"<version> <added|removed>"`` as written by the launcher."""
    fields = text.split()
    if not fields:
        return HostsVersion()
    return HostsVersion(int(fields[0]), len(fields) > 1 and fields[1] == "removed")
