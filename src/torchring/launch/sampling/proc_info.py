"""What /proc says about a process: its state, CPU time and the signals it catches (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["catches_signal", "process_state"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_state(pid: int) -> tuple[str, float] | None:
    """(state letter, CPU seconds) of ``pid``, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0], (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def is_stopped(stat: tuple[str, float] | None) -> bool:
    """Whether a ``process_state`` result is a stopped process (``T``: SIGSTOP; ``t``: a tracer's stop)."""
    return stat is not None and stat[0] in "Tt"


def catches_signal(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (``SigCgt`` in /proc/PID/status): sending it is safe."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) & (1 << (signum - 1)))
