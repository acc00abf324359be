"""What each rank contributes to a negotiation cycle (``Announcement``), and the texts of the errors the
engine raises. (What the engine is configured with is ``engine_settings``.)"""

from __future__ import annotations

from dataclasses import dataclass

from ...exceptions import HorovodInternalError
from ..observe.timeline import backend_activity
from ..requests import RequestMeta
from .negotiation import RequestKey, Response


@dataclass(frozen=True)
class Announcement:
    """One rank's contribution to a cycle."""

    metas: tuple[RequestMeta, ...]
    shutting_down: bool
    #: Set by rank 0 when requests stalled past the shutdown time: every rank stops with this text.
    stall_abort: str = ""
    #: Requests found in the response cache, one bit per cache slot (see ``response_cache``).
    cached: bytes = b""
    #: What this rank's threads have been blocked on for a while: (request key, call site) pairs (``deadlock``).
    blocked: tuple = ()
    #: This rank could have settled the cycle without the all-gather (``cycles``): nothing but cache bits.
    settle: bool = False
    #: Collectives this rank could not start after they were released (``launch_failures``).
    launch_failures: tuple = ()


def response_backend_activity(response: Response) -> str:
    """The timeline name of the backend step, e.g. ``GLOO_ALLREDUCE`` or ``NCCL_BROADCAST``."""
    return backend_activity(response.template.device, response.op_type.value)


def duplicate_message(key: RequestKey) -> str:
    """The error for a second request under a name still in flight on this rank."""
    return (f"Duplicate tensor name '{key[1]}': an operation with this name is still in progress on this "
            "rank. Wait for it (synchronize) or give the new operation another name.")


def shutdown_error(stopping_ranks: list[int]) -> HorovodInternalError:
    """The error of operations that can no longer complete because ``stopping_ranks`` shut down."""
    who = ", ".join(map(str, stopping_ranks))
    return HorovodInternalError(
        f"torchring has been shut down (by rank {who}). This is caused by hvd.shutdown() or the end "
        "of the program on that rank, or by an exception there; operations still pending on this "
        "rank can no longer complete."
    )
