"""Automatic names of unnamed operations (``<kind>.noname.<n>``), numbered per process set.

Every rank that submits the same unnamed operations in a process set gets the same names, so they
negotiate as one operation. The engine moves a joined rank's numbering past the names the others used
(``skip_auto_name``); ``hvd.init()`` restarts the numbering (``reset_auto_names``). It sits beside
``runtime.requests`` at the bottom of the runtime, so that both the context and submission use it.
"""

from __future__ import annotations

import re
import threading

#: ``<kind>.noname.<n>``, or a member ``<kind>.noname.<n>_<i>of<count>`` of a group.
_AUTO_NAME = re.compile(r"(?P<kind>.+)\.noname\.(?P<number>\d+)(?:_\d+of\d+)?")

_lock = threading.Lock()
#: The next automatic name's number, per "<kind>@<process set>".
_next: dict[str, int] = {}


def auto_name(kind: str, process_set: int = 0) -> str:
    """``<kind>.noname.<n>``, numbered per process set: the same sequence on every member that submits
    the same unnamed operations in that set."""
    with _lock:
        key = f"{kind}@{process_set}"
        number = _next.get(key, 0)
        _next[key] = number + 1
        return f"{kind}.noname.{number}"


def skip_auto_name(name: str, process_set: int) -> None:
    """Another rank's automatic ``name`` ran without a request of this rank (it had joined): move this
    rank's numbering past it, so that its next unnamed operation of that kind has the others' name."""
    match = _AUTO_NAME.fullmatch(name)
    if match is None:
        return
    with _lock:
        key = f"{match['kind']}@{process_set}"
        _next[key] = max(_next.get(key, 0), int(match["number"]) + 1)


def reset_auto_names() -> None:
    """Restart automatic names, so that every rank numbers a fresh initialisation alike."""
    with _lock:
        _next.clear()
