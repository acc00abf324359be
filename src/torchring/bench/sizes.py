"""Message sizes as people write them (``4K``, ``1M``, ``256MB``) and back.

Suffixes are binary: ``K`` = 1024 bytes, ``M`` = 1024², ``G`` = 1024³; ``B``/``iB`` may follow.
"""

from __future__ import annotations

import re

#: Bytes per element of the float32 tensors every benchmark sends.
ELEMENT_BYTES = 4

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_SIZE_RE = re.compile(r"(\d+)([KMG]?)(?:I?B)?", re.IGNORECASE)

#: The default sizes of ``torchring bench collectives``: 4K, 16K, ..., 256M (powers of 4).
DEFAULT_SIZES = tuple(4 * 1024 * 4**i for i in range(9))


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``4096``, ``4K``, ``1M``, ``2GB``); ``ValueError`` when it is not a size."""
    match = _SIZE_RE.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text.strip()!r} is not a size; write bytes with an optional K, M or G suffix, e.g. 4K")
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if size < ELEMENT_BYTES or size % ELEMENT_BYTES:
        raise ValueError(f"{text.strip()!r} is not a positive multiple of {ELEMENT_BYTES} bytes (float32 elements)")
    return size


def parse_sizes(text: str) -> list[int]:
    """Sizes of a comma-separated list, in the order given, without repeats."""
    entries = [entry for entry in text.split(",") if entry.strip()]
    if not entries:
        raise ValueError("no sizes given; e.g. --sizes 4K,64K,1M")
    sizes: list[int] = []
    for entry in entries:
        size = parse_size(entry)
        if size not in sizes:
            sizes.append(size)
    return sizes


def format_size(size: int) -> str:
    """The shortest exact form: 4096 → ``4K``, 1048576 → ``1M``, 1000 → ``1000``."""
    for suffix in ("G", "M", "K"):
        unit = _UNITS[suffix]
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)
