"""Transitional: the two calls ``optimizer.py`` still makes, answered from ``runtime.settings``.

Remove this module once ``DistributedOptimizer`` reads ``settings.read("BUCKET_CAP_MB")`` and
``settings.read("GRADIENT_LANE")`` itself. The defaults given here must match the table's.
"""

from __future__ import annotations

from collections.abc import Mapping

from .runtime import settings


def float_setting(name: str, default: float, env: Mapping[str, str] | None = None) -> float:
    """``settings.read(name)`` as a float; ``default`` when the table's default is None."""
    value = settings.read(name, env)
    return default if value is None else float(value)


def bool_setting(name: str, default: bool = False, env: Mapping[str, str] | None = None) -> bool:
    """``settings.read(name)`` as a bool; ``default`` when the table's default is None."""
    value = settings.read(name, env)
    return default if value is None else bool(value)
