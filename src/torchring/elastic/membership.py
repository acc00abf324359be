"""What a worker learns about the job's membership from an elastic launcher.

An elastic ``torchring run`` sets ``TORCHRING_ELASTIC=1`` and publishes, under
``contract.HOSTS_VERSION_KEY``, a counter it bumps whenever hosts are added or removed. Workers
compare it with the version they last saw at each ``commit()``/``check_host_updates()``. Only a value
the launcher signed counts (``store_auth``): a forged or malformed one is ignored (with one warning)
and the last good version stands.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import settings
from ..contract import HOSTS_VERSION_KEY
from ..runtime import context


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


#: The longest hosts-version value read from the store.
_MAX_BYTES = 64
_last_verified = HostsVersion()


def current_hosts_version() -> HostsVersion:
    """The version published by the launcher; version 0 outside elastic mode or before any change; the
    last good version when the store's value is not the launcher's."""
    global _last_verified
    if not elastic_mode() or not context.is_initialized():
        return HostsVersion()
    value = context.current().signed.get(HOSTS_VERSION_KEY, max_bytes=_MAX_BYTES)
    if value is not None:
        parsed = parse_hosts_version(value.decode(errors="replace"))
        if parsed is not None:
            _last_verified = parsed
    return _last_verified


def parse_hosts_version(text: str) -> HostsVersion | None:
    """``"<version> <added|removed>"`` as written by the launcher; None when ``text`` is not that."""
    fields = text.split()
    if not fields:
        return HostsVersion()
    if not fields[0].isdigit():
        return None
    return HostsVersion(int(fields[0]), len(fields) > 1 and fields[1] == "removed")
