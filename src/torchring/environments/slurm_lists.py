"""Slurm's compressed lists: host lists (``gpu[03-05,09],cpu1``) and per-node counts (``2(x3),1``).

Slurm writes ``SLURM_JOB_NODELIST``, ``SLURM_STEP_NODELIST`` and ``SLURM_TASKS_PER_NODE`` (also
``SLURM_JOB_CPUS_PER_NODE``) in these forms; torchring reads them to find rank 0's host under ``srun``
and to place ``torchring run``'s ranks on an allocation's nodes.
"""

from __future__ import annotations

import re

__all__ = ["SlurmListError", "expand_counts", "expand_hostlist"]

#: The most hosts one list may expand to (a typo such as ``n[1-99999999]`` fails instead of filling memory).
MAX_HOSTS = 100_000


class SlurmListError(ValueError):
    """A host list or count list that is not in Slurm's format; the message quotes it."""


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise SlurmListError(f"unbalanced ']' in Slurm host list {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SlurmListError(f"unbalanced '[' in Slurm host list {text!r}")
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def _expand_range(item: str, whole: str) -> list[str]:
    """``03-05`` -> ``03 04 05`` (the width of the first bound is kept); ``9`` -> ``9``."""
    low, sep, high = item.partition("-")
    if not low.isdigit() or (sep and not high.isdigit()):
        raise SlurmListError(f"{item!r} in Slurm host list {whole!r} is not a number or a range of numbers")
    if not sep:
        return [low]
    start, stop = int(low), int(high)
    if stop < start:
        raise SlurmListError(f"range {item!r} in Slurm host list {whole!r} runs backwards")
    if stop - start >= MAX_HOSTS:
        raise SlurmListError(f"range {item!r} in Slurm host list {whole!r} names more than {MAX_HOSTS} hosts")
    return [str(number).zfill(len(low)) for number in range(start, stop + 1)]


def _expand_one(pattern: str, whole: str) -> list[str]:
    """Every host of one comma-free pattern; several bracket groups multiply (``r[1-2]n[1-2]``)."""
    match = re.search(r"\[([^\[\]]*)\]", pattern)
    if match is None:
        if "[" in pattern or "]" in pattern:
            raise SlurmListError(f"unbalanced brackets in Slurm host list {whole!r}")
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    numbers = [n for item in match.group(1).split(",") if item.strip() for n in _expand_range(item.strip(), whole)]
    if not numbers:
        raise SlurmListError(f"empty brackets in Slurm host list {whole!r}")
    rests = _expand_one(tail, whole)
    if len(numbers) * len(rests) > MAX_HOSTS:
        raise SlurmListError(f"Slurm host list {whole!r} names more than {MAX_HOSTS} hosts")
    return [f"{head}{number}{rest}" for number in numbers for rest in rests]


def expand_hostlist(text: str) -> list[str]:
    """Every host of a Slurm host list, in order: ``gpu[03-05,09],cpu1`` -> ``gpu03 gpu04 gpu05 gpu09 cpu1``."""
    hosts: list[str] = []
    for part in _split_top_level(text.strip()):
        hosts.extend(_expand_one(part, text))
        if len(hosts) > MAX_HOSTS:
            raise SlurmListError(f"Slurm host list {text!r} names more than {MAX_HOSTS} hosts")
    if not hosts:
        raise SlurmListError("the Slurm host list is empty")
    return hosts


def expand_counts(text: str) -> list[int]:
    """A Slurm per-node count list: ``2(x3),1`` -> ``2 2 2 1``."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise SlurmListError(f"{part!r} in Slurm count list {text!r} is not N or N(xM)")
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > MAX_HOSTS:
            raise SlurmListError(f"Slurm count list {text!r} covers more than {MAX_HOSTS} nodes")
        counts.extend([int(match.group(1))] * repeat)
    return counts
