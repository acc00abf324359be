"""``elastic.run``: run a training function, roll back on failures and continue with the new membership."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from .. import basics
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from ..metrics.counters import METRICS
from ..rank_failure import caused_by_peer
from .membership import elastic_mode, reset_limit
from .state import State

logger = logging.getLogger("torchring.elastic")

Result = TypeVar("Result")


class ResetLimitExceeded(RuntimeError):
    """The job was reset more often than ``--reset-limit`` allows."""


def run(func: Callable[..., Result]) -> Callable[..., Result]:
    """Decorate ``train(state, *args, **kwargs)`` so that it survives membership changes.

    Loop: ``state.sync()`` (skipped after an interrupt that only removed hosts), call ``func``. When a
    collective fails (``HorovodInternalError``), in ``func`` or in ``sync()`` itself (a peer lost while
    the state is handed out), the state rolls back to its last commit; when hosts were added or removed
    (``HostsUpdatedInterrupt``) it keeps its current values. Then torchring is re-initialised with the
    new membership (again, should a peer be lost while the groups form), ``state.on_reset()`` runs the
    reset callbacks, and the loop starts again. Outside an elastic launch a failure cannot be recovered
    from and is re-raised.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Result:
        if not isinstance(state, State):
            raise TypeError(f"elastic.run: the first argument must be an elastic State, got {type(state).__name__}")
        if not basics.is_initialized():
            basics.init()
        resets, skip_sync = 0, False
        while True:
            try:
                if not _everyone_skips_sync(skip_sync):
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as error:
                if not elastic_mode():
                    raise HorovodInternalError(
                        f"{error} (not an elastic launch, so the job cannot continue without this rank; start it "
                        "with torchring run --min-np/--max-np to survive lost workers)") from error
                logger.warning("a collective failed (%s); rolling back to the last commit", error)
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                logger.warning("hosts changed; continuing with the new membership")
                skip_sync = interrupt.skip_sync
            resets += 1
            METRICS.resets += 1
            limit = reset_limit()
            if limit is not None and resets > limit:
                raise ResetLimitExceeded(f"the job was reset {resets} times, more than --reset-limit {limit}")
            _reinitialize()
            state.on_reset()

    return wrapper


def _everyone_skips_sync(skip: bool) -> bool:
    """Skip ``sync()`` only when every rank may: ranks that rolled back after a failed collective, new
    workers, and ranks interrupted by a removal of hosts can reach this point together, and a rank that
    skipped while another synchronised would wait forever."""
    if basics.size() == 1:
        return skip
    import torch

    from ..collectives import allreduce
    from ..reduction import ReduceOp

    return bool(allreduce(torch.tensor([1 if skip else 0]), op=ReduceOp.MIN, name="elastic.skip_sync").item())


def _reinitialize() -> None:
    """Leave the current membership and join the next one. A peer lost while the new groups form fails
    ``init()`` on the others; they join the generation the launcher publishes without it."""
    old_size = basics.size()
    basics.shutdown()
    while True:
        try:
            basics.init()
            break
        except Exception as error:  # noqa: BLE001 - only a lost peer is retried; anything else is raised
            if not caused_by_peer(error):
                raise
            logger.warning("a peer was lost while the new membership formed (%s); joining the next one",
                           str(error).splitlines()[0][:200] if str(error) else type(error).__name__)
            basics.shutdown()
    logger.warning("re-initialised: %d -> %d ranks, this is rank %d", old_size, basics.size(), basics.rank())
