"""A collective that could not start on some ranks after every rank agreed to run it.

Once a response is released, each member launches its collective. If the launch raises on a rank (out of
GPU memory for its buffer, a tensor the backend cannot move), that rank fails its own request, but the
members whose launch succeeded wait in a collective that rank will never join: without more, until the
backend's timeout, and for NCCL its watchdog. So a rank whose launch failed announces it in its next
cycle (``Announcement.launch_failures``: the request's key, its members and the error), and every rank
reads the same announcements: when every member failed alike (the same tensor fails everywhere), each has
already failed its own request and the job goes on; when only some did, every rank stops with one error
naming the ranks that could not start it and why (``HorovodInternalError``: the launcher blames those
ranks, an elastic job rolls back).
"""

from __future__ import annotations

from collections.abc import Sequence

from .messages import Announcement
from .negotiation import RequestKey, Response

__all__ = ["LaunchFailure", "failure_of", "launch_failure_verdict", "refuse_after_failed_launch"]

#: (request key, the response's members, the error's text)
LaunchFailure = tuple[RequestKey, tuple[int, ...], str]


def failure_of(response: Response, error: BaseException) -> LaunchFailure:
    """What a rank announces after ``response``'s launch raised ``error``."""
    return (response.key, tuple(response.members), f"{type(error).__name__}: {error}")


def refuse_after_failed_launch(failures: Sequence[LaunchFailure]) -> None:
    """After a launch failed in this cycle (``failures`` of this rank), launch nothing more in it: a later
    collective on the same group would pair up with the one the other ranks wait in. Raises."""
    if failures:
        raise RuntimeError("not started: an earlier collective of the same cycle could not start on this rank")


def launch_failure_verdict(announcements: Sequence[Announcement]) -> str:
    """The error every rank stops with, or "" (no failure, or every member failed alike)."""
    failed: dict[RequestKey, tuple[tuple[int, ...], dict[int, str]]] = {}
    for rank, announcement in enumerate(announcements):
        for key, members, text in announcement.launch_failures:
            failed.setdefault(key, (members, {}))[1][rank] = text
    for key, (members, texts) in sorted(failed.items()):
        started = [rank for rank in members if rank not in texts]
        if started:
            why = "; ".join(f"rank {rank}: {text}" for rank, text in sorted(texts.items()))
            return (f"'{key[1]}' could not start on rank(s) {sorted(texts)} after every rank agreed to run it "
                    f"({why}); rank(s) {started} had started it and could only wait, so every rank stops")
    return ""
