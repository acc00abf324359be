"""Settings read from the environment, under a ``TORCHRING_`` or a ``HOROVOD_`` name."""

from __future__ import annotations

import os
from collections.abc import Mapping


def setting(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """Value of ``TORCHRING_<name>``, else ``HOROVOD_<name>``, else None (empty counts as unset)."""
    env = os.environ if env is None else env
    for prefix in ("TORCHRING_", "HOROVOD_"):
        value = env.get(prefix + name)
        if value not in (None, ""):
            return value
    return None


def float_setting(name: str, default: float, env: Mapping[str, str] | None = None) -> float:
    """A numeric setting; a value that is not a number is an error naming the variable."""
    raw = setting(name, env)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"TORCHRING_{name}/HOROVOD_{name} must be a number, got {raw!r}") from None


def bool_setting(name: str, default: bool = False, env: Mapping[str, str] | None = None) -> bool:
    """A flag setting: 1/true/yes/on are true, 0/false/no/off are false."""
    raw = setting(name, env)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"TORCHRING_{name}/HOROVOD_{name} must be 1 or 0, got {raw!r}")
