"""How much CPU one thread of this process used (the bench reports the engine's and the lanes' threads)."""

from __future__ import annotations

import threading
import time

__all__ = ["thread_cpu_seconds"]


def thread_cpu_seconds(thread: threading.Thread) -> float:
    """CPU seconds used by a running ``thread`` (0 when it is not running or the platform cannot tell)."""
    if thread.ident is None or not thread.is_alive():
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError):
        return 0.0
